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
    env = {**os.environ, "PRECNB_DOCS_REPORTS": "0", "PYTHONPATH": str(ROOT)}  # the reports: tested elsewhere
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
