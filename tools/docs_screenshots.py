"""``make docs-screenshots``: the documentation's pictures, taken by headless Chromium, never by hand (issue #52).

For every incident of the gallery (``tools/docs_hooks.py`` ``REPORTS``: one bundled sample per incident guide):

* ``explorer-<name>.png``: the explorer's first screen, in a real JupyterLab (one notebook, one cell per
  incident, run in its kernel), scrolled to the explorer's top;
* ``report-<name>.png``: the first screen of the HTML report ``precnb report`` exports from the same sample,
  opened from the file system in an offline browser context.

They are written to ``build/docs-screenshots/`` (``PRECNB_DOCS_SHOTS``), outside ``docs/``: ``make docs`` shows them
on the guides and the gallery when they are there, and builds without them otherwise. The README's one picture
(``docs/images/explorer.png``, the explorer on the NaN-on-one-rank incident) is the one file written into the
sources: the README is read where no site is built.

JupyterLab and Chromium are driven exactly as the browser tests drive them (``tests/browser/conftest.py``:
``jupyter_lab``, ``open_notebook``, the system chromium through playwright, no download).

    python tools/docs_screenshots.py [--only dp_nan,tensor_bug] [--width 1400] [--height 1000] [--no-readme]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tools"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import docs_hooks  # noqa: E402 - tools/docs_hooks.py: the gallery's incidents and where the shots go

README_SHOT = ROOT / "docs" / "images" / "explorer.png"
README_INCIDENT = "reports/dp_nan.html"

#: ``precnb report`` options -> ``precnb.explore`` keywords (the same pipeline options)
_KEYWORDS = {"--baseline": "baseline", "--layout": "layout", "--target-layout": "target_layout",
             "--rank-table": "rank_table", "--monitor": "monitor", "--loss": "loss"}


def explore_call(args: list[str]) -> str:
    """``precnb.explore(...)`` source for the ``precnb report`` arguments *args* (paths made absolute)."""
    def value(option: str, text: str) -> str:
        return repr(text if option in ("--layout", "--target-layout") else str(ROOT / text))

    parts, i = [repr(str(ROOT / args[0]))], 1
    while i < len(args):
        option = args[i]
        if option not in _KEYWORDS:
            raise SystemExit(f"docs_screenshots: no explore keyword for the report option {option}")
        parts.append(f"{_KEYWORDS[option]}={value(option, args[i + 1])}")
        i += 2
    return f"precnb.explore({', '.join(parts)})"


class _Dirs:
    """What ``jupyter_lab`` needs of pytest's ``tmp_path_factory``: ``mktemp(name)``, here below one folder."""

    def __init__(self, root: Path) -> None:
        self.root, self.n = root, 0

    def mktemp(self, name: str) -> Path:
        self.n += 1
        path = self.root / f"{name}{self.n}"
        path.mkdir()
        return path


def explorer_shots(chromium, incidents: dict[str, list[str]], out: Path, tmp: Path, viewport: dict) -> list[Path]:
    """The explorer's first screen of every incident, in one JupyterLab notebook."""
    from playwright.sync_api import expect

    from tests.browser.conftest import jupyter_lab, open_notebook

    names = list(incidents)
    cells = ["import precnb"] + [f"ex{i} = {explore_call(incidents[site])}\nex{i}" for i, site in enumerate(names)]
    settings = {"@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"}}
    written = []
    with jupyter_lab(_Dirs(tmp), cells, "docs_screenshots.ipynb", settings=settings) as lab:
        page = open_notebook(chromium, lab["url"], viewport=viewport)
        try:
            # the notebook's own toolbar and the cells' code above the explorer are not the picture
            page.evaluate("window.jupyterapp.commands.execute('application:toggle-left-area')")
            for i, site in enumerate(names):
                ex = page.locator(".precnb-explorer").nth(i)
                expect(ex.locator(".precnb-heatmap svg").first).to_be_visible(timeout=120_000)
                page.evaluate("el => el.scrollIntoView({block: 'start'})", ex.element_handle())
                page.wait_for_timeout(500)  # the charts drawn after the scroll
                path = out / Path(docs_hooks.shot_name("explorer", site)).name
                page.screenshot(path=str(path))
                written.append(path)
                print(f"docs-screenshots: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
            if page.errors:
                print(f"docs-screenshots: page errors in JupyterLab: {page.errors[:3]}", file=sys.stderr)
        finally:
            page.close()
    return written


def report_shots(chromium, incidents: dict[str, list[str]], out: Path, tmp: Path, viewport: dict) -> list[Path]:
    """The first screen of every incident's exported report (exported here as ``make docs`` exports it)."""
    folder = tmp / "reports"
    folder.mkdir()
    reports = docs_hooks._reports(folder, only=list(incidents))
    ctx = chromium.new_context(offline=True, viewport=viewport)
    written = []
    try:
        for site in incidents:
            page = ctx.new_page()
            page.goto(reports[site].as_uri())
            page.wait_for_selector(".vega-embed svg.marks", timeout=60_000)
            page.wait_for_timeout(1000)  # every chart embedded
            path = out / Path(docs_hooks.shot_name("report", site)).name
            page.screenshot(path=str(path))
            written.append(path)
            print(f"docs-screenshots: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
            page.close()
    finally:
        ctx.close()
    return written


def main(argv: list[str] | None = None) -> int:
    """Take the screenshots; 0 when written, 1 when chromium is missing."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="report names (dp_nan,tensor_bug, ...): only these incidents")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--skip-explorer", action="store_true", help="only the reports (no JupyterLab)")
    parser.add_argument("--no-readme", action="store_true",
                        help=f"do not refresh the README's picture ({README_SHOT.relative_to(ROOT)})")
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS

    if not Path(CHROMIUM).exists():
        print(f"docs-screenshots: {CHROMIUM} not installed (apt-get install chromium; `make system-deps`)",
              file=sys.stderr)
        return 1
    incidents = {site: a for site, (_guide, _title, a) in docs_hooks.REPORTS.items()}
    if args.only:
        wanted = {f"reports/{n.strip()}.html" for n in args.only.split(",")}
        unknown = wanted - set(incidents)
        if unknown:
            parser.error(f"unknown incidents {sorted(unknown)}; known: "
                         f"{', '.join(Path(s).stem for s in incidents)}")
        incidents = {s: a for s, a in incidents.items() if s in wanted}
    out = docs_hooks.SHOTS
    out.mkdir(parents=True, exist_ok=True)
    viewport = {"width": args.width, "height": args.height}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="precnb-docs-shots-") as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            written = report_shots(browser, incidents, out, Path(tmp), viewport)
            if not args.skip_explorer:
                written += explorer_shots(browser, incidents, out, Path(tmp), viewport)
        finally:
            browser.close()
    readme = out / Path(docs_hooks.shot_name("explorer", README_INCIDENT)).name
    if readme in written and not args.no_readme:
        README_SHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(readme, README_SHOT)
        print(f"docs-screenshots: {README_SHOT.relative_to(ROOT)} (the README's picture)")
    print(f"docs-screenshots: {len(written)} PNG(s) in {time.monotonic() - start:.0f} s; `make docs` shows them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
