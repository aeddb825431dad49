"""Reader for ``msprobe compare`` result CSVs, as a two-run dataset to overlay.

Three header generations are read (see ``msprobe_formats.md`` section 6):

- ptdbg (2023): ``NPU Tensor Dtype``, ..., ``Cosine, MaxAbsErr``, ``NPU max/min/mean``,
  ``Bench max/min/mean``, ``Accuracy Reached or Not, Err_message``; underscore names
  (``Functional_linear_0_forward_input.0``);
- mstt era: ``NPU Dtype``, ..., ``Accuracy Reached or Not, Err_message`` (MD5 mode ends
  with ``Result``);
- 26.2.0: ``..., Result, Err_message`` (a JSON list) and an optional ``NPU_Stack_Info``.

SUMMARY, TENSOR (``Cosine``, ``MaxAbsErr``, ...) and MD5 (``NPU MD5``, ``BENCH MD5``) modes
are recognised from the columns.

The result has a leading ``run`` dim ``["target", "baseline"]`` (NPU side = target, Bench
side = baseline), one step and one rank (``compare_result_rank{R}_...`` and
``compare_result_{R}_{S}_{timestamp}`` file names give them, else 0) and one tensor per row,
labelled with the NPU name (the Bench name where the NPU side is ``N/A`` or empty). A side
whose name is ``N/A``, or empty with no value, is absent (``present`` False). Statistics come
from ``NPU max/min/mean/l2norm`` and ``Bench ...``: ``" inf"`` is inf, ``True``/``False``
are 1.0/0.0, and ``N/A``/``None``/empty cells are null (``null_stats``); a missing column
(ptdbg has no l2norm) is null too.

Per-tensor variables (dims ``("tensor",)``), where the columns exist: ``compare_result``
(``pass``/``warning``/``error``, ``Yes``/``No``, ...), ``compare_err`` (``Err_message``; a
JSON list is joined with ``"; "``), float ``cosine``, ``euc_dist``, ``max_abs_err``,
``max_rel_err``, ``one_thousandth_err_ratio``, ``five_thousandths_err_ratio``, ``max_diff``,
``min_diff``, ``mean_diff``, ``norm_diff``, ``min_rel_err``, ``mean_rel_err``,
``norm_rel_err`` (``"12.5%"`` is read as 0.125; ``N/A``, ``Nan``, ``unsupported`` are NaN),
and ``md5_target`` / ``md5_baseline`` strings (also stored per side as ``crc``).
``NPU_Stack_Info`` fills the ``stacks`` side table (node → frames).

Examples
--------
>>> is_compare_csv("/nonexistent.csv")
False
>>> split_compare_name("Module.conv1.Conv2d.forward.0.parameters.weight")
('Module.conv1.Conv2d.forward.0', 'parameter')
>>> split_compare_name("Functional_linear_0_forward_input.0")
('Functional_linear_0_forward', 'input')
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from precnb.combine import combine_runs
from precnb.errors import DumpFormatError, NotADumpError
from precnb.io._assemble import LoadReport, RecordBuilder, assemble
from precnb.io._compare_cells import NA as _NA
from precnb.io._compare_cells import data_names as _data_names
from precnb.io._compare_cells import dotted as _dotted
from precnb.io._compare_cells import err_text as _err_text
from precnb.io._compare_cells import frames as _frames
from precnb.io._compare_cells import metric as _metric
from precnb.io._compare_cells import split_compare_name
from precnb.io._compare_cells import stat as _stat
from precnb.io._csvutil import iter_rows, parse_shape, read_header
from precnb.io.readers import Reader
from precnb.naming import parse_node
from precnb.schema import side_text, validate

__all__ = ["METRIC_COLUMNS", "is_compare_csv", "open_compare_csv", "split_compare_name"]

RUNS = ("target", "baseline")
_SIDES = {"target": "npu", "baseline": "bench"}
METRIC_COLUMNS: dict[str, str] = {
    "cosine": "cosine",
    "eucdist": "euc_dist",
    "maxabserr": "max_abs_err",
    "maxrelativeerr": "max_rel_err",
    "one thousandth err ratio": "one_thousandth_err_ratio",
    "five thousandths err ratio": "five_thousandths_err_ratio",
    "five thousandth err ratio": "five_thousandths_err_ratio",
    "max diff": "max_diff",
    "min diff": "min_diff",
    "mean diff": "mean_diff",
    "l2norm diff": "norm_diff",
    "minrelativeerr": "min_rel_err",
    "meanrelativeerr": "mean_rel_err",
    "normrelativeerr": "norm_rel_err",
}
_STAT_KEYS = {"max": ("max",), "min": ("min",), "mean": ("mean",), "norm": ("l2norm", "norm")}
_RESULT_COLUMNS = ("result", "accuracy reached or not")

_FILE_RANK = re.compile(r"^compare_result_rank([0-9]{1,9})_")
_FILE_RANK_STEP = re.compile(r"^compare_result_([0-9]{1,9})_([0-9]{1,9})_[0-9]{8,}")


def _norm(h: str) -> str:
    return re.sub(r"\s+", " ", h.strip().lower())


def is_compare_csv(path: str | Path) -> bool:
    """Whether *path* is a CSV whose header has ``NPU Name`` and ``Bench Name``.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    bool

    Examples
    --------
    >>> is_compare_csv("/nonexistent.csv")
    False
    """
    p = Path(path)
    try:
        if not (p.is_file() and p.suffix.lower() == ".csv"):
            return False
    except OSError:
        return False
    header = read_header(p)
    if not header:
        return False
    names = {_norm(h) for h in header}
    return "npu name" in names and "bench name" in names


def _step_rank(path: Path) -> tuple[int, int]:
    m = _FILE_RANK.match(path.name)
    if m:
        return 0, int(m.group(1))
    m = _FILE_RANK_STEP.match(path.name)
    if m:
        return int(m.group(2)), int(m.group(1))
    return 0, 0


def _header_generation(names: set[str]) -> str:
    if "npu tensor dtype" in names:
        return "ptdbg"
    if "accuracy reached or not" in names:
        return "accuracy"
    return "result"


def _mode(names: set[str]) -> str:
    if "npu md5" in names:
        return "md5"
    if "cosine" in names:
        return "tensor"
    return "summary"


def open_compare_csv(path: str | Path) -> xr.Dataset:
    """Open an msprobe compare result CSV as a two-run (target, baseline) dataset.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    xarray.Dataset
        Dims (run, step, rank, tensor) with ``run = ["target", "baseline"]``, per-tensor
        comparison variables, and attrs ``compare_mode`` (summary / tensor / md5),
        ``compare_header`` (``ptdbg``: underscore-era ``NPU Tensor Dtype`` header;
        ``accuracy``: an ``Accuracy Reached or Not`` column (mstt era); ``result``: a
        ``Result`` column (26.x, and mstt-era MD5/SUMMARY)) and ``load_report``.

    Raises
    ------
    DumpFormatError
        On a row with the wrong number of fields, naming the line.
    NotADumpError
        When the file is not a compare CSV.

    Examples
    --------
    >>> ds = open_compare_csv("compare_result_20230703104808.csv")  # doctest: +SKIP
    >>> ds.max.sel(run="target")  # doctest: +SKIP
    """
    p = Path(path)
    try:
        is_file = p.is_file()
    except OSError as exc:
        raise NotADumpError(f"{p}: cannot access: {exc.strerror or exc}") from None
    if not is_file:
        raise NotADumpError(f"{p}: no such file")
    rows = iter_rows(p)
    first = next(rows, None)
    if first is None:
        raise DumpFormatError(p, "empty file (no header)")
    header = [h.strip() for h in first[1]]
    while header and not header[-1]:
        header.pop()
    col = {_norm(h): i for i, h in enumerate(header)}
    if "npu name" not in col or "bench name" not in col:
        raise NotADumpError(f"{p}: not an msprobe compare CSV "
                            "(header lacks 'NPU Name' and 'Bench Name')")
    step, rank = _step_rank(p)
    got = _Rows(p, _Columns.of(col, len(header)), step, rank)
    for line, row in rows:
        got.add(line, row)
    if not got.labels:
        got.report.warnings.append(f"{p}: no comparison rows")
    got.report.read.append(str(p))
    return _dataset(got, set(col))


def _column(col: dict[str, int], *cands: str) -> int | None:
    return next((col[c] for c in cands if c in col), None)


@dataclass
class _Columns:
    """Where each value of a compare CSV is (header positions; None when the column is absent)."""

    n: int
    sides: dict[str, dict[str, int | None]]  # run -> name, dtype, shape, md5, max, min, mean, norm
    metrics: dict[str, int]
    result: int | None
    err: int | None
    stack: int | None
    data_name: int | None

    @classmethod
    def of(cls, col: dict[str, int], n: int) -> _Columns:
        sides: dict[str, dict[str, int | None]] = {}
        for run, side in _SIDES.items():
            sides[run] = {
                "name": col[f"{side} name"],
                "dtype": _column(col, f"{side} dtype", f"{side} tensor dtype"),
                "shape": _column(col, f"{side} tensor shape", f"{side} shape"),
                "md5": _column(col, f"{side} md5"),
                **{stat: _column(col, *(f"{side} {k}" for k in keys)) for stat, keys in _STAT_KEYS.items()},
            }
        return cls(n, sides, {var: col[h] for h, var in METRIC_COLUMNS.items() if h in col},
                   _column(col, *_RESULT_COLUMNS), _column(col, "err_message"), _column(col, "npu_stack_info"),
                   _column(col, "data_name"))

    @property
    def md5_mode(self) -> bool:
        return self.sides["target"]["md5"] is not None or self.sides["baseline"]["md5"] is not None


def _cell(row: list[str], i: int | None) -> str:
    return row[i].strip() if i is not None else ""


class _Rows:
    """The rows of one compare CSV, collected per side (target = NPU, baseline = Bench) and per tensor."""

    def __init__(self, path: Path, cols: _Columns, step: int, rank: int) -> None:
        self.path, self.cols = path, cols
        self.step, self.rank = step, rank
        self.report = LoadReport()
        self.builders = {run: RecordBuilder(step, rank) for run in RUNS}
        self.seqs: dict[str, list[int]] = {run: [] for run in RUNS}
        self.data_names: dict[str, list[str]] = {run: [] for run in RUNS}
        self.labels: list[str] = []
        self.per_tensor: dict[str, list[Any]] = {v: [] for v in cols.metrics}
        self.results: list[str] = []
        self.errs: list[str] = []
        self.md5s: dict[str, list[str]] = {run: [] for run in RUNS}
        self.stacks: dict[str, list[str]] = {}
        self.seen: dict[str, int] = {}

    def _present(self, row: list[str]) -> dict[str, bool]:
        present: dict[str, bool] = {}
        for run in RUNS:
            sc = self.cols.sides[run]
            name = _cell(row, sc["name"])
            if name.upper() == "N/A":
                present[run] = False
            elif name:
                present[run] = True
            else:  # an empty name: present only if the side carries values
                vals = [_cell(row, sc[k]) for k in ("max", "min", "mean", "norm", "dtype", "md5")]
                present[run] = any(v and v.lower() not in _NA for v in vals)
        return present

    def _label(self, row: list[str], line: int) -> str | None:
        npu = _cell(row, self.cols.sides["target"]["name"])
        bench = _cell(row, self.cols.sides["baseline"]["name"])
        label = npu if npu and npu.upper() != "N/A" else bench
        if not label or label.upper() == "N/A":
            self.report.warnings.append(f"{self.path}: line {line}: neither NPU nor Bench name; row skipped")
            return None
        if label in self.seen:
            self.seen[label] += 1
            return f"{label}#dup{self.seen[label]}"
        self.seen[label] = 0
        return label

    def add(self, line: int, row: list[str]) -> None:
        """Take one CSV row (a row with the wrong number of fields is an error naming the line)."""
        cols, n = self.cols, self.cols.n
        if len(row) != n:
            if len(row) > n and not any(c.strip() for c in row[n:]):
                row = row[:n]
            else:
                raise DumpFormatError(
                    self.path, f"line {line}: expected {n} fields as in the header, got {len(row)}")
        present = self._present(row)
        label = self._label(row, line)
        if label is None:
            return
        index = len(self.labels)
        self.labels.append(label)
        node, role = split_compare_name(label.split("#dup")[0])
        nn = parse_node(_dotted(node))
        md5_mode = cols.md5_mode
        for run in RUNS:
            if not present[run]:
                continue
            sc = cols.sides[run]
            stats = {k: _stat(_cell(row, sc[k])) for k in ("max", "min", "mean", "norm")}
            dtype = _cell(row, sc["dtype"])
            md5 = _cell(row, sc["md5"])
            self.builders[run].add(
                label, stats,
                shape=parse_shape(_cell(row, sc["shape"])),
                crc=(md5 if md5.upper() != "N/A" else "") if md5_mode else None,
                node=node, module=nn.module, api=nn.api, kind=nn.kind, direction=nn.direction,
                role=role, dtype="" if dtype.upper() == "N/A" else dtype, call=nn.call)
            self.seqs[run].append(index)
        for var, i in cols.metrics.items():
            self.per_tensor[var].append(_metric(row[i]))
        self.results.append(_cell(row, cols.result))
        self.errs.append(_err_text(_cell(row, cols.err)))
        for run in RUNS:
            md5 = _cell(row, cols.sides[run]["md5"])
            self.md5s[run].append("" if md5.upper() == "N/A" else md5)
        if cols.data_name is not None:
            for run, name in zip(RUNS, _data_names(row[cols.data_name]), strict=True):
                if present[run]:
                    self.data_names[run].append(name)
        frames = _frames(_cell(row, cols.stack))
        if frames is not None:
            self.stacks.setdefault(node, frames)


def _dataset(got: _Rows, names: set[str]) -> xr.Dataset:
    """The two-run dataset of the collected rows, in row order, with the per-tensor comparison variables."""
    cols, p = got.cols, got.path
    sides = {}
    for run in RUNS:
        rec = got.builders[run].build(stacks=got.stacks if run == "target" else {}, meta={"path": str(p)})
        rec.seq = np.asarray(got.seqs[run], dtype=np.int32)
        if cols.data_name is not None:
            rec.strings["data_name"] = got.data_names[run]
        sides[run] = assemble([rec], source_format="compare", steps=[got.step], ranks=[got.rank])
    ds = combine_runs(sides)
    order = {lbl: i for i, lbl in enumerate(got.labels)}
    perm = np.argsort([order[str(t)] for t in ds["tensor"].values], kind="stable")
    ds = ds.isel(tensor=perm)
    extra: dict[str, Any] = {}
    for var, vals in got.per_tensor.items():
        extra[var] = ("tensor", np.asarray(vals, dtype=np.float64))
    if cols.result is not None:
        extra["compare_result"] = ("tensor", np.asarray(got.results, dtype=object))
    if cols.err is not None:
        extra["compare_err"] = ("tensor", np.asarray(got.errs, dtype=object))
    if cols.md5_mode:
        extra["md5_target"] = ("tensor", np.asarray(got.md5s["target"], dtype=object))
        extra["md5_baseline"] = ("tensor", np.asarray(got.md5s["baseline"], dtype=object))
    ds = ds.assign(extra)
    ds.attrs.update({
        "source_format": "compare",
        "source": str(p),
        "compare_mode": _mode(names),
        "compare_header": _header_generation(names),
        "stacks": side_text(got.stacks),
        "load_report": json.dumps(got.report.to_dict()),
    })
    ds.attrs.pop("run_attrs", None)
    return validate(ds)


READER = Reader(name="compare", can_open=is_compare_csv, open=lambda path, **_: open_compare_csv(path),
                description="compare result CSV", detect_priority=40)
