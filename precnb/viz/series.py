"""Series and detail frames: selected tensors over steps, and one (step, rank)'s records.

Examples
--------
>>> from precnb.viz.series import series_frame
>>> series_frame(run, "Functional.linear.0.forward.output.0", ranks=[0, 1])  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from precnb.combine import select_run
from precnb.schema import dtype_changes, meta_changes
from precnb.viz.frames import _fmt, _index
from precnb.viz.same_op import SERIES_COLUMNS, op_family, same_op_series  # the last two re-exported

__all__ = ["detail_frame", "informative_series", "op_family", "same_op_series", "series_frame", "shard_kinds",
           "tensor_evidence"]



def _runs(ds: xr.Dataset, runs: Sequence[str] | None) -> list[tuple[str, xr.Dataset]]:
    if "run" not in ds.dims:
        return [("", ds)]
    names = [str(r) for r in ds["run"].values] if runs is None else list(runs)
    return [(n, ds.sel(run=n)) for n in names]


def _choose_ranks(block: np.ndarray, ranks: np.ndarray, keep: Sequence[int], n: int) -> list[int]:
    """*keep* first, then the ranks furthest from the cross-rank median (block: run,S,R,T)."""
    chosen = [int(r) for r in keep if r in set(ranks.tolist())][:n]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        finite = np.where(np.isfinite(block), block, np.nan)
        med = np.nanmedian(finite, axis=2, keepdims=True)
        dev = np.abs(finite - med) / (np.abs(med) + 1e-30)
        dev = np.where(np.isfinite(block), np.nan_to_num(dev, nan=0.0), np.inf)  # non-finite: first
        score = np.nanmax(dev, axis=(0, 1, 3)) if dev.size else np.zeros(len(ranks))
    for i in np.argsort(-np.nan_to_num(score, nan=-1), kind="stable"):
        if len(chosen) >= n:
            break
        if int(ranks[i]) not in chosen:
            chosen.append(int(ranks[i]))
    return sorted(chosen)


def series_frame(
    ds: xr.Dataset,
    tensors: str | Sequence[str],
    *,
    stat: str = "norm",
    ranks: Sequence[int] | None = None,
    steps: Sequence[int] | None = None,
    runs: Sequence[str] | None = None,
    keep_ranks: Sequence[int] = (),
    max_lines: int = 12,
) -> pd.DataFrame:
    """Selected tensors over steps: one line per (run, rank, tensor).

    Parameters
    ----------
    ds : xarray.Dataset
        One run, or several along ``run`` (then every run is drawn, or those in *runs*).
    tensors : str or sequence of str
    stat : str
    ranks, steps : sequence of int, optional
        Restrict (default: all).
    runs : sequence of str, optional
    keep_ranks : sequence of int
        Ranks that are always drawn (the selected one).
    max_lines : int
        With more ranks than this, draw *keep_ranks*, then the ranks furthest from the
        cross-rank median, plus a ``median`` line over all of them.

    Returns
    -------
    pandas.DataFrame
        Columns ``step, value, series, tensor, rank, run, nonfinite, value_text``; ``value``
        is NaN where the statistic is non-finite (``nonfinite`` True); absent and null
        statistics (an integer tensor's mean) have no row.
    """
    tensors = [tensors] if isinstance(tensors, str) else list(tensors)
    parts = _runs(ds, runs)
    first = parts[0][1]
    tensors = [t for t in tensors if t in first.indexes["tensor"]]
    if not tensors:
        return pd.DataFrame({c: [] for c in SERIES_COLUMNS})
    si, ri = _index(first, "step", steps), _index(first, "rank", ranks)
    ti = first.indexes["tensor"].get_indexer(tensors)
    sub = np.ix_(si, ri, ti)
    from precnb.analysis.masks import recorded

    vals = np.stack([np.asarray(d[stat].values)[sub] for _, d in parts])  # run,S,R,T
    pres = np.stack([np.asarray(recorded(d, stat).values)[sub] for _, d in parts])
    vals = np.where(pres, vals, np.nan)
    step_vals = first["step"].values[si]
    rank_vals = first["rank"].values[ri]
    chosen = rank_vals.tolist()
    rows: list[pd.DataFrame] = []
    if len(rank_vals) > max_lines:
        chosen = _choose_ranks(vals, rank_vals, keep_ranks, max_lines)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(np.where(np.isfinite(vals), vals, np.nan), axis=2)  # run,S,T
        for k, (name, _) in enumerate(parts):
            for j, t in enumerate(tensors):
                rows.append(_lines(step_vals, med[k, :, j], pres[k, :, :, j].any(axis=1), name, t,
                                   -1, f"median of {len(rank_vals)} ranks", len(tensors) > 1))
    pos = {int(r): i for i, r in enumerate(rank_vals)}
    for k, (name, _) in enumerate(parts):
        for r in chosen:
            for j, t in enumerate(tensors):
                i = pos[int(r)]
                rows.append(_lines(step_vals, vals[k, :, i, j], pres[k, :, i, j], name, t, int(r),
                                   f"rank {r}", len(tensors) > 1))
    out = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame({c: [] for c in SERIES_COLUMNS})
    out.attrs.update(stat=stat, ranks_total=len(rank_vals), ranks_drawn=len(chosen))
    return out




def _lines(steps: np.ndarray, v: np.ndarray, present: np.ndarray, run: str, tensor: str, rank: int,
           what: str, many: bool) -> pd.DataFrame:
    label = " · ".join(p for p in (run, what, _short(tensor) if many else "") if p)
    keep = np.asarray(present, bool)
    v = np.asarray(v, dtype=np.float64)[keep]
    return pd.DataFrame({
        "step": steps[keep].astype(np.int64),
        "value": np.where(np.isfinite(v), v, np.nan),
        "series": label,
        "tensor": tensor,
        "rank": rank,
        "run": run,
        "nonfinite": ~np.isfinite(v),
        "value_text": [_fmt(x) for x in v],
    })


def _short(tensor: str, n: int = 3) -> str:
    parts = tensor.split(".")
    return ".".join(parts[-n:]) if len(parts) > n else tensor


def detail_frame(
    ds: xr.Dataset,
    *,
    step: int,
    rank: int,
    tensors: Sequence[str] | None = None,
    run: str | None = None,
    baseline: str | None = None,
    limit: int = 60,
    focus: str | None = None,
    merged: dict[str, str] | None = None,
) -> pd.DataFrame:
    """The records of one (step, rank): values, dtype/shape, module, execution order.

    Module, shape and dtype are that rank's own (:func:`precnb.schema.entry_meta`): where a label
    names another op on another rank, the row shows this rank's op.

    Parameters
    ----------
    ds : xarray.Dataset
    step, rank : int
    tensors : sequence of str, optional
        Restrict to these (e.g. the tensors of one module).
    run, baseline : str, optional
        With a ``run`` dim: the run shown (default the last) and the run compared against
        (adds ``<stat>_<baseline>`` and ``rel_diff`` columns).
    limit : int
        Most rows, in execution order.
    focus : str, optional
        A tensor that is always a row when it is recorded here: the *limit* rows are the window of
        execution order around it (``attrs["first_row"]`` / ``attrs["rows_total"]`` say which).
    merged : dict, optional
        Tensor → how merging shards made it (:func:`shard_kinds` of the merged run; default: of *ds*).

    Returns
    -------
    pandas.DataFrame
        ``tensor, node, module, role, direction, dtype, shape, seq, max, min, mean, norm,
        null_stats, nonfinite, merged`` (+ baseline columns, ``null_stats_<baseline>`` and
        ``rel_diff``); ``null_stats`` is the schema's bit mask of statistics recorded as null
        (shown as "null", not NaN); ``merged`` how merging shards made the entry (``sharded``,
        ``partial_sum`` — whose max, min and norm no shard statistic gives —, ``replicas_differ``;
        empty otherwise).
    """
    from precnb.analysis.masks import nonfinite, stat_vars

    base = None
    if "run" in ds.dims:
        names = [str(r) for r in ds["run"].values]
        run = run or names[-1]
        if baseline is not None and baseline != run:
            base = ds.sel(run=baseline)
        ds = select_run(ds, run)
    ti = _index(ds, "tensor", tensors)
    stats = stat_vars(ds)
    if step not in ds.indexes["step"] or rank not in ds.indexes["rank"]:
        cols = ["tensor", "node", "module", "role", "direction", "dtype", "shape", "seq", *stats,
                "nonfinite"]
        return pd.DataFrame({c: [] for c in cols})
    si, ri = ds.indexes["step"].get_loc(step), ds.indexes["rank"].get_loc(rank)
    e = ds.isel(step=si, rank=ri, tensor=ti)
    keep = np.asarray(e["present"].values, bool)
    df = pd.DataFrame({c: e[c].values.astype(str) for c in
                       ("tensor", "node", "module", "role", "direction", "dtype", "shape")})
    changes = dtype_changes(ds)
    if changes:  # entries whose dtype is not their tensor's first-seen one
        df["dtype"] = [changes.get(t, {}).get((int(step), int(rank)), d)
                       for t, d in zip(df["tensor"], df["dtype"], strict=True)]
    meta = meta_changes(ds)
    for f in ("module", "shape"):  # entries whose rank recorded another op under this label
        where = meta.get(f)
        if where:
            key = (int(step), int(rank))
            df[f] = [where.get(t, {}).get(key, v) for t, v in zip(df["tensor"], df[f], strict=True)]
    df["seq"] = np.asarray(e["seq"].values, dtype=np.int64)
    for s in stats:
        df[s] = np.asarray(e[s].values, dtype=np.float64)
    df["null_stats"] = np.asarray(e["null_stats"].values, dtype=np.int64)
    df["nonfinite"] = np.asarray(nonfinite(e).values, bool)
    kinds = shard_kinds(ds) if merged is None else merged  # how merging shards made the entry
    df["merged"] = [kinds.get(t, "") for t in df["tensor"]] if kinds else ""
    if base is not None:
        from precnb.analysis import relative_difference

        b = base.isel(step=si, rank=ri, tensor=ti)
        for s in ("max", "min", "mean", "norm"):
            df[f"{s}_{baseline}"] = np.asarray(b[s].values, dtype=np.float64)
        df[f"null_stats_{baseline}"] = np.asarray(b["null_stats"].values, dtype=np.int64)  # the baseline's own nulls
        rel = relative_difference(b, e).max("stat")
        df["rel_diff"] = np.where(keep & np.asarray(b["present"].values), rel.values, np.nan)
        keep = keep | np.asarray(b["present"].values, bool)
    df = df[keep].sort_values("seq", kind="stable").reset_index(drop=True)
    total, first = len(df), 0
    if total > limit:  # a window of execution order that holds the focused record, a few records before it
        at = np.flatnonzero(df["tensor"].to_numpy() == focus) if focus is not None else np.zeros(0, np.int64)
        if len(at):
            first = int(min(max(int(at[0]) - min(2, limit // 4), 0), total - limit))
        df = df.iloc[first:first + limit].reset_index(drop=True)
    df.attrs.update(step=int(step), rank=int(rank), run=run or "", baseline=baseline or "", first_row=first,
                    rows_total=total)
    return df


def shard_kinds(ds: xr.Dataset) -> dict[str, str]:
    """Tensor → how :func:`precnb.merge_shards` made it (``sharded``, ``partial_sum``, ``replicas_differ``).

    Replicated and unmerged tensors are left out; empty for a run that was not merged.
    """
    out: dict[str, str] = {}
    for c in ("shard_kind_tp", "shard_kind_cp"):
        if c in ds.coords:
            for t, k in zip(ds["tensor"].values.tolist(), ds[c].values.tolist(), strict=True):
                if k not in ("replicated", "local", "") and str(t) not in out:
                    out[str(t)] = str(k)
    return out


def tensor_evidence(ds: xr.Dataset, tensor: str, step: int | None = None, rank: int | None = None
                    ) -> dict[str, Any]:
    """Node, module, module path (construct.json) and stack frames (stack.json) of a tensor.

    With *step* and *rank*, as that rank recorded them (its own construct.json and stack.json:
    a label may name another op on another rank); ``elsewhere`` lists the ranks where it does
    (:func:`precnb.analysis.findings.evidence.label_elsewhere`).
    """
    from precnb.analysis.findings.evidence import label_elsewhere, node_evidence
    from precnb.schema import entry_meta

    if tensor not in ds.indexes["tensor"]:
        return {"tensor": tensor, "node": "", "module": "", "module_path": [], "stack": [], "elsewhere": []}
    node = str(ds["node"].sel(tensor=tensor).values)
    ev = node_evidence(ds, node, step=step, rank=rank, tensor=tensor)
    meta = entry_meta(ds, tensor, step, rank)
    here = step is not None and rank is not None and step in ds.indexes["step"] and rank in ds.indexes["rank"]
    return {"tensor": tensor, "node": node, "module": meta["module"],
            "module_path": ev.get("module_path", []), "stack": ev.get("stack", []),
            "dtype": meta["dtype"], "shape": meta["shape"], "step": step, "rank": rank,
            "elsewhere": label_elsewhere(ds, tensor, step=int(step), rank=int(rank)) if here else []}


def _flat(ds: xr.Dataset, tensors: list[str], stat: str) -> bool:
    """Whether *stat* of *tensors* takes one finite value (or none) over every step and rank."""
    if stat not in ds:
        return True
    v = np.asarray(ds[stat].sel(tensor=tensors).values, dtype=np.float64)
    v = v[np.isfinite(v) & np.asarray(ds["present"].sel(tensor=tensors).values, bool)]
    return not v.size or float(v.max()) == float(v.min())


def informative_series(ds: xr.Dataset, tensors: Sequence[str], stat: str, *, node: str | None = None
                       ) -> tuple[list[str], str]:
    """Tensors and statistic for a line chart that does not draw a flat line.

    When *tensors* are constant wherever they are finite (the output of ``sqrt(poison)`` is 0
    except where it is NaN), the inputs of *node* that vary are drawn too (they show what
    changed); when the statistic is still flat, another one that varies is used.

    Returns
    -------
    (tensors, stat)
        Unchanged when *stat* already varies.
    """
    tensors = [t for t in tensors if t in ds.indexes["tensor"]]
    if not tensors or not _flat(ds, tensors, stat):
        return tensors, stat
    nodes, roles = ds["node"].values.astype(str), ds["role"].values.astype(str)
    labels = ds["tensor"].values.astype(str)
    node = node or str(ds["node"].sel(tensor=tensors[0]).values)
    inputs = [str(t) for t, n, r in zip(labels, nodes, roles, strict=True) if n == node and r == "input"]
    out = list(dict.fromkeys([*tensors, *[t for t in inputs if not _flat(ds, [t], stat)][:2]]))
    if not _flat(ds, out, stat):
        return out, stat
    for other in ("max", "min", "mean", "norm"):
        if other != stat and not _flat(ds, out, other):
            return out, other
    return tensors, stat
