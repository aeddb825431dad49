"""Scrub the generating machine's absolute paths out of the samples (issue #53).

msprobe writes absolute paths into what it dumps: every frame of ``stack.json`` names its file
(``File /…/site-packages/torch/nn/modules/module.py, line 1811, …``), a tensor dump's ``dump.json``
names its ``dump_data_dir``, MindSpore's graphs name their sources, and the generator's own configs
name their ``dump_path``. The generator applies :func:`scrub_paths` to every text file of a sample it
writes (:func:`scrub_tree`, from :func:`precnb_samples._scenarios.generate_one` and the population
subset's export), and so does the msprobe release matrix (``tools/msprobe_matrix/generate.py``) to the
fixtures it writes; the command below applies the same function to committed samples and fixtures::

    PYTHONPATH=tools/samples python -m precnb_samples.scrub data_samples tests/fixtures

(``--root PATH=REPLACEMENT``: a known folder replaced first, as the generators pass their output and venv
folders.)

Only the path strings change (a textual replacement, not a re-serialisation: the files keep their
formatting, statistics and NaN literals byte for byte). The scrubbed forms keep the markers precnb's
frame classifiers look for (``/site-packages/torch/``, ``/lib/python3``):

- ``/any/prefix/lib/python3.11/site-packages/torch/x.py`` → ``<venv>/site-packages/torch/x.py``
  (also ``dist-packages``; a bare ``site-packages/…`` written by an older scrub gets the same prefix);
- ``/any/prefix/lib/python3.11/multiprocessing/x.py`` → ``<python>/lib/python3.11/multiprocessing/x.py``;
- a checkout of this repository, ``/any/checkout/tools/samples/…`` (also ``tools/msprobe_matrix/``, ``precnb/``,
  ``data_samples/``, ``tests/``) → ``tools/samples/…``, relative to the repository;
- a temporary working folder, ``/tmp/name/…`` → ``<run>/…``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["ABSOLUTE", "TEXT_SUFFIXES", "leftovers", "main", "scrub_file", "scrub_paths", "scrub_tree"]

# a path starts at a boundary: not inside a word, a relative path or a placeholder (``<venv>/…``)
_START = r"(?<![\w.~<>/\\-])"
# a path: up to a character that ends one in JSON, msprobe frames (``, line``) or MindSpore IR (``:423~438``)
_PATH = re.compile(rf"{_START}(?:/|(?:site|dist)-packages/|lib/python\d)[^\s\"',:;<>|()\[\]{{}}]*")
_PACKAGES = re.compile(r"(?:^|/)(?:site|dist)-packages/")
_STDLIB = re.compile(r"(?:^|/)lib/(python\d+(?:\.\d+)?)/")
_CHECKOUT = re.compile(r"(?:/[^/]+)+/(?=(?:tools|precnb|data_samples|tests)/)")
_TMP = re.compile(r"/tmp/[^/]+")  # noqa: S108 (matched in text, no file made there)


def _neutral(path: str) -> str:
    """The machine-neutral form of one path (unchanged when no rule of the module docstring applies)."""
    m = _PACKAGES.search(path)  # an interpreter's installed packages
    if m:
        return "<venv>/site-packages/" + path[m.end():]
    m = _STDLIB.search(path)  # an interpreter's standard library
    if m:
        return f"<python>/lib/{m.group(1)}/" + path[m.end():]
    m = _CHECKOUT.match(path)  # a checkout of this repository (the last anchor: a checkout named precnb)
    if m:
        return path[m.end():]
    m = _TMP.match(path)  # a temporary working folder
    if m:
        return "<run>" + path[m.end():]
    return path


#: an absolute path of some machine: what must not be left in a sample
ABSOLUTE = re.compile(r"(?<![\w.~<>-])(?:/(?:work|root|home|tmp|usr|opt|var|mnt|data|Users)/|[A-Za-z]:\\\\?[\w.-])")
#: the files that may hold paths (the others are binary: ``.npy``, ``.pt``, ``.npz``, ``.zip``)
TEXT_SUFFIXES = (".json", ".md", ".ir", ".csv", ".yaml", ".yml", ".txt", ".log")


def scrub_paths(text: str, roots: Iterable[tuple[str | Path, str]] = ()) -> str:
    """Rewrite the absolute paths of *text* into the machine-neutral forms of this module.

    Parameters
    ----------
    text : str
        The text of a sample file.
    roots : iterable of (path, str)
        Known folders replaced first, each by its replacement (the generator passes its output folder,
        ``data_samples``); a folder is replaced where it is followed by ``/`` or ends a string.

    Returns
    -------
    str
        *text* with its paths rewritten; the rest of it unchanged.

    Examples
    --------
    >>> scrub_paths('"File /opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py, line 1, in f"')
    '"File <venv>/site-packages/torch/nn/modules/module.py, line 1, in f"'
    >>> scrub_paths("File /root/.pyenv/versions/3.11.7/lib/python3.11/multiprocessing/process.py, line 108")
    'File <python>/lib/python3.11/multiprocessing/process.py, line 108'
    >>> scrub_paths('"File /home/me/precnb/tools/samples/precnb_samples/_model.py, line 2"')
    '"File tools/samples/precnb_samples/_model.py, line 2"'
    >>> scrub_paths('"dump_path": "/tmp/tmpab12/dump"')
    '"dump_path": "<run>/dump"'
    >>> scrub_paths('"dump_path": "/data/out/x"', [("/data/out", "data_samples")])
    '"dump_path": "data_samples/x"'
    >>> scrub_paths("File <venv>/site-packages/torch/x.py") == "File <venv>/site-packages/torch/x.py"
    True
    """
    for root, rep in roots:
        root = str(root).rstrip("/")
        text = re.sub(rf"{_START}{re.escape(root)}(?=/|\")", rep.replace("\\", r"\\"), text)
    return _PATH.sub(lambda m: _neutral(m.group(0)), text)


def leftovers(text: str) -> list[str]:
    """The absolute paths still in *text* (``[]`` for a scrubbed one).

    Examples
    --------
    >>> leftovers('"dump_path": "/work/x/data"'), leftovers('"File <venv>/site-packages/t.py"')
    (['/work/'], [])
    """
    return [m.group(0) for m in ABSOLUTE.finditer(text)]


def scrub_file(path: Path, roots: Sequence[tuple[str | Path, str]] = ()) -> bool:
    """Scrub one text file in place (bytes outside the path strings untouched); True when it changed.

    Parameters
    ----------
    path : Path
        The file (a binary one, or one that is not UTF-8, is left alone).
    roots : sequence of (path, str)
        Passed to :func:`scrub_paths`.

    Returns
    -------
    bool
        Whether the file was rewritten.
    """
    if path.suffix not in TEXT_SUFFIXES:
        return False
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    new = scrub_paths(text, roots)
    if new == text:
        return False
    path.write_bytes(new.encode("utf-8"))
    return True


def scrub_tree(root: Path, roots: Sequence[tuple[str | Path, str]] = ()) -> list[Path]:
    """Scrub every text file under *root* (or *root* itself, a file); return the files rewritten.

    Parameters
    ----------
    root : Path
        A sample folder, the whole ``data_samples`` folder, or one file.
    roots : sequence of (path, str)
        Passed to :func:`scrub_paths`.

    Returns
    -------
    list of Path
        The files that changed, sorted.
    """
    root = Path(root)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return [f for f in files if scrub_file(f, roots)]


def main(argv: list[str] | None = None) -> int:
    """``python -m precnb_samples.scrub [FOLDER ...]``: scrub committed samples; 1 when a path is left."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m precnb_samples.scrub",
                                     description="Rewrite the generating machine's absolute paths in sample "
                                                 "files (the function the generator applies).")
    parser.add_argument("folders", nargs="*", default=["data_samples"], help="default: %(default)s")
    parser.add_argument("--root", action="append", default=[], metavar="PATH=REPLACEMENT",
                        help="a known folder rewritten after the rules (e.g. /work/venvs=<venvs>); repeatable")
    args = parser.parse_args(argv)
    roots = [tuple(r.split("=", 1)) for r in args.root]
    if any(len(r) != 2 for r in roots):
        parser.error("--root takes PATH=REPLACEMENT")
    left = []
    for folder in args.folders:
        changed = sorted(set(scrub_tree(Path(folder))) | set(scrub_tree(Path(folder), roots)))
        print(f"{folder}: {len(changed)} file(s) rewritten")
        for f in sorted(p for p in Path(folder).rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()):
            found = leftovers(f.read_text(encoding="utf-8", errors="replace"))
            if found:
                left.append(f"{f}: {sorted(set(found))[:3]}")
    for line in left:
        print(f"absolute path left: {line}", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
