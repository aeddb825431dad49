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

import ast
import json
import math
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from precnb.combine import combine_runs
from precnb.errors import DumpFormatError, NotADumpError
from precnb.io._assemble import LoadReport, RecordBuilder, assemble
from precnb.io._csvutil import iter_rows, parse_float, parse_shape, read_header
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
_NA = {"", "n/a", "none", "null", "nan"}

_FULL = re.compile(
    r"^(?P<node>.+\.(?:forward|backward)(?:\.\d+)?)\.(?P<sec>input|output|parameters|input_args|"
    r"input_kwargs)(?:\.(?P<rest>.+))?$")
_PGRAD = re.compile(r"^(?P<node>.+\.parameters_grad(?:\.\d+)?)\.(?P<rest>[^.]+)$")
_OLD = re.compile(r"^(?P<node>.+_(?:forward|backward))_(?P<sec>input|output)(?:\.(?P<rest>.+))?$")
_OLD_NODE = re.compile(r"^(?P<pre>[A-Za-z]+)_(?P<api>.+)_(?P<call>\d+)_(?P<dir>forward|backward)$")
_ROLES = {"input": "input", "input_args": "input", "input_kwargs": "input", "output": "output",
          "parameters": "parameter"}
_FILE_RANK = re.compile(r"^compare_result_rank([0-9]{1,9})_")
_FILE_RANK_STEP = re.compile(r"^compare_result_([0-9]{1,9})_([0-9]{1,9})_[0-9]{8,}")
_LITERAL_ERRORS = (ValueError, SyntaxError, TypeError, MemoryError, RecursionError)


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


def split_compare_name(name: str) -> tuple[str, str]:
    """Split a compare row name into ``(node, role)``.

    Strips ``.input.N`` / ``.output.N`` / ``.parameters.x`` / ``.parameters_grad[.n].x``
    suffixes (and the ptdbg ``_input.N`` / ``_output`` ones).

    Parameters
    ----------
    name : str

    Returns
    -------
    (str, str)
        The node name and the role (``input``, ``output``, ``parameter``, ``grad`` or ``""``).

    Examples
    --------
    >>> split_compare_name("Module.fc.Linear.parameters_grad.1.bias")
    ('Module.fc.Linear.parameters_grad.1', 'grad')
    >>> split_compare_name("Functional.conv2d.0.forward.input.3.0")
    ('Functional.conv2d.0.forward', 'input')
    """
    m = _PGRAD.match(name)
    if m:
        return m["node"], "grad"
    m = _FULL.match(name)
    if m:
        return m["node"], _ROLES[m["sec"]]
    m = _OLD.match(name)
    if m:
        return m["node"], _ROLES[m["sec"]]
    return name, ""


def _dotted(node: str) -> str:
    m = _OLD_NODE.match(node)
    return f"{m['pre']}.{m['api']}.{m['call']}.{m['dir']}" if m else node


def _metric(text: str) -> float:
    s = text.strip()
    if s.lower() in _NA:
        return math.nan
    pct = s.endswith("%")
    if pct:
        s = s[:-1].strip()
    try:
        v = float(s)
    except ValueError:
        return math.nan  # "unsupported", "Diff", ... : not a number
    return v / 100.0 if pct else v


def _stat(text: str) -> float | None:
    try:
        return parse_float(text)
    except ValueError:
        return None  # device strings and other non-numbers: recorded as null


def _literal(s: str) -> Any:
    """``ast.literal_eval`` of a cell holding a Python list or tuple (never executes code).

    Raises one of ``_LITERAL_ERRORS`` when the cell is not such a literal (or is too deep).
    """
    if s[:1] not in ("[", "("):
        raise ValueError(s)
    with warnings.catch_warnings():  # invalid escapes in frames: SyntaxWarning, not an error
        warnings.simplefilter("ignore")
        return ast.literal_eval(s)


def _err_text(text: str) -> str:
    s = text.strip()
    if s.startswith("["):
        try:
            val = json.loads(s)
        except (ValueError, RecursionError):
            return s
        if isinstance(val, list):
            return "; ".join(str(v) for v in val)
    return s


def _frames(text: str) -> list[str] | None:
    s = text.strip()
    if not s or s.upper() == "N/A":
        return None
    try:
        val = _literal(s)
    except _LITERAL_ERRORS:
        return [s]
    if isinstance(val, (list, tuple)):
        return [str(v) for v in val]
    return [str(val)]


def _data_names(text: str) -> tuple[str, str]:
    s = text.strip()
    try:
        val = _literal(s)
    except _LITERAL_ERRORS:
        return "", ""
    if isinstance(val, (list, tuple)) and len(val) == 2:
        return tuple("" if str(v) in ("-1", "N/A") else str(v) for v in val)  # type: ignore[return-value]
    return "", ""


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


def open_compare_csv(path: str | Path) -> xr.Dataset:  # noqa: C901
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
    names = set(col)
    step, rank = _step_rank(p)
    report = LoadReport()

    def column(*cands: str) -> int | None:
        for c in cands:
            if c in col:
                return col[c]
        return None

    side_cols: dict[str, dict[str, int | None]] = {}
    for run, side in _SIDES.items():
        side_cols[run] = {
            "name": col[f"{side} name"],
            "dtype": column(f"{side} dtype", f"{side} tensor dtype"),
            "shape": column(f"{side} tensor shape", f"{side} shape"),
            "md5": column(f"{side} md5"),
            **{stat: column(*(f"{side} {k}" for k in keys)) for stat, keys in _STAT_KEYS.items()},
        }
    metric_cols = {var: col[h] for h, var in METRIC_COLUMNS.items() if h in col}
    result_col = column(*_RESULT_COLUMNS)
    err_col = column("err_message")
    stack_col = column("npu_stack_info")
    data_name_col = column("data_name")
    md5_mode = side_cols["target"]["md5"] is not None or side_cols["baseline"]["md5"] is not None

    n = len(header)
    builders = {run: RecordBuilder(step, rank) for run in RUNS}
    seqs: dict[str, list[int]] = {run: [] for run in RUNS}
    data_names: dict[str, list[str]] = {run: [] for run in RUNS}
    labels: list[str] = []
    per_tensor: dict[str, list[Any]] = {v: [] for v in metric_cols}
    results: list[str] = []
    errs: list[str] = []
    md5s: dict[str, list[str]] = {run: [] for run in RUNS}
    stacks: dict[str, list[str]] = {}
    seen: dict[str, int] = {}

    def cell(row: list[str], i: int | None) -> str:
        return row[i].strip() if i is not None else ""

    for line, row in rows:
        if len(row) != n:
            if len(row) > n and not any(c.strip() for c in row[n:]):
                row = row[:n]
            else:
                raise DumpFormatError(
                    p, f"line {line}: expected {n} fields as in the header, got {len(row)}")
        present: dict[str, bool] = {}
        for run in RUNS:
            sc = side_cols[run]
            name = cell(row, sc["name"])
            if name.upper() == "N/A":
                present[run] = False
            elif name:
                present[run] = True
            else:  # an empty name: present only if the side carries values
                vals = [cell(row, sc[k]) for k in ("max", "min", "mean", "norm", "dtype", "md5")]
                present[run] = any(v and v.lower() not in _NA for v in vals)
        npu = cell(row, side_cols["target"]["name"])
        bench = cell(row, side_cols["baseline"]["name"])
        label = npu if npu and npu.upper() != "N/A" else bench
        if not label or label.upper() == "N/A":
            report.warnings.append(f"{p}: line {line}: neither NPU nor Bench name; row skipped")
            continue
        if label in seen:
            seen[label] += 1
            label = f"{label}#dup{seen[label]}"
        else:
            seen[label] = 0
        index = len(labels)
        labels.append(label)
        node, role = split_compare_name(label.split("#dup")[0])
        nn = parse_node(_dotted(node))
        for run in RUNS:
            if not present[run]:
                continue
            sc = side_cols[run]
            stats = {k: _stat(cell(row, sc[k])) for k in ("max", "min", "mean", "norm")}
            dtype = cell(row, sc["dtype"])
            md5 = cell(row, sc["md5"])
            builders[run].add(
                label, stats,
                shape=parse_shape(cell(row, sc["shape"])),
                crc=(md5 if md5.upper() != "N/A" else "") if md5_mode else None,
                node=node, module=nn.module, api=nn.api, kind=nn.kind, direction=nn.direction,
                role=role, dtype="" if dtype.upper() == "N/A" else dtype, call=nn.call)
            seqs[run].append(index)
        for var, i in metric_cols.items():
            per_tensor[var].append(_metric(row[i]))
        results.append(cell(row, result_col))
        errs.append(_err_text(cell(row, err_col)))
        for run in RUNS:
            md5 = cell(row, side_cols[run]["md5"])
            md5s[run].append("" if md5.upper() == "N/A" else md5)
        if data_name_col is not None:
            dn = _data_names(row[data_name_col])
            for run, name in zip(RUNS, dn, strict=True):
                if present[run]:
                    data_names[run].append(name)
        frames = _frames(cell(row, stack_col))
        if frames is not None:
            stacks.setdefault(node, frames)
    if not labels:
        report.warnings.append(f"{p}: no comparison rows")
    report.read.append(str(p))
    sides = {}
    for run in RUNS:
        rec = builders[run].build(stacks=stacks if run == "target" else {},
                                  meta={"path": str(p)})
        rec.seq = np.asarray(seqs[run], dtype=np.int32)
        if data_name_col is not None:
            rec.strings["data_name"] = data_names[run]
        sides[run] = assemble([rec], source_format="compare", steps=[step], ranks=[rank])
    ds = combine_runs(sides)
    order = {lbl: i for i, lbl in enumerate(labels)}
    perm = np.argsort([order[str(t)] for t in ds["tensor"].values], kind="stable")
    ds = ds.isel(tensor=perm)
    extra: dict[str, Any] = {}
    for var, vals in per_tensor.items():
        extra[var] = ("tensor", np.asarray(vals, dtype=np.float64))
    if result_col is not None:
        extra["compare_result"] = ("tensor", np.asarray(results, dtype=object))
    if err_col is not None:
        extra["compare_err"] = ("tensor", np.asarray(errs, dtype=object))
    if md5_mode:
        extra["md5_target"] = ("tensor", np.asarray(md5s["target"], dtype=object))
        extra["md5_baseline"] = ("tensor", np.asarray(md5s["baseline"], dtype=object))
    ds = ds.assign(extra)
    ds.attrs.update({
        "source_format": "compare",
        "source": str(p),
        "compare_mode": _mode(names),
        "compare_header": _header_generation(names),
        "stacks": side_text(stacks),
        "load_report": json.dumps(report.to_dict()),
    })
    ds.attrs.pop("run_attrs", None)
    return validate(ds)


READER = Reader(name="compare", can_open=is_compare_csv, open=lambda path, **_: open_compare_csv(path),
                description="compare result CSV", detect_priority=40)
