"""Offline HTML in a real browser: the CLI report and every exported notebook template.

Headless Debian chromium (playwright-python, ``executable_path="/usr/bin/chromium"``; never
``playwright install``) opens each file over ``file://`` in an offline context where every
http(s) request is aborted and counted. For each page:

* every chart renders (``.vega-embed svg.marks`` / ``canvas``), and so does every widget view
  and static SVG output of a notebook;
* zero http(s) requests, zero failed requests of any kind, zero page errors, no dialogs;
* in the CLI report, clicking a heat-map cell changes the linked line chart (pure Vega-Lite
  parameters: no kernel), and shift-click adds a row;
* a run whose module / node names, stack frames and paths hold markup shows them as text.

Screenshots go to ``test-output/``. The template exports need the ``offline_lab`` nbconvert
template (``make offline-template``); without it those tests skip and say so.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import ROOT, sample_path

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

CHARTS = ".vega-embed svg.marks, .vega-embed canvas"
TEMPLATES = ["nan_origin", "divergence", "sharded_vs_single", "dp_grad_sync", "monitor_trends"]
OUT = ROOT / "test-output"


class Offline:
    """A page opened over file:// with the network blocked; everything it tried is recorded."""

    def __init__(self, browser, path: Path, *, width: int = 1400, height: int = 1000) -> None:
        self.fetched: list[str] = []
        self.failed: list[str] = []
        self.errors: list[str] = []
        self.console_errors: list[str] = []
        self.dialogs: list[str] = []
        self.ctx = browser.new_context(offline=True, viewport={"width": width, "height": height})
        self.ctx.route("http*://**/*", lambda route: (self.fetched.append(route.request.url), route.abort()))
        self.page = self.ctx.new_page()
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("requestfailed", lambda r: self.failed.append(r.url[:200]))
        self.page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.goto(path.as_uri())

    def assert_clean(self) -> None:
        assert self.fetched == [], f"http(s) requests: {self.fetched}"
        assert self.failed == [], f"failed requests: {self.failed}"
        assert self.errors == [], f"page errors: {self.errors}"
        assert self.console_errors == [], f"console errors: {self.console_errors}"
        assert self.dialogs == [], f"dialogs (script ran from data?): {self.dialogs}"

    def close(self) -> None:
        self.ctx.close()


def _save(shot: Path, name: str) -> None:
    OUT.mkdir(exist_ok=True)
    shutil.copy(shot, OUT / name)


def _wait_report_charts(page) -> int:
    n = page.locator("script[data-precnb-chart]").count()
    page.wait_for_function(f"document.querySelectorAll('.chart[data-rendered]').length === {n}", timeout=30_000)
    states = page.locator(".chart").evaluate_all("els => els.map(e => e.getAttribute('data-rendered'))")
    assert states == ["true"] * n, states
    assert page.locator(CHARTS).count() == n
    return n


def _line_labels(page) -> list[str]:
    """aria-labels of the line chart's points (legend symbols have none)."""
    return page.locator("#chart-linked g.mark-symbol path[aria-label]").evaluate_all(
        "els => els.map(e => e.getAttribute('aria-label')).filter(s => s.startsWith('step:'))")


# -- the CLI report --------------------------------------------------------------------------------


def test_cli_report_renders_offline_and_its_heat_map_drives_the_line_chart(chromium, tmp_path):
    from precnb.cli import main

    report = tmp_path / "report.html"
    assert main(["report", str(sample_path("dp_nan")), "-o", str(report)]) == 0
    t0 = time.time()
    view = Offline(chromium, report, height=1200)
    page = view.page
    try:
        assert _wait_report_charts(page) == 3
        cell_signal = "window.precnbViews['chart-linked'].signal('cell')"
        assert page.evaluate(cell_signal)["row"] == ["blocks.1.attn"]  # opens on the NaN origin's module
        before_labels = _line_labels(page)
        before_svg = page.locator("#chart-linked").inner_html()
        assert before_labels and all("row: blocks.1.attn;" in s for s in before_labels)
        page.locator("#figure-linked").screenshot(path=str(tmp_path / "linked_before.png"))

        # click a cell of another module: the line chart now plots that module, in the browser only
        cells = page.locator("#chart-linked g.mark-rect path")
        labels = cells.evaluate_all("els => els.map(e => e.getAttribute('aria-label') || '')")
        pick = next(i for i, s in enumerate(labels) if "row: embed;" in s and "step: 0;" in s)
        cells.nth(pick).click()
        page.wait_for_function(
            "() => { const l = [...document.querySelectorAll('#chart-linked g.mark-symbol path')]"
            ".map(e => e.getAttribute('aria-label') || '').filter(s => s.startsWith('step:')); "
            "return l.length && l.every(s => s.includes('row: embed;')); }",
            timeout=10_000)
        after_labels = _line_labels(page)
        assert after_labels != before_labels
        assert page.locator("#chart-linked").inner_html() != before_svg
        assert page.evaluate(cell_signal)["row"] == ["embed"]
        page.locator("#figure-linked").screenshot(path=str(tmp_path / "linked_after.png"))

        # shift-click adds a second module to the line chart
        pick2 = next(i for i, s in enumerate(labels) if "row: lm_head;" in s and "step: 1;" in s)
        cells.nth(pick2).click(modifiers=["Shift"])
        page.wait_for_function(
            "() => { const l = [...document.querySelectorAll('#chart-linked g.mark-symbol path')]"
            ".map(e => e.getAttribute('aria-label') || ''); "
            "return l.some(s => s.includes('row: lm_head;')) && l.some(s => s.includes('row: embed;')); }",
            timeout=10_000)
        assert sorted(page.evaluate(cell_signal)["row"]) == ["embed", "lm_head"]

        # the finding is readable as text; links stay inside the page
        assert page.locator("article.finding code.where-node").first.inner_text() == "Torch.sqrt.0.forward"
        hrefs = page.locator("a[href]").evaluate_all("els => els.map(e => e.getAttribute('href'))")
        assert hrefs and all(h.startswith("#") for h in hrefs)
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        view.assert_clean()
    finally:
        view.close()
    _save(tmp_path / "report.png", "report_cli.png")
    _save(tmp_path / "linked_before.png", "report_linked_before.png")
    _save(tmp_path / "linked_after.png", "report_linked_after_click.png")
    assert time.time() - t0 < 60


def test_comparison_report_renders_offline(chromium, tmp_path):
    from precnb.cli import main

    report = tmp_path / "diff.html"
    assert main(["report", str(sample_path("dp_sum", "target")), "--baseline", str(sample_path("dp_sum", "baseline")),
                 "--layout", "dp=2", "-o", str(report)]) == 0
    view = Offline(chromium, report)
    try:
        assert _wait_report_charts(view.page) == 3
        assert "summed, not averaged" in view.page.locator("article.finding").first.inner_text()
        view.page.screenshot(path=str(tmp_path / "diff.png"), full_page=True)
        view.assert_clean()
    finally:
        view.close()
    _save(tmp_path / "diff.png", "report_dp_sum.png")


def test_hostile_names_render_as_text(chromium, tmp_path):
    import warnings

    import precnb
    from precnb.report import write_html
    from tests.test_report import HOSTILE, HOSTILE_NODE, hostile_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = hostile_run(precnb.open_run(sample_path("dp_nan"), progress=False))
    report = write_html(ds, tmp_path / "hostile.html")
    view = Offline(chromium, report)
    page = view.page
    try:
        _wait_report_charts(page)
        assert page.locator("code.where-module").first.inner_text() == f"blocks.1.attn{HOSTILE}"
        assert page.locator("code.where-node").first.inner_text() == HOSTILE_NODE
        assert page.get_by_text("</script><script>alert(3)</script>", exact=False).count() >= 1
        assert page.evaluate("document.querySelectorAll('img, iframe, [onerror], [onload]').length") == 0
        page.locator("#chart-linked").hover()  # tooltips are escaped by vega-tooltip
        view.assert_clean()
    finally:
        view.close()


def test_line_separators_in_names_do_not_break_charts(chromium, tmp_path):
    """U+2028 / U+2029 in module, node and tensor names: all three charts draw (Vega's parser)."""
    from precnb.report import write_html
    from tests.test_hostile_strings import hostile_run

    ds, _ = hostile_run()
    report = write_html(ds, tmp_path / "separators.html")
    view = Offline(chromium, report)
    try:
        assert _wait_report_charts(view.page) == 3
        assert view.page.locator(".chart-error").count() == 0
        view.assert_clean()
    finally:
        view.close()


# -- exported notebook templates -------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory, executed_templates):
    """Every template executed on the bundled samples (once per session, conftest) and exported offline."""
    nbformat = pytest.importorskip("nbformat")
    from precnb.report import notebooks

    sample_path()
    tdir = notebooks.offline_template_dir()
    if tdir is None:
        pytest.skip("the offline_lab nbconvert template is not built: run `make offline-template` (it needs npm) "
                    "(or set PRECNB_NBTEMPLATES / OFFLINE_TEMPLATE_DIR to the folder holding offline_lab/)")
    root = tmp_path_factory.mktemp("templates")

    def run(name: str) -> tuple[str, Path, dict]:
        nb_path, _folder, error = executed_templates[name]
        if error is not None:
            raise error
        nb = nbformat.read(nb_path, as_version=4)
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
        models = state.get("state", {}).values()
        expected = {
            "views": sum("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs),
            "svg": sum("image/svg+xml" in o.get("data", {}) for o in outputs),
            "vega": sum(1 for m in models if m.get("model_name") == "AnyModel" and m.get("state", {}).get("spec")),
        }
        return name, notebooks.export_html(nb, root / f"{name}.html", template_dir=tdir), expected

    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(run, TEMPLATES))
    return {name: (path, expected) for name, path, expected in done}


@pytest.mark.parametrize("name", TEMPLATES)
def test_exported_template_renders_offline(chromium, exported, name, tmp_path):
    path, expected = exported[name]
    assert expected["views"] >= 1 and expected["svg"] >= 1 and expected["vega"] >= 1, expected
    view = Offline(chromium, path)
    page = view.page
    try:
        page.wait_for_function(
            f"() => document.querySelectorAll('{CHARTS}').length >= {expected['vega']}"
            f" && document.querySelectorAll('.widget-subarea').length >= {expected['views']}",
            timeout=45_000)
        page.wait_for_timeout(500)  # let late renders land before counting
        assert page.locator(".vega-embed").count() == expected["vega"]
        assert page.locator(CHARTS).count() == expected["vega"]  # every JupyterChart drew its marks
        assert page.locator(".widget-subarea").count() == expected["views"]
        assert page.locator(".jp-RenderedSVG svg, .jp-RenderedSVG img").count() == expected["svg"]
        explorer = page.locator(".precnb-explorer").first
        assert explorer.is_visible()
        assert explorer.locator(".precnb-heatmap g.mark-rect path").count() > 0
        body = page.locator("body").inner_text()
        for bad in ("Error loading script", "Failed to initialize", "Traceback (most recent call last)"):
            assert bad not in body, bad
        page.screenshot(path=str(tmp_path / "shot.png"), full_page=True)
        view.assert_clean()
    finally:
        view.close()
    _save(tmp_path / "shot.png", f"template_{name}.png")
    (OUT / f"template_{name}.json").write_text(json.dumps({"expected": expected, "html_bytes": path.stat().st_size}))
