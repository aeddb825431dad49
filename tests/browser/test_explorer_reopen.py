"""Issue 26: a saved notebook with explorers reopens cleanly in JupyterLab.

Two explorers are run with JupyterLab's "save widget state" on, the notebook is saved, and a new page
opens it again (the kernel still running, as when a user comes back to a tab): no "Error displaying
widget: model not found" in an output, no ``[anywidget] Failed to initialize model`` page error, and
the charts draw again. (Each chart's JavaScript, vl-convert's 0.9 MB bundle, is compiled once per
page: :class:`precnb.widgets.charts.OfflineChart`.)
"""

from __future__ import annotations

import pytest

from tests.browser.conftest import NB, jupyter_lab, open_notebook, wait_idle
from tests.conftest import sample_path

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SAVE_STATE = {"@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": True}}


def _bad(errors: list[str]) -> list[str]:
    return [e for e in errors if "anywidget" in e.lower() or "model not found" in e.lower()]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    cells = ["import precnb", f"a = precnb.explore({str(sample_path('dp_nan'))!r})\na",
             f"b = precnb.explore({str(sample_path('rank_shift'))!r})\nb"]
    with jupyter_lab(tmp_path_factory, cells, "reopen.ipynb", settings=SAVE_STATE) as server:
        yield server


def test_a_saved_notebook_reopens_without_page_errors(chromium, lab):
    from playwright.sync_api import expect

    page = open_notebook(chromium, lab["url"], viewport={"width": 1600, "height": 1000})
    try:
        expect(page.locator(".precnb-explorer .precnb-heatmap svg").first).to_be_visible(timeout=60_000)
        assert not _bad(page.errors), page.errors
        page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function(f"!{NB}.context.model.dirty", timeout=30_000)
        wait_idle(page)
    finally:
        page.close()
    again = open_notebook(chromium, lab["url"], viewport={"width": 1600, "height": 1000}, run=False)
    try:
        expect(again.locator(".precnb-explorer .precnb-heatmap svg").first).to_be_visible(timeout=60_000)
        # every chart draws again: 2 explorers x (heat map, rank x step view, line chart)
        again.wait_for_function("document.querySelectorAll('.precnb-explorer .vega-embed svg.marks').length >= 6",
                                timeout=60_000)
        again.wait_for_timeout(3000)  # every saved output has rendered (or failed to)
        texts = again.locator(".jp-OutputArea-output").all_inner_texts()
        assert not [t for t in texts if "Error displaying widget" in t], [t[:200] for t in texts]
        assert not _bad(again.errors), again.errors
    finally:
        again.close()
