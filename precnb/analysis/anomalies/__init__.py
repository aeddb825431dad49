"""Anomalies over steps: non-finite transitions and spikes against a tensor's own history.

For every (rank, tensor) series over steps:

* **nonfinite** — the first step at which a statistic becomes NaN/Inf when it was not
  before (benign infinities such as attention masks, and series that are non-finite at every
  recorded step — e.g. a monitor row for a gradient that never exists — are not anomalies);
* **spike** — ``|x - median(history)| > z * max(1.4826 * MAD(history), rel_floor * |median|)``
  and ``|x| / |median| > ratio`` (or its inverse for drops), with at least ``min_history``
  earlier finite values of the same series;
* **drift** — a statistic that leaves its own history gradually, reported at its *onset* (see
  :mod:`precnb.analysis.anomalies.trends`), with modules ranked by lead time before a loss or grad-norm
  change.

Not judged (spikes and drifts): near-zero scalars that change sign, the mean of a centred
tensor (noise-dominated; min/max/norm are not), and bookkeeping ops — the statistics a monitor
computes inside module hooks when it runs in the same process as the dump.

Anomalies are ranked in training order: step, then execution order ``seq`` (which encodes the
micro step)
(forward before backward before optimizer), then rank.

The family of series over steps: this module, :mod:`~precnb.analysis.anomalies.trends` (drifts and what is
too noisy to judge; also the loss spike's lead indicators, :mod:`precnb.analysis.spike`) and
:mod:`~precnb.analysis.anomalies.call_counters` (which API call counters name the same call across steps).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from precnb.analysis.anomalies.call_counters import same_calls
from precnb.analysis.events import event_mask, lazy_persistence
from precnb.analysis.findings import Finding
from precnb.analysis.findings.evidence import entry_values, node_evidence
from precnb.schema import entry_meta

__all__ = ["SpikeRule", "anomalies", "anomaly_table", "same_calls"]


@dataclass(frozen=True)
class SpikeRule:
    """Parameters of the robust spike test."""

    stats: tuple[str, ...] = ("norm",)
    z: float = 10.0
    ratio: float = 5.0
    rel_floor: float = 0.05
    min_history: int = 1


def nanmedian0(h: np.ndarray) -> np.ndarray:
    """``np.nanmedian(h, axis=0)`` (NaN where a column holds none), by one sort: several times faster.

    Examples
    --------
    >>> nanmedian0(np.array([[1.0, np.nan, 4.0], [3.0, np.nan, np.nan], [2.0, np.nan, 6.0]])).tolist()
    [2.0, nan, 5.0]
    """
    s = np.sort(h, axis=0)  # NaN last
    cnt = (~np.isnan(h)).sum(axis=0)
    lo = np.take_along_axis(s, np.maximum((cnt - 1) // 2, 0)[None], axis=0)[0]
    hi = np.take_along_axis(s, np.maximum(cnt // 2, 0)[None], axis=0)[0]
    with np.errstate(invalid="ignore"):
        return np.where(cnt > 0, (lo + hi) / 2, np.nan)


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
            med = nanmedian0(np.where(ok[None], h, np.nan))
            mad = nanmedian0(np.abs(h - med[None]))
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
    from precnb.analysis.anomalies.trends import bookkeeping_nodes, drift_table, noise_mask

    comparable = same_calls(ds)
    if not comparable.all():  # not one series where the counters name other calls
        ds = ds.assign(present=ds["present"] & comparable)

    events, _benign = event_mask(ds, persistent=persistent)
    book = bookkeeping_nodes(ds)
    keep = ~np.isin(np.asarray([str(n) for n in ds["node"].values]), list(book)) if book else \
        np.ones(ds.sizes["tensor"], bool)
    ev = events.values & keep
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
    rec = np.asarray(present)
    series = {s: np.where(rec, ds[s].values, np.nan) for s in ("max", "min", "mean", "norm") if s in ds}
    numel = ds["numel"].values if "numel" in ds else np.full(rec.shape, -1)
    for stat in rule.stats:
        if stat not in ds:
            continue
        vals = ds[stat].values
        judged = keep[None, :] & ~noise_mask(stat, series, numel) if stat in series else keep[None, :]
        mask, ref, score = _spikes(vals, present & ~nonfinite_any & judged[None], rule)
        for si, ri, tj in np.argwhere(mask):
            rows.append({"type": "spike", "step": int(step_vals[si]), "rank": int(rank_vals[ri]),
                         "tensor": str(labels[tj]), "node": str(nodes[tj]), "module": str(modules[tj]),
                         "stat": stat, "value": float(vals[si, ri, tj]),
                         "reference": float(ref[si, ri, tj]), "score": float(score[si, ri, tj]),
                         "micro_step": int(micro[tj]), "seq": int(seq[si, ri, tj])})
    cols = ["type", "step", "rank", "tensor", "node", "module", "stat", "value", "reference", "score",
            "micro_step", "seq"]
    drifts = drift_table(ds, skip=book)
    if len(drifts):
        rows += drifts[cols].to_dict("records")
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
    expert_ev, expert_hints = _expert_tokens(ds)
    if not len(df):
        return Finding(kind="none", stats=stats, hints=expert_hints, evidence=expert_ev,
                       reason="no NaN/Inf transition, no spike and no drift against the tensors' own history")
    rows = df.head(limit + 1).to_dict("records")
    first = rows[0]
    values: dict[str, Any] = {"entry": entry_values(ds, step=first["step"], rank=first["rank"],
                                                    tensor=first["tensor"])}
    for typ in ("nonfinite", "spike", "drift"):
        sub = df[df["type"] == typ]
        if len(sub):
            values[f"first_{typ}"] = _row(sub.iloc[0].to_dict())
    hints: list[str] = []
    d0: dict[str, Any] | None = None
    trend_ev: dict[str, Any] | None = None
    if (df["type"] == "drift").any():
        from precnb.analysis.anomalies.trends import drift_table, trend_summary

        full = drift_table(ds) if not ds.chunks else df[df["type"] == "drift"]
        if len(full) and "direction" in full:
            trend = trend_summary(ds, full)
            trend_ev = trend
            d0 = _first_module_drift(full)
            values["first_drift"] = {**_row(d0), "module": d0["module"] or None, "last_step": int(d0["last_step"]),
                                     "last_value": float(d0["last_value"]), "direction": d0["direction"]}
            change = trend["first_reference_change"]
            lead = (f"{change - int(d0['step'])} step(s) before the {_changed(trend)} changes (step {change})"
                    if change is not None else
                    "no loss or gradient-norm change within the recorded steps (lead ≥ "
                    f"{int(d0['last_step']) - int(d0['step']) + 1} steps)")
            hints.append(f"trend break: {d0['module'] or d0['node']} {d0['stat']} {d0['direction']} from step "
                         f"{int(d0['step'])} ({float(d0['reference']):.4g} → {float(d0['last_value']):.4g} at step "
                         f"{int(d0['last_step'])}), {lead}; modules by lead time: "
                         + ", ".join(f"{m['module'] or m['node']} (step {m['onset_step']})"
                                     for m in trend["modules"][:5]))
    if first["type"] == "drift" and d0 is not None:
        first = d0
        what = (f"{first['stat']} {first['direction']} from step {first['step']} on, leaving its own history "
                f"({float(first['reference']):.4g} → {float(first['last_value']):.4g} at step "
                f"{int(first['last_step'])})")
    elif first["type"] == "nonfinite":
        what = "becomes non-finite"
    elif first["type"] == "drift":
        what = f"{first['stat']} drifts from step {first['step']} (reference {first['reference']:.4g})"
    else:
        what = f"{first['stat']} spikes to {first['value']:.4g} (typical {first['reference']:.4g})"
    reason = f"{first['tensor']} {what} at step {first['step']}, rank {first['rank']}"
    if first["type"] == "drift" and first.get("module"):
        reason = f"{first['module']}: " + reason
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
    hints += expert_hints
    suspects = [_row(r) for r in rows[1: limit + 1]]
    module = first["module"] if first["type"] == "drift" else (
        entry_meta(ds, first["tensor"], first["step"], first["rank"])["module"] or first["module"])
    return Finding(kind="anomaly", reason=reason, step=first["step"], rank=first["rank"],
                   node=first["node"], tensor=first["tensor"], module=module or None,
                   values=values, hints=hints, suspects=suspects,
                   evidence={**node_evidence(ds, first["node"], step=first["step"], rank=first["rank"],
                                             tensor=first["tensor"]), **({"trend": trend_ev} if trend_ev else {}),
                             **expert_ev},
                   stats=stats)


def _expert_tokens(ds: xr.Dataset) -> tuple[dict[str, Any], list[str]]:
    """MoE runs: ``{"tokens_per_expert": {layer: {expert: {step: tokens}}}, "starved_experts": rows}`` and hints.

    Read from the experts' own input records (:mod:`precnb.analysis.experts`); empty for a run without experts.
    """
    from precnb.analysis.experts import describe_starved, expert_tokens, tokens_table

    rows = expert_tokens(ds)
    if not rows:
        return {}, []
    if ds.sizes.get("rank", 0) > 1:
        from precnb.analysis.layout.infer import infer_layout

        layout = infer_layout(ds).layout
        if layout is not None and layout.ep > 1:
            rows = expert_tokens(ds, layout)
    starved = [r for r in rows if r["tokens"] == 0]
    ev: dict[str, Any] = {"tokens_per_expert": tokens_table(rows)}
    hints = []
    if starved:
        ev["starved_experts"] = starved
        hints.append("experts that received no token: " + "; ".join(describe_starved(r) for r in starved[:4])
                     + (f" (+{len(starved) - 4} more)" if len(starved) > 4 else ""))
    return ev, hints


def _first_module_drift(drifts: pd.DataFrame) -> dict[str, Any]:
    """The first drift in training order, preferring one inside a named module at the same onset step."""
    rows = drifts.to_dict("records")
    first = rows[0]
    same = [r for r in rows if r["step"] == first["step"] and r["module"] and r["module"] not in ("optimizer",)]
    if not same:
        return first
    module = same[0]["module"]
    # the module's own record (its input as the module received it) says it best
    own = [r for r in same if r["module"] == module and str(r["node"]).startswith(("Module.", "Cell."))
           and ".input" in str(r["tensor"])]
    return own[0] if own else same[0]


def _changed(trend: dict[str, Any]) -> str:
    ch = trend["reference_change"]
    step = trend["first_reference_change"]
    names = [("loss" if k == "loss" else "gradient norm") for k, v in ch.items() if v == step]
    return " and ".join(names) or "loss"


def _row(r: dict[str, Any]) -> dict[str, Any]:
    out = {k: r[k] for k in ("type", "step", "rank", "tensor", "node", "stat", "value", "reference", "score")}
    out["why"] = r["type"]
    return out
