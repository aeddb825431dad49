"""Strip the notebook templates in notebooks/ and copy them into the package.

``notebooks/*.ipynb`` is the single source of truth (open and edit them there, e.g. with
``make lab``); this script clears outputs, execution counts and run metadata (widget state,
papermill) in place and writes the same bytes to ``precnb/templates/notebooks/`` (package
data, what ``precnb template`` reads). ``--check`` only reports differences (exit 1).

    python tools/sync_notebooks.py            # strip + copy
    python tools/sync_notebooks.py --check    # verify (tests/test_templates.py does the same)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "notebooks"
PACKAGE = ROOT / "precnb" / "templates" / "notebooks"
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
    """Strip and copy (or check) every template; return the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report differences only")
    args = ap.parse_args(argv)
    problems = []
    names = sorted(p.name for p in SOURCE.glob("*.ipynb"))
    for name in names:
        text = stripped(SOURCE / name)
        for target in (SOURCE / name, PACKAGE / name):
            current = target.read_text(encoding="utf-8") if target.exists() else None
            if current == text:
                continue
            if args.check:
                problems.append(f"{target.relative_to(ROOT)} is not the stripped copy of notebooks/{name}")
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
                print(f"wrote {target.relative_to(ROOT)}")
    extra = sorted({p.name for p in PACKAGE.glob("*.ipynb")} - set(names))
    for name in extra:
        if args.check:
            problems.append(f"precnb/templates/notebooks/{name} has no source in notebooks/")
        else:
            (PACKAGE / name).unlink()
            print(f"removed precnb/templates/notebooks/{name}")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
