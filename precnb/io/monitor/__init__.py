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
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import xarray as xr

from precnb.errors import NotADumpError
from precnb.io._assemble import FileRecords, LoadReport, assemble
from precnb.io._dupes import last_row_wins
from precnb.io.executor import parse_files
from precnb.io.monitor._names import FAMILY_RANK, is_monitor_output
from precnb.io.monitor.discover import MonitorFile, discover
from precnb.io.monitor.parse import read_monitor_csv
from precnb.io.readers import Reader
from precnb.schema import STATS, TENSOR_COORDS

__all__ = ["FAMILY_RANK", "MonitorFile", "discover", "is_monitor_output", "open_monitor",
           "read_monitor_csv"]


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
