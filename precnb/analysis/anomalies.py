"""Anomalies over steps: non-finite transitions and spikes against a tensor's own history.

For every (rank, tensor) series over steps:

* **nonfinite** — the first step at which a statistic becomes NaN/Inf when it was not
  before (benign infinities such as attention masks, and series that are non-finite at every
  recorded step — e.g. a monitor row for a gradient that never exists — are not anomalies);
* **spike** — ``|x - median(history)| > z * max(1.4826 * MAD(history), rel_floor * |median|)``
  and ``|x| / |median| > ratio`` (or its inverse for drops), with at least ``min_history``
  earlier finite values of the same series.

Anomalies are ranked in training order: step, then execution order ``seq`` (which encodes the
micro step)
(forward before backward before optimizer), then rank.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from precnb.analysis.evidence import entry_values, node_evidence
from precnb.analysis.findings import Finding
from precnb.analysis.nan_origin import event_mask, lazy_persistence

__all__ = ["SpikeRule", "anomalies", "anomaly_table"]


@dataclass(frozen=True)
class SpikeRule:
    """Parameters of the robust spike test."""

    stats: tuple[str, ...] = ("norm",)
    z: float = 10.0
    ratio: float = 5.0
    rel_floor: float = 0.05
    min_history: int = 1


def _spikes(values: np.ndarray, rec: np.ndarray, rule: SpikeRule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spike mask, reference (median) and score over axis 0 (steps) of (step, rank, tensor)."""
    n = values.shape[0]
    mask = np.zeros(values.shape, bool)
    ref = np.full(values.shape, np.nan)
    score = np.zeros(values.shape)
    finite = rec & np.isfinite(values)
    hist = np.where(finite, values, np.nan)
    for i in range(rule.min_history, n):
        h = hist[:i]
        cnt = np.sum(~np.isnan(h), axis=0)
        ok = (cnt >= rule.min_history) & finite[i]
        if not ok.any():
            continue
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(np.where(ok[None], h, np.nan), axis=0)
            mad = np.nanmedian(np.abs(h - med[None]), axis=0)
            scale = np.fmax(1.4826 * mad, rule.rel_floor * np.abs(med))
            scale = np.where(scale > 0, scale, np.inf)
            z = np.abs(values[i] - med) / scale
            big, small = np.abs(values[i]), np.abs(med)
            r = np.where(small > 0, big / small, np.inf)
            r = np.fmax(r, np.where(big > 0, small / big, np.inf))
        hit = ok & (z > rule.z) & (r > rule.ratio)
        mask[i] = hit
        ref[i] = np.where(ok, med, np.nan)
        score[i] = np.where(ok, z, 0)
    return mask, ref, score


def anomaly_table(
    ds: xr.Dataset,
    *,
    rule: SpikeRule | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
) -> pd.DataFrame:
    """All anomalies of one run, ranked in training order.

    Returns
    -------
    pandas.DataFrame
        Columns ``type, step, rank, tensor, node, module, stat, value, reference, score,
        micro_step, seq``.

    Notes
    -----
    A dask-backed (lazily opened) run is scanned one block of ranks at a time (all steps of
    about 256 MB), so a store larger than memory can be searched; the table is the same.
    """
    rule = rule or SpikeRule()
    if "run" in ds.dims:
        raise ValueError("anomalies work on one run; select it with ds.sel(run=...)")
    if steps is not None:
        ds = ds.sel(step=[s for s in ds["step"].values if s in set(steps)])
    if ranks is not None:
        ds = ds.sel(rank=[r for r in ds["rank"].values if r in set(ranks)])
    if ds.chunks:
        return _lazy_table(ds, rule)
    return _table(ds, rule)


RANK_BLOCK_BYTES = 256 * 2**20
"""Memory for one block of ranks (all steps) when a lazy run is scanned for anomalies."""


def _rank_blocks(ds: xr.Dataset, budget: int) -> list[slice]:
    """Consecutive rank ranges, on the dataset's rank chunks, of about *budget* bytes (all steps)."""
    per_rank = ds.sizes["step"] * ds.sizes["tensor"] * sum(
        v.dtype.itemsize for v in ds.data_vars.values() if v.dims == ds["max"].dims)
    want = max(1, budget // max(per_rank, 1))
    chunks = ds.chunks.get("rank") or (ds.sizes["rank"],)
    out: list[slice] = []
    start = end = 0
    for c in chunks:
        if end > start and end + c - start > want:
            out.append(slice(start, end))
            start = end
        end += c
    if end > start:
        out.append(slice(start, end))
    return out


def _lazy_table(ds: xr.Dataset, rule: SpikeRule) -> pd.DataFrame:
    """:func:`anomaly_table` on a dask-backed run, one block of ranks (all steps) in memory at a time.

    A spike is judged against its own (rank, tensor) history, so blocks of ranks are
    independent; only the per-tensor "non-finite wherever recorded" test needs every rank,
    and it is reduced chunk by chunk first.
    """
    persistent, _ = lazy_persistence(ds)
    parts = [_table(ds.isel(rank=block).load(), rule, persistent=persistent)
             for block in _rank_blocks(ds, RANK_BLOCK_BYTES)]
    df = pd.concat(parts, ignore_index=True) if parts else _table(ds.isel(rank=[]).load(), rule)
    if len(df):
        df = df.sort_values(["step", "seq", "rank", "type"], kind="stable").reset_index(drop=True)
    return df


def _table(ds: xr.Dataset, rule: SpikeRule, *, persistent: np.ndarray | None = None) -> pd.DataFrame:
    events, _benign = event_mask(ds, persistent=persistent)
    ev = events.values
    prior = np.zeros_like(ev)
    prior[1:] = np.cumsum(ev, axis=0)[:-1] > 0
    first_nf = ev & ~prior
    rows: list[dict[str, Any]] = []
    labels = ds["tensor"].values
    nodes = ds["node"].values
    modules = ds["module"].values
    micro = ds["micro_step"].values
    seq = ds["seq"].values
    step_vals = ds["step"].values
    rank_vals = ds["rank"].values
    present = ds["present"].values
    nf_idx = np.argwhere(first_nf)
    if len(nf_idx):
        si_, ri_, tj_ = nf_idx.T
        stack = np.stack([ds[s].values[si_, ri_, tj_] for s in ("max", "min", "mean", "norm")], axis=1)
        bad = ~np.isfinite(stack)
        first_bad = np.where(bad.any(axis=1), stack[np.arange(len(stack)), np.argmax(bad, axis=1)], np.nan)
        seqs = seq[si_, ri_, tj_]
        for k, (si, ri, tj) in enumerate(nf_idx):
            rows.append({"type": "nonfinite", "step": int(step_vals[si]), "rank": int(rank_vals[ri]),
                         "tensor": str(labels[tj]), "node": str(nodes[tj]), "module": str(modules[tj]),
                         "stat": "any", "value": float(first_bad[k]), "reference": np.nan,
                         "score": np.inf, "micro_step": int(micro[tj]), "seq": int(seqs[k])})
    nonfinite_any = np.cumsum(ev, axis=0) > 0
    for stat in rule.stats:
        if stat not in ds:
            continue
        vals = ds[stat].values
        mask, ref, score = _spikes(vals, present & ~nonfinite_any, rule)
        for si, ri, tj in np.argwhere(mask):
            rows.append({"type": "spike", "step": int(step_vals[si]), "rank": int(rank_vals[ri]),
                         "tensor": str(labels[tj]), "node": str(nodes[tj]), "module": str(modules[tj]),
                         "stat": stat, "value": float(vals[si, ri, tj]),
                         "reference": float(ref[si, ri, tj]), "score": float(score[si, ri, tj]),
                         "micro_step": int(micro[tj]), "seq": int(seq[si, ri, tj])})
    cols = ["type", "step", "rank", "tensor", "node", "module", "stat", "value", "reference", "score",
            "micro_step", "seq"]
    df = pd.DataFrame(rows, columns=cols)
    if len(df):
        df = df.sort_values(["step", "seq", "rank", "type"], kind="stable").reset_index(drop=True)
    return df


def anomalies(
    ds: xr.Dataset,
    *,
    rule: SpikeRule | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    limit: int = 50,
) -> Finding:
    """Rank anomalies of one run (dump or monitor data) and describe the first one.

    Parameters
    ----------
    ds : xarray.Dataset
        One run.
    rule : SpikeRule, optional
        Spike-test parameters.
    steps, ranks : sequence of int, optional
    limit : int
        How many further anomalies to list as ``suspects``.

    Returns
    -------
    Finding
        Kind ``anomaly`` describing the first anomaly in training order, with
        ``values["first_nonfinite"]`` and ``values["first_spike"]``, and the next ones in
        ``suspects``; or kind ``none``.

    Examples
    --------
    >>> import precnb
    >>> f = precnb.anomalies(precnb.open_run("monitor_output/"))  # doctest: +SKIP
    >>> f.step, f.rank, f.tensor  # doctest: +SKIP
    """
    df = anomaly_table(ds, rule=rule, steps=steps, ranks=ranks)
    counts = df["type"].value_counts().to_dict() if len(df) else {}
    stats = {"anomalies": len(df), "by_type": {str(k): int(v) for k, v in counts.items()},
             "steps": [int(s) for s in ds["step"].values], "ranks": [int(r) for r in ds["rank"].values]}
    if not len(df):
        return Finding(kind="none", reason="no NaN/Inf transition and no spike against the tensors' own history",
                       stats=stats)
    rows = df.head(limit + 1).to_dict("records")
    first = rows[0]
    values: dict[str, Any] = {"entry": entry_values(ds, step=first["step"], rank=first["rank"],
                                                    tensor=first["tensor"])}
    for typ in ("nonfinite", "spike"):
        sub = df[df["type"] == typ]
        if len(sub):
            values[f"first_{typ}"] = _row(sub.iloc[0].to_dict())
    what = ("becomes non-finite" if first["type"] == "nonfinite" else
            f"{first['stat']} spikes to {first['value']:.4g} (typical {first['reference']:.4g})")
    reason = f"{first['tensor']} {what} at step {first['step']}, rank {first['rank']}"
    hints: list[str] = []
    spikes = df[df["type"] == "spike"]
    if len(spikes):
        s0 = spikes.iloc[0]
        same_step = spikes[spikes["step"] == s0["step"]]
        rk = sorted(set(same_step["rank"]))
        if len(rk) < ds.sizes["rank"]:
            hints.append(f"the step-{int(s0['step'])} spike is on rank(s) {rk} only: a rank-local cause "
                         "(its data batch or loss) rather than the model")
    nf = df[df["type"] == "nonfinite"]
    if len(nf):
        n0 = nf.iloc[0]
        hints.append(f"first non-finite value: step {int(n0['step'])}, rank {int(n0['rank'])}, {n0['tensor']}")
    suspects = [_row(r) for r in rows[1: limit + 1]]
    return Finding(kind="anomaly", reason=reason, step=first["step"], rank=first["rank"],
                   node=first["node"], tensor=first["tensor"], module=first["module"] or None,
                   values=values, hints=hints, suspects=suspects, evidence=node_evidence(ds, first["node"]),
                   stats=stats)


def _row(r: dict[str, Any]) -> dict[str, Any]:
    out = {k: r[k] for k in ("type", "step", "rank", "tensor", "node", "stat", "value", "reference", "score")}
    out["why"] = r["type"]
    return out
