"""Issue 26: each bundled incident opened in real JupyterLab shows its origin's own module, shape and stack.

One notebook opens every bundled incident whose dumps carry construct.json and stack.json (the
monitor and MindSpore kernel samples have neither). For each, the test reads what the page shows
for the record the explorer opened on — the selection line's module and shape, the first frame of
the detail's stack — and checks it against *that* rank's own construct.json, dump.json and
stack.json (not rank 0's: ``rank_shift``'s label names another op on rank 0). It also checks the
layout at 1600 px: the maps on the left, the selected record (its line chart and detail table)
beside them, the origin's cell, its chart and its table row on one screen, nothing wider than the
notebook; and that a saved notebook reopens without page errors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.browser.conftest import NO_WINDOWING, explore_cells, jupyter_lab, kernel_output, open_notebook
from tests.conftest import ROOT, sample_path

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

OUT = ROOT / "test-output"
# name, target, baseline (relative to data_samples/), options
INCIDENTS = [
    ("dp_nan", "dp_nan", None, {}),
    ("rank_shift", "rank_shift", None, {}),
    ("custom_op_gap", "custom_op_gap", None, {}),
    ("custom_op_registered", "custom_op_registered", None, {}),
    ("moe_empty_expert", "moe_empty_expert", None, {}),
    ("drift", "drift/dump", None, {}),
    ("divergence", "divergence/target", "divergence/baseline", {}),
    ("dp_sum", "dp_sum/target", "dp_sum/baseline", {}),
    ("tp_unsync", "tp_unsync/tp2", "tp_unsync/tp1", {"target_layout": "tp=2"}),
    ("tp_noise", "tp_noise/tp2", "tp_noise/tp1", {"target_layout": "tp=2"}),
    ("renamed", "renamed/target", "renamed/baseline", {}),
    ("xfw", "xfw/ms_bug", "xfw/pt", {}),
    ("tensor_bug", "tensor_bug/target", "tensor_bug/baseline", {}),
]


def _cells() -> list[str]:
    head = ("import json, precnb\n"
            "def state(ex):\n"
            "    ds = ex._ds(ex.unmerged)\n"
            "    node = str(ds['node'].sel(tensor=ex.tensor).values) if ex.tensor in ds.indexes['tensor'] else None\n"
            "    owner = ex.record._owner(ex, ds) is not ds\n"
            "    print(json.dumps([ex.step, ex.rank, ex.tensor, node, bool(ex.unmerged), owner]))\n")
    return explore_cells(head, INCIDENTS)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with jupyter_lab(tmp_path_factory, _cells(), "incidents.ipynb", settings=NO_WINDOWING) as server:
        yield server


@pytest.fixture(scope="module")
def page(chromium, lab):
    page = open_notebook(chromium, lab["url"], viewport={"width": 1600, "height": 1000})
    yield page
    page.close()


# -- what the files say -------------------------------------------------------------------------------
def _rank_dir(root: Path, step: int, rank: int) -> Path:
    sdir = root / f"step{step}"
    named = sdir / f"rank{rank}"
    if named.is_dir():
        return named
    dirs = sorted(p for p in sdir.iterdir() if p.is_dir())
    assert len(dirs) == 1 and rank == 0, (root, step, rank, dirs)
    return dirs[0]


def _leaves(node: str, record: dict) -> dict[str, dict]:
    """Tensor label → leaf of one dump.json record (msprobe's compare naming)."""
    out: dict[str, dict] = {}

    def walk(prefix: str, obj) -> None:
        if isinstance(obj, dict) and isinstance(obj.get("type"), str):
            out[prefix] = obj
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(obj, list):
            for k, v in enumerate(obj):
                walk(f"{prefix}.{k}", v)

    if ".parameters_grad" in node:
        for param, v in record.items():
            walk(f"{node}.{param}", v[0] if isinstance(v, list) and len(v) == 1 else v)
        return out
    for key, v in record.items():
        name = {"input_args": "input", "input_kwargs": "input", "input": "input", "output": "output",
                "parameters": "parameters"}.get(key)
        if name is not None:
            walk(f"{node}.{name}", v)
    return out


def _frames(stack: dict, node: str) -> list[str]:
    if "0" in stack:  # the grouped format: id -> [[nodes], [frames]]
        return next((list(frames) for nodes, frames in stack.values() if node in nodes), [])
    return list(stack.get(node, []))


def _module_of(node: str, construct: dict) -> str:
    from precnb.analysis.causal.dataflow import module_of_node

    own = module_of_node(node)
    if own:
        return own
    parent = construct.get(node)
    if isinstance(parent, list):
        parent = parent[0]
    return module_of_node(parent) if parent else ""


def _expected(root: Path, step: int, rank: int, node: str, tensor: str) -> dict[str, str]:
    d = _rank_dir(root, step, rank)
    record = json.loads((d / "dump.json").read_text())["data"][node]
    leaf = _leaves(node, record)[tensor.removesuffix(" (baseline)")]
    construct = json.loads((d / "construct.json").read_text())
    frames = _frames(json.loads((d / "stack.json").read_text()), node)
    return {"module": _module_of(node, construct) or "—", "shape": json.dumps(leaf["shape"]),
            "frame": frames[0] if frames else ""}


def _shown(ex) -> dict[str, str]:
    status = " ".join(ex.locator(".precnb-selection").inner_text().split())
    module = re.search(r"module (\S+) · shape (.+?)(?: this label| \(hidden|$)", status)
    assert module, status
    items = ex.locator(".precnb-detail-panel .precnb-stack li")
    if not items.count():  # no frame for this node in that rank's stack.json
        assert "stack: not recorded" in ex.locator(".precnb-detail-panel").inner_text(), status
        return {"module": module.group(1), "shape": module.group(2).strip(), "loc": "", "code": ""}
    first = items.first
    loc = " ".join(first.locator(".loc").inner_text().split())
    code = " ".join(first.locator("code").inner_text().split())
    return {"module": module.group(1), "shape": module.group(2).strip(), "loc": loc, "code": code}


@pytest.mark.parametrize("i", range(len(INCIDENTS)), ids=[n for n, *_ in INCIDENTS])
def test_origin_module_shape_and_stack_are_that_ranks_own(page, i):
    from playwright.sync_api import expect

    from precnb.analysis.findings.evidence import parse_frame

    name, target, base, _opts = INCIDENTS[i]
    ex = page.locator(".precnb-explorer").nth(i)
    ex.scroll_into_view_if_needed()
    expect(ex.locator(".precnb-detail-panel table").first).to_be_visible(timeout=60_000)
    step, rank, tensor, node, unmerged, in_baseline = json.loads(
        kernel_output(page, f"state(ex{i})").strip().splitlines()[-1])
    # a replica copy that departs (tp_unsync, tp_noise) is shown as dumped, on its own rank (issue 51)
    assert node and (not unmerged or name in ("tp_unsync", "tp_noise")), (name, tensor)
    root = sample_path(base if in_baseline else target)
    want = _expected(root, step, rank, node, tensor)
    got = _shown(ex)
    assert (got["module"], got["shape"]) == (want["module"], want["shape"]), (name, step, rank, tensor)
    if not want["frame"]:  # that rank's stack.json has no frame for the node: the page says so
        assert (got["loc"], got["code"]) == ("", ""), (name, got)
    else:
        frame = parse_frame(want["frame"])
        assert got["loc"] == f"{frame['file']}:{frame['line']} in {frame['func']}" and got["code"] == frame["code"], \
            (name, got, frame)
    OUT.mkdir(exist_ok=True)
    ex.screenshot(path=str(OUT / f"origin_{name}.png"))


def test_rank_shift_shows_rank_1s_op_not_rank_0s(page):
    from playwright.sync_api import expect

    i = next(k for k, (n, *_r) in enumerate(INCIDENTS) if n == "rank_shift")
    ex = page.locator(".precnb-explorer").nth(i)
    ex.scroll_into_view_if_needed()
    expect(ex.locator(".precnb-detail-panel table").first).to_be_visible(timeout=60_000)
    got = _shown(ex)
    assert (got["module"], got["shape"]) == ("blocks.0.attn", "[2, 2, 8, 8]")
    assert "scores = scores + torch.sqrt(poison)" in got["code"]
    assert "names another op on rank 0" in ex.locator(".precnb-selection").inner_text()


def test_layout_at_1600_px_origin_chart_and_record_on_one_screen(page):
    """The maps on the left, the record beside them; the origin's numbered cell, its chart and its detail row
    fit one 1600 x 1000 screen; nothing wider than the notebook; the suspects are not clipped."""
    for i, (name, *_rest) in enumerate(INCIDENTS):
        ex = page.locator(".precnb-explorer").nth(i)
        grid = ex.locator(".precnb-grid").first
        grid.scroll_into_view_if_needed()
        page.evaluate("el => el.scrollIntoView({block: 'start'})", grid.element_handle())

        def box(css, ex=ex, name=name):
            b = ex.locator(css).first.bounding_box()
            assert b and b["width"] > 0 and b["height"] > 0, (name, css)
            return b

        maps, side = box(".precnb-maps"), box(".precnb-record")
        assert side["x"] >= maps["x"] + maps["width"] - 1 and side["y"] < maps["y"] + maps["height"], name
        assert ex.evaluate("el => el.scrollWidth <= el.clientWidth + 1"), name  # fits the notebook's width
        one = ex.locator(".precnb-heatmap g.mark-text.role-mark text").filter(has_text=re.compile(r"^1$")).first
        cell, lines, row = one.bounding_box(), box(".precnb-lines"), box(".precnb-detail-panel tr.focus")
        for what, b in (("origin cell", cell), ("line chart", lines), ("detail row", row)):
            if not (b is not None and b["y"] >= 0 and b["y"] + min(b["height"], 40) <= 1000):
                page.screenshot(path=str(OUT / f"layout_{name}.png"))
                raise AssertionError((name, what, b))
        for s in ex.locator(".precnb-suspect").all():  # the whole text shows (wrapped, not cut)
            assert s.evaluate("el => el.scrollWidth <= el.clientWidth + 1"), (name, s.inner_text())
    page.screenshot(path=str(OUT / "explorer_1600.png"))
