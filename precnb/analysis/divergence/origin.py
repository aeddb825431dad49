"""The first-divergence finding at its origin: where, why, what followed, and what ran in one run only before it.

:func:`origin_finding` takes a :class:`~precnb.analysis.divergence.judged.Judged` pair that has a
difference left: the first differing step, its origin rank and tensor in the communication-aware order
of :mod:`precnb.analysis.causal.order`, the reason, the suspects after it, the evidence (first differing API
and module, the culprit module), and — when an op recorded in one run only runs before the first value
difference — that op as the finding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from precnb.analysis.causal.order import RankEvent, after_collectives, first_event_per_rank, pick_origin
from precnb.analysis.compare import Comparison
from precnb.analysis.divergence.culprit import culprit_module
from precnb.analysis.divergence.hints import divergence_hints
from precnb.analysis.divergence.judged import Judged
from precnb.analysis.findings import Finding
from precnb.analysis.findings.evidence import (
    departing_copy,
    entry_values,
    first_by_seq,
    node_evidence,
    shard_suspect,
    stat_distance,
)
from precnb.schema import entry_dtype, entry_meta

__all__ = ["origin_finding"]

MAX_SUSPECTS = 6  # later differing nodes on the origin rank listed as suspects (beyond the origin's own)


@dataclass
class _Origin:
    """The origin entry of a divergence: its event, position and labels."""

    event: RankEvent
    step: int
    si: int  # index of the step in the comparison
    ri: int  # index of the rank
    col: int  # index of the tensor
    role: str
    module: str | None  # the innermost module around the origin (the culprit's when one is found)
    parent: str  # the module call around the origin (the origin itself when it is a module record)
    dmask: np.ndarray  # (tensor,) the differences at (step, rank)
    sq: np.ndarray  # (tensor,) execution order at (step, rank)

    @property
    def rank(self) -> int:
        return self.event.rank

    @property
    def tensor(self) -> str:
        return self.event.tensor


def _first_of_kind(mask: np.ndarray, seq: np.ndarray, kinds: np.ndarray, kind: str) -> int | None:
    return first_by_seq(mask & (kinds == kind), seq)


def _locate(j: Judged, step: int, event: RankEvent) -> _Origin:
    """Where the origin *event* sits in the comparison, and its role and module."""
    ds, b = j.cmp.ds, j.b
    si = list(ds["step"].values).index(step)
    ri = list(ds["rank"].values).index(event.rank)
    col = list(ds["tensor"].values).index(event.tensor)
    # the target rank's own (a label may name another op elsewhere)
    own_meta = entry_meta(j.cmp.targ, event.tensor, step, event.rank)
    parent = (own_meta["parent"] or str(b["parent"].values[col])) if str(b["kind"].values[col]) == "api" \
        else event.node
    return _Origin(event=event, step=step, si=si, ri=ri, col=col, role=str(b["role"].values[col]),
                   module=own_meta["module"] or str(b["module"].values[col]) or None, parent=parent,
                   dmask=j.diff.values[si, ri], sq=j.seq.values[si, ri].astype(np.int64))


def _origin_values(j: Judged, o: _Origin) -> dict[str, Any]:
    """The origin entry's statistics in both runs, its relative difference and tolerance (and tensor metrics)."""
    cmp, names = j.cmp, j.names
    vb = entry_values(cmp.base, step=o.step, rank=o.rank, tensor=o.tensor)
    vt = entry_values(cmp.targ, step=o.step, rank=o.rank, tensor=o.tensor)
    values: dict[str, Any] = {names[0]: vb, names[1]: vt, "rel_diff": float(cmp.rel.values[o.si, o.ri, o.col]),
                              "rtol": float(cmp.rtol.values[o.col])}
    from precnb.analysis.divergence.carried import created_rule

    rule = created_rule(j, o.si, o.ri, o.col)
    if rule:
        values["rule"] = rule
    departing = departing_copy(cmp.targ, vb, step=o.step, rank=o.rank, tensor=o.tensor)
    if departing is not None and _drawn_apart(cmp, o, vb, values["rtol"]):
        values["copies_undecided"] = sorted(r for r in (departing["rank"], departing["agrees"]) if r is not None)
        departing = None
    if departing is not None:  # the copy that departs from the baseline is the one shown, with its dump rank
        values[names[1]] = {**vt, **departing["values"]}
        # the difference shown is the departing copy's (the merged entry's first copy may agree: rel_diff 0)
        values["rel_diff"] = max(float(values["rel_diff"]), stat_distance(departing["values"], vb))
        values["departing_rank"] = departing["rank"]
        values["agreeing_rank"] = departing["agrees"]
    else:  # a merged shard: the member behind the difference, when one is singled out
        suspect = shard_suspect(cmp.targ, vb, step=o.step, rank=o.rank, tensor=o.tensor, rtol=values["rtol"])
        if suspect is not None and suspect["rank"] is not None:
            values["shard_rank"] = suspect["rank"]
            values["shard_why"] = suspect["why"]
        elif suspect is not None:  # the extremes' holders are vouched for: a lone other member is the suspect
            values["shard_vouched"] = suspect["vouched"]
            values["shard_vouched_by"] = suspect.get("by", ["Max", "Min"])
    # -- issue #17 hook: the origin's tensor metrics and the rule that fired
    from precnb.analysis.tensor.findings import origin_tensor_values

    values.update(origin_tensor_values(cmp, step=o.step, rank=o.rank, tensor=o.tensor))
    if o.tensor in cmp.dtype_notes:
        values["dtype_note"] = "{} vs {}: {}".format(*cmp.dtype_notes[o.tensor])
    if cmp.step_offset:
        values["target_step"] = o.step + cmp.step_offset
    return values


def _drawn_apart(cmp: Comparison, o: _Origin, vb: dict[str, Any], rtol: float) -> bool:
    """Whether the baseline cannot tell which copy of a random draw departs: it draws apart from both by design.

    A random op of a pipeline stage the baseline's layout seeds otherwise (``seed + 100 x pipeline rank``), or of a
    draw split another way, matches the baseline in neither copy: the nearer copy is only nearer by chance (an
    unsynchronised seed on stage 1 against the unsharded run). Where the nearer copy agrees within tolerance (stage
    0's first draws), the baseline does decide.
    """
    from precnb.analysis.divergence.random_draws import _why as drawn_differently
    from precnb.analysis.findings.evidence import stat_distance
    from precnb.analysis.random_ops import is_random_op

    if not is_random_op(o.event.node) or drawn_differently(cmp, o.tensor) is None:
        return False
    e = cmp.targ.sel(step=o.step, rank=o.rank, tensor=o.tensor)
    copies = [entry_values(cmp.targ, step=o.step, rank=o.rank, tensor=o.tensor),
              {s: float(e[f"copy_{s}"]) for s in ("max", "min", "mean", "norm")}]
    return min(stat_distance(c, vb) for c in copies) > rtol


_WHY_BY_ROLE = {"output": "inputs agree, output differs: computed differently here",
                "parameter": "a parameter differs", "grad": "a parameter gradient differs"}


def _why(cmp: Comparison, o: _Origin, values: dict[str, Any]) -> str:
    """Why the origin is where the runs part: by its role, inherited through a collective, or copies differing."""
    why = _WHY_BY_ROLE.get(o.role, "an input differs before any recorded op changed it")
    if o.event.inherited and o.event.via == "p2p":
        why = ("an input differs after a pipeline receive from a peer stage that differs too "
               "(no rank has an earlier local difference)")
    elif o.event.inherited:
        why = ("the output of a collective differs while this rank's own inputs agree "
               "(no rank has an earlier local difference)")
    replica = _replica_reason(cmp, o.si, o.ri, o.col, o.tensor)
    if replica and "departing_rank" in values:
        return (f"{replica}: rank {values['departing_rank']}'s copy departs from the baseline, rank "
                f"{values['agreeing_rank']}'s matches it")
    if replica and "copies_undecided" in values:
        return f"{replica}: neither copy matches the baseline"
    return replica or why


def _origin_hints(j: Judged, o: _Origin, before: list[dict[str, Any]]) -> list[str]:
    """The finding's hints: the divergence's own (dtype and shape changes, structure before it), then the pair's."""
    cmp, hints = j.cmp, j.hints
    same_shard = _same_shard_reason(cmp, o.tensor)
    if same_shard:
        hints.insert(0, f"{o.tensor}: {same_shard}")
    if j.part:
        hints.append(f"{j.part}: the rest was not compared (steps, ranks or tensors one run does not hold)")
    dtype_changed = dict(cmp.dtype_changed)
    if cmp.dtype_differs is not None and bool(cmp.dtype_differs.values[o.si, o.ri, o.col]):
        dtype_changed[o.tensor] = (entry_dtype(cmp.base, o.tensor, o.step, o.rank),
                                   entry_dtype(cmp.targ, o.tensor, o.step, o.rank))
    else:  # its dtype changes at other entries, not at the origin
        dtype_changed.pop(o.tensor, None)
    return divergence_hints(origin_node=o.event.node, origin_tensor=o.tensor, origin_role=o.role,
                            origin_seq=o.event.seq, first_step=o.step,
                            steps=[int(s) for s in cmp.ds["step"].values],
                            dtype_changed=dtype_changed, shape_changed=cmp.shape_changed,
                            names=j.names, structural_before=[x["node"] for x in before]) + hints


def _suspects(j: Judged, o: _Origin, others: list[RankEvent]) -> list[dict[str, Any]]:
    """The origin, the other ranks' first differences, then later differing nodes on the origin rank."""
    ds, b = j.cmp.ds, j.b
    suspects: list[dict[str, Any]] = [{"step": o.step, "rank": o.rank, "node": o.event.node, "tensor": o.tensor,
                                       "why": "origin", "epoch": o.event.epoch}]
    for e in others:
        suspects.append({"step": e.step, "rank": e.rank, "node": e.node, "tensor": e.tensor,
                         "why": "inherited via communication" if e.inherited else
                         f"first difference on rank {e.rank}, {after_collectives(e.epoch)}", "epoch": e.epoch})
    order = np.argsort(np.where(o.dmask, o.sq, np.iinfo(np.int64).max), kind="stable")
    seen = {o.event.node}
    for k in order[: int(o.dmask.sum())]:
        node = str(b["node"].values[k])
        if node in seen:
            continue
        seen.add(node)
        suspects.append({"step": o.step, "rank": o.rank, "node": node, "tensor": str(ds["tensor"].values[k]),
                         "why": "later difference on the origin rank",
                         "rel_diff": float(j.cmp.rel.values[o.si, o.ri, k])})
        if len(seen) > MAX_SUSPECTS:
            break
    return suspects


def _origin_evidence(j: Judged, o: _Origin, events: list[RankEvent]) -> dict[str, Any]:
    """The target's own evidence at the origin, the first differing API and module, the culprit module.

    Sets ``o.module`` to the culprit's module when a culprit is found.
    """
    cmp, b = j.cmp, j.b
    evidence = node_evidence(cmp.targ, o.event.node, step=o.step, rank=o.rank, tensor=o.tensor) or {}
    kinds = b["kind"].values
    j_api = _first_of_kind(o.dmask, o.sq, kinds, "api")
    j_mod = _first_of_kind(o.dmask, o.sq, kinds, "module")
    if j_api is not None:
        evidence["first_api_node"] = str(b["node"].values[j_api])
    # the first differing module: the innermost module around the first differing API, and the
    # first Module record (msprobe writes a module's record when it completes) that differs
    evidence["first_module"] = o.module or ""
    evidence["first_module_node"] = o.parent
    if j_mod is not None:
        evidence["first_differing_module_record"] = str(b["node"].values[j_mod])
    evidence["ranks_with_differences"] = [e.rank for e in events]
    if j.aside:
        evidence["set_aside"] = j.aside
    diff = j.diff.values[o.si, o.ri]  # a module's output that differs counts, carried or not (its own inside)
    if j.carried is not None:
        diff = diff | np.asarray(j.carried)[o.si, o.ri]
    culprit = culprit_module(cmp, diff, o.si, o.ri, o.event.node)
    if culprit is not None:
        evidence["culprit"] = culprit
        o.module = culprit["module"] or o.module
    if j.aligned:
        evidence["alignment"] = j.alignment.describe()
    return evidence


def _expert_replica_own(cmp: Any, x: dict[str, Any]) -> bool:
    """Whether *x*, a node in one run only, is set aside as a replica's own value of an expert-parallel run.

    On a data-parallel merge of an expert-parallel run, backward API calls have no whole-batch counterpart (each
    replica's own loss), and their labels come from call counters that differ between the replicas (each holds
    other experts) and from the other run's: a label present on some replicas only, or missing from the other
    run, says nothing about what ran there.
    """
    why = str((cmp.undefined_why or {}).get(str(x.get("tensor")), ""))
    if not why.startswith("data-parallel"):
        return False
    return ".experts." in str(x.get("module") or "") or any(
        bool(getattr(side, "attrs", {}).get("expert_parallel")) for side in (cmp.base, cmp.targ))


def _structural_before(j: Judged, o: _Origin) -> dict[str, Any] | None:
    """The first op recorded in one run only that runs before the first value difference (None if none)."""
    cmp, ds = j.cmp, j.cmp.ds
    side_of = {j.names[0]: 0, j.names[1]: 1}
    # a computation one run makes at an earlier step can only matter when the differing step starts
    # from differing state (a parameter, or an input before any recorded op); if the step started in
    # agreement, what happened before it had no visible effect
    first_seq = int(np.min(np.where(cmp.both.values[o.si, o.ri], o.sq, np.iinfo(np.int64).max)))
    # (a gradient is state only when nothing compared at its step agreed before it: a forward pass that agreed
    # started from agreeing state, and the gradient was made in this step)
    state_differs = o.role == "parameter" or (
        o.role in ("input", "grad") and not o.event.inherited and int(o.event.seq) <= first_seq)
    for x in j.structural:
        if _expert_replica_own(cmp, x):
            continue
        if x["step"] < o.step:
            if state_differs:
                return x
        elif x["step"] == o.step and x["rank"] == o.rank and x["seq"] >= 0:
            own = int(ds["seq"].isel(run=side_of[x["only_in"]]).values[o.si, o.ri, o.col])
            if own >= 0 and x["seq"] < own:
                return x
    return None


def _structural_finding(j: Judged, x: dict[str, Any], o: _Origin, reason: str, values: dict[str, Any],
                        hints: list[str], suspects: list[dict[str, Any]], evidence: dict[str, Any]) -> Finding:
    """The finding when *x*, an op recorded in one run only, runs before the first value difference."""
    cmp, names = j.cmp, j.names
    evidence["first_value_difference"] = {"step": o.step, "rank": o.rank, "node": o.event.node, "tensor": o.tensor,
                                          "reason": reason}
    evidence.update({k: v for k, v in node_evidence(cmp.base if x["only_in"] == names[0] else cmp.targ,
                                                    x["node"], step=x["step"], rank=x["rank"]).items()})
    missing = names[1] if x["only_in"] == names[0] else names[0]
    reason = (f"{x['node']} runs in {x['only_in']} but not in {missing} (step {x['step']}, rank {x['rank']}), "
              f"before the first value difference ({o.event.node}, step {o.step}, rank {o.rank})")
    suspects.insert(0, {"step": x["step"], "rank": x["rank"], "node": x["node"], "tensor": x["tensor"],
                        "why": f"only in {x['only_in']}"})
    own_ds = cmp.base if x["only_in"] == names[0] else cmp.targ
    pre_values = {x["only_in"]: entry_values(own_ds, step=x["step"], rank=x["rank"], tensor=x["tensor"]),
                  "first_value_difference": {"tensor": o.tensor, **values}}
    f = Finding(kind="first_divergence", reason=reason, step=x["step"], rank=x["rank"], node=x["node"],
                tensor=x["tensor"], module=x["module"] or None, values=pre_values, structural=j.struct_out,
                crc_only=j.crc_only, hints=hints, suspects=suspects, evidence=evidence, stats=j.stats)
    if x["only_in"] == names[0]:  # a computation only the baseline has: its name is the baseline's
        f.tensor = str(x["tensor"]).removesuffix(" (baseline)")
        f.baseline = {"node": x["node"], "tensor": f.tensor, "module": x["module"] or None}
        f.evidence["only_in"] = names[0]
        return f
    return _with_baseline_names(f, j.alignment if j.aligned else None)


def origin_finding(j: Judged, any_step: Any) -> Finding:
    """The ``first_divergence`` finding of a judged pair with a difference left.

    Parameters
    ----------
    j : Judged
        The pair (:func:`~precnb.analysis.divergence.judged.judge`); its hints are extended in place.
    any_step : xarray.DataArray
        (step,) whether ``j.diff`` holds a difference at each step (one at least).

    Returns
    -------
    Finding
    """
    ds = j.cmp.ds
    step = int(ds["step"].values[int(np.argmax(any_step.values))])
    events = first_event_per_rank(j.diff, j.seq, j.b, step)
    event, others = pick_origin(events)
    assert event is not None
    o = _locate(j, step, event)
    values = _origin_values(j, o)
    reason = f"{event.node} at step {step}, rank {o.rank}: {_why(j.cmp, o, values)}"
    # structural difference just before the divergence on the same (step, rank)
    before = [s for s in j.structural if s["step"] == step and s["rank"] == o.rank]
    hints = _origin_hints(j, o, before)
    if before:
        reason += f"; {len(before)} node(s) at this step exist in one run only (see structural)"
    suspects = _suspects(j, o, others)
    evidence = _origin_evidence(j, o, events)
    # an op that exists in one run only and runs before the first value difference is the cause
    pre = _structural_before(j, o)
    if pre is not None:
        return _structural_finding(j, pre, o, reason, values, hints, suspects, evidence)
    f = Finding(kind="first_divergence", reason=reason, step=step, rank=o.rank, node=event.node,
                tensor=o.tensor, module=o.module, values=values, structural=j.struct_out,
                crc_only=j.crc_only, hints=hints, suspects=suspects, evidence=evidence, stats=j.stats)
    return _with_baseline_names(f, j.alignment if j.aligned else None)


def _same_shard_reason(cmp: Comparison, tensor: str) -> str | None:
    """The merge's reason when a split tensor's shards are identical on every rank of the group (else None)."""
    if tensor not in cmp.targ.indexes["tensor"]:
        return None
    for name in cmp.targ.coords:
        if str(name).startswith("shard_reason_"):
            said = str(cmp.targ[name].sel(tensor=tensor).values)
            if "hold the same shard" in said:
                return f"across the {str(name).removeprefix('shard_reason_').upper()} group, {said}"
    return None


def _replica_reason(cmp: Comparison, si: int, ri: int, j: int, tensor: str) -> str | None:
    """The reason of a merged replicated tensor whose copies differ at this entry (None otherwise)."""
    rd = cmp.replicas_differ
    if rd is None or not bool(rd.values[si, ri, j]):
        return None
    known = tensor in cmp.targ.indexes["tensor"]
    for name in cmp.targ.coords:
        if known and str(name).startswith("shard_kind_") and \
                str(cmp.targ[name].sel(tensor=tensor).values) == "replicas_differ":
            dim = str(name).removeprefix("shard_kind_")
            said = str(cmp.targ[f"shard_reason_{dim}"].sel(tensor=tensor).values)
            return f"across the {dim.upper()} group, this tensor {said} (the merged entry is the first copy)"
    return "its copies differ across the ranks merged into this entry"


def _with_baseline_names(f: Finding, alignment: Any) -> Finding:
    """Set ``f.baseline`` (and each suspect's ``baseline_node``) from the alignment; say both names."""
    if alignment is None:
        f.baseline = {"node": f.node, "tensor": f.tensor, "module": f.module}
        culprit = f.evidence.get("culprit")
        if culprit:
            culprit["baseline"] = {"module": culprit.get("module"), "node": culprit.get("node"),
                                   "api": culprit.get("api")}
        return f
    nodes, tensors, mods = alignment.node_map(), alignment.tensor_map(), alignment.module_map()
    f.baseline = {"node": nodes.get(f.node or ""), "tensor": tensors.get(f.tensor or ""),
                  "module": mods.get(f.module or "")}
    for s in f.suspects:
        if s.get("node") in nodes:
            s["baseline_node"] = nodes[s["node"]]
    culprit = f.evidence.get("culprit")
    if culprit:
        culprit["baseline"] = {"module": mods.get(culprit.get("module") or ""),
                               "node": nodes.get(culprit.get("node") or ""),
                               "api": nodes.get(culprit.get("api") or "")}
    b = f.baseline
    if f.node and b.get("node") and b["node"] != f.node:
        where = f" in module {f.module} (baseline {b.get('module') or '?'})" if f.module else ""
        f.reason += f"; baseline name {b['node']}{where}"
    return f
