"""Issue 51 item 3: a notebook saved without widget state reopens with a readable static explorer.

JupyterLab's default (no "save widget state"): an explorer is run, the notebook saved, the kernel shut down,
and the notebook opened again in a new page (a new kernel, no widget model). Each explorer shows its static
view — the finding (what, where, why), the selected record, its line chart as SVG, its detail table — and no
"Error displaying widget: model not found". While the explorer is live the static view is hidden; running the
cell again brings the live explorer back (and hides the static view again).
"""

from __future__ import annotations

import pytest

from tests.browser.conftest import NB, jupyter_lab, open_notebook, wait_idle
from tests.conftest import ROOT, sample_path

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SHOTS = ROOT / "build" / "screenshots"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    cells = ["import precnb", f"a = precnb.explore({str(sample_path('dp_nan'))!r})\na",
             f"b = precnb.explore({str(sample_path('moe_empty_expert'))!r})\nb"]
    with jupyter_lab(tmp_path_factory, cells, "static.ipynb") as server:
        yield server


def _visible_errors(page) -> list[str]:
    return [t.inner_text() for t in page.locator(".jp-OutputArea-output", has_text="Error displaying widget").all()
            if t.is_visible()]


def test_a_reopened_notebook_without_its_kernel_shows_the_static_explorer(chromium, lab):
    from playwright.sync_api import expect

    page = open_notebook(chromium, lab["url"], viewport={"width": 1600, "height": 1000})
    try:
        live = page.locator(".precnb-explorer")
        expect(live.nth(1).locator(".precnb-heatmap svg").first).to_be_visible(timeout=60_000)
        titles = [" ".join(t.split()) for t in live.locator(".precnb-finding-title").all_inner_texts()]
        assert len(titles) == 2 and all("step 1, rank 1" in t for t in titles), titles
        assert page.locator(".precnb-static").count() == 2
        assert not any(s.is_visible() for s in page.locator(".precnb-static").all())  # hidden while live
        page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function(f"!{NB}.context.model.dirty", timeout=30_000)
        wait_idle(page)
        page.evaluate(f"{NB}.sessionContext.shutdown()")
        page.wait_for_function(f"!{NB}.sessionContext.session", timeout=30_000)
    finally:
        page.close()
    again = open_notebook(chromium, lab["url"], viewport={"width": 1600, "height": 1000}, run=False)
    try:
        static = again.locator(".precnb-static")
        expect(static.nth(1)).to_be_visible(timeout=60_000)
        again.wait_for_timeout(3000)  # every saved output has rendered (or failed to)
        SHOTS.mkdir(parents=True, exist_ok=True)
        again.screenshot(path=str(SHOTS / "static_reopened_1600.png"))
        assert again.locator(".precnb-explorer").count() == 0
        assert not _visible_errors(again), _visible_errors(again)
        texts = [" ".join(t.split()) for t in static.all_inner_texts()]
        assert titles[0] in texts[0] and "sqrt of negative values" in texts[0], texts[0][:500]
        assert titles[1] in texts[1] and "expert that received no tokens" in texts[1], texts[1][:500]
        for s in static.all():
            sel = " ".join(s.locator(".precnb-static-selection").inner_text().split())
            assert "step 1 · rank 1" in sel and "node" in sel, sel
            expect(s.locator(".precnb-static-chart svg").first).to_be_visible()
            expect(s.locator(".precnb-static-detail tr.focus").first).to_be_visible()
        # the cell run again: the live explorer is back, its static view hidden
        again.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        expect(again.locator(".precnb-explorer").nth(1).locator(".precnb-heatmap svg").first).to_be_visible(
            timeout=120_000)
        wait_idle(again)
        assert not any(s.is_visible() for s in again.locator(".precnb-static").all())
        assert not _visible_errors(again)
    finally:
        again.close()
