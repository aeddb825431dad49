"""The report's layout at 1400 px in headless chromium: tables fit their cards, names stay short, vega is quiet.

For the NaN report and the comparison report: no console warning or error (vega's "Infinite extent
for field step" came from an empty chart layer), no table wider than its scroll box, tensor names
on at most three lines (they used to break at every dot), and the NaN finding's line chart is not a
flat line (it draws the node's input too).
"""

from __future__ import annotations

import pytest

from tests.conftest import sample_path

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    from precnb.report import write_html

    out = tmp_path_factory.mktemp("reports")
    nan = write_html(sample_path("dp_nan"), out / "nan.html")
    div = write_html(sample_path("divergence", "target"), out / "div.html",
                     baseline=sample_path("divergence", "baseline"))
    return {"nan": nan, "div": div}


@pytest.mark.parametrize("name", ["nan", "div"])
def test_report_fits_1400px_and_vega_is_quiet(chromium, reports, name):
    ctx = chromium.new_context(offline=True, viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    messages: list[str] = []
    page.on("console", lambda m: messages.append(f"{m.type}: {m.text}") if m.type in ("warning", "error") else None)
    page.goto(reports[name].as_uri())
    page.wait_for_selector(".vega-embed svg.marks", timeout=30_000)
    page.wait_for_timeout(1500)  # every chart embedded
    assert messages == []
    wide = page.evaluate("""() => Array.from(document.querySelectorAll('.tscroll')).filter(
        d => d.scrollWidth > d.clientWidth + 1).map(d => d.firstElementChild.className)""")
    assert wide == [], f"tables wider than their card: {wide}"
    lines = page.evaluate("""() => Array.from(document.querySelectorAll('table.detail td.name:not(.short)')).map(
        td => Math.round(td.getBoundingClientRect().height / parseFloat(getComputedStyle(td).lineHeight)))""")
    assert lines and max(lines) <= 3, lines
    ctx.close()
