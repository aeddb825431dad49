"""Issue 51 items 5-7 in real JupyterLab: the origin's chart follows its op, Unmatch, heat-map numbering, texts.

5. ``rank_shift`` (rank 1 runs one ``sqrt`` more, so ``Torch.sqrt.0`` names another op on rank 0; here rank 0's
   record of that op at step 0 is also dropped): the chart plots rank 0's own ``Torch.sqrt.1`` and says that rank 0
   has no such op at step 0.
6. ``xfw`` (MindSpore vs PyTorch, an ``add`` with another ``eps``): Unmatch of the origin call reruns the triage,
   the finding bar no longer gives the cause of a comparison that no longer exists, and the call is "unpaired"
   (orange), not "(glue)".
7. In each heat map the top-most numbered cell is on a module's row (not "(none)") unless it is cell 1; cell 1 is
   the one dark cell; the search box's placeholder and the "replace a precnb ..." boxes are not cut off.
"""

from __future__ import annotations

import json

import pytest

from tests.browser.conftest import NO_WINDOWING, jupyter_lab, kernel_output, open_notebook
from tests.conftest import sample_path

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SHIFT = "Torch.sqrt.0.forward.output.0"  # rank 1's NaN op; rank 0's Torch.sqrt.0 is another op
HEAT = ["dp_nan", "drift", "custom_op_gap", "moe_empty_expert"]  # explorers ex2.. for item 7


def _cells() -> list[str]:
    return [
        "import json, precnb, numpy as np\n"
        f"ds = precnb.open_run({str(sample_path('rank_shift'))!r})\n"
        "j = ds.indexes['tensor'].get_loc('Torch.sqrt.1.forward.output.0')\n"
        "p = ds['present'].values.copy(); p[0, 0, j] = False  # rank 0's record of the op at step 0: gone\n"
        "shifted = ds.assign(present=(ds['present'].dims, p))\n",
        "ex0 = precnb.explore(shifted)\nex0",
        f"ex1 = precnb.explore({str(sample_path('xfw', 'ms_bug'))!r}, baseline={str(sample_path('xfw', 'pt'))!r})\n"
        "ex1",
        *[f"ex{i + 2} = precnb.explore({str(sample_path(n, 'dump') if n == 'drift' else sample_path(n))!r})\n"
          f"ex{i + 2}" for i, n in enumerate(HEAT)],
    ]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with jupyter_lab(tmp_path_factory, _cells(), "origin_op_unmatch.ipynb", settings=NO_WINDOWING) as server:
        yield server


@pytest.fixture(scope="module")
def page(chromium, lab):
    page = open_notebook(chromium, lab["url"], viewport={"width": 1600, "height": 1000})
    yield page
    page.close()


def _kernel_json(page, code: str):
    return json.loads(kernel_output(page, code).strip().splitlines()[-1])


def test_origin_chart_follows_the_op_not_its_label(page):
    """Rank 0's line is its own Torch.sqrt.1 (the same module, parent and shape as rank 1's Torch.sqrt.0),
    drawn only where rank 0 has that op; the caption says so and says where it does not exist."""
    from playwright.sync_api import expect

    ex = page.locator(".precnb-explorer").nth(0)
    expect(ex.locator(".precnb-lines svg").first).to_be_visible(timeout=60_000)
    state = _kernel_json(page, "s = ex0.series\n"
                               "pts = sorted((int(r), int(st), t, float(v)) for r, st, t, v in "
                               "zip(s['rank'], s['step'], s['tensor'], s['value']))\n"
                               "own = float(ds['norm'].sel(step=1, rank=0, tensor='Torch.sqrt.1.forward.output.0'))\n"
                               "print(json.dumps([ex0.step, ex0.rank, ex0.tensor, pts, own]))")
    step, rank, tensor, pts, own = state
    assert (step, rank, tensor) == (1, 1, SHIFT)
    rank0 = [p for p in pts if p[0] == 0]
    assert [(p[1], p[2]) for p in rank0] == [(1, "Torch.sqrt.1.forward.output.0")], pts  # step 0: no such op
    assert rank0[0][3] == pytest.approx(own)
    assert {(p[1], p[2]) for p in pts if p[0] == 1} == {(0, SHIFT), (1, SHIFT)}, pts
    caption = " ".join(ex.locator(".precnb-lines").inner_text().split())
    assert "on rank 0 it is Torch.sqrt.1.forward.output.0" in caption, caption
    assert "rank 0 has no such op at step 0" in caption, caption


def test_unmatch_of_the_origin_call_updates_the_finding(page):
    """Unmatch the origin call: the finding bar no longer says it ran with another scalar than PyTorch's (it has no
    PyTorch counterpart now), and both trees show the call as unpaired, not glue."""
    from playwright.sync_api import expect

    ex = page.locator(".precnb-explorer").nth(1)
    expect(ex.locator(".precnb-finding-why")).to_contain_text("scalar argument", timeout=60_000)
    node = _kernel_json(page, "print(json.dumps(ex1.current_finding.node))")
    assert node == "Tensor.__add__.6.forward"
    kernel_output(page, "al = ex1.panel('Alignment')\n"
                        "ex1.tabs.selected_index = ex1.panels.index(al)\n"
                        "al.level.value = 'calls'\n"
                        f"al.pick(right={node!r})\n"
                        "al.do_unmatch()")
    panel = ex.locator(".precnb-alignment")
    expect(panel.locator(".precnb-align-output")).to_contain_text("first finding now", timeout=60_000)
    why = ex.locator(".precnb-finding-why")
    expect(why).not_to_contain_text("scalar argument", timeout=30_000)
    reason = _kernel_json(page, "f = ex1.current_finding\n"
                                "print(json.dumps([f.node, f.reason, [c.get('cause') for c in f.causes], "
                                "ex1.triage.alignment.user_unpaired]))")
    assert reason[3] == [node] and "scalar_argument" not in reason[2], reason
    assert "runs in target but not in baseline" in reason[1], reason
    assert "runs in target but not in baseline" in panel.locator(".precnb-align-output").inner_text()
    status = " ".join(panel.locator(".precnb-align-status").inner_text().split())
    assert "(unpaired: unmatched by hand)" in status and "glue" not in status, status
    # the tree draws the call's label in the unpaired colour (orange), on both sides
    fills = panel.locator("svg g.mark-text text").evaluate_all(
        f"ts => ts.filter(t => t.textContent === {node!r}).map(t => t.getAttribute('fill'))")
    assert fills and all(f == "#a05a00" for f in fills), fills


def _numbered(ex) -> list[dict]:
    """The main heat map's numbered cells (1-3) top to bottom, each with the row label level with it."""
    return ex.locator(".precnb-heatmap svg").first.evaluate("""svg => {
      const labels = [...svg.querySelectorAll('g.role-axis-label text')].map(t => {
        const b = t.getBoundingClientRect(); return {text: t.textContent, y: b.top + b.height / 2}; });
      return [...svg.querySelectorAll('g.mark-text.role-mark text')].map(t => {
        const b = t.getBoundingClientRect(); const y = b.top + b.height / 2;
        let best = null;
        for (const l of labels) if (!best || Math.abs(l.y - y) < Math.abs(best.y - y)) best = l;
        return {n: t.textContent.trim(), y, row: best && Math.abs(best.y - y) < 8 ? best.text : null}; })
        .sort((a, b) => a.y - b.y);
    }""")


@pytest.mark.parametrize("i", range(len(HEAT)), ids=HEAT)
def test_first_numbered_cell_is_never_on_a_none_row_unless_it_is_cell_1(page, i):
    from playwright.sync_api import expect

    ex = page.locator(".precnb-explorer").nth(i + 2)
    expect(ex.locator(".precnb-heatmap svg").first).to_be_visible(timeout=60_000)
    ex.scroll_into_view_if_needed()
    cells = _numbered(ex)
    assert cells and any(c["n"] == "1" for c in cells), (HEAT[i], cells)
    top = cells[0]
    assert top["row"] is not None, (HEAT[i], cells)
    assert top["n"] == "1" or top["row"] != "(none)", (HEAT[i], cells)


def _luminance(color: str) -> float:
    c = color.strip()
    if c.startswith("#") and len(c) == 7:
        r, g, b = (int(c[k:k + 2], 16) / 255 for k in (1, 3, 5))
    else:  # rgb(r, g, b)
        r, g, b = (int(x) / 255 for x in c[c.index("(") + 1:c.index(")")].split(",")[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@pytest.mark.parametrize("i", [0, 3], ids=["dp_nan", "moe_empty_expert"])
def test_the_origin_is_the_one_dark_cell(page, i):
    """Cell 1 is dark; every other flagged cell is pale (dp_nan: every forward row downstream of the NaN is
    flagged, and was as dark as the origin)."""
    ex = page.locator(".precnb-explorer").nth(i + 2)
    ex.scroll_into_view_if_needed()
    got = ex.locator(".precnb-heatmap svg").first.evaluate("""svg => {
      const one = [...svg.querySelectorAll('g.mark-text.role-mark text')].find(t => t.textContent.trim() === '1');
      const c = one.getBoundingClientRect(); const cx = c.left + c.width / 2, cy = c.top + c.height / 2;
      const rects = [...svg.querySelectorAll('g.mark-rect.role-mark path')].map(p => {
        const b = p.getBoundingClientRect();
        return {fill: p.getAttribute('fill'), one: b.left <= cx && cx <= b.right && b.top <= cy && cy <= b.bottom}; });
      return rects.filter(r => r.fill && !['#eeeeee', '#ffffff', 'white', 'transparent'].includes(r.fill));
    }""")
    ones = [r for r in got if r["one"]]
    others = [r for r in got if not r["one"]]
    assert ones and _luminance(ones[0]["fill"]) < 0.3, ones
    assert len(others) >= 2, got  # the downstream cells are flagged too ...
    dark = [r["fill"] for r in others if _luminance(r["fill"]) < 0.55]
    assert not dark, (len(others), dark[:10])  # ... and pale beside the origin


def test_no_clipped_placeholder_or_checkbox_text(page):
    """The search box's placeholder and every checkbox label show whole, in every tab of the xfw explorer."""
    ex = page.locator(".precnb-explorer").nth(1)
    n = _kernel_json(page, "print(json.dumps(len(ex1.panels)))")
    clipped = []
    for tab in range(n):
        kernel_output(page, f"ex1.tabs.selected_index = {tab}")
        page.wait_for_timeout(600)
        clipped += ex.evaluate("""ex => {
          const out = [];
          const ctx = document.createElement('canvas').getContext('2d');
          for (const inp of ex.querySelectorAll('input[placeholder]')) {
            if (!inp.placeholder || !inp.offsetParent) continue;
            const cs = getComputedStyle(inp);
            ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
            const room = inp.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
            if (ctx.measureText(inp.placeholder).width > room + 1) out.push(['placeholder', inp.placeholder]);
          }
          for (const box of ex.querySelectorAll('.widget-checkbox')) {
            if (!box.offsetParent) continue;
            const b = box.getBoundingClientRect();
            for (const s of box.querySelectorAll('span, label')) {
              if (s.scrollWidth > s.clientWidth + 1 || s.getBoundingClientRect().right > b.right + 1)
                out.push(['checkbox', s.textContent]);
            }
          }
          return out;
        }""")
    assert not clipped, clipped
