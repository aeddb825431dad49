"""The explorer in real JupyterLab, driven by headless Debian chromium (playwright, no download).

Starts JupyterLab on 127.0.0.1 (random port and token, throw-away config dirs, ``--allow-root``,
news toast off) and opens a generated notebook with four explorers, each in its default view:
a NaN run (``dp_nan``), a resume mismatch (``kernel_resume``: MindSpore kernel dumps), a TP=2
run whose dropout seed is unsynchronised on rank 1 against TP=1 (``tp_unsync``, ``target_layout``
``tp=2``) and a pair whose names differ (``renamed``). Then, as a person would:

* the origin of the NaN, resume and TP samples is reached by clicking the cells numbered "1"
  (the earliest flagged record) in the heat map and in the rank × step view — at most 3 clicks —
  and the kernel's ``ex.step / ex.rank / ex.tensor`` equal the ground truth;
* an arrow key moves the selection;
* in the Alignment tab a baseline and a target module are clicked, "Match" reruns the triage,
  "Save mapping" writes the file, and ``precnb diff --mapping FILE`` and ``precnb align
  --mapping FILE`` read it back (the pair as a user pair, the same first finding);
* the latency of every click (click → the selection line shows the record) is recorded in
  ``test-output/explorer_latency.json`` (not asserted: the budget is a benchmark figure).

Screenshots go to ``test-output/``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.browser.conftest import NB, jupyter_lab, kernel_output, open_notebook, wait_idle
from tests.conftest import ROOT, sample_path

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

OUT = ROOT / "test-output"


def _origin(name: str) -> dict:
    gt = json.loads(sample_path(name, "ground_truth.json").read_text())
    return next(f for f in gt["faults"] if f.get("role") == "origin")


def _cells() -> list[str]:
    p = {k: str(v) for k, v in {
        "nan": sample_path("dp_nan"), "bad": sample_path("kernel_resume", "bad"),
        "good": sample_path("kernel_resume", "correct"), "tp2": sample_path("tp_unsync", "tp2"),
        "tp1": sample_path("tp_unsync", "tp1"), "rt": sample_path("renamed", "target"),
        "rb": sample_path("renamed", "baseline")}.items()}
    state = ("import json\n"
             "def state(ex):\n"
             "    node = str(ex._ds(ex.unmerged)['node'].sel(tensor=ex.tensor).values) if ex.tensor else None\n"
             "    print(json.dumps([ex.step, ex.rank, ex.tensor, node, ex.row, bool(ex.unmerged)]))\n")
    return [
        "import precnb\n" + state,
        f"nan = precnb.explore({p['nan']!r})\nnan",
        f"res = precnb.explore({p['bad']!r}, baseline={p['good']!r})\nres",
        f"tp = precnb.explore({p['tp2']!r}, baseline={p['tp1']!r}, target_layout='tp=2')\ntp",
        f"ren = precnb.explore({p['rt']!r}, baseline={p['rb']!r})\nren",
    ]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with jupyter_lab(tmp_path_factory, _cells(), "explorer.ipynb") as server:
        yield server


def _state(page, name: str) -> list:
    return json.loads(kernel_output(page, f"state({name})").strip().splitlines()[-1])


def _number(explorer, view: str, n: int = 1):
    """The cell number *n* ("1" = the earliest flagged record) drawn in a heat map (``heatmap`` / ``where``)."""
    return explorer.locator(f".precnb-{view} g.mark-text.role-mark text").filter(has_text=re.compile(rf"^{n}$")).first


class Clicks:
    """Clicks as a person makes them, each timed until the selection line shows its record."""

    def __init__(self, page, explorer, name: str) -> None:
        self.page, self.explorer, self.name = page, explorer, name
        self.path: list[str] = []
        self.latency_ms: list[float] = []

    def click(self, locator, what: str, expect_text: str | None = None) -> None:
        status = self.explorer.locator(".precnb-selection")
        before = status.inner_text()
        locator.scroll_into_view_if_needed()
        box = locator.bounding_box()  # a person clicks where the number is drawn (the cell beneath takes it)
        t = time.perf_counter()
        self.page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        self.page.wait_for_function("([el, old, text]) => el.innerText !== old && el.innerText.includes(text)",
                                    arg=[status.element_handle(), before, expect_text or ""], timeout=30_000)
        self.latency_ms.append(round((time.perf_counter() - t) * 1000, 1))
        self.path.append(what)
        wait_idle(self.page)


def _away(page, name: str) -> None:
    """Leave the origin first (a person who clicked around): the path below must bring it back."""
    kernel_output(page, f"{name}.select_cell(*{name}.frame.loc[{name}.frame['first_bad'] != 1]"
                  ".iloc[0][['row', 'col', 'group']].tolist())")
    wait_idle(page)


@pytest.fixture(scope="module")
def page(chromium, lab):
    page = open_notebook(chromium, lab["url"], viewport={"width": 1400, "height": 1600})
    yield page
    page.close()


@pytest.fixture(scope="module")
def latencies():
    out: dict[str, dict] = {}
    yield out
    OUT.mkdir(exist_ok=True)
    (OUT / "explorer_latency.json").write_text(json.dumps(out, indent=1))


def _explorer(page, i: int):
    from playwright.sync_api import expect

    ex = page.locator(".precnb-explorer").nth(i)
    ex.scroll_into_view_if_needed()
    expect(_number(ex, "heatmap")).to_be_visible(timeout=60_000)
    return ex


def test_layout_at_1400_px_and_nothing_printed_into_cells(page):
    """The maps on the left (the where view above the heat map), the selected record on the right (selection
    line above its line chart), nothing wider than the notebook; no cell printed to stderr (a warning, a
    progress bar)."""
    outputs = page.evaluate(f"() => {NB}.content.widgets.map(c => c.model.outputs ? c.model.outputs.toJSON() : [])")
    assert len(outputs) == len(_cells())
    assert not [o for cell in outputs for o in cell if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    assert not [o for cell in outputs for o in cell if o.get("output_type") == "error"]
    for i in range(4):
        ex = _explorer(page, i)

        def box(css, ex=ex):
            b = ex.locator(css).first.bounding_box()
            assert b and b["width"] > 0 and b["height"] > 0, css
            return b

        OUT.mkdir(exist_ok=True)
        ex.screenshot(path=str(OUT / f"explorer_1400_{i}.png"))
        where, heat, lines, sel, maps = (box(c) for c in (".precnb-where", ".precnb-heatmap", ".precnb-lines",
                                                          ".precnb-selection", ".precnb-maps"))
        assert where["y"] + where["height"] <= heat["y"] + 1, i  # the where view above the heat map
        assert sel["x"] >= maps["x"] + maps["width"] - 1 and sel["y"] < where["y"] + where["height"], i
        assert lines["x"] >= maps["x"] + maps["width"] - 1 and lines["y"] < heat["y"] + heat["height"], i
        assert sel["y"] + sel["height"] <= lines["y"] + 1, i  # the selection line above its chart
        assert ex.evaluate("el => el.scrollWidth <= el.clientWidth + 1"), i  # fits the notebook's width


@pytest.mark.parametrize(("i", "name", "sample"), [(0, "nan", "dp_nan"), (1, "res", "kernel_resume")])
def test_origin_in_at_most_three_clicks(page, latencies, i, name, sample):
    gt = _origin(sample)
    ex = _explorer(page, i)
    clicks = Clicks(page, ex, name)
    # each path starts away from the origin (a person who clicked around) and needs one click
    for view, what in (("heatmap", "heat map: the cell numbered 1"),
                       ("where", "where view (rank × step): the cell numbered 1")):
        _away(page, name)
        assert _state(page, name)[3] != gt["node"]
        clicks.click(_number(ex, view), what, f"step {gt['step']} · rank {gt['rank']}")
        step, rank, _tensor, node, _row, _unmerged = _state(page, name)
        assert (step, rank, node) == (gt["step"], gt["rank"], gt["node"]), view
    assert len(clicks.path) <= 3
    latencies[sample] = {"clicks": clicks.path, "latency_ms": clicks.latency_ms}
    OUT.mkdir(exist_ok=True)
    ex.screenshot(path=str(OUT / f"explorer_{sample}.png"))


def test_tp_origin_rank_in_the_where_view(page, latencies):
    gt = _origin("tp_unsync")
    ex = _explorer(page, 2)
    _away(page, "tp")
    clicks = Clicks(page, ex, "tp")  # two clicks: the op and step, then the rank
    # the merged comparison's earliest cell: the op, at the step (merged ranks)
    clicks.click(_number(ex, "heatmap"), "heat map: the cell numbered 1", gt["node"].split(".")[1])
    assert _state(page, "tp")[3] == gt["node"]
    # the rank × step view shows the dump's ranks: rank 1 departs from its replica
    clicks.click(_number(ex, "where"), "where view (the dump's ranks): the cell numbered 1",
                 f"step {gt['step']} · rank {gt['rank']}")
    step, rank, _t, node, _row, unmerged = _state(page, "tp")
    assert (step, rank, node, unmerged) == (gt["step"], gt["rank"], gt["node"], True)
    assert len(clicks.path) <= 3
    latencies["tp_unsync"] = {"clicks": clicks.path, "latency_ms": clicks.latency_ms}
    ex.screenshot(path=str(OUT / "explorer_tp_unsync.png"))


def test_keyboard_moves_the_selection(page, latencies):
    ex = _explorer(page, 0)
    _away(page, "nan")
    Clicks(page, ex, "nan").click(_number(ex, "heatmap"), "heat map 1", "Torch.sqrt")  # focuses the explorer
    before = _state(page, "nan")
    status = ex.locator(".precnb-selection")
    old = status.inner_text()
    t = time.perf_counter()
    page.keyboard.press("ArrowRight")
    page.wait_for_function("([el, old]) => el.innerText !== old", arg=[status.element_handle(), old],
                           timeout=30_000)
    latencies["keyboard ArrowRight"] = {"latency_ms": [round((time.perf_counter() - t) * 1000, 1)]}
    wait_idle(page)
    after = _state(page, "nan")
    assert after[0] == before[0] + 1 and after[4] == before[4]  # next step, same row


def test_match_and_save_mapping_round_trip_into_precnb_diff(page, lab, latencies, tmp_path):
    from playwright.sync_api import expect

    ex = _explorer(page, 3)
    ex.get_by_role("tab", name="Alignment").click()
    panel = ex.locator(".precnb-alignment")
    rects = panel.locator("g.mark-rect path")
    expect(rects.first).to_be_attached(timeout=30_000)
    labels = rects.evaluate_all("els => els.map(e => e.getAttribute('aria-label') || '')")

    def row(name: str) -> int:
        return next(i for i, s in enumerate(labels) if f"name: {name};" in s)

    t0 = time.perf_counter()
    rects.nth(row("model.layers.1.mlp")).click()
    expect(panel.locator(".precnb-align-status")).to_contain_text("baseline: model.layers.1.mlp")
    rects.nth(row("decoder.layers.1.mlp")).click()
    expect(panel.locator(".precnb-align-status")).to_contain_text("target: decoder.layers.1.mlp")
    status = panel.locator(".precnb-align-status").inner_text()
    assert "baseline: model.layers.1.mlp (" in status and "target: decoder.layers.1.mlp (" in status
    pick_ms = (time.perf_counter() - t0) * 1000
    t1 = time.perf_counter()
    panel.locator("button[title='Match']").click()
    expect(panel.locator(".precnb-align-output")).to_contain_text("first finding now", timeout=60_000)
    match_ms = (time.perf_counter() - t1) * 1000
    wait_idle(page)
    assert kernel_output(page, "print(next(p.how for p in ren.triage.alignment.modules "
                         "if p.target == 'decoder.layers.1.mlp'))").strip() == "user"
    path = lab["root"] / "renamed_mapping.json"
    box = panel.locator("input[type=text]").first
    box.fill(str(path))
    box.press("Enter")
    panel.locator("button[title='Save mapping']").click()
    expect(panel.locator(".precnb-align-output")).to_contain_text("written", timeout=30_000)
    latencies["alignment"] = {"pick two nodes (ms)": round(pick_ms, 1), "match + rerun (ms)": round(match_ms, 1)}
    panel.screenshot(path=str(OUT / "explorer_alignment.png"))  # the tab (the whole explorer is taller than the page)
    assert path.is_file()
    # the file round-trips: precnb diff / align --mapping read the pair as the user's, same first finding
    base, target = sample_path("renamed", "baseline"), sample_path("renamed", "target")
    run = [sys.executable, "-m", "precnb"]
    diff = subprocess.run([*run, "diff", str(base), str(target), "--mapping", str(path), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert diff.returncode == 0, diff.stderr
    finding = json.loads(diff.stdout)
    want = json.loads(kernel_output(page, "print(json.dumps([ren.triage.finding.step, ren.triage.finding.rank, "
                                    "ren.triage.finding.node]))").strip())
    assert [finding["step"], finding["rank"], finding["node"]] == want == [1, 0, "Functional.gelu.1.forward"]
    align = subprocess.run([*run, "align", str(base), str(target), "--mapping", str(path), "--json"],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert align.returncode == 0, align.stderr
    mods = {m["target"]: m for m in json.loads(align.stdout)["modules"]}
    assert mods["decoder.layers.1.mlp"]["baseline"] == "model.layers.1.mlp"
    assert mods["decoder.layers.1.mlp"]["how"] == "user"


def test_no_page_errors(page):
    assert not [e for e in page.errors if "precnb" in e or "vega" in e.lower() or "anywidget" in e.lower()], \
        page.errors
    shutil.copy(OUT / "explorer_dp_nan.png", OUT / "explorer.png") if (OUT / "explorer_dp_nan.png").exists() \
        else None
