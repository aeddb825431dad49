"""Strip the notebook templates in notebooks/ in place (outputs, execution counts, run metadata).

``notebooks/*.ipynb`` is the one committed copy of the templates (open and edit them there, e.g.
with ``make lab``); the build puts them into the package (``setup.py``: a wheel carries them as
``precnb/templates/notebooks/``, what ``precnb template`` reads when there is no checkout). This
script clears outputs, execution counts and run metadata (widget state, papermill) so that what
is committed is the clean template. ``--check`` only reports templates that are not clean (exit 1).

    python tools/strip_notebooks.py            # strip in place
    python tools/strip_notebooks.py --check    # verify (tests/test_templates.py does the same)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "notebooks"
KEEP_METADATA = ("kernelspec", "language_info")


def stripped(path: Path) -> str:
    """The canonical text of a template: no outputs, counts, widget state or run metadata."""
    nb = nbformat.read(path, as_version=4)
    nb.metadata = {k: v for k, v in nb.metadata.items() if k in KEEP_METADATA}
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    if "language_info" in nb.metadata:
        nb.metadata["language_info"] = {"name": "python"}
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k == "tags"}
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Strip (or check) every template; return the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report templates that are not clean only")
    args = ap.parse_args(argv)
    problems = []
    for path in sorted(SOURCE.glob("*.ipynb")):
        text = stripped(path)
        if path.read_text(encoding="utf-8") == text:
            continue
        if args.check:
            problems.append(f"{path.relative_to(ROOT)} is not stripped: run `make notebooks`")
        else:
            path.write_text(text, encoding="utf-8")
            print(f"stripped {path.relative_to(ROOT)}")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
