"""Reader for msprobe training-state monitor output (``TrainerMon`` v1 and ``TrainerMonitorV2``).

Layouts
-------
v1 (``msprobe.pytorch.TrainerMon`` / ``msprobe.mindspore.TrainerMon``)::

    <root>/<anything>-rank<R>-<hex>/{family}_{a}-{b}.csv

``{a}-{b}`` is the step window of the file; ``family`` is one of ``actv``, ``actv_grad``,
``grad_unreduced``, ``grad_reduced``, ``exp_avg``, ``exp_avg_sq``, ``param_origin``,
``param_updated``, ``other`` or ``*_hook``. Header ``vpp_stage,name,step[,micro_step],<ops>``.

v2 (``TrainerMonitorV2``)::

    <root>/rank_<R>/{slug}_step{a}-{b}.csv

with slug ``module``, ``weight_grad``, ``optimizer``, ``param`` or ``cc`` and header
``vpp_stage,step,module_name,scope[,micro_step],<ops>``. ``scope`` maps to the v1 family
names: module forward → ``actv``, backward → ``actv_grad``; weight_grad unreduced / reduced →
``grad_unreduced`` / ``grad_reduced``; optimizer ``exp_avg`` / ``exp_avg_sq``; param
``param_origin`` / ``param_updated``; cc → ``cc``.

*path* may be the output root or a single rank folder. ``anomaly_detected/`` and
``module_struct/`` are not read; the anomaly.json files found are listed in
``attrs["anomaly_json"]`` (rank → path).

Tensors
-------
Label ``"{family}/{name}"``. The name gets a ``"{vpp}:"`` prefix when any row of the load has
``vpp_stage != 0``, and the label a ``"/micro{m}"`` suffix for the families of which some CSV
holds more than one distinct ``micro_step``. ``node`` is the label without the micro suffix,
``api`` the family, ``kind`` ``"monitor"``; ``module`` is the module path (``blocks.1.attn``
for ``blocks.1.attn.output``, ``blocks.0.attn.q_proj`` for ``blocks.0.attn.q_proj.weight``).
Every numeric op column (min, max, norm, mean, zeros, nans, entropy, ...) becomes a float64
variable holding exactly ``float(cell)``; an empty cell is null (``null_stats``), a column
missing from a file is null there. A row of ``nan`` everywhere (the monitor's record of a
tensor that does not exist, e.g. the gradient of integer token ids) is loaded as present with
NaN statistics, ``dtype == ""`` and ``numel == -1``.

Broken input
------------
A CSV that cannot be read (not UTF-8, malformed quoting, a row with the wrong number of
fields, a non-numeric ``min/max/norm/mean/zeros/nans`` cell, a ``step`` outside 0..2**31-1, a
``micro_step`` outside -1..99999, no header) is skipped and named in the load report with its
line; the other files still load and the rank stays in the ``rank`` coordinate. Folders that
cannot be listed are reported; a rank number beyond 2**31 is reported and skipped.

Execution order
---------------
``seq = FAMILY_RANK[family] * 1_000_000 + max(micro_step, 0) * 10_000 + row`` where ``row``
is the index of the row among the rows of the same (CSV file, step, family, micro_step), in
file order, and :data:`FAMILY_RANK` is actv 0, actv_grad 1, grad_unreduced 2, grad_reduced 3,
param_origin 4, exp_avg 5, exp_avg_sq 6, param_updated 7, cc 8, other 9, ``*_hook`` 10-14.
The order is exact while micro_step < 100 and a group has fewer than 10 000 rows.

Examples
--------
>>> is_monitor_output("/nonexistent")
False
>>> FAMILY_RANK["grad_reduced"] < FAMILY_RANK["param_origin"] < FAMILY_RANK["exp_avg"]
True
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import xarray as xr

from precnb.errors import DumpFormatError, NotADumpError
from precnb.io._assemble import FileRecords, LoadReport, RecordBuilder, assemble
from precnb.io._csvutil import iter_rows, parse_float, parse_shape, short_repr
from precnb.io._dupes import last_row_wins
from precnb.io._fs import is_dir as _is_dir
from precnb.io._fs import is_file as _is_file
from precnb.io._fs import list_dir as _list_dir
from precnb.io.executor import parse_files
from precnb.io.readers import Reader
from precnb.schema import STATS, TENSOR_COORDS

__all__ = ["FAMILY_RANK", "MonitorFile", "discover", "is_monitor_output", "open_monitor",
           "read_monitor_csv"]

FAMILY_RANK: dict[str, int] = {
    "actv": 0,
    "actv_grad": 1,
    "grad_unreduced": 2,
    "grad_reduced": 3,
    "param_origin": 4,
    "exp_avg": 5,
    "exp_avg_sq": 6,
    "param_updated": 7,
    "cc": 8,
    "other": 9,
    "attention_hook": 10,
    "linear_hook": 11,
    "moe_router_weight_hook": 12,
    "moe_router_logit_hook": 13,
}
_OTHER_HOOK_RANK = 14
_UNKNOWN_RANK = 15
_SEQ_FAMILY, _SEQ_MICRO = 1_000_000, 10_000

_DIRECTION = {
    "actv": "forward",
    "actv_grad": "backward",
    "grad_unreduced": "backward",
    "grad_reduced": "backward",
    "exp_avg": "optimizer",
    "exp_avg_sq": "optimizer",
    "param_origin": "optimizer",
    "param_updated": "optimizer",
}
_PARAM_ROLE = {
    "grad_unreduced": "grad",
    "grad_reduced": "grad",
    "exp_avg": "state",
    "exp_avg_sq": "state",
    "param_origin": "parameter",
    "param_updated": "parameter",
}
_V2_SCOPES = {
    ("module", "forward"): "actv",
    ("module", "backward"): "actv_grad",
    ("weight_grad", "unreduced"): "grad_unreduced",
    ("weight_grad", "reduced"): "grad_reduced",
    ("optimizer", "exp_avg"): "exp_avg",
    ("optimizer", "exp_avg_sq"): "exp_avg_sq",
    ("param", "param_origin"): "param_origin",
    ("param", "param_updated"): "param_updated",
}

_V1_FILE = re.compile(r"^(?P<family>[a-z][a-z0-9_]*?)_(?P<a>[0-9]+)-(?P<b>[0-9]+)\.csv$")
_V2_FILE = re.compile(
    r"^(?P<slug>module|weight_grad|optimizer|param|cc)_step(?P<a>[0-9]+)-(?P<b>[0-9]+)\.csv$")
_V1_RANK = re.compile(r"(?:^|-)rank([0-9]+)-[0-9A-Za-z]+$")
_V2_RANK = re.compile(r"^rank_([0-9]+)$")
_MAX_INDEX = 2**31 - 1  # steps, ranks, vpp stages
_MAX_MICRO = 99_999  # keeps seq (see the module docstring) inside int32
_OUT_OF_RANGE = -2
_IO_NAME = re.compile(r"^(?P<module>.*)\.(?P<io>input|output)(?:_grad)?(?:_\d+)?$")
_IGNORED_DIRS = ("anomaly_detected", "module_struct")

_FIXED_COLUMNS = {"vpp_stage", "name", "module_name", "step", "micro_step", "scope", "shape",
                  "dtype"}
_KNOWN_OPS = {"min", "max", "norm", "mean", "zeros", "nans"}
_RESERVED = {"present", "seq", "numel", "null_stats", "crc", "data_name", "step", "rank", "tensor",
             "run", *TENSOR_COORDS}


def _known_v1_family(family: str) -> bool:
    return family in FAMILY_RANK or family.endswith("_hook")


def family_rank(family: str) -> int:
    """Position of a monitor family in training order (see the module docstring).

    Parameters
    ----------
    family : str

    Returns
    -------
    int

    Examples
    --------
    >>> family_rank("actv"), family_rank("exp_avg_sq"), family_rank("my_hook")
    (0, 6, 14)
    """
    if family in FAMILY_RANK:
        return FAMILY_RANK[family]
    return _OTHER_HOOK_RANK if family.endswith("_hook") else _UNKNOWN_RANK


def _file_kind(name: str) -> tuple[str, str, int, int] | None:
    """``(version, family-or-slug, a, b)`` for a monitor CSV file name, else None."""
    m = _V2_FILE.match(name)
    if m:
        return "v2", m["slug"], int(m["a"]), int(m["b"])
    m = _V1_FILE.match(name)
    if m and _known_v1_family(m["family"]):
        return "v1", m["family"], int(m["a"]), int(m["b"])
    return None


def _holds_monitor_csv(folder: Path) -> bool:
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if entry.name.endswith(".csv") and _file_kind(entry.name) and entry.is_file():
                    return True
    except OSError:
        return False
    return False


def _rank_of_folder(name: str) -> int | None:
    """The rank in a monitor folder name; None when not a rank folder, -2 when out of range."""
    m = _V1_RANK.search(name) or _V2_RANK.match(name)
    if not m:
        return None
    digits = m.group(1)
    return int(digits) if len(digits) <= 10 and int(digits) <= _MAX_INDEX else _OUT_OF_RANGE


def is_monitor_output(path: str | Path) -> bool:
    """Whether *path* is a monitor output root (v1 or v2) or one of its rank folders.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    bool

    Examples
    --------
    >>> is_monitor_output("/nonexistent")
    False
    """
    p = Path(path)
    try:
        if not p.is_dir():
            return False
        if _holds_monitor_csv(p):
            return True
        with os.scandir(p) as it:
            for entry in it:
                if (_rank_of_folder(entry.name) not in (None, _OUT_OF_RANGE) and entry.is_dir()
                        and _holds_monitor_csv(Path(entry.path))):
                    return True
    except OSError:
        return False
    return False


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


def _merge(parts: list[FileRecords], use_vpp: bool, multi: set[str], report: LoadReport | None = None) -> FileRecords:
    """Concatenate the partial records of one (step, rank), relabel and sort by seq.

    Rows for the same (step, family, vpp, name, micro_step) are duplicates: the last one (in
    file order; of the later file) is kept, and every other one holding different values is
    listed in *report* (file and line of both), see :func:`precnb.io._dupes.last_row_wins`.
    """
    stat_names: list[str] = list(STATS)
    for p in parts:
        stat_names += [k for k in p.values if k not in stat_names]
    labels: list[str] = []
    nodes: list[str] = []
    coords: dict[str, list[Any]] = {k: [] for k in TENSOR_COORDS}
    values: dict[str, list[np.ndarray]] = {k: [] for k in stat_names}
    null, seq, numel = [], [], []
    where: list[str] = []
    for p in parts:
        n = len(p.labels)
        for family, vpp, name, micro, line in p.meta["parts"]:
            node = f"{family}/{vpp}:{name}" if use_vpp else f"{family}/{name}"
            nodes.append(node)
            labels.append(f"{node}/micro{micro}" if family in multi and micro >= 0 else node)
            where.append(f"{p.meta.get('path', '')} line {line}")
        for k in TENSOR_COORDS:
            coords[k].extend(p.coords[k])
        for k in stat_names:
            values[k].append(p.values.get(k, np.full(n, np.nan)))
        null.append(p.null_stats)
        seq.append(p.seq)
        numel.append(p.numel)
    seq_arr = np.concatenate(seq) if seq else np.zeros(0, np.int32)
    flat = {k: np.concatenate(v) for k, v in values.items()}
    null_arr = np.concatenate(null) if null else np.zeros(0, np.uint8)
    order = np.argsort(seq_arr, kind="stable")
    order = np.asarray(last_row_wins(order.tolist(), labels, flat, null_arr, where, parts[0].step,
                                     report if report is not None else LoadReport()), dtype=np.int64)
    out_labels = [labels[i] for i in order.tolist()]
    coords["node"] = nodes
    idx = order.tolist()
    return FileRecords(
        step=parts[0].step,
        rank=parts[0].rank,
        labels=out_labels,
        coords={k: [v[i] for i in idx] for k, v in coords.items()},
        values={k: v[order] for k, v in flat.items()},
        null_stats=null_arr[order].astype(np.uint8),
        seq=seq_arr[order].astype(np.int32),
        numel=np.concatenate(numel)[order].astype(np.int64),
        meta={"path": ";".join(sorted({str(p.meta.get("path", "")) for p in parts}))},
    )


def open_monitor(
    path: str | Path,
    *,
    errors: Literal["report", "raise"] = "report",
    client: Any = None,
    progress: bool | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    workers: int | str | None = None,
) -> xr.Dataset:
    """Open msprobe monitor output (v1 or v2) as a canonical dataset.

    Parameters
    ----------
    path : str or Path
        The monitor output root or one rank folder.
    errors : {"report", "raise"}
        ``"report"`` skips unreadable CSV files (see ``precnb.load_report(ds)``); ``"raise"``
        stops at the first one.
    client : dask.distributed.Client, optional
        Parse on this cluster, one task per CSV file.
    progress : bool, optional
        Force the progress bar on or off.
    steps, ranks : sequence of int, optional
        Load only these.
    workers : int, "auto" or None
        Local worker processes when there is no client (see :func:`precnb.open_run`).

    Returns
    -------
    xarray.Dataset
        Dims (step, rank, tensor), ``kind == "monitor"``; attrs ``monitor_version``,
        ``rank_dirs`` (JSON rank → folder), ``anomaly_json`` (JSON rank → path) and
        ``load_report``.

    Raises
    ------
    NotADumpError
        When nothing could be read.

    Examples
    --------
    >>> ds = open_monitor("monitor_output")  # doctest: +SKIP
    >>> ds.nans.sel(tensor="actv/blocks.1.attn.output")  # doctest: +SKIP
    """
    report = LoadReport()
    found = discover(path, report)
    files = found.files
    if ranks is not None:
        keep = {int(r) for r in ranks}
        files = [f for f in files if f.rank in keep]
    step_sel = tuple(sorted({int(s) for s in steps})) if steps is not None else None
    if step_sel is not None:
        files = [f for f in files if any(f.window[0] <= s <= f.window[1] for s in step_sel)]
    files = [MonitorFile(f.path, f.rank, f.version, f.family, f.window, f.priority, step_sel)
             for f in files]
    if not files:
        raise NotADumpError(f"{path}: no monitor CSV file matches the selection")
    results = parse_files(files, read_monitor_csv, describe=lambda f: str(f.path),
                          report=report, errors=errors, client=client, progress=progress, workers=workers)
    partials: list[FileRecords] = [r for group in results for r in group]
    for r in partials:
        report.warnings.extend(r.meta.get("warnings", []))
    partials = [r for r in partials if r.meta.get("parts")]
    if not partials:
        if report.skipped:
            reasons = "; ".join(f"{p}: {r}" for p, r in report.skipped[:3])
            raise NotADumpError(f"{path}: no monitor CSV file could be read ({reasons})")
        raise NotADumpError(f"{path}: the monitor CSV files hold no row for the selection")
    use_vpp = any(r.meta["vpp_nonzero"] for r in partials)
    multi = {f for r in partials for f in r.meta["multi_micro"]}
    groups: dict[tuple[int, int], list[FileRecords]] = defaultdict(list)
    for r in partials:
        groups[r.step, r.rank].append(r)
    records = []
    for key in sorted(groups):
        group = groups[key]
        best: dict[str, int] = {}
        for r in group:
            fam, prio = r.meta["family_key"]
            best[fam] = max(best.get(fam, prio), prio)
        kept = [r for r in group if r.meta["family_key"][1] == best[r.meta["family_key"][0]]]
        kept_ids = {id(r) for r in kept}
        for r in group:
            if id(r) not in kept_ids:
                report.skipped.append((f"{r.meta['path']} (step {key[0]})",
                                       f"ignored: superseded by a newer folder of rank {key[1]}"))
        records.append(_merge(kept, use_vpp, multi, report))
    versions = sorted({f.version for f in files})
    selected_ranks = sorted({f.rank for f in files})
    rank_dirs = {str(r): os.pathsep.join(str(d) for d in found.rank_dirs[r])
                 for r in selected_ranks}
    ds = assemble(
        records,
        source_format="monitor",
        ranks=selected_ranks,
        attrs={
            "source": str(path),
            "monitor_version": "+".join(versions),
            "rank_dirs": json.dumps(rank_dirs),
            "anomaly_json": json.dumps({str(k): v for k, v in sorted(found.anomaly.items())}),
            "load_report": json.dumps(report.to_dict()),
        },
    )
    return ds


READER = Reader(name="monitor", can_open=is_monitor_output, open=lambda path, **o: open_monitor(path, **_opts(o)),
                description="monitor output", detect_priority=20)


def _opts(options: dict[str, Any]) -> dict[str, Any]:
    return {k: options[k] for k in ("errors", "client", "progress", "steps", "ranks", "workers") if k in options}
