"""Issue 51 item 2: the cause is on the explorer's first screen, in real JupyterLab.

For each incident whose finding has a cause — a NaN from sqrt of a negative (``dp_nan``), a scalar argument
(``alpha``) set differently on one rank (megatron ``tp2pp2_scaled`` vs ``tp1pp1``), 0/0 of an expert with no
tokens (``moe_empty_expert``) — the finding bar's cause line is within the first 1000 px of the explorer, at a
notebook 1000 and 1600 px wide. Screenshots of the first screen go to ``build/screenshots/``.
"""

from __future__ import annotations

import json

import pytest

from tests.browser.conftest import NO_WINDOWING, explore_cells, jupyter_lab, kernel_output, open_notebook
from tests.conftest import ROOT

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SHOTS = ROOT / "build" / "screenshots"
INCIDENTS = [("dp_nan", "dp_nan", None), ("tp2pp2_scaled", "megatron/tp2pp2_scaled", "megatron/tp1pp1"),
             ("moe_empty_expert", "moe_empty_expert", None)]


def _cells() -> list[str]:
    return explore_cells("import json, precnb\n"
                         "def cause(ex):\n"
                         "    f = ex.current_finding\n"
                         "    print(json.dumps([c.strip() for c in f.summary().splitlines()\n"
                         "                      if c.strip().startswith('cause')]))\n", INCIDENTS)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with jupyter_lab(tmp_path_factory, _cells(), "first_screen.ipynb", settings=NO_WINDOWING) as server:
        yield server


@pytest.mark.parametrize("width", [1000, 1600])
def test_the_cause_is_in_the_first_1000_px_of_every_explorer(chromium, lab, width):
    from playwright.sync_api import expect

    page = open_notebook(chromium, lab["url"], viewport={"width": width, "height": 1000})
    try:
        SHOTS.mkdir(parents=True, exist_ok=True)
        for i, (name, *_rest) in enumerate(INCIDENTS):
            causes = json.loads(kernel_output(page, f"cause(ex{i})").strip().splitlines()[-1])
            assert causes, name
            ex = page.locator(".precnb-explorer").nth(i)
            expect(ex.locator(".precnb-heatmap svg").first).to_be_visible(timeout=60_000)
            page.evaluate("el => el.scrollIntoView({block: 'start'})", ex.element_handle())
            why = ex.locator(".precnb-finding-why")
            assert causes[0] in " ".join(why.inner_text().split()), (name, why.inner_text(), causes)
            top, box = ex.bounding_box(), why.bounding_box()
            assert box is not None and box["height"] > 0 and box["y"] + box["height"] - top["y"] <= 1000, \
                (name, width, top, box)
            page.screenshot(path=str(SHOTS / f"first_screen_{name}_{width}.png"))
    finally:
        page.close()
