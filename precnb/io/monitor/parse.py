"""Parsing one monitor CSV file into partial per-step records (:func:`read_monitor_csv`)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from precnb.errors import DumpFormatError
from precnb.io._assemble import FileRecords, RecordBuilder
from precnb.io._csvutil import iter_rows, parse_float, parse_shape, short_repr
from precnb.io.monitor._names import (
    _DIRECTION,
    _FIXED_COLUMNS,
    _IO_NAME,
    _KNOWN_OPS,
    _MAX_INDEX,
    _MAX_MICRO,
    _PARAM_ROLE,
    _RESERVED,
    _SEQ_FAMILY,
    _SEQ_MICRO,
    _V2_SCOPES,
    FAMILY_RANK,
    family_rank,
)
from precnb.io.monitor.discover import MonitorFile
from precnb.schema import STATS

# (step, family, vpp, name, micro, stats, shape, dtype) of one CSV row
_Row = tuple[int, str, int, str, int, dict[str, float | None], list[int] | None, str, int]


def _stat_name(column: str) -> str:
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", column.strip()).strip("_").lower() or "op"
    if name[0].isdigit() or name in _RESERVED:
        name = f"op_{name}"
    return name


def _int_cell(cell: str, column: str, path: Path, line: int, default: int | None = None,
              lo: int = 0, hi: int = _MAX_INDEX) -> int:
    s = cell.strip()
    if not s and default is not None:
        return default
    v: int | None = None
    if len(s) <= 24:
        try:
            v = int(s)
        except ValueError:
            try:
                f = float(s)
            except ValueError:
                f = math.nan
            if f.is_integer():
                v = int(f)
    if v is None:
        raise DumpFormatError(path, f"line {line}: column {column!r}: {short_repr(cell)} is not an integer")
    if not lo <= v <= hi:
        raise DumpFormatError(path, f"line {line}: column {column!r}: {v} is out of range ({lo}..{hi})")
    return v


def _describe(family: str, name: str) -> tuple[str, str, str]:
    """Return ``(module, direction, role)`` of a monitor row."""
    direction = _DIRECTION.get(family, "forward" if family.endswith("_hook") else "")
    if family in _PARAM_ROLE:
        return name.rpartition(".")[0], direction, _PARAM_ROLE[family]
    if family in ("actv", "actv_grad") or family.endswith("_hook"):
        m = _IO_NAME.match(name)
        module = m["module"] if m else name
        role = (m["io"] if m else "") if family == "actv" else "grad" if family == "actv_grad" else ""
        return module, direction, role
    return "", direction, ""


def read_monitor_csv(item: MonitorFile) -> list[FileRecords]:  # noqa: C901
    """Parse one monitor CSV file into one partial record per step.

    The records carry provisional labels; :func:`open_monitor` relabels them once the
    whole load is known (vpp prefix, micro suffix) and merges the files of a (step, rank).

    Parameters
    ----------
    item : MonitorFile

    Returns
    -------
    list of FileRecords
        One per step found in the file; ``meta["parts"]`` holds ``(family, vpp, name, micro, line)``
        per row.

    Raises
    ------
    DumpFormatError
        On a missing column, a row with the wrong number of fields, or a non-numeric value in
        a numeric column, naming the line.
    """
    path = item.path
    rows = iter_rows(path)
    first = next(rows, None)
    if first is None:
        raise DumpFormatError(path, "empty file (no header)")
    header = [h.strip() for h in first[1]]
    while header and not header[-1]:
        header.pop()
    col = {h: i for i, h in enumerate(header)}
    if len(col) != len(header):
        dup = sorted({h for h in header if header.count(h) > 1})
        raise DumpFormatError(path, f"line 1: duplicate column(s) {dup}")
    name_col = "module_name" if "module_name" in col else "name"
    required = ["step", name_col]
    if item.version == "v2" and item.family != "cc":
        required.append("scope")
    missing = [c for c in required if c not in col]
    if missing:
        raise DumpFormatError(path, f"line 1: not a monitor CSV: header lacks {missing} "
                                    f"(header: {','.join(header)})")
    stat_cols = [(h, i, _stat_name(h)) for h, i in col.items() if h not in _FIXED_COLUMNS]
    names = [s for _, _, s in stat_cols]
    if len(set(names)) != len(names):
        raise DumpFormatError(path, f"line 1: op columns {[h for h, _, _ in stat_cols]} clash")
    want = set(item.steps) if item.steps is not None else None
    n = len(header)
    warnings: list[str] = []
    bad: set[str] = set()
    parsed: list[_Row] = []
    micros: dict[str, set[int]] = defaultdict(set)
    for line, row in rows:
        if len(row) != n:
            if len(row) > n and not any(c.strip() for c in row[n:]):
                row = row[:n]
            else:
                raise DumpFormatError(path, f"line {line}: expected {n} fields as in the header, "
                                            f"got {len(row)}")
        step = _int_cell(row[col["step"]], "step", path, line)
        if want is not None and step not in want:
            continue
        vpp = (_int_cell(row[col["vpp_stage"]], "vpp_stage", path, line, 0)
               if "vpp_stage" in col else 0)
        micro = (_int_cell(row[col["micro_step"]], "micro_step", path, line, -1, lo=-1, hi=_MAX_MICRO)
                 if "micro_step" in col else -1)
        name = row[col[name_col]].strip()
        if not name:
            raise DumpFormatError(path, f"line {line}: empty {name_col!r}")
        if item.version == "v1":
            family = item.family
        elif item.family == "cc":
            family = "cc"
        else:
            scope = row[col["scope"]].strip()
            family = _V2_SCOPES.get((item.family, scope), "")
            if not family:
                family = scope if scope in FAMILY_RANK else f"{item.family}_{scope}"
                msg = f"{path}: unknown scope {scope!r} for {item.family}; family {family!r}"
                if msg not in warnings:
                    warnings.append(msg)
        stats: dict[str, float | None] = {}
        for header_name, i, stat in stat_cols:
            if stat in bad:
                continue
            try:
                stats[stat] = parse_float(row[i])
            except ValueError:
                if header_name in _KNOWN_OPS:
                    raise DumpFormatError(path, f"line {line}: column {header_name!r}: {short_repr(row[i])} "
                                                "is not a number") from None
                bad.add(stat)
        shape = parse_shape(row[col["shape"]]) if "shape" in col else None
        dtype = row[col["dtype"]].strip() if "dtype" in col else ""
        if dtype.lower() in ("nan", "n/a", "none", "null"):
            dtype = ""
        if micro >= 0:
            micros[family].add(micro)
        parsed.append((step, family, vpp, name, micro, stats, shape, dtype, line))
    for stat in sorted(bad):
        warnings.append(f"{path}: column {stat!r} is not numeric; not loaded")
    extra = [s for s in names if s not in bad and s not in STATS]
    by_step: dict[int, list[int]] = defaultdict(list)
    for k, entry in enumerate(parsed):
        by_step[entry[0]].append(k)
    multi = sorted(f for f, ms in micros.items() if len(ms) > 1)
    out: list[FileRecords] = []
    for step in sorted(by_step):
        b = RecordBuilder(step, item.rank, extra_stats=extra)
        seq: list[int] = []
        parts: list[tuple[str, int, str, int, int]] = []
        counters: dict[tuple[str, int], int] = defaultdict(int)
        for k in by_step[step]:
            _, family, vpp, name, micro, stats, shape, dtype, line = parsed[k]
            for stat in bad:
                stats.pop(stat, None)
            module, direction, role = _describe(family, name)
            row_no = counters[family, micro]
            counters[family, micro] += 1
            seq.append(family_rank(family) * _SEQ_FAMILY + max(micro, 0) * _SEQ_MICRO + row_no)
            parts.append((family, vpp, name, micro, line))
            b.add(f"{family}/{vpp}:{name}/micro{micro}#{k}", stats, shape=shape, node="",
                  module=module, api=family, kind="monitor", direction=direction, role=role,
                  dtype=dtype, micro_step=micro)
        rec = b.build(meta={
            "path": str(path),
            "parts": parts,
            "vpp_nonzero": any(p[1] != 0 for p in parts),
            "multi_micro": multi,
            "family_key": (item.family, item.priority),
            "warnings": warnings if not out else [],
        })
        rec.seq = np.asarray(seq, dtype=np.int32)
        rec.null_stats = rec.null_stats & np.uint8(0x0F)
        out.append(rec)
    if not out and warnings:  # keep the warnings of a file whose rows were all filtered out
        empty = RecordBuilder(-1, item.rank).build(meta={"warnings": warnings, "parts": []})
        out.append(empty)
    return out
