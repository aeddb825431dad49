"""First divergence between a baseline and a target run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import xarray as xr

from precnb.analysis.compare import Comparison, compare_runs, split_runs
from precnb.analysis.evidence import entry_values, first_by_seq, node_evidence
from precnb.analysis.findings import Finding
from precnb.analysis.hints import (
    divergence_hints,
    grad_ratio_hint,
    ratio_hint,
    structural_hints,
    zero_parameter_hints,
)
from precnb.analysis.order import first_event_per_rank, pick_origin
from precnb.analysis.tolerance import Tolerance
from precnb.schema import entry_dtype

__all__ = ["first_divergence", "structural_differences"]

MAX_LISTED = 200


def structural_differences(cmp: Comparison) -> list[dict[str, Any]]:
    """Nodes recorded in one run only, at a (step, rank) both runs recorded.

    Returns a list of ``{"node", "only_in", "step", "rank", "count"}`` in execution order
    (first occurrence), one entry per node and side.
    """
    ds = cmp.ds
    nodes = ds["node"].values
    out: list[dict[str, Any]] = []
    pres_b = ds["present"].isel(run=0)
    pres_t = ds["present"].isel(run=1)
    # node-level presence per (step, rank)
    uniq, inv = np.unique(nodes, return_inverse=True)
    for side, (mine, other, run) in enumerate(
            ((pres_b, pres_t, cmp.names[0]), (pres_t, pres_b, cmp.names[1]))):
        m = mine.values  # (step, rank, tensor)
        o = other.values
        n_nodes = len(uniq)
        node_m = np.zeros((*m.shape[:2], n_nodes), bool)
        node_o = np.zeros_like(node_m)
        for j in range(m.shape[2]):  # small loop over tensors; vectorised over (step, rank)
            node_m[:, :, inv[j]] |= m[:, :, j]
            node_o[:, :, inv[j]] |= o[:, :, j]
        rank_has_other = o.any(axis=2)  # the other run recorded this (step, rank) at all
        only = node_m & ~node_o & rank_has_other[:, :, None]
        seq = ds["seq"].isel(run=side).values
        for k in np.flatnonzero(only.any(axis=(0, 1))):
            si, ri = np.argwhere(only[:, :, k])[0]
            cols = np.flatnonzero(inv == k)
            sv = seq[si, ri, cols]
            first_seq = int(sv[sv >= 0].min()) if (sv >= 0).any() else -1
            out.append({"node": str(uniq[k]), "only_in": run, "step": int(ds["step"].values[si]),
                        "rank": int(ds["rank"].values[ri]), "count": int(only[:, :, k].sum()),
                        "seq": first_seq, "tensor": str(ds["tensor"].values[cols[0]]),
                        "module": str(ds["module"].values[cols[0]])})
    out.sort(key=lambda d: (d["step"], d["seq"], d["rank"]))
    return out


def _first_of_kind(mask: np.ndarray, seq: np.ndarray, kinds: np.ndarray, kind: str) -> int | None:
    return first_by_seq(mask & (kinds == kind), seq)


def first_divergence(
    baseline: xr.Dataset,
    target: xr.Dataset | None = None,
    *,
    runs: tuple[str, str] | None = None,
    tolerance: Tolerance | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    step_offset: int | Literal["auto"] | None = None,
    crc: Literal["report", "strict"] = "report",
) -> Finding:
    """Find where *target* first departs from *baseline*.

    Order: step, then execution order (``seq``); across ranks, communication-aware (see
    :mod:`precnb.analysis.order`). Value differences are judged on statistics with
    *tolerance*; nodes recorded in one run only are reported as ``structural``; CRC
    differences with identical statistics are reported as ``crc_only`` (``crc="strict"``
    counts them as divergence).

    Parameters
    ----------
    baseline, target : xarray.Dataset
        Two runs, or one dataset with a ``run`` dim (then pass ``runs=(b, t)`` if it has more
        than two).
    runs : (str, str), optional
    tolerance : Tolerance, optional
        Defaults by dtype.
    steps, ranks : sequence of int, optional
        Restrict the search (baseline step numbers).
    step_offset : int, "auto" or None
        Target step = baseline step + offset (a resumed run). None (default): 0 when both runs
        hold the same steps, else "auto" (see :func:`precnb.analysis.compare.default_step_offset`).
    crc : {"report", "strict"}

    Returns
    -------
    Finding
        Kind ``first_divergence``, or ``none``.

    Notes
    -----
    Dask-backed (lazily opened) inputs are searched step by step (see
    :func:`precnb.analysis.stepwise.first_divergence_stepwise`): only the steps up to the
    fault are loaded, and ``stats["steps_not_searched"]`` lists the others.

    See Also
    --------
    xarray.Dataset.diff : finite differences along a dimension (unrelated).

    Examples
    --------
    >>> import precnb
    >>> f = precnb.first_divergence(base, target)  # doctest: +SKIP
    >>> f.step, f.rank, f.node  # doctest: +SKIP
    (1, 0, 'Functional.gelu.0.forward')
    """
    from precnb.analysis.stepwise import first_divergence_lazy, is_lazy

    if is_lazy(baseline) or is_lazy(target):  # out of core: load the steps up to the fault only
        b, t, pair = split_runs(baseline, target, runs=runs)
        return first_divergence_lazy(b, t, names=pair, tolerance=tolerance, steps=steps, ranks=ranks,
                                     step_offset=step_offset, crc=crc)
    cmp = compare_runs(baseline, target, runs=runs, tolerance=tolerance, steps=steps, ranks=ranks,
                       step_offset=step_offset)
    ds = cmp.ds
    names = cmp.names
    structural = structural_differences(cmp)
    diff = cmp.differs | cmp.crc_differs if crc == "strict" else cmp.differs
    crc_only_idx = np.argwhere(cmp.crc_only.values) if crc == "report" else np.zeros((0, 3), int)
    crc_only = [{"step": int(ds["step"].values[s]), "rank": int(ds["rank"].values[r]),
                 "tensor": str(ds["tensor"].values[t])} for s, r, t in crc_only_idx[:MAX_LISTED]]
    stats = {
        "compared_records": int(cmp.both.sum()),
        "differing_records": int(diff.sum()),
        "crc_only_records": int(cmp.crc_only.sum()),
        "only_in_" + names[0]: int(cmp.only_baseline.sum()),
        "only_in_" + names[1]: int(cmp.only_target.sum()),
        "steps": [int(s) for s in ds["step"].values],
        "ranks": [int(r) for r in ds["rank"].values],
        "step_offset": cmp.step_offset,
    }
    b, t = ds.isel(run=0), ds.isel(run=1)
    hints: list[str] = []
    world = int(ds.sizes["rank"])
    gh = grad_ratio_hint(b, t, cmp.both, world, names) or ratio_hint(b, t, diff, world, names)
    if gh:
        hints.append(gh)
    hints += zero_parameter_hints(b, t, cmp.both, names)
    hints += structural_hints(structural, names)
    struct_out = [{"node": s["node"], "only_in": s["only_in"], "step": s["step"], "rank": s["rank"],
                   "count": s["count"]} for s in structural[:MAX_LISTED]]
    any_step = diff.any(["rank", "tensor"])
    if not bool(any_step.any()):
        reason = "no value divergence beyond tolerance"
        if structural:
            reason += f"; {len(structural)} node(s) recorded in one run only"
        if stats["crc_only_records"]:
            reason += (f"; {stats['crc_only_records']} CRC-only difference(s) with identical statistics "
                       "(typically in-place ops whose checksum is taken while the buffer changes)")
        return Finding(kind="none", reason=reason, structural=struct_out, crc_only=crc_only,
                       hints=hints, stats=stats)
    step = int(ds["step"].values[int(np.argmax(any_step.values))])
    seq = b["seq"].where(b["seq"] >= 0, t["seq"])
    events = first_event_per_rank(diff, seq, b, step)
    origin, others = pick_origin(events)
    assert origin is not None
    r = origin.rank
    si = list(ds["step"].values).index(step)
    ri = list(ds["rank"].values).index(r)
    dmask = diff.values[si, ri]
    sq = seq.values[si, ri].astype(np.int64)
    kinds = b["kind"].values
    j_api = _first_of_kind(dmask, sq, kinds, "api")
    j_mod = _first_of_kind(dmask, sq, kinds, "module")
    tensor = origin.tensor
    j = list(ds["tensor"].values).index(tensor)
    role = str(b["role"].values[j])
    module = str(b["module"].values[j]) or None
    vb = entry_values(cmp.base, step=step, rank=r, tensor=tensor)
    vt = entry_values(cmp.targ, step=step, rank=r, tensor=tensor)
    values: dict[str, Any] = {names[0]: vb, names[1]: vt, "rel_diff": float(cmp.rel.values[si, ri, j]),
                              "rtol": float(cmp.rtol.values[j])}
    if cmp.step_offset:
        values["target_step"] = step + cmp.step_offset
    if role == "output":
        why = "inputs agree, output differs: computed differently here"
    elif role == "parameter":
        why = "a parameter differs"
    elif role == "grad":
        why = "a parameter gradient differs"
    else:
        why = "an input differs before any recorded op changed it"
    if origin.inherited:
        why = ("the output of a collective differs while this rank's own inputs agree "
               "(no rank has an earlier local difference)")
    reason = f"{origin.node} at step {step}, rank {r}: {why}"
    # structural difference just before the divergence on the same (step, rank)
    before = [s for s in structural if s["step"] == step and s["rank"] == r]
    if before:
        reason += f"; {len(before)} node(s) at this step exist in one run only (see structural)"
    dtype_changed = dict(cmp.dtype_changed)
    if cmp.dtype_differs is not None and bool(cmp.dtype_differs.values[si, ri, j]):
        dtype_changed[tensor] = (entry_dtype(cmp.base, tensor, step, r), entry_dtype(cmp.targ, tensor, step, r))
    else:  # its dtype changes at other entries, not at the origin
        dtype_changed.pop(tensor, None)
    hints = divergence_hints(origin_node=origin.node, origin_tensor=tensor, origin_role=role,
                             origin_seq=origin.seq, first_step=step,
                             steps=[int(s) for s in ds["step"].values],
                             dtype_changed=dtype_changed, shape_changed=cmp.shape_changed,
                             names=names, structural_before=[x["node"] for x in before]) + hints
    suspects: list[dict[str, Any]] = [{"step": step, "rank": r, "node": origin.node, "tensor": tensor,
                                       "why": "origin", "epoch": origin.epoch}]
    for e in others:
        suspects.append({"step": e.step, "rank": e.rank, "node": e.node, "tensor": e.tensor,
                         "why": "inherited via communication" if e.inherited else
                         f"first difference on rank {e.rank} (epoch {e.epoch})", "epoch": e.epoch})
    order = np.argsort(np.where(dmask, sq, np.iinfo(np.int64).max), kind="stable")
    seen = {origin.node}
    for k in order[: int(dmask.sum())]:
        node = str(b["node"].values[k])
        if node in seen:
            continue
        seen.add(node)
        suspects.append({"step": step, "rank": r, "node": node, "tensor": str(ds["tensor"].values[k]),
                         "why": "later difference on the origin rank",
                         "rel_diff": float(cmp.rel.values[si, ri, k])})
        if len(seen) > 6:
            break
    ev_ds = t if origin.node in t.attrs.get("stacks", "") else b
    evidence = node_evidence(ev_ds, origin.node) or {}
    if j_api is not None:
        evidence["first_api_node"] = str(b["node"].values[j_api])
    # the first differing module: the innermost module around the first differing API, and the
    # first Module record (msprobe writes a module's record when it completes) that differs
    parent = str(b["parent"].values[j]) if str(b["kind"].values[j]) == "api" else origin.node
    evidence["first_module"] = module or ""
    evidence["first_module_node"] = parent
    if j_mod is not None:
        evidence["first_differing_module_record"] = str(b["node"].values[j_mod])
    evidence["ranks_with_differences"] = [e.rank for e in events]
    # an op that exists in one run only and runs before the first value difference is the cause
    side_of = {names[0]: 0, names[1]: 1}
    pre = []
    for x in structural:
        if x["step"] < step:
            pre.append(x)
        elif x["step"] == step and x["rank"] == r and x["seq"] >= 0:
            own = int(ds["seq"].isel(run=side_of[x["only_in"]]).values[si, ri, j])
            if own >= 0 and x["seq"] < own:
                pre.append(x)
    if pre:
        x = pre[0]
        evidence["first_value_difference"] = {"step": step, "rank": r, "node": origin.node, "tensor": tensor,
                                              "reason": reason}
        evidence.update({k: v for k, v in node_evidence(b if x["only_in"] == names[0] else t,
                                                        x["node"]).items()})
        missing = names[1] if x["only_in"] == names[0] else names[0]
        reason = (f"{x['node']} runs in {x['only_in']} but not in {missing} (step {x['step']}, rank {x['rank']}), "
                  f"before the first value difference ({origin.node}, step {step}, rank {r})")
        suspects.insert(0, {"step": x["step"], "rank": x["rank"], "node": x["node"], "tensor": x["tensor"],
                            "why": f"only in {x['only_in']}"})
        own_ds = cmp.base if x["only_in"] == names[0] else cmp.targ
        pre_values = {x["only_in"]: entry_values(own_ds, step=x["step"], rank=x["rank"], tensor=x["tensor"]),
                      "first_value_difference": {"tensor": tensor, **values}}
        return Finding(kind="first_divergence", reason=reason, step=x["step"], rank=x["rank"], node=x["node"],
                       tensor=x["tensor"], module=x["module"] or None, values=pre_values, structural=struct_out,
                       crc_only=crc_only, hints=hints, suspects=suspects, evidence=evidence, stats=stats)
    return Finding(kind="first_divergence", reason=reason, step=step, rank=r, node=origin.node,
                   tensor=tensor, module=module, values=values, structural=struct_out,
                   crc_only=crc_only, hints=hints, suspects=suspects, evidence=evidence, stats=stats)
