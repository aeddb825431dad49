"""What a tab switch of the explorer costs in the browser (issue 51 item 8): real JupyterLab, headless Chromium.

    python benchmarks/bench_browser_tabs.py [--repeat 5] [--workdir /tmp/precnb-bench-frontends]

The explorers of ``bench_frontends.py``'s runs (5,000 tensors, 8 ranks, 4 steps: the NaN run, and the
pair against its baseline) in one notebook, as ``tests/browser`` opens them (:mod:`tests.browser.conftest`:
the system chromium by path, a throw-away JupyterLab server). For each tab of each explorer, the time from
the click on its title until the panel is shown, the kernel idle again (a first opening computes what the
tab shows), the tab's chart drawn (an ``svg`` in the Alignment and Hierarchy tabs) and two animation frames
painted after that: its first opening, then the median of ``--repeat`` switches to it once every tab was
opened (``performance.now()`` in the page; each includes a few playwright round trips, ~5-10 ms).
``bench_frontends.py`` measures the kernel's side of the same clicks (0 ms for a switch to an opened tab).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

CHARTED = {"Alignment": ".precnb-alignment svg", "Hierarchy": ".precnb-hierarchy svg"}

# the click's own time (the pointerdown event, not playwright's round trip) and every long task (main thread busy
# over 50 ms) the page reports
_WATCH = """() => {
    if (window.__precnbTabs) return;
    window.__precnbTabs = {t0: 0, long: []};
    document.addEventListener('pointerdown', e => { window.__precnbTabs.t0 = performance.now(); }, true);
    new PerformanceObserver(l => { for (const e of l.getEntries()) window.__precnbTabs.long.push(
        [e.startTime, e.duration]); }).observe({type: 'longtask', buffered: false});
}"""

_SETTLED = """async () => {
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    const w = window.__precnbTabs, end = performance.now();
    const busy = w.long.filter(([s, d]) => s + d >= w.t0 && s <= end).reduce((a, [s, d]) => a + d, 0);
    w.long = [];
    return [end - w.t0, busy];
}"""


class _Dirs:
    """The ``tmp_path_factory`` that :func:`tests.browser.conftest.jupyter_lab` asks for."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=name, dir=self.root))


def _switch(page, ex, title: str) -> tuple[float, float]:
    """(milliseconds from the click on *title* until its panel is shown, the kernel idle and the chart drawn,
    milliseconds of long tasks in that time)."""
    from tests.browser.conftest import wait_idle

    tab = ex.get_by_role("tab", name=title)
    page.evaluate(_WATCH)
    tab.click()
    page.wait_for_function("t => t.getAttribute('aria-selected') === 'true'", arg=tab.element_handle(),
                           timeout=60_000)
    wait_idle(page)
    if title in CHARTED:
        ex.locator(CHARTED[title]).first.wait_for(state="visible", timeout=120_000)
    took, busy = page.evaluate(_SETTLED)
    return float(took), float(busy)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/precnb-bench-frontends"))
    ap.add_argument("--width", type=int, default=1600)
    args = ap.parse_args(argv)
    from bench_frontends import build_trees
    from playwright.sync_api import sync_playwright

    from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, NO_WINDOWING, jupyter_lab, open_notebook

    trees, n = build_trees(args.workdir, 5000, 8, 4)
    cells = ["import precnb",
             f"ex0 = precnb.explore({str(trees / 'nan')!r}, progress=False)\nex0",
             f"ex1 = precnb.explore({str(trees / 'diverge')!r}, baseline={str(trees / 'baseline')!r}, "
             "progress=False)\nex1"]
    load0 = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    t_start = time.perf_counter()
    rows: list[tuple[str, str, tuple[float, float], float, float, list[float]]] = []
    with tempfile.TemporaryDirectory() as tmp, \
            jupyter_lab(_Dirs(Path(tmp)), cells, "tabs.ipynb", settings=NO_WINDOWING) as lab, \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = open_notebook(browser, lab["url"], viewport={"width": args.width, "height": 1000})
        for i, case in enumerate(("NaN run", "pair")):
            ex = page.locator(".precnb-explorer").nth(i)
            ex.scroll_into_view_if_needed()
            titles = [t.strip() for t in ex.get_by_role("tab").all_inner_texts()]
            first = {t: _switch(page, ex, t) for t in titles[1:] + titles[:1]}  # each opened once, Finding last
            again: dict[str, list[tuple[float, float]]] = {t: [] for t in titles}
            for _ in range(args.repeat):
                for t in titles[1:] + titles[:1]:
                    again[t].append(_switch(page, ex, t))
            rows += [(case, t, first[t], statistics.median(x for x, _ in again[t]),
                      statistics.median(b for _, b in again[t]), [x for x, _ in again[t]]) for t in titles]
        browser.close()
    print(f"Tab switches in the browser: JupyterLab + headless Chromium at {args.width}x1000, the explorers of a "
          f"{n}-tensor, 8-rank, 4-step run (`benchmarks/bench_browser_tabs.py --repeat {args.repeat}`): "
          "milliseconds from the click on a tab's title (its pointerdown) until its panel is shown, the kernel "
          "idle, its chart drawn and two frames painted; long tasks: the main thread's tasks over 50 ms in that "
          "time (layout, vega rendering, widget messages).\n")
    print("| case | tab | first opening | its long tasks | switch to it (opened before), median | its long tasks "
          "| each switch |")
    print("|---|---|---:|---:|---:|---:|---|")
    for case, t, f, med, busy, each in rows:
        print(f"| {case} | {t} | {f[0]:.0f} | {f[1]:.0f} | {med:.0f} | {busy:.0f} | "
              f"{', '.join(f'{x:.0f}' for x in each)} |")
    print(f"\nWhole run {time.perf_counter() - t_start:.0f} s; load averages (1/5/15 min, {os.cpu_count()} cores) "
          f"{load0} before, {' / '.join(f'{x:.2f}' for x in os.getloadavg())} after.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
