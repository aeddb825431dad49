"""Where the (step, rank) files of an msprobe dump are: ``step*/rank*/dump.json`` and its variants.

Handles ``rank{R}``, bare ``rank`` and ``proc{PID}`` folders, MindSpore's ``pynative/`` and
``graph/`` trees, a dump root, a ``stepN`` folder, a rank folder or a dump.json (also renamed).
Unreadable folders are reported, symlinks that loop back to an ancestor folder are ignored
(reported), rank / step numbers beyond 2**31 are reported and skipped.

Examples
--------
>>> is_msprobe_dump("/nonexistent")
False
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from precnb.errors import NotADumpError
from precnb.io import _why
from precnb.io._assemble import LoadReport
from precnb.io._dupes import keep_one_per_number
from precnb.io._fs import is_dir as _is_dir
from precnb.io._fs import is_file as _is_file
from precnb.io._fs import is_link as _is_link
from precnb.io._fs import list_dir as _list_dir
from precnb.io._fs import open_regular
from precnb.io._fs import os_reason as _why_os

__all__ = ["DUMP_FILES", "RankDir", "discover", "is_msprobe_dump"]

DUMP_FILES = ("dump.json", "debug.json")
_MAX_INDEX = 2**31 - 1  # step / rank numbers
_STEP = re.compile(r"^step([0-9]+)$")
_RANK = re.compile(r"^rank([0-9]*)$")
_PROC = re.compile(r"^proc([0-9]+)$")


@dataclass(frozen=True)
class RankDir:
    """One (step, rank) folder of a dump."""

    path: Path
    step: int
    rank: int
    dump_file: Path

    @property
    def key(self) -> str:
        """``"step,rank"`` text key."""
        return f"{self.step},{self.rank}"


def _dump_file(folder: Path) -> Path | None:
    for name in DUMP_FILES:
        p = folder / name
        if _is_file(p):
            return p
    return None


def _no_dump_reason(folder: Path) -> str:
    """Why a rank/proc folder has no readable dump.json: the real reason, not a guess."""
    for name in DUMP_FILES:
        f = folder / name
        special = _why.not_a_file_reason(f)
        if special:
            return special
        if _is_link(f) and not _exists(f):  # (an unreadable folder: both answer "no", the listing says why)
            return f"{name}: {_why.missing_reason(f)}"
    try:
        next(folder.iterdir(), None)
    except OSError as exc:
        return f"cannot list folder: {_why_os(exc)}"
    return "no dump.json in rank folder (job died before the first flush?)"


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except OSError:
        return False


def _loops_back(child: Path) -> bool:
    """Whether *child* is a symlink to its own folder or one of that folder's ancestors."""
    try:
        if not child.is_symlink():
            return False
        target = child.resolve()
        here = child.parent.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink cycle (Python < 3.13): not a folder at all
        return False
    return target == here or target in here.parents


def _number(m: re.Match[str] | None, default: int = 0) -> int | None:
    """The folder number of a step/rank/proc match; None when beyond 2**31."""
    if m is None or not m.group(1):
        return default
    digits = m.group(1)
    if len(digits) > 10 or int(digits) > _MAX_INDEX:
        return None
    return int(digits)


def is_msprobe_dump(path: str | Path) -> bool:
    """Whether *path* looks like an msprobe dump root, step folder, rank folder or dump.json.

    Examples
    --------
    >>> is_msprobe_dump("/nonexistent")
    False
    """
    p = Path(path)
    if _is_file(p):
        return p.name in DUMP_FILES or (p.suffix == ".json" and _sniff_dump_json(p))
    if not _is_dir(p):
        return False
    if _dump_file(p):
        return True
    try:
        for child in p.iterdir():
            if (_RANK.match(child.name) or _PROC.match(child.name) or _STEP.match(child.name)
                    or child.name in ("graph", "pynative")) and _is_dir(child):
                return True
    except OSError:
        return False
    return False


def _sniff_dump_json(p: Path) -> bool:
    """A renamed dump.json (``{"task": .., "data": {..}}``) or a bare ``data`` object."""
    try:
        with open_regular(p) as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if b'"data"' in head and (b'"task"' in head or b'"level"' in head or b'"framework"' in head):
        return True
    return bool(re.search(rb'"[A-Za-z_]+\.[^"]*\.(forward|backward)[^"]*"\s*:\s*\{', head)) and (
        b'"input_args"' in head or b'"output"' in head or b'"input"' in head)


def _regular(path: str) -> bool:
    """Whether *path* is a regular file (links followed); False when it cannot be checked."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):  # ValueError: an embedded NUL byte
        return False


def _dump_in(folder: str) -> str | None:
    """The dump file of a rank folder given as text (the scan's fast form of :func:`_dump_file`)."""
    for name in DUMP_FILES:
        p = os.path.join(folder, name)
        if _regular(p):
            return p
    return None


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    """The entries of *folder* sorted by name; raises OSError when it cannot be listed."""
    with os.scandir(folder) as it:
        return sorted(it, key=lambda e: e.name)


def _entry_is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # the file type from the listing: no stat unless a symlink
    except OSError:
        return False


def _rank_dirs_in_step(step_dir: Path, step: int, report: LoadReport, *,
                       ranks: frozenset[int] | None = None, first: bool = False) -> list[RankDir]:
    """The rank (or proc) folders of one step folder; with *first*, stop at the first one with a dump file.

    The folder is listed once (``os.scandir``: the file types come with the names, so a plain
    folder costs no ``stat``) and each rank folder's dump file is checked with one ``stat``: a
    step of 4,096 ranks is scanned in milliseconds, as a 100-step run's discovery must be.
    *ranks* keeps only those rank numbers (proc folders are numbered first, then kept likewise).
    """
    ranks_found: list[RankDir] = []
    procs: list[Path] = []
    try:
        children = _entries(step_dir)
    except OSError as exc:
        report.skipped.append((str(step_dir), f"cannot list folder: {_why_os(exc)}"))
        return ranks_found
    for entry in children:
        rank_m, proc_m = _RANK.match(entry.name), _PROC.match(entry.name)
        if not (rank_m or proc_m):
            continue
        link = entry.is_symlink()
        child = Path(entry.path) if link or proc_m else None
        if child is not None and link and _loops_back(child):
            report.skipped.append((entry.path, "ignored: symlink to one of its parent folders (a loop)"))
            continue
        if not _entry_is_dir(entry):
            if link:
                report.skipped.append((entry.path, "broken symlink"))
            continue
        if rank_m:
            rank = _number(rank_m)
            if rank is None:
                report.skipped.append((entry.path, f"rank number out of range (0..{_MAX_INDEX})"))
                continue
            if ranks is not None and rank not in ranks:
                continue
            df = _dump_in(entry.path)
            if df is None:
                report.skipped.append((entry.path, _no_dump_reason(Path(entry.path))))
                continue
            ranks_found.append(RankDir(child or Path(entry.path), step, rank, Path(df)))
            if first:
                return ranks_found
        else:
            procs.append(Path(entry.path))
    found = [rd for _, rd in keep_one_per_number([(rd.rank, rd) for rd in ranks_found], "rank",
                                                 lambda n: f"rank{n}", report, name=lambda rd: rd.path.name,
                                                 where=lambda rd: str(rd.path))]
    procs = [p for _, p in keep_one_per_number([(_number(_PROC.match(p.name)), p) for p in procs],
                                                "process", lambda n: f"proc{n}", report,
                                                name=lambda p: p.name)]
    if procs and found:
        for p in procs:
            report.skipped.append((str(p), "ignored: proc* folder (rank* folders exist; msprobe tools do the same)"))
    elif procs:
        if len(procs) > 1:
            report.warnings.append(
                f"{step_dir}: {len(procs)} proc* folders; numbered as ranks 0..{len(procs) - 1} by name"
            )
        for i, p in enumerate(procs):
            if ranks is not None and i not in ranks:
                continue
            pdf = _dump_file(p)
            if pdf is None:
                report.skipped.append((str(p), _no_dump_reason(p)))
                continue
            found.append(RankDir(p, step, i, pdf))
            if first:
                break
    return found


def discover(path: str | Path, report: LoadReport | None = None, *, steps: Collection[int] | None = None,
             ranks: Collection[int] | None = None, first: bool = False) -> list[RankDir]:
    """Find the (step, rank) folders below *path*.

    Parameters
    ----------
    path : str or Path
        A dump root (holding ``step*``), a ``stepN`` folder, a rank folder, or a dump.json.
    report : LoadReport, optional
        Receives skipped folders.
    steps, ranks : collection of int, optional
        Only these steps / ranks: the other step folders of a dump root are not listed at all
        (a step-wise search over a 100-step run lists the steps it reads, not all 100), and
        what is skipped is reported for the chosen steps only.
    first : bool
        One rank folder per step, the first found (the steps a dump holds, without listing every
        rank's dump file).

    Returns
    -------
    list of RankDir
        Sorted by (step, rank).

    Raises
    ------
    NotADumpError
        When nothing loadable is found (the reasons of skipped folders are included).

    Examples
    --------
    >>> discover("/nonexistent")
    Traceback (most recent call last):
    ...
    precnb.errors.NotADumpError: /nonexistent: no such file or directory
    """
    report = report if report is not None else LoadReport()
    want_steps = None if steps is None else frozenset(int(x) for x in steps)
    want_ranks = None if ranks is None else frozenset(int(x) for x in ranks)
    p = Path(path)
    try:
        exists = p.exists()
    except OSError as exc:
        raise NotADumpError(f"{p}: cannot access: {_why_os(exc)}") from None
    if not exists:
        raise NotADumpError(f"{p}: {_why.missing_reason(p)}")
    special = _why.not_a_file_reason(p, "it") if _why.kind_of(p) not in (None, "a folder") else None
    if special:
        raise NotADumpError(f"{p}: {special}")
    if _is_file(p):
        if p.name not in DUMP_FILES and not _sniff_dump_json(p):
            raise NotADumpError(f"{p}: not an msprobe dump.json")
        folder = p.parent
        return [RankDir(folder, _step_of(folder.parent), _rank_of(folder), p)]
    df = _dump_file(p)
    if df is not None:  # a rank folder
        return [RankDir(p, _step_of(p.parent), _rank_of(p), df)]
    try:
        children = [c for c in _list_dir(p) if _is_dir(c) or _is_link(c)]
    except OSError as exc:
        raise NotADumpError(f"{p}: cannot list folder: {_why_os(exc)}") from None
    found: list[RankDir] = []
    step_dirs = [c for c in children if _STEP.match(c.name)]
    skipped_before = len(report.skipped)
    if step_dirs:
        # step1 beside step01: keep one, report the other (their values would overwrite each other)
        numbered = [(n, s) for s in step_dirs if _is_dir(s) and not _loops_back(s)
                    and (n := _number(_STEP.match(s.name))) is not None]
        kept = {id(s) for _, s in keep_one_per_number(numbered, "step", lambda n: f"step{n}", report,
                                                      name=lambda s: s.name)}
        step_dirs = [s for s in step_dirs if id(s) in kept or all(s is not t for _, t in numbered)]
        for s in step_dirs:
            if _loops_back(s):
                report.skipped.append((str(s), "ignored: symlink to one of its parent folders (a loop)"))
                continue
            if not _is_dir(s):
                report.skipped.append((str(s), "broken symlink"))
                continue
            step = _number(_STEP.match(s.name))
            if step is None:
                report.skipped.append((str(s), f"step number out of range (0..{_MAX_INDEX})"))
                continue
            if want_steps is None or step in want_steps:
                found += _rank_dirs_in_step(s, step, report, ranks=want_ranks, first=first)
    elif any(_RANK.match(c.name) or _PROC.match(c.name) for c in children):
        step = _step_of(p)
        if want_steps is None or step in want_steps:
            found = _rank_dirs_in_step(p, step, report, ranks=want_ranks, first=first)
    else:
        wrappers = [c for c in children if c.name in ("pynative", "graph") and _is_dir(c) and not _loops_back(c)]
        if wrappers:
            # MindSpore writes graph/ and pynative/ trees; read pynative (dynamic graph) first
            chosen = sorted(wrappers, key=lambda c: c.name != "pynative")[0]
            for other in wrappers:
                if other is not chosen:
                    report.warnings.append(f"{other}: second MindSpore tree; open it separately")
            return discover(chosen, report, steps=steps, ranks=ranks, first=first)
    if not found:
        failures = [f"{q}: {r}" for q, r in report.skipped[skipped_before:] if not r.startswith("ignored")]
        reasons = f" ({'; '.join(failures[:3])})" if failures else ""
        raise NotADumpError(f"{p}: no msprobe dump found (expected step*/rank*/dump.json below it){reasons}")
    return sorted(found, key=lambda r: (r.step, r.rank))


def _step_of(folder: Path) -> int:
    return _number(_STEP.match(folder.name)) or 0


def _rank_of(folder: Path) -> int:
    return _number(_RANK.match(folder.name)) or 0
