"""Rank tables: which host and device served each rank of a job.

Two formats are read:

* Ascend's HCCL ``rank_table_file`` (JSON): ``server_list[].server_id`` is the host,
  ``server_list[].device[].device_id`` the device on it and ``rank_id`` the global rank;
* a CSV with the header ``rank,host,device`` (other columns are ignored).

:func:`read_rank_table` returns ``{rank: {"host": str, "device": str}}``; a table that cannot
be used raises :class:`RankTableError`, one line naming the file and what is wrong (a missing
field, a rank given twice, one device serving two ranks, ...).

Examples
--------
>>> import precnb
>>> t = read_rank_table(precnb.sample_path("sdc/rank_tables/job2.json"))
>>> t[2]
{'host': '10.0.0.1', 'device': '1'}
>>> read_rank_table(precnb.sample_path("sdc/rank_tables/job2.csv")) == t
True
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from precnb.errors import PrecnbError

__all__ = ["MAX_RANK", "RankTableError", "check_covers", "normalise_table", "read_rank_table", "within_run"]

_MAX_BYTES = 64 * 2**20  # a rank table of a million ranks stays far below this


class RankTableError(PrecnbError):
    """A rank table that cannot be read or used (the message names the file and the problem)."""


#: the largest rank a table may name (HCCL ranks are 32-bit; 10**30 used to overflow later)
MAX_RANK = 2**31 - 1


def _rank(value: Any, where: str, name: str) -> int:
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is None or not (text.isascii() and text.isdigit()):  # "²".isdigit() is True
        raise RankTableError(f"{name}: {where}: rank {str(value)[:40]!r} is not a non-negative integer")
    if len(text) > 10 or int(text) > MAX_RANK:
        raise RankTableError(f"{name}: {where}: rank {text[:40]} is larger than any job's ({MAX_RANK})")
    return int(text)


def _text(value: Any, where: str, what: str, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise RankTableError(f"{name}: {where}: no {what}")
    return str(value).strip()


def _build(entries: Iterable[tuple[Any, Any, Any, str]], name: str) -> dict[int, dict[str, str]]:
    out: dict[int, dict[str, str]] = {}
    served: dict[tuple[str, str], int] = {}
    for rank_v, host_v, dev_v, where in entries:
        rank = _rank(rank_v, where, name)
        host, dev = _text(host_v, where, "host", name), _text(dev_v, where, "device", name)
        if rank in out:
            raise RankTableError(f"{name}: {where}: rank {rank} is given twice")
        if (host, dev) in served:
            raise RankTableError(f"{name}: {where}: device {host}:{dev} serves rank {served[(host, dev)]} and "
                                 f"rank {rank}")
        served[(host, dev)] = rank
        out[rank] = {"host": host, "device": dev}
    if not out:
        raise RankTableError(f"{name}: the rank table lists no rank")
    return dict(sorted(out.items()))


def _from_hccl(doc: Any, name: str) -> dict[int, dict[str, str]]:
    if not isinstance(doc, dict) or not isinstance(doc.get("server_list"), list):
        raise RankTableError(f"{name}: not an HCCL rank table (no server_list list)")

    def entries() -> Iterable[tuple[Any, Any, Any, str]]:
        for i, server in enumerate(doc["server_list"]):
            if not isinstance(server, dict) or not isinstance(server.get("device"), list):
                raise RankTableError(f"{name}: server_list[{i}]: no device list")
            for j, dev in enumerate(server["device"]):
                where = f"server_list[{i}].device[{j}]"
                if not isinstance(dev, dict):
                    raise RankTableError(f"{name}: {where}: not an object")
                for key in ("rank_id", "device_id"):
                    if key not in dev:
                        raise RankTableError(f"{name}: {where}: no {key}")
                if "server_id" not in server:
                    raise RankTableError(f"{name}: server_list[{i}]: no server_id")
                yield dev["rank_id"], server["server_id"], dev["device_id"], where

    return _build(entries(), name)


def _from_csv(text: str, name: str) -> dict[int, dict[str, str]]:
    try:
        return _csv_table(text, name)
    except csv.Error as exc:  # a field larger than the field limit, a NUL byte, ...
        line = exc.args[1] if len(exc.args) > 1 else None
        raise RankTableError(f"{name}: malformed CSV{f' at line {line}' if line else ''}: {exc.args[0]}") from None


def _csv_table(text: str, name: str) -> dict[int, dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    try:
        fields = reader.fieldnames
    except csv.Error as exc:
        raise csv.Error(str(exc), 1) from None
    header = [h.strip().lower() for h in (fields or [])]
    missing = [h for h in ("rank", "host", "device") if h not in header]
    if missing:
        raise RankTableError(f"{name}: CSV header {','.join(header) or '(empty)'} lacks {', '.join(missing)} "
                             "(expected rank,host,device)")
    reader.fieldnames = header

    def entries() -> Iterable[tuple[Any, Any, Any, str]]:
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                raise csv.Error(str(exc), reader.line_num + 1) from None  # the row being read
            if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
                continue
            yield row.get("rank"), row.get("host"), row.get("device"), f"line {reader.line_num}"

    return _build(entries(), name)


def read_rank_table(path: str | os.PathLike[str]) -> dict[int, dict[str, str]]:
    """Read an HCCL ``rank_table_file`` JSON or a ``rank,host,device`` CSV.

    Parameters
    ----------
    path : path-like
        The table. JSON is recognised by its content (a leading ``{``), anything else is read as CSV.

    Returns
    -------
    dict
        ``{rank: {"host": ..., "device": ...}}``, by rank.

    Raises
    ------
    RankTableError
        When the file cannot be read, is neither format, or lists a rank twice or one device for two ranks.
    """
    from precnb.errors import DumpFormatError
    from precnb.io._fs import check_depth, read_text_input

    name = str(path)
    try:  # the input-safety layer: a regular file (never a FIFO), _MAX_BYTES at most, UTF-8 named by position
        text = read_text_input(path, _MAX_BYTES, what="rank table")
        if text.lstrip().startswith("{") or (Path(path).suffix.lower() == ".json" and not text.strip()):
            if not text.strip():
                raise RankTableError(f"{name}: empty file (expected an HCCL rank table JSON object)")
            check_depth(text, path)
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as exc:
                raise RankTableError(f"{name}: not valid JSON at line {exc.lineno} column {exc.colno}: "
                                     f"{exc.msg}") from None
            except (ValueError, RecursionError) as exc:
                raise RankTableError(f"{name}: not valid JSON ({exc})") from None
            return _from_hccl(doc, name)
    except DumpFormatError as exc:
        raise RankTableError(str(exc)) from None
    return _from_csv(text, name)


def normalise_table(table: Any, *, name: str = "rank table") -> dict[int, dict[str, str]]:
    """A table given as a path, or as a mapping ``{rank: {"host", "device"}}`` / ``{rank: (host, device)}``.

    Examples
    --------
    >>> normalise_table({"0": ("h1", 0), 1: {"host": "h1", "device": "1"}})
    {0: {'host': 'h1', 'device': '0'}, 1: {'host': 'h1', 'device': '1'}}
    """
    if isinstance(table, (str, os.PathLike)):
        return read_rank_table(table)
    if not isinstance(table, Mapping):
        raise RankTableError(f"{name}: a rank table is a path or a mapping rank -> (host, device), "
                             f"not {type(table).__name__}")

    def entries() -> Iterable[tuple[Any, Any, Any, str]]:
        for rank, dev in table.items():
            where = f"rank {rank}"
            if isinstance(dev, Mapping):
                yield rank, dev.get("host"), dev.get("device"), where
            elif isinstance(dev, (tuple, list)) and len(dev) == 2:
                yield rank, dev[0], dev[1], where
            else:
                raise RankTableError(f"{name}: {where}: expected (host, device), got {dev!r}")

    return _build(entries(), name)


def within_run(table: Mapping[int, dict[str, str]], ranks: Iterable[int], *, notes: list[str] | None = None,
               name: str = "rank table") -> dict[int, dict[str, str]]:
    """The entries of *table* for the run's *ranks* only: a table names at most the job's ranks.

    A cluster's table beside a dump of a few ranks names ranks the run does not have: they are left out
    (a 1,000,000-row table beside a 4-rank run listed 1,000,000 phantom "CLEAN" devices, issue #49), and
    said: one note in *notes* naming the table and how many rows were ignored (:func:`extra_rows_note`).

    Examples
    --------
    >>> notes = []
    >>> within_run({0: {}, 1: {}, 7: {}}, [0, 1], notes=notes, name="t.csv")
    {0: {}, 1: {}}
    >>> notes
    ['rank table t.csv: 1 row(s) ignored: they place ranks the run does not have (rank 7; the run has ranks 0-1)']
    """
    keep = set(int(r) for r in ranks)
    kept = {r: d for r, d in table.items() if r in keep}
    if notes is not None and len(kept) < len(table):
        notes.append(extra_rows_note(name, sorted(set(table) - keep), sorted(keep)))
    return kept


NOTE_PREFIX = "rank table "
"""Notes about a rank table start with this (the command line prints them on stderr)."""


def _span(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    return ", ".join(map(str, ranks[:6])) + (f" ... ({len(ranks)})" if len(ranks) > 6 else "")


def extra_rows_note(name: str, extra: list[int], run: list[int]) -> str:
    """The note for rows of table *name* that place ranks (*extra*) the run (ranks *run*) does not have."""
    which = f"rank {extra[0]}" if len(extra) == 1 else f"ranks {_span(extra)}"
    return (f"{NOTE_PREFIX}{name}: {len(extra)} row(s) ignored: they place ranks the run does not have "
            f"({which}; the run has ranks {_span(run)})")


def check_covers(table: Mapping[int, Any], ranks: Iterable[int], *, name: str = "rank table") -> None:
    """Raise :class:`RankTableError` when the run holds a rank the table does not place.

    Examples
    --------
    >>> check_covers({0: {}, 1: {}}, [0, 1, 2], name="t.csv")
    Traceback (most recent call last):
    ...
    precnb.io.rank_table.RankTableError: t.csv: the run has rank 2, the table places ranks 0-1 only
    """
    missing = sorted(set(int(r) for r in ranks) - set(table))
    if missing:
        have = sorted(table)
        span = f"{have[0]}-{have[-1]}" if have == list(range(have[0], have[-1] + 1)) else ", ".join(map(str, have[:8]))
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise RankTableError(f"{name}: the run has rank {missing[0]}{more}, the table places ranks {span} only")
