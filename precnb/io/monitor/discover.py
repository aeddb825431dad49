"""Finding the monitor CSV files of an output root or a rank folder (:func:`discover`)."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from precnb.errors import NotADumpError
from precnb.io._assemble import LoadReport
from precnb.io._fs import is_dir as _is_dir
from precnb.io._fs import is_file as _is_file
from precnb.io._fs import list_dir as _list_dir
from precnb.io.monitor._names import (
    _IGNORED_DIRS,
    _MAX_INDEX,
    _OUT_OF_RANGE,
    _V1_FILE,
    _file_kind,
    _holds_monitor_csv,
    _rank_of_folder,
)


@dataclass(frozen=True)
class MonitorFile:
    """One monitor CSV file of one rank (one parse task).

    Attributes
    ----------
    path : Path
    rank : int
    version : {"v1", "v2"}
    family : str
        The v1 family (file prefix) or the v2 slug.
    window : (int, int)
        The ``{a}-{b}`` step window from the file name.
    priority : int
        Order of the rank folder among the folders of the same rank (oldest 0); when a rank
        has several folders, the newest one wins for a (step, family).
    steps : tuple of int, optional
        Keep only these steps.
    """

    path: Path
    rank: int
    version: str
    family: str
    window: tuple[int, int]
    priority: int = 0
    steps: tuple[int, ...] | None = None


@dataclass
class _Found:
    files: list[MonitorFile]
    rank_dirs: dict[int, list[Path]]
    anomaly: dict[int, str]


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def discover(path: str | Path, report: LoadReport | None = None) -> _Found:  # noqa: C901
    """Find the monitor CSV files below *path*.

    Parameters
    ----------
    path : str or Path
        A monitor output root (v1 ``*-rank<R>-<hex>/`` or v2 ``rank_<R>/`` folders) or a rank
        folder.
    report : LoadReport, optional
        Receives skipped folders and files.

    Returns
    -------
    _Found
        ``files`` (sorted by rank, then name), ``rank_dirs`` (rank → folders) and ``anomaly``
        (rank → anomaly.json path).

    Raises
    ------
    NotADumpError
        When *path* holds no monitor output.
    """
    report = report if report is not None else LoadReport()
    p = Path(path)
    if not _is_dir(p):
        from precnb.io._why import missing_reason

        raise NotADumpError(f"{p}: {'not a monitor output folder' if os.path.exists(p) else missing_reason(p)}")
    folders: list[tuple[Path, int]] = []
    if _holds_monitor_csv(p):
        rank = _rank_of_folder(p.name)
        if rank is None or rank == _OUT_OF_RANGE:
            report.warnings.append(f"{p}: rank not in the folder name (or out of range); using rank 0")
            rank = 0
        folders.append((p, rank))
    else:
        try:
            children = _list_dir(p)
        except OSError as exc:
            raise NotADumpError(f"{p}: cannot list folder: {exc.strerror or exc}") from None
        for child in children:
            if child.name in _IGNORED_DIRS or not _is_dir(child):
                continue
            rank = _rank_of_folder(child.name)
            if rank is None:
                continue
            if rank == _OUT_OF_RANGE:
                report.skipped.append((str(child), f"rank number out of range (0..{_MAX_INDEX})"))
                continue
            try:
                next(child.iterdir(), None)
            except OSError as exc:
                report.skipped.append((str(child), f"cannot list folder: {exc.strerror or exc}"))
                continue
            if _holds_monitor_csv(child):
                folders.append((child, rank))
            else:
                report.skipped.append((str(child), "rank folder holds no monitor CSV file"))
    if not folders:
        failures = [f"{q}: {r}" for q, r in report.skipped if not r.startswith("ignored")]
        reasons = f" ({'; '.join(failures[:3])})" if failures else ""
        raise NotADumpError(f"{p}: no monitor output found (expected *-rank<R>-<hex>/ or rank_<R>/ "
                            f"folders holding actv_0-0.csv, module_step0-0.csv, ...){reasons}")
    by_rank: dict[int, list[Path]] = defaultdict(list)
    for folder, rank in folders:
        by_rank[rank].append(folder)
    files: list[MonitorFile] = []
    for rank, dirs in sorted(by_rank.items()):
        dirs.sort(key=lambda d: (_mtime(d), d.name))
        if len(dirs) > 1:
            report.warnings.append(
                f"rank {rank}: {len(dirs)} monitor folders ({', '.join(d.name for d in dirs)}); "
                "the newest wins where they overlap")
        for prio, folder in enumerate(dirs):
            try:
                entries = _list_dir(folder)
            except OSError as exc:
                report.skipped.append((str(folder), f"cannot list folder: {exc.strerror or exc}"))
                continue
            for f in entries:
                kind = _file_kind(f.name)
                if kind is None:
                    m = _V1_FILE.match(f.name)
                    if m:
                        why = f"ignored: unknown monitor family {m['family']!r}"
                        report.skipped.append((str(f), why))
                    continue
                if not _is_file(f):
                    continue
                version, family, a, b = kind
                files.append(MonitorFile(f, rank, version, family, (a, b), prio))
    anomaly: dict[int, str] = {}
    root = p if not _holds_monitor_csv(p) else p.parent
    adir = root / "anomaly_detected"
    try:
        anomaly_dirs = _list_dir(adir) if _is_dir(adir) else []
    except OSError as exc:
        report.warnings.append(f"{adir}: cannot list folder: {exc.strerror or exc}")
        anomaly_dirs = []
    for child in anomaly_dirs:
        m = re.match(r"^rank_?([0-9]{1,9})$", child.name)
        if m and _is_file(child / "anomaly.json"):
            anomaly[int(m.group(1))] = str(child / "anomaly.json")
    return _Found(files, dict(by_rank), anomaly)
