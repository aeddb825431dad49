"""Where a MindSpore tensor-layout kernel dump keeps its files, grouped per (step, rank).

Layout: ``<root>/rank_<id>/<net_name>/<graph_id>/<iteration>/<op_type>.<op_name>....npy``; see
:mod:`precnb.io.mindspore.tensors` for the reader and :mod:`precnb.io.mindspore._layout` for the
shared folder search.

Examples
--------
>>> is_ms_kernel_tensors("/nonexistent")
False
>>> iteration_dirs(Path("/nonexistent"))
[]
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from precnb.errors import NotADumpError
from precnb.io._assemble import LoadReport
from precnb.io.mindspore._files import NAME
from precnb.io.mindspore._layout import MAX_INDEX, RANK_DIR, dirs_at_depth, folder_number, rank_folder

__all__ = ["KernelTensorItem", "discover", "is_ms_kernel_tensors", "iteration_dirs"]


def _is_iteration_dir(p: Path) -> bool:
    """An iteration folder: numeric name and a tensor file (or a mapping.csv and .npy files); stops at the first."""
    if folder_number(p.name) is None:
        return False
    npy = mapped = False
    try:
        with os.scandir(p) as it:
            for e in it:
                if e.name.endswith(".npy"):
                    if NAME.match(e.name):
                        return True
                    npy = True
                elif e.name == "mapping.csv":
                    mapped = True
                if npy and mapped:  # hashed long names only
                    return True
    except OSError:
        return False
    return False


def iteration_dirs(p: Path, problems: list[tuple[str, str]] | None = None, first_only: bool = False) -> list[Path]:
    """Iteration folders at fixed depths below *p* (iteration, graph, net, rank folder or root), shallowest first."""
    if _is_iteration_dir(p):
        return [p]
    sink: list[tuple[str, str]] = [] if problems is None else problems
    for depth in (1, 2, 3, 4):
        found = dirs_at_depth(p, depth, ranks_first=depth == 4, problems=sink, keep=_is_iteration_dir,
                              first_only=first_only)
        if found:
            return found
    return []


def is_ms_kernel_tensors(path: str | Path) -> bool:
    """Whether *path* holds a MindSpore tensor-layout kernel dump (and no statistic.csv there).

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    bool

    Examples
    --------
    >>> is_ms_kernel_tensors("/nonexistent")
    False
    """
    p = Path(path)
    try:
        if not p.is_dir():
            return False
        found = iteration_dirs(p, first_only=True)
        return bool(found) and not (found[0] / "statistic.csv").is_file()
    except OSError:
        return False


@dataclass(frozen=True)
class KernelTensorItem:
    """The iteration folders of one (step, rank): one parse task.

    Attributes
    ----------
    step, rank : int
    folders : tuple of Path
        One per graph, by graph id.
    rank_dir : Path or None
        The ``rank_<id>`` folder holding ``graphs/`` and ``execution_order/``.
    net_name : str
    """

    step: int
    rank: int
    folders: tuple[Path, ...]
    rank_dir: Path | None
    net_name: str

    @property
    def path(self) -> str:
        """Printable name (the folders joined by ``;``)."""
        return ";".join(str(f) for f in self.folders)


def discover(path: str | Path, report: LoadReport | None = None) -> list[KernelTensorItem]:
    """Find the iteration folders below *path*, grouped per (step, rank), sorted.

    Raises
    ------
    NotADumpError
        When there is no tensor-layout kernel dump below *path*.
    """
    p = Path(path)
    try:
        if not p.exists():
            raise NotADumpError(f"{p}: no such file or directory")
    except OSError as exc:
        raise NotADumpError(f"{p}: cannot access: {exc.strerror or exc}") from None
    problems: list[tuple[str, str]] = []
    dirs = iteration_dirs(p, problems) if p.is_dir() else []
    if report is not None:
        report.skipped.extend(problems)
    if not dirs:
        raise NotADumpError(f"{p}: no MindSpore tensor kernel dump found (expected "
                            "rank_*/<net>/<graph>/<iteration>/<op_type>.<op_name>....npy)")
    groups: dict[tuple[int, int], list[Path]] = {}
    meta: dict[tuple[int, int], tuple[Path | None, str]] = {}
    for d in dirs:
        step, graph = folder_number(d.name), folder_number(d.parent.name)
        rank_dir = rank_folder(d)
        rank = folder_number(RANK_DIR.match(rank_dir.name)[1]) if rank_dir is not None else 0  # type: ignore[index]
        if step is None or rank is None:
            if report is not None:
                report.skipped.append((str(d), f"iteration or rank number out of range (0..{MAX_INDEX})"))
            continue
        groups.setdefault((step, rank), []).append(d)
        net = d.parent.parent.name if graph is not None else ""
        meta[(step, rank)] = (rank_dir if rank_dir is not None and rank_dir == d.parent.parent.parent else None, net)
        del graph
    if not groups:
        raise NotADumpError(f"{p}: no iteration folder with a usable step and rank")
    return [KernelTensorItem(s, r, tuple(sorted(fs, key=lambda f: (folder_number(f.parent.name) or 0, str(f)))),
                             *meta[(s, r)]) for (s, r), fs in sorted(groups.items())]
