"""NaN/Inf origin: the first NaN, or the first *new* infinity, in causal order across ranks.

Healthy models carry ±inf on purpose: a causal mask written with ``masked_fill(-inf)`` and
the softmax that reads it. Those are *benign* and never reported as the origin
(:func:`precnb.analysis.events.event_mask`, re-exported here):

* an output infinity created by a masking API (:data:`MASKING_APIS`) is benign;
* an infinity that flows on unchanged (an input whose statistics equal an earlier benign
  tensor's: the same tensor seen again as the next op's input) is benign, and so is an
  output of a node whose inputs carry benign infinities;
* a tensor that is non-finite at every step and rank where it is recorded is so by design.

Everything else that is NaN, or infinite, is an *event*. Per (step, rank) the first event
in execution order is that rank's first event; across ranks, a first event at the output of
a collective whose inputs were clean is inherited from another rank, and the origin is the
rank with the earliest non-inherited event (see :mod:`precnb.analysis.causal.order`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.causal.order import RankEvent, after_collectives, first_event_per_rank, pick_origin
from precnb.analysis.events import MASKING_APIS, event_mask, lazy_persistence, persistent_nonfinite
from precnb.analysis.findings import Finding
from precnb.analysis.findings.evidence import entry_values, node_evidence
from precnb.analysis.masks import nonfinite
from precnb.analysis.undefined import set_aside, undefined_mask
from precnb.combine import select_run
from precnb.schema import entry_meta

# the event rule (MASKING_APIS, event_mask, ...) is precnb.analysis.events, below causal.earliness that uses it too
__all__ = ["MASKING_APIS", "event_mask", "lazy_persistence", "nan_origin", "persistent_nonfinite"]

def _merge_aside(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per reason (the lazy search collects them step by step)."""
    out: dict[str, dict[str, Any]] = {}
    for a in parts:
        e = out.setdefault(a["why"], {"why": a["why"], "entries": 0, "tensors": 0, "examples": []})
        e["entries"] += a["entries"]
        e["tensors"] = max(e["tensors"], a["tensors"])
        e["examples"] = (e["examples"] + a["examples"])[:3]
    return list(out.values())


def _aside_hint(aside: list[dict[str, Any]]) -> str:
    parts = "; ".join(f"{a['entries']} entr{'y' if a['entries'] == 1 else 'ies'} {a['why']} "
                      f"(e.g. {a['examples'][0]['tensor']})" for a in aside)
    return f"set aside, not counted as NaN/inf (no defined value by construction): {parts}"


def nan_origin(
    ds: xr.Dataset,
    *,
    run: str | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
) -> Finding:
    """Find where NaN (or a new ±inf) first appeared.

    Parameters
    ----------
    ds : xarray.Dataset
        One run (or a dataset with a ``run`` dim: pass *run*).
    run : str, optional
    steps, ranks : sequence of int, optional
        Restrict the search.

    Returns
    -------
    Finding
        Kind ``nan_origin`` (says whether the NaN came in through the node's inputs or was
        created by the node), or ``none``.

    Notes
    -----
    On a dask-backed (lazily opened) dataset the search is out of core: small per-tensor and
    per-step reductions run chunk by chunk, then only steps holding non-finite values are
    loaded, one at a time, up to the first with an event (``stats["steps_not_searched"]``).

    Examples
    --------
    >>> import precnb
    >>> f = precnb.nan_origin(precnb.open_run("dump/"))  # doctest: +SKIP
    >>> f.kind, f.step, f.rank, f.node  # doctest: +SKIP
    ('nan_origin', 1, 1, 'Functional.softmax.1.forward')
    """
    if "run" in ds.dims:
        if run is None:
            if ds.sizes["run"] != 1:
                raise ValueError("dataset has several runs; pass run=NAME")
            run = str(ds["run"].values[0])
        ds = select_run(ds, run)
    if steps is not None:
        ds = ds.sel(step=[s for s in ds["step"].values if s in set(steps)])
    if ranks is not None:
        ds = ds.sel(rank=[r for r in ds["rank"].values if r in set(ranks)])
    from precnb.analysis.divergence.stepwise import is_lazy

    if is_lazy(ds):
        return _nan_origin_lazy(ds)
    events, benign = event_mask(ds)
    stats: dict[str, Any] = {
        "nan_values": int(nonfinite(ds, kind="nan").sum()),
        "inf_values": int(nonfinite(ds, kind="inf").sum()),
        "event_records": int(events.sum()),
        "benign_inf_records": int(benign.sum()),
        "steps": [int(s) for s in ds["step"].values],
        "ranks": [int(r) for r in ds["rank"].values],
    }
    aside = set_aside(ds, only=nonfinite(ds, kind="any").values)
    return _finding(ds, events, benign, stats, aside=aside)


def _nan_origin_lazy(ds: xr.Dataset) -> Finding:
    """:func:`nan_origin` on a dask-backed dataset, one step in memory at a time.

    Per-tensor persistence and per-step "any non-finite" flags are reduced chunk by chunk;
    then the flagged steps are loaded in order until one holds an event. ``stats`` count
    events and benign records over the steps searched and list the ``steps_not_searched``
    (when some were left).
    """
    nan, inf = nonfinite(ds, kind="nan"), nonfinite(ds, kind="inf")
    # one pass over the chunks: per-tensor persistence, per-step flags, totals
    persistent, (flags, n_nan, n_inf) = lazy_persistence(ds, (nan | inf).any(["rank", "tensor"]), nan.sum(),
                                                         inf.sum())
    all_steps = [int(s) for s in ds["step"].values]
    stats: dict[str, Any] = {"nan_values": int(n_nan), "inf_values": int(n_inf), "event_records": 0,
                             "benign_inf_records": 0, "steps": all_steps,
                             "ranks": [int(r) for r in ds["rank"].values]}
    benign_parts: list[xr.DataArray] = []
    aside: list[dict[str, Any]] = []
    flagged = [i for i, f in enumerate(np.asarray(flags)) if f]
    for n, i in enumerate(flagged):
        one = ds.isel(step=[i]).load()
        events, benign = event_mask(one, persistent=persistent)
        stats["event_records"] += int(events.sum())
        stats["benign_inf_records"] += int(benign.sum())
        benign_parts.append(benign.any(["step", "rank"]))
        aside += set_aside(one, only=nonfinite(one, kind="any").values)
        if bool(events.any()):
            rest = [all_steps[k] for k in flagged[n + 1:]]
            if rest:
                stats["steps_not_searched"] = rest
            return _finding(one, events, benign, stats, benign_any=benign_parts, aside=aside)
    return _finding(ds.isel(step=[]).load(), None, None, stats, benign_any=benign_parts, aside=aside)


def _benign_hints(ds: xr.Dataset, benign: xr.DataArray | None, benign_any: list[xr.DataArray] | None,
                  aside: list[dict[str, Any]], stats: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The nodes whose non-finite values are benign, and the hints on them and on what was set aside."""
    if benign_any is not None:
        mask = np.zeros(ds.sizes["tensor"], bool)
        for b in benign_any:
            mask |= b.values
    else:
        assert benign is not None
        mask = benign.any(["step", "rank"]).values
    benign_nodes = sorted({str(n) for n in ds["node"].values[mask]})
    hints: list[str] = []
    if benign_nodes:
        hints.append(f"{len(benign_nodes)} node(s) carry non-finite values by design (masks, or monitor "
                     "rows of tensors that never exist) and were not counted, "
                     f"e.g. {', '.join(benign_nodes[:4])}")
    if aside:
        hints.append(_aside_hint(aside))
        stats["set_aside_entries"] = sum(a["entries"] for a in aside)
    return benign_nodes, hints


def _inputs_with_inf(ds: xr.Dataset, e: xr.Dataset, step: int, origin: RankEvent) -> list[str]:
    """The origin node's inputs (and parameters) recorded with a non-finite statistic (undefined ones left out)."""
    node_cols = np.flatnonzero(ds["node"].values == origin.node)
    inputs = [c for c in node_cols if ds["role"].values[c] in ("input", "parameter")]
    und = undefined_mask(ds)[list(ds["step"].values).index(step), list(ds["rank"].values).index(origin.rank)]
    return [str(ds["tensor"].values[c]) for c in inputs
            if bool(e["present"].values[c]) and not und[c] and not np.isfinite(
                [e[s].values[c] for s in ("max", "min", "mean", "norm")]).all()]


def _how(ds: xr.Dataset, step: int, origin: RankEvent) -> tuple[bool, bool, str, list[str]]:
    """``(is_nan, created, how, inputs_with_inf)``: what the origin holds and whether its node created it."""
    j = list(ds["tensor"].values).index(origin.tensor)
    role = str(ds["role"].values[j])
    kind = str(ds["kind"].values[j])
    e = ds.sel(step=step, rank=origin.rank)
    is_nan = bool(nonfinite(e.sel(tensor=[origin.tensor]), kind="nan").any())
    input_inf = _inputs_with_inf(ds, e, step, origin)
    if kind == "monitor":
        how = "first recorded in this monitored tensor"
        created = True
    elif origin.inherited:
        how = "arrived through a collective while this rank's own earlier tensors were clean"
        created = False
    elif role in ("output", "grad"):
        created = True
        how = "created by this node (its inputs hold no NaN)" if is_nan else \
            "created by this node from finite inputs (overflow?)"
        if input_inf and is_nan:
            how = "created by this node from ±inf inputs (inf − inf, 0 × inf, or a fully masked row)"
    else:
        created = False
        how = "came in through this node's inputs (not produced by any recorded op: data, " \
              "parameters or an unhooked op)"
    return is_nan, created, how, input_inf


def _suspects(step: int, origin: RankEvent, others: list[RankEvent]) -> list[dict[str, Any]]:
    """The origin, then each other rank's first event (inherited, or after how many collectives)."""
    suspects = [{"step": step, "rank": origin.rank, "node": origin.node, "tensor": origin.tensor,
                 "why": "origin", "epoch": origin.epoch}]
    for ev in others:
        suspects.append({"step": ev.step, "rank": ev.rank, "node": ev.node, "tensor": ev.tensor,
                         "why": "inherited via communication" if ev.inherited else
                         f"first event on rank {ev.rank}, {after_collectives(ev.epoch)}", "epoch": ev.epoch})
    return suspects


def _rank_hints(origin: RankEvent, per_rank: list[RankEvent]) -> list[str]:
    """What the ranks' first events say: no local origin anywhere, or several ranks creating NaN at once."""
    hints = []
    if origin.inherited:
        hints.append("no rank shows a local origin: the collective itself produced the NaN "
                     "(check its dtype / reduce op), or the source rank was not dumped")
    # ranks whose own first event is as early as the origin's (a later one may be downstream of it, e.g. a
    # pipeline stage receiving the NaN gradient point-to-point, whose irecv buffer has no defined value)
    if len([p for p in per_rank if not p.inherited and p.epoch == origin.epoch]) > 1:
        hints.append("several ranks create NaN independently at this step: suspect shared data "
                     "or shared parameters rather than one rank")
    return hints


def _finding(ds: xr.Dataset, events: xr.DataArray | None, benign: xr.DataArray | None,
             stats: dict[str, Any], *, benign_any: list[xr.DataArray] | None = None,
             aside: list[dict[str, Any]] | None = None) -> Finding:
    """The finding, from the event and benign masks of *ds* (the steps searched).

    *aside*: the non-finite entries set aside as undefined (:func:`precnb.analysis.undefined.set_aside`),
    listed in the finding's ``evidence["set_aside"]`` and a hint.
    """
    aside = _merge_aside(aside or [])
    benign_nodes, hints = _benign_hints(ds, benign, benign_any, aside, stats)
    if events is None or not bool(events.any()):
        return Finding(kind="none", reason="no NaN and no unexpected ±inf in the recorded statistics",
                       hints=hints, stats=stats, evidence={"benign_nodes": benign_nodes[:50], "set_aside": aside})
    any_step = events.any(["rank", "tensor"])
    step = int(ds["step"].values[int(np.argmax(any_step.values))])
    per_rank = first_event_per_rank(events, ds["seq"], ds, step)
    origin, others = pick_origin(per_rank)
    assert origin is not None
    is_nan, created, how, input_inf = _how(ds, step, origin)
    what = "NaN" if is_nan else "±inf"
    node = origin.node
    reason = f"first {what} at step {step}, rank {origin.rank}: {node} — {how}"
    values: dict[str, Any] = {"entry": entry_values(ds, step=step, rank=origin.rank, tensor=origin.tensor),
                              "created_by_node": created}
    if input_inf:
        values["inputs_with_inf"] = input_inf
    hints += _rank_hints(origin, per_rank)
    from precnb.analysis.causal.coverage import find_gap, gap_hint
    from precnb.analysis.nan.causes import nan_causes

    causes = nan_causes(ds, step=step, rank=origin.rank, tensor=origin.tensor) if created else []
    gap = None if created or origin.inherited else find_gap(ds, step=step, rank=origin.rank, tensor=origin.tensor,
                                                             what=what)
    if gap is not None:
        hints.insert(0, gap_hint(gap))
        reason = (f"first {what} at step {step}, rank {origin.rank}: {node} — "
                  + (f"the gradient of {gap['gradient_of']} " if gap.get("gradient_of") else "its input ")
                  + f"came from an op msprobe did not capture inside {gap.get('module') or 'the model'}")
    evidence = node_evidence(ds, node, step=step, rank=origin.rank, tensor=origin.tensor)
    evidence["ranks_with_events"] = [p.rank for p in per_rank]
    evidence["benign_nodes"] = benign_nodes[:50]
    evidence["set_aside"] = aside
    own_module = entry_meta(ds, origin.tensor, step, origin.rank)["module"]  # that rank's own
    module = (gap.get("module") if gap else None) or own_module or None
    if gap is not None:
        evidence["node_module"] = own_module
    return Finding(kind="nan_origin", reason=reason, step=step, rank=origin.rank, node=node,
                   tensor=origin.tensor, module=module, values=values, hints=hints,
                   suspects=_suspects(step, origin, others), evidence=evidence, stats=stats, causes=causes, gap=gap)
