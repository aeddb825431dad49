"""The documentation site builds (issue #52): ``make docs``, offline and strict (docs/README.md).

Skipped, saying so, where the ``docs`` extra (mkdocs, mkdocstrings) is not installed: ``make docs`` installs it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

needs_docs_tooling = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
    reason="the docs tooling is not installed (pip install -e '.[docs]', or `make docs`)",
)


@pytest.mark.slow
@needs_docs_tooling
def test_the_site_builds_strict_and_offline(tmp_path):
    """``mkdocs build --strict``: no warning, no broken internal link or anchor; the key pages are there."""
    site = tmp_path / "site"
    env = {**os.environ, "PRECNB_DOCS_REPORTS": "0", "PYTHONPATH": str(ROOT),  # the reports: tested elsewhere
           "PRECNB_DOCS_SHOTS": str(tmp_path / "no-screenshots")}  # a machine that never ran make docs-screenshots
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for page in ("index.html", "ARCHITECTURE.html", "guide/diagnose.html", "guide/layouts.html",
                 "guide/msprobe-releases.html", "reference/finding-schema.html"):
        assert (site / page).is_file(), page
    assert "precnb" in (site / "index.html").read_text(encoding="utf-8")
    # the generated reference: every verb of the parser, every public name of precnb
    import precnb
    from precnb.cli import build_parser

    cli = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    verbs = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices
    assert verbs and all(f'id="precnb-{v}"' in cli for v in verbs)
    assert "Exit codes" in cli and "--scheduler" in cli
    api = (site / "reference" / "api.html").read_text(encoding="utf-8")
    assert all(f"precnb.{name}" in api for name in precnb.__all__ if name != "__version__")
    # the gallery: every incident's report linked (placeholders here), no screenshot referenced
    gallery = (site / "gallery.html").read_text(encoding="utf-8")
    hooks = _hooks()
    for report in hooks.REPORTS:
        assert f'href="{report}"' in gallery and (site / report).is_file(), report
    assert "<img" not in gallery and not (site / "screenshots").exists()


def _hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "tools" / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_incident_guide_links_its_report_in_the_gallery():
    """Each incident guide has one gallery entry, links that report, and shows the command that exports it."""
    hooks = _hooks()
    guides = {f"incidents/{p.name}" for p in (ROOT / "docs" / "incidents").glob("*.md")}
    entries = {guide: site for site, (guide, _title, _args) in hooks.REPORTS.items()}
    assert len(entries) == len(hooks.REPORTS) and set(entries) == guides, sorted(guides ^ set(entries))
    assert len(guides) == 12
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:\n", 1)[1]
    assert all(f": {guide}\n" in nav for guide in [*guides, "gallery.md"]), "a guide or the gallery not in the nav"
    from precnb.cli import build_parser

    for site, (guide, _title, args) in hooks.REPORTS.items():
        text = " ".join((ROOT / "docs" / guide).read_text(encoding="utf-8").split())
        assert f"(../{site})" in text, f"{guide} does not link ../{site}"
        assert f"precnb report {' '.join(args)}" in text, f"{guide} shows another command than the gallery's"
        build_parser().parse_args(["report", *args, "-o", "x.html"])  # a valid command line
        assert all((ROOT / a).exists() for a in args if a.startswith("data_samples/")), args


def test_screenshots_are_shown_only_when_they_were_taken(tmp_path):
    """The pages reference a screenshot only when ``make docs-screenshots`` wrote it (else: no image, no link)."""
    hooks = _hooks()
    site = "reports/dp_nan.html"
    page = (ROOT / "docs" / "incidents" / "nan-one-rank.md").read_text(encoding="utf-8")
    assert hooks.guide_with_shots(page, site, {}) == page
    assert "<img" not in hooks.gallery_page({}) and "](screenshots/" not in hooks.gallery_page({})
    shots = {hooks.shot_name(kind, site): tmp_path / f"{kind}.png" for kind in ("explorer", "report")}
    shown = hooks.guide_with_shots(page, site, shots)
    explorer, report = "(../screenshots/explorer-dp_nan.png)", "(../screenshots/report-dp_nan.png)"
    assert explorer in shown and report in shown
    assert shown.index(explorer) < shown.index("## The report") < shown.index(report)
    gallery = hooks.gallery_page(shots)
    assert "(screenshots/explorer-dp_nan.png)" in gallery and "(screenshots/report-dp_nan.png)" in gallery


@pytest.mark.slow
@needs_docs_tooling
def test_the_site_shows_the_screenshots_when_present(tmp_path):
    """With PNGs in the screenshot folder the strict build copies them and the guides and the gallery show them."""
    shots = tmp_path / "shots"
    shots.mkdir()
    png = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                        "1f15c4890000000d49444154789c63000100000500010d0a2db40000000049454e44ae426082")
    for name in ("explorer-dp_nan.png", "report-dp_nan.png", "report-tensor_bug.png"):
        (shots / name).write_bytes(png)
    site = tmp_path / "site"
    env = {**os.environ, "PRECNB_DOCS_REPORTS": "0", "PYTHONPATH": str(ROOT), "PRECNB_DOCS_SHOTS": str(shots)}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in (site / "screenshots").iterdir()) == sorted(p.name for p in shots.iterdir())
    nan = (site / "incidents" / "nan-one-rank.html").read_text(encoding="utf-8")
    assert 'src="../screenshots/explorer-dp_nan.png"' in nan and 'src="../screenshots/report-dp_nan.png"' in nan
    tensor = (site / "incidents" / "tensor-metrics-repro.html").read_text(encoding="utf-8")
    assert 'src="../screenshots/report-tensor_bug.png"' in tensor and "explorer-tensor_bug" not in tensor
    assert 'src="screenshots/report-tensor_bug.png"' in (site / "gallery.html").read_text(encoding="utf-8")


def test_readme_is_short_and_its_links_resolve():
    """The README is the two-minute page (≤ 150 lines); everything else moved to docs/, and every link resolves."""
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert "make demo" in text and "make test" in text and "## Quick start" in text
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        if "://" not in link:
            assert (ROOT / link).exists(), link


def _blocks(lang: str) -> list[tuple[str, str]]:
    """``(page, body)`` of every fenced *lang* block of the incident guides."""
    import re

    out = []
    for page in sorted((ROOT / "docs" / "incidents").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        out += [(page.name, m.group(1)) for m in re.finditer(rf"^```{lang}\n(.*?)^```$", text, re.S | re.M)]
    return out


CONSOLE = _blocks("console")


@pytest.mark.slow
@pytest.mark.parametrize(("page", "block"), CONSOLE, ids=[f"{p}:{i}" for i, (p, _) in enumerate(CONSOLE)])
def test_incident_guide_output_is_what_the_command_prints(page, block):
    """Each ``console`` block of docs/incidents is ``$ precnb ...`` and the output it printed: run it again."""
    import shlex

    first, _, shown = block.partition("\n")
    assert first.startswith("$ precnb "), (page, first)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    proc = subprocess.run([sys.executable, "-m", "precnb", *shlex.split(first[len("$ precnb "):])], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.rstrip("\n") == shown.rstrip("\n"), f"{page}: `{first[2:]}` prints otherwise now: " \
        "paste its output into the page"


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted({p for p, _ in _blocks("python")}))
def test_incident_guide_notebook_cells_run(page):
    """The ``python`` blocks of an incident guide run, in order, in one interpreter (as notebook cells)."""
    code = "\n".join(body for p, body in _blocks("python") if p == page)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # what the page says they print ("prints (this ran):" and a text block)
    import re

    text = (ROOT / "docs" / "incidents" / page).read_text(encoding="utf-8")
    shown = re.findall(r"^prints \(this ran\):\n\n```text\n(.*?)^```$", text, re.S | re.M)
    assert shown
    assert proc.stdout.rstrip("\n") == "".join(shown).rstrip("\n"), f"{page}: paste the cells' output again"


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_make_docs_screenshots_takes_the_explorer_and_the_report(tmp_path):
    """``tools/docs_screenshots.py`` (``make docs-screenshots``) on one incident: real JupyterLab and the report."""
    from tests.browser.conftest import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium; `make system-deps`)")
    pytest.importorskip("playwright.sync_api")
    pytest.importorskip("jupyterlab")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PRECNB_DOCS_SHOTS": str(tmp_path), "PRECNB_NO_DASK_CLIENT": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "docs_screenshots.py"), "--only", "dp_nan",
                           "--no-readme", "--width", "1000", "--height", "700"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["explorer-dp_nan.png", "report-dp_nan.png"]
    import struct

    for png in tmp_path.iterdir():
        head = png.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n", png
        assert struct.unpack(">II", head[16:24]) == (1000, 700), png  # the viewport, not an empty page
        assert png.stat().st_size > 20_000, png  # something drawn
