"""Open an msprobe dump: discover the (step, rank) folders, parse them, assemble the dataset.

:class:`MsprobeLoad` folds parsed folders into an :class:`~precnb.io._assemble.Assembler` in item
order; :func:`open_msprobe` loads everything at once and :func:`stream_msprobe` hands the run over
one step at a time (what :func:`precnb.to_zarr` writes without holding the whole run).
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from precnb.errors import NotADumpError
from precnb.io._assemble import Assembler, LoadReport
from precnb.io._gc import paused_gc
from precnb.io._memory import check_memory
from precnb.io.executor import parse_files
from precnb.io.msprobe.discover import RankDir, discover
from precnb.io.msprobe.parse import read_rank_dir
from precnb.io.msprobe.release import release_range, release_text

__all__ = ["MsprobeLoad", "available_steps", "open_msprobe", "select_rank_dirs", "stream_msprobe"]

#: memory per byte of dump.json: what the dataset keeps, and the transient peak of parsing one file
#: (benchmarks/bench_large.py measures the peak of a one-file load)
KEPT_PER_BYTE, PARSE_PER_BYTE = 1.0, 1.5


def select_rank_dirs(path: Path, report: LoadReport, steps: Sequence[int] | None,
                     ranks: Sequence[int] | None) -> list[RankDir]:
    """The (step, rank) folders below *path*, restricted to *steps* and *ranks* (the others are not listed)."""
    if steps is None and ranks is None:
        return discover(path, report)
    try:
        dirs = discover(path, report, steps=steps, ranks=ranks)
    except NotADumpError:
        dirs = []
    if not dirs:
        discover(path, LoadReport())  # nothing there at all: its own message, else the selection's
        raise NotADumpError(f"{path}: no (step, rank) folder matches the selection")
    return dirs


def _read_dir(rd: RankDir, shared: frozenset[int]) -> Any:
    """:func:`read_rank_dir`, with the scalar-argument checksums only for a step that other files share."""
    return read_rank_dir(rd, signatures=rd.step in shared)


class MsprobeLoad:
    """Parse msprobe rank folders into an :class:`Assembler`, in item order (shared by the streaming writer)."""

    def __init__(self, path: Path, dirs: Sequence[RankDir], report: LoadReport) -> None:
        self.path, self.dirs, self.report = path, list(dirs), report
        self.acc = Assembler(steps=[d.step for d in dirs], ranks=[d.rank for d in dirs])
        self.comm_groups: dict[str, str] = {}
        self.release_facts: dict[tuple[tuple[str, Any], ...], None] = {}  # distinct facts of the files read
        self.n_read = 0

    def read(self, dirs: Sequence[RankDir], *, offset: int = 0, errors: Any = "report", client: Any = None,
             progress: bool | None = None, workers: int | str | None = None) -> None:
        """Parse *dirs* (item numbers start at *offset*) and fold them in."""
        def consume(i: int, rec: Any) -> None:
            for g, node in rec.meta.get("comm_groups", {}).items():
                self.comm_groups.setdefault(g, node)
            self.report.warnings.extend(rec.meta.get("warnings", ()))
            self.report.unread.extend(tuple(u) for u in rec.meta.get("unread", ()))
            self.report.unread_count += int(rec.meta.get("unread_count", 0))
            self.release_facts[tuple(sorted(rec.meta.get("release_facts", {}).items()))] = None
            self.acc.add(rec, order=offset + i)
            self.n_read += 1

        # the checksums are compared between the ranks of a step (rank-dependent calls): not taken for a step
        # that one file holds (a large single dump.json spends a sixth of its parse on them otherwise)
        shared = frozenset(s for s, n in Counter(d.step for d in self.dirs).items() if n > 1)
        parse_files(dirs, functools.partial(_read_dir, shared=shared), describe=lambda d: str(d.dump_file),
                    report=self.report, errors=errors, client=client, progress=progress, consume=consume,
                    workers=workers)

    def check_any(self) -> None:
        """Raise :class:`NotADumpError` when no file could be read."""
        if not self.n_read:
            reasons = "; ".join(r if r.startswith(p) else f"{p}: {r}" for p, r in self.report.skipped[:3])
            raise NotADumpError(f"{self.path}: no dump file could be read ({reasons})")

    def attrs(self) -> dict[str, Any]:
        """Reader attributes: source, rank folders, communication groups, load report."""
        rank_dirs = {d.key: str(d.path) for d in self.dirs}
        candidates, evidence = release_range(dict(f) for f in self.release_facts)
        return {"source": str(self.path), "rank_dirs": json.dumps(rank_dirs),
                "comm_groups": json.dumps([{"ranks": json.loads(g), "node": n} for g, n in self.comm_groups.items()]),
                "load_report": json.dumps(self.report.to_dict()),
                "msprobe_release": release_text(candidates),
                "msprobe_release_evidence": json.dumps({"candidates": candidates, "evidence": evidence})}


def _sizes(dirs: Sequence[RankDir]) -> list[tuple[str, int]]:
    out = []
    for d in dirs:
        try:
            out.append((str(d.dump_file), d.dump_file.stat().st_size))
        except OSError:
            continue
    return out


def open_msprobe(path: Path, *, errors: Any = "report", client: Any = None, progress: bool | None = None,
                 steps: Sequence[int] | None = None, ranks: Sequence[int] | None = None,
                 workers: int | str | None = None, **_: Any) -> xr.Dataset:
    """Open an msprobe dump (see :func:`precnb.open_run`)."""
    report = LoadReport()
    dirs = select_rank_dirs(path, report, steps, ranks)
    check_memory(path, _sizes(dirs), KEPT_PER_BYTE, PARSE_PER_BYTE, what="dump.json")
    with paused_gc():  # parsing and assembling build millions of acyclic objects (see precnb.io._gc)
        load = MsprobeLoad(path, dirs, report)
        load.read(dirs, errors=errors, client=client, progress=progress, workers=workers)
        load.check_any()
        return load.acc.build(source_format="msprobe", attrs=load.attrs())


def available_steps(path: Path, ranks: Sequence[int] | None = None) -> list[int]:
    """The steps of the dump's ``step*/rank*`` folders (no file is parsed)."""
    try:
        dirs = discover(path, LoadReport(), ranks=ranks, first=True)  # one rank folder per step tells
    except NotADumpError:
        if ranks is None:
            raise
        discover(path, LoadReport())  # nothing there at all: its message; else none of these ranks
        return []
    return sorted({d.step for d in dirs})


def stream_msprobe(path: Path, *, errors: Any = "report", client: Any = None, progress: bool | None = None,
                   steps: Sequence[int] | None = None, ranks: Sequence[int] | None = None,
                   workers: int | str | None = None) -> Iterator[tuple[Any, ...]]:
    """Yield ``("ranks", ranks)``, then ``("step", step, arrays, tensor coords)`` per step, then ``("attrs", attrs)``.

    Each step's folders are parsed and materialised before the next step is read, so memory
    holds one step (see :func:`precnb.io.store.to_zarr`).
    """
    report = LoadReport()
    dirs = select_rank_dirs(path, report, steps, ranks)
    by_step: dict[int, list[RankDir]] = {}
    for d in dirs:
        by_step.setdefault(d.step, []).append(d)
    check_memory(path, max((_sizes(v) for v in by_step.values()), key=lambda s: sum(b for _, b in s)),
                 KEPT_PER_BYTE, PARSE_PER_BYTE, what="dump.json (one step)")
    load = MsprobeLoad(path, dirs, report)
    rank_vals = sorted({d.rank for d in dirs})
    yield "ranks", np.asarray(rank_vals, np.int64)
    for step in sorted(by_step):
        first = next(i for i, d in enumerate(dirs) if d.step == step)
        load.read(by_step[step], offset=first, errors=errors, client=client, progress=progress, workers=workers)
        # views of the assembler's columns (a one-record step: the record's own), written before the next step
        yield "step", step, load.acc.take_steps([step], rank_vals), load.acc.tensor_coords(copy=False)
    load.acc.release()  # the columns are in the store: only the side tables are left to write
    load.check_any()
    yield "attrs", load.acc.attrs("msprobe", load.attrs())
