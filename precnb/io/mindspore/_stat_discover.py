"""Where a MindSpore ``statistic.csv`` kernel dump keeps its files, grouped per (step, rank).

Layout: ``<root>/rank_{id}/{net_name}/{graph_id}/{iteration}/statistic.csv``; see
:mod:`precnb.io.mindspore.statistic` for the reader and :mod:`precnb.io.mindspore._layout` for the
shared folder search.

Examples
--------
>>> is_statistic_header(["Op Type", "Op Name", "IO", "Slot", "Max Value"])
True
>>> find_csvs(Path("/nonexistent"))
[]
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from precnb.errors import NotADumpError
from precnb.io._assemble import LoadReport
from precnb.io._csvutil import read_header
from precnb.io._dupes import keep_one_per_number
from precnb.io._fs import is_file
from precnb.io.mindspore._layout import MAX_INDEX, RANK_DIR, dirs_at_depth, folder_number

__all__ = ["REQUIRED_COLUMNS", "STAT_FILE", "KernelItem", "discover", "find_csvs", "is_statistic_header"]

STAT_FILE = "statistic.csv"
REQUIRED_COLUMNS = ("Op Type", "Op Name", "IO", "Slot")


def is_statistic_header(header: list[str] | None) -> bool:
    return bool(header) and all(c in header for c in REQUIRED_COLUMNS)  # type: ignore[operator]


def find_csvs(p: Path, unreadable: list[tuple[str, str]] | None = None) -> list[Path]:
    """statistic.csv files below a root / rank folder / iteration folder (fixed depths).

    The depths are fixed, so a symlink loop cannot make the search run away. Folders that
    cannot be listed are appended to *unreadable* as ``(path, reason)`` (for the search that
    found the files, else for the first one).
    """
    if is_file(p / STAT_FILE):
        return [p / STAT_FILE]
    # (depth, name filter of the first level): root, rank folder, net folder, graph folder
    searches = [(3, False)] if RANK_DIR.match(p.name) else [(4, True)]
    searches += [(2, False), (1, False)]
    first_problems: list[tuple[str, str]] | None = None
    for depth, ranks_first in searches:
        problems: list[tuple[str, str]] = []
        found = [d / STAT_FILE for d in dirs_at_depth(p, depth, ranks_first=ranks_first, problems=problems,
                                                      report_root=False, keep=lambda d: is_file(d / STAT_FILE))]
        if first_problems is None:
            first_problems = problems
        if found:
            if unreadable is not None:
                unreadable.extend(problems)
            return found
    if unreadable is not None and first_problems:
        unreadable.extend(first_problems)
    return []


def _step_rank_of(csv_path: Path) -> tuple[int, int] | None:
    """(step, rank) from the path (0 when absent); None when a number there is out of range."""
    name = csv_path.parent.name
    step = folder_number(name)
    if step is None and name.isascii() and name.isdigit():
        return None
    for parent in csv_path.parents:
        m = RANK_DIR.match(parent.name)
        if m:
            rank = folder_number(m.group(1))
            return None if rank is None else (step or 0, rank)
    return step or 0, 0


def _graph_key(csv_path: Path) -> tuple[int, str]:
    graph = folder_number(csv_path.parent.parent.name)
    return (1 << 31 if graph is None else graph), str(csv_path)


@dataclass(frozen=True)
class KernelItem:
    """The statistic.csv files of one (step, rank): one parse task.

    Attributes
    ----------
    step, rank : int
    files : tuple of Path
        Ordered by graph id.
    """

    step: int
    rank: int
    files: tuple[Path, ...]

    @property
    def path(self) -> str:
        """Printable name (the file, or the files joined by ``;``)."""
        return ";".join(str(f) for f in self.files)


def discover(path: str | Path, report: LoadReport | None = None) -> list[KernelItem]:
    """Find the statistic.csv files below *path*, grouped per (step, rank).

    Parameters
    ----------
    path : str or Path
    report : LoadReport, optional
        Receives folders that cannot be listed and files skipped because of their path (step
        or rank out of range).

    Returns
    -------
    list of KernelItem
        Sorted by (step, rank).

    Raises
    ------
    NotADumpError
        When no statistic.csv is found.
    """
    p = Path(path)
    try:
        exists = p.exists()
    except OSError as exc:
        raise NotADumpError(f"{p}: cannot access: {exc.strerror or exc}") from None
    if not exists:
        from precnb.io._why import missing_reason

        raise NotADumpError(f"{p}: {missing_reason(p)}")
    if is_file(p):
        if not is_statistic_header(read_header(p)):
            raise NotADumpError(f"{p}: not a MindSpore statistic.csv (header lacks "
                                f"{', '.join(REQUIRED_COLUMNS)})")
        files = [p]
    else:
        unreadable: list[tuple[str, str]] = []
        files = find_csvs(p, unreadable)
        if report is not None:
            report.skipped.extend(unreadable)
        if not files and unreadable:
            reasons = "; ".join(f"{q}: {r}" for q, r in unreadable[:3])
            raise NotADumpError(f"{p}: no statistic.csv could be found ({reasons})")
    if not files:
        raise NotADumpError(f"{p}: no MindSpore kernel dump found (expected "
                            "rank_*/<net>/<graph>/<iteration>/statistic.csv)")
    groups: dict[tuple[int, int], list[Path]] = defaultdict(list)
    for f in files:
        key = _step_rank_of(f)
        if key is None:
            if report is not None:
                report.skipped.append((str(f), f"step or rank number out of range (0..{MAX_INDEX})"))
            continue
        groups[key].append(f)
    if not groups:
        raise NotADumpError(f"{p}: no statistic.csv with a usable step and rank")
    if report is not None:  # rank_1 beside rank_01, iteration 0 beside 00: one file per (net, graph)
        for key, fs in groups.items():
            numbered = [(f"{f.parent.parent.parent.name}/{f.parent.parent.name}", f) for f in fs]
            if len({k for k, _ in numbered}) < len(numbered):
                kept = keep_one_per_number(numbered, f"step {key[0]} rank {key[1]} graph", lambda n: "",
                                           report, name=_spelling)
                groups[key] = [f for _, f in kept]
    return [KernelItem(s, r, tuple(sorted(fs, key=_graph_key)))
            for (s, r), fs in sorted(groups.items())]


def _spelling(f: Path) -> str:
    """"" for a canonically spelled path (no leading zeros in rank, graph and iteration), else the path."""
    m = next((m for q in f.parents if (m := RANK_DIR.match(q.name))), None)
    numbers = [f.parent.name, f.parent.parent.name, m.group(1) if m else "0"]
    return "" if all(n == str(int(n)) for n in numbers if n.isdigit()) else str(f)
