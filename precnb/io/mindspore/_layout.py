"""The folder layout MindSpore's kernel dumps share: ``rank_<id>/<net>/<graph>/<iteration>/``.

Both kernel readers (``statistic.csv`` and one ``.npy`` per tensor) search the same fixed depths below
the path the user gives and read step, graph and rank numbers from folder names. The depths are fixed,
so a symlink loop cannot make a search run away; a folder that cannot be listed is recorded as a
``(path, reason)`` problem, never raised.

Examples
--------
>>> folder_number("0012"), folder_number("x1"), folder_number(str(2**31))
(12, None, None)
>>> RANK_DIR.match("rank_3")[1]
'3'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from precnb.io._fs import is_dir, list_dir

__all__ = ["MAX_INDEX", "RANK_DIR", "dirs_at_depth", "folder_number", "rank_folder"]

RANK_DIR = re.compile(r"^rank_?([0-9]+)$")
MAX_INDEX = 2**31 - 1


def folder_number(text: str) -> int | None:
    """A folder name made of ASCII digits, as an int in 0..2**31-1 (else None)."""
    if not (text.isascii() and text.isdigit()) or len(text) > 10:
        return None
    v = int(text)
    return v if v <= MAX_INDEX else None


def rank_folder(path: Path) -> Path | None:
    """The nearest ``rank_<id>`` folder above *path* (None when there is none)."""
    return next((a for a in path.parents if RANK_DIR.match(a.name)), None)


def dirs_at_depth(root: Path, depth: int, *, ranks_first: bool, problems: list[tuple[str, str]],
                  report_root: bool = True, keep: Callable[[Path], bool] | None = None,
                  first_only: bool = False) -> list[Path]:
    """The folders exactly *depth* levels below *root* (kept by *keep*), in path order.

    Parameters
    ----------
    root : Path
    depth : int
        1 = the children of *root*.
    ranks_first : bool
        Only ``rank_<id>`` folders at the first level.
    problems : list of (str, str)
        Receives the folders that cannot be listed (*root* itself only with *report_root*).
    keep : callable, optional
        A test on the folders of the last level.
    first_only : bool
        Stop at the first folder kept.

    Returns
    -------
    list of Path
    """
    level = [root]
    for i in range(depth):
        below: list[Path] = []
        last = i == depth - 1
        for d in level:
            try:
                children = list_dir(d)
            except OSError as exc:
                if report_root or d is not root:
                    problems.append((str(d), f"cannot list folder: {exc.strerror or exc}"))
                continue
            for c in children:
                if (i == 0 and ranks_first and not RANK_DIR.match(c.name)) or not is_dir(c):
                    continue
                if last and keep is not None and not keep(c):
                    continue
                below.append(c)
                if last and first_only:
                    return below
        level = below
    return level
