"""The report's detail table (the records around a finding, both runs' values side by side) and hot spots.

Their cells are formatted by :func:`precnb.report._tables.fmt`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from precnb.report._tables import STATS, Cell, fmt, pair_cell

__all__ = ["detail_table", "hotspot_table"]


def _window(ds: xr.Dataset, step: int, rank: int, tensor: str | None, before: int, after: int) -> list[str]:
    """Tensors recorded at (step, rank) around *tensor* in execution order."""
    e = ds.sel(step=step, rank=rank)
    seq = np.asarray(e["seq"].values, dtype=np.int64)
    present = np.asarray(e["present"].values, bool) & (seq >= 0)
    labels = ds["tensor"].values
    known = tensor is not None and tensor in ds.indexes["tensor"]
    s0 = int(seq[ds.indexes["tensor"].get_loc(tensor)]) if known else -1
    if s0 < 0:
        idx = np.flatnonzero(present)
        idx = idx[np.argsort(seq[idx], kind="stable")][: before + after + 1]
    else:
        idx = np.flatnonzero(present & (seq >= s0 - before) & (seq <= s0 + after))
        idx = idx[np.argsort(seq[idx], kind="stable")]
    return [str(labels[i]) for i in idx]


def detail_table(data: Any, combined: xr.Dataset | None, finding: Any, *, rows: int = 40) -> dict[str, Any] | None:
    """Records around the finding at its (step, rank): values, module, dtype, shape.

    Parameters
    ----------
    data : ReportData
    combined : xarray.Dataset or None
        Baseline and target as runs (comparison reports).
    finding : Finding or None
    rows : int
        Most records.

    Returns
    -------
    dict or None
        ``title``, ``columns`` and ``rows`` (lists of :class:`Cell`), ``focus`` row index.
    """
    from precnb.analysis.findings import shown_record
    from precnb.viz import detail_frame

    ds = data.target
    rec = shown_record(finding, [int(r) for r in ds["rank"].values]) if finding is not None else None
    if rec is not None and rec[2] in ds.indexes["tensor"]:  # the origin record, when the finding has one
        step, rank, tensor = rec
    elif finding is not None and finding.found and finding.step is not None and finding.rank is not None:
        step, rank, tensor = int(finding.step), int(finding.rank), finding.tensor
    else:
        if not (ds.sizes["step"] and ds.sizes["rank"]):
            return None
        step, rank, tensor = int(ds["step"].values[0]), int(ds["rank"].values[0]), None
    before, after = rows // 3, rows - rows // 3 - 1
    if combined is not None:
        names = [str(r) for r in combined["run"].values]
        side = combined.sel(run=names[1])
        if tensor is not None and tensor in side.indexes["tensor"] and step in side.indexes["step"] \
                and rank in side.indexes["rank"] and not bool(side["present"].sel(step=step, rank=rank,
                                                                                   tensor=tensor)):
            side = combined.sel(run=names[0])  # only in the baseline: its execution order
        if step not in side.indexes["step"] or rank not in side.indexes["rank"]:
            return None
        window = _window(side, step, rank, tensor, before, after)
        from precnb.viz.series import shard_kinds

        frame = detail_frame(combined, step=step, rank=rank, tensors=window, run=names[1], baseline=names[0],
                             limit=len(window) + 1, merged=shard_kinds(data.target))
        order = {t: i for i, t in enumerate(window)}
        frame = frame.assign(_o=frame["tensor"].map(order)).sort_values("_o", kind="stable").drop(columns="_o")
        from precnb.report._tensor_cols import metric_columns  # issue #17: whole-tensor metrics

        metrics = metric_columns(data, step=step, rank=rank, tensors=window)
        return _detail_rows(frame, step, rank, tensor, names, metrics=metrics)
    else:
        if step not in ds.indexes["step"] or rank not in ds.indexes["rank"]:
            return None
        window = _window(ds, step, rank, tensor, before, after)
        frame = detail_frame(ds, step=step, rank=rank, tensors=window, limit=len(window) + 1)
        names = []
    return _detail_rows(frame, step, rank, tensor, names)


def _detail_rows(frame: pd.DataFrame, step: int, rank: int, tensor: str | None, names: list[str],
                 metrics: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    base = names[0] if names else None
    stat_cols = [s for s in STATS if s in frame.columns]
    extra = [c for c in frame.columns if c in ("nans", "zeros")]
    cols = ["seq", "tensor", "module", "role", "dtype", "shape"]
    header = [*cols, *stat_cols, *extra]
    if base is not None:  # one cell per statistic, the target's value over the baseline's: fits a 1400 px page
        header = [*cols, *[f"{s} ({names[1]} / {base})" for s in stat_cols], "rel. diff"]
    if metrics:
        from precnb.report._tensor_cols import METRIC_HEADERS

        header += list(METRIC_HEADERS.values())
    out, focus = [], None
    for i, r in enumerate(frame.to_dict("records")):
        null = int(r.get("null_stats", 0) or 0)
        bnull = int(r.get(f"null_stats_{base}", 0) or 0) if base is not None else 0
        partial = str(r.get("merged", "") or "") == "partial_sum"  # only its mean merges from shard statistics
        cells = [fmt(int(r["seq"])) if int(r["seq"]) >= 0 else Cell("—", "absent"),
                 Cell(r["tensor"], "name"), Cell(r["module"] or "—", "name short"), Cell(r["role"]),
                 Cell(str(r["dtype"]).removeprefix("torch."), "meta"), Cell(r["shape"], "meta")]
        bits = {"max": 1, "min": 2, "mean": 4, "norm": 8}
        own = [(Cell("Σ (partial sum)", "num null") if partial else Cell("null", "num null")) if null & bits[s]
               else fmt(r[s]) for s in stat_cols]
        if base is None:
            cells += own
            cells += [fmt(r[c]) for c in extra]
        else:
            cells += [pair_cell(v, Cell("null", "num null") if bnull & bits[s] else fmt(r.get(f"{s}_{base}")))
                      for s, v in zip(stat_cols, own, strict=True)]
            rel = r.get("rel_diff")
            cells.append(Cell("—", "absent") if rel is None or (isinstance(rel, float) and math.isnan(rel))
                         else fmt(rel))
        if metrics:
            got = metrics.get(r["tensor"])
            cells += [Cell("—", "absent") if got is None or math.isnan(got[k]) else fmt(got[k])
                      for k in METRIC_HEADERS]
        if r["tensor"] == tensor:
            focus = i
        out.append(cells)
    where = f"step {step}, rank {rank}"
    title = (f"Records around the finding at {where}, in execution order" if tensor else
             f"First records of {where}, in execution order")
    return {"title": title, "columns": header, "rows": out, "focus": focus}


def hotspot_table(frame: pd.DataFrame | None, *, rows: int = 15) -> dict[str, Any] | None:
    """The heat map's worst cells, one per module: where to look first, as text."""
    if frame is None or not len(frame):
        return None
    mode = frame.attrs.get("color", "stat")
    f = frame[frame["tensor"].astype(str) != ""]
    if not len(f):
        return None
    key = "nonfinite" if mode in ("nonfinite", "events") else "color"
    f = f.assign(_k=f[key].astype(float).fillna(-np.inf))
    if mode == "stat":  # cells holding only non-finite values first
        f = f.assign(_k=np.where(f["value"].isna() & (f["nonfinite"] > 0), np.inf, f["_k"]))
    best = f.sort_values(["_k", "row_order"], ascending=[False, True], kind="stable").drop_duplicates("row")
    nf = frame.groupby("row")["nonfinite"].sum()
    out = []
    for r in best.head(rows).to_dict("records"):
        out.append([Cell(r["row"], "name"), Cell(r["value_text"], "num nf" if r["nonfinite"] and mode != "reldiff"
                                                 and r["value_text"] in ("nan", "non-finite", "inf") else "num"),
                    Cell(r["tensor"], "name"), fmt(int(r["worst_step"])), fmt(int(r["worst_rank"])),
                    fmt(int(nf.get(r["row"], 0)))])
    what = {"reldiff": "largest rel. diff", "events": "NaN / new inf records", "nonfinite": "non-finite records"
            }.get(mode, "largest value")
    return {"columns": ["module", what, "worst tensor", "step", "rank", "non-finite records"], "rows": out}
