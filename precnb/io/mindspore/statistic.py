"""Reader for MindSpore native kernel dumps (O0/O1 "kbyk" dump, ``statistic.csv``).

Layout::

    <root>/rank_{id}/{net_name}/{graph_id}/{iteration}/statistic.csv

*path* may be the root, a ``rank_{id}`` folder, an iteration folder or a single
``statistic.csv`` (any file name: the header is checked). Step and rank come from the path
(``{iteration}`` and ``rank_{id}``) and default to 0 when the path does not carry them. The
graphs of one (iteration, rank) are read into one (step, rank) record, ordered by graph id.

Columns: the fixed prefix ``Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,
Data Type,Shape`` and then one column per statistic category. ``Max Value``, ``Min Value``,
``Avg Value`` and ``L2Norm Value`` become ``max``, ``min``, ``mean`` and ``norm`` (null
where the column is missing or the cell is ``null``); the count columns become extra float64
variables (``count``, ``neg_zero_count``, ``pos_zero_count``, ``nan_count``,
``neg_inf_count``, ``pos_inf_count``, ``zero_count``); ``MD5`` (else ``SHA1``) becomes the
``crc`` string variable. ``True``/``False`` cells are read as 1.0/0.0. Rows may end with a
trailing comma.

Tensors are labelled ``"{op_name}.{io}.{slot}"``; a label that repeats within a (step, rank)
gets ``.1``, ``.2``, ... in row order. ``node`` is the op name, ``api`` the op type, ``role``
the IO column, ``kind`` ``"kernel"``, ``direction`` ``"forward"``; ``module`` is the scope
before the last ``/`` of the op name (``""`` for ``_``-separated names such as
``Default_Sub-op0``). ``seq`` is the row order.

A statistic.csv that cannot be read (not UTF-8, a missing required column, a row with the
wrong number of fields, a non-numeric statistic) is skipped and named in the load report with
its line; the other graphs and ranks still load. Step, rank and graph numbers are ASCII
digits below 2**31 (a file whose path carries a larger one is reported and skipped). The
search depth is fixed, so symlink loops cannot make it run away.

Examples
--------
>>> is_kernel_dump("/nonexistent")
False
>>> kernel_label_parts("Default/network-Net/Sub-op0")
('Default/network-Net', 'Sub-op0')
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import xarray as xr

from precnb.errors import DumpFormatError, NotADumpError
from precnb.io._assemble import FileRecords, LoadReport, RecordBuilder, assemble, select_items
from precnb.io._csvutil import iter_rows, parse_float, parse_shape, read_header, short_repr
from precnb.io.executor import parse_files
from precnb.io.mindspore._stat_discover import (
    REQUIRED_COLUMNS,
    KernelItem,
    discover,
    find_csvs,
    is_statistic_header,
)
from precnb.io.readers import Reader

__all__ = ["KernelItem", "discover", "is_kernel_dump", "kernel_label_parts", "open_kernel_dump",
           "read_kernel_item", "read_statistic_csv"]

FIXED_COLUMNS = ("Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot",
                 "Data Size", "Data Type", "Shape")
STAT_COLUMNS: dict[str, str] = {
    "Max Value": "max",
    "Min Value": "min",
    "Avg Value": "mean",
    "L2Norm Value": "norm",
    "Count": "count",
    "Negative Zero Count": "neg_zero_count",
    "Positive Zero Count": "pos_zero_count",
    "NaN Count": "nan_count",
    "Negative Inf Count": "neg_inf_count",
    "Positive Inf Count": "pos_inf_count",
    "Zero Count": "zero_count",
}
HASH_COLUMNS = ("MD5", "SHA1")


def kernel_label_parts(op_name: str) -> tuple[str, str]:
    """Split an op name into ``(scope, short name)`` on its last ``/``.

    Parameters
    ----------
    op_name : str

    Returns
    -------
    (str, str)
        The scope is ``""`` for names without ``/`` (``Default_Sub-op0``).

    Examples
    --------
    >>> kernel_label_parts("Default_Sub-op0")
    ('', 'Default_Sub-op0')
    """
    scope, _, short = op_name.rpartition("/")
    return scope, short


def is_kernel_dump(path: str | Path) -> bool:
    """Whether *path* is a MindSpore kernel dump (root, rank folder or statistic.csv).

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    bool

    Examples
    --------
    >>> is_kernel_dump("/nonexistent")
    False
    """
    p = Path(path)
    try:
        if p.is_file():
            return p.suffix.lower() == ".csv" and is_statistic_header(read_header(p))
        if not p.is_dir():
            return False
        return next(iter(find_csvs(p)), None) is not None
    except OSError:
        return False


def _cell_float(cell: str, column: str, path: Path, line: int) -> float | None:
    try:
        return parse_float(cell)
    except ValueError:
        raise DumpFormatError(
            path, f"line {line}: column {column!r}: {short_repr(cell)} is not a number") from None


def read_statistic_csv(path: str | Path) -> list[dict[str, Any]]:
    """Parse one statistic.csv into row dicts.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    list of dict
        Keys ``op_type, op_name, io, slot, dtype, shape, stats, crc, sha1, line``.

    Raises
    ------
    DumpFormatError
        On a missing required column, a row with the wrong number of fields or a
        non-numeric statistic, naming the line.
    """
    path = Path(path)
    rows = iter_rows(path)
    first = next(rows, None)
    if first is None:
        raise DumpFormatError(path, "empty file (no header)")
    header = [h.strip() for h in first[1]]
    while header and not header[-1]:  # a trailing comma on the header line
        header.pop()
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise DumpFormatError(
            path, f"line 1: not a MindSpore statistic.csv: header lacks {missing}")
    col = {h: i for i, h in enumerate(header)}
    stat_cols: list[tuple[str, int, str]] = []
    for h, i in col.items():
        if h in FIXED_COLUMNS or h in HASH_COLUMNS:
            continue
        name = STAT_COLUMNS.get(h) or re.sub(r"[^0-9a-z]+", "_", h.lower()).strip("_") or f"col{i}"
        stat_cols.append((h, i, name))
    n = len(header)
    out: list[dict[str, Any]] = []
    for line, row in rows:
        if len(row) != n:
            if len(row) > n and not any(c.strip() for c in row[n:]):
                row = row[:n]  # trailing comma(s)
            else:
                raise DumpFormatError(path, f"line {line}: expected {n} fields as in the header "
                                            f"(plus an optional trailing comma), got {len(row)}")
        op_name = row[col["Op Name"]].strip()
        if not op_name:
            raise DumpFormatError(path, f"line {line}: empty 'Op Name'")
        stats = {name: _cell_float(row[i], h, path, line) for h, i, name in stat_cols}
        hashes = {h: row[col[h]].strip() for h in HASH_COLUMNS if h in col}
        hashes = {h: v for h, v in hashes.items() if v and v.lower() not in ("null", "none", "n/a")}
        out.append({
            "op_type": row[col["Op Type"]].strip(),
            "op_name": op_name,
            "io": row[col["IO"]].strip(),
            "slot": row[col["Slot"]].strip(),
            "dtype": row[col["Data Type"]].strip() if "Data Type" in col else "",
            "shape": parse_shape(row[col["Shape"]]) if "Shape" in col else None,
            "stats": stats,
            "crc": hashes.get("MD5", hashes.get("SHA1")),
            "sha1": hashes.get("SHA1") if "MD5" in hashes else None,
            "line": line,
            "has_hash": any(h in col for h in HASH_COLUMNS),
        })
    return out


def read_kernel_item(item: KernelItem) -> FileRecords:
    """Parse the statistic.csv files of one (step, rank) into columnar records.

    A broken file among several graphs is listed in ``meta["skipped"]`` and the others are
    still read; when every file is broken the first error is raised.

    Parameters
    ----------
    item : KernelItem

    Returns
    -------
    FileRecords

    Raises
    ------
    DumpFormatError
        When no file of the item could be read.
    """
    parsed: list[dict[str, Any]] = []
    skipped: list[tuple[str, str]] = []
    first_error: DumpFormatError | None = None
    read: list[str] = []
    for f in item.files:
        try:
            parsed += read_statistic_csv(f)
            read.append(str(f))
        except DumpFormatError as exc:
            first_error = first_error or exc
            skipped.append((str(f), exc.message))
    if first_error is not None and not read:
        raise first_error
    extra: list[str] = []
    for r in parsed:
        extra += [k for k in r["stats"] if k not in extra]
    b = RecordBuilder(item.step, item.rank, extra_stats=extra)
    counts: dict[str, int] = {}
    sha1: list[str] = []
    any_hash = any(r["has_hash"] for r in parsed)
    for r in parsed:
        label = f"{r['op_name']}.{r['io']}.{r['slot']}"
        k = counts.get(label, 0)
        counts[label] = k + 1
        if k:
            label = f"{label}.{k}"
        scope, _ = kernel_label_parts(r["op_name"])
        b.add(label, r["stats"], shape=r["shape"],
              crc=(r["crc"] or "") if any_hash else None,
              node=r["op_name"], module=scope, api=r["op_type"], kind="kernel",
              direction="forward", role=r["io"], dtype=r["dtype"])
        sha1.append(r["sha1"] or "")
    rec = b.build(meta={"framework": "mindspore", "task": "statistics", "path": item.path,
                        "skipped": skipped, "read": read})
    rec.null_stats = rec.null_stats & np.uint8(0x0F)  # schema bits: max, min, mean, norm only
    if any(sha1):
        rec.strings["sha1"] = sha1
    return rec


def open_kernel_dump(
    path: str | Path,
    *,
    errors: Literal["report", "raise"] = "report",
    client: Any = None,
    progress: bool | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    workers: int | str | None = None,
) -> xr.Dataset:
    """Open a MindSpore kernel dump (statistic.csv) as a canonical dataset.

    Parameters
    ----------
    path : str or Path
        The dump root, a ``rank_{id}`` folder, an iteration folder or one statistic.csv.
    errors : {"report", "raise"}
        ``"report"`` skips unreadable files (see ``precnb.load_report(ds)``); ``"raise"``
        stops at the first one.
    client : dask.distributed.Client, optional
        Parse on this cluster, one task per (step, rank).
    progress : bool, optional
        Force the progress bar on or off.
    steps, ranks : sequence of int, optional
        Load only these.
    workers : int, "auto" or None
        Local worker processes when there is no client (see :func:`precnb.open_run`).

    Returns
    -------
    xarray.Dataset
        ``kind == "kernel"``; attrs ``rank_dirs`` (JSON ``"step,rank"`` → files) and
        ``load_report``.

    Raises
    ------
    NotADumpError
        When nothing could be read.

    Examples
    --------
    >>> ds = open_kernel_dump("dump/rank_0")  # doctest: +SKIP
    """
    report = LoadReport()
    items = select_items(discover(path, report), steps, ranks)
    if not items:
        raise NotADumpError(f"{path}: no statistic.csv matches the selection")
    recs = parse_files(items, read_kernel_item, describe=lambda i: i.path, report=report,
                       errors=errors, client=client, progress=progress, workers=workers)
    for rec in recs:
        if rec.meta.get("skipped"):
            report.skipped.extend(rec.meta["skipped"])
            # the item was described as all its files: list the files actually read
            desc = rec.meta["path"]
            if desc in report.read:
                report.read.remove(desc)
                report.read.extend(rec.meta["read"])
    if not recs:
        reasons = "; ".join(f"{p}: {r}" for p, r in report.skipped[:3])
        raise NotADumpError(f"{path}: no statistic.csv could be read ({reasons})")
    if errors == "raise" and report.skipped:
        p, r = report.skipped[0]
        raise DumpFormatError(p, r)
    ds = assemble(
        recs,
        source_format="kernel",
        steps=[i.step for i in items],
        ranks=[i.rank for i in items],
        attrs={
            "source": str(path),
            "rank_dirs": json.dumps({f"{i.step},{i.rank}": i.path for i in items}),
            "load_report": json.dumps(report.to_dict()),
        },
    )
    return ds


def _open(path: Path, **options: Any) -> xr.Dataset:
    keep = ("errors", "client", "progress", "steps", "ranks", "workers")
    return open_kernel_dump(path, **{k: options[k] for k in keep if k in options})


READER = Reader(name="kernel", can_open=is_kernel_dump, open=_open,
                description="MindSpore kernel dump (statistic.csv or .npy tensors)",
                detect_priority=30)
