"""First divergence between a baseline and a target run."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import xarray as xr

from precnb.analysis.compare import Comparison, NothingToCompareError, compare_runs, split_runs
from precnb.analysis.compared import compared_part, nothing_compared
from precnb.analysis.divergence.crossfw import _drop_isolated, noise_floor, searched_differences, two_frameworks
from precnb.analysis.divergence.hints import (
    divergence_hints,
    grad_ratio_hint,
    ratio_hint,
    structural_hints,
    zero_parameter_hints,
)
from precnb.analysis.divergence.versions import (
    late_inplace_inputs,
    late_inplace_text,
    releases_of,
    version_structural_hints,
)
from precnb.analysis.evidence import entry_values, first_by_seq, node_evidence
from precnb.analysis.findings import Finding
from precnb.analysis.order import after_collectives, first_event_per_rank, pick_origin
from precnb.analysis.stepwise import StepLoader, is_lazy, search_stepwise
from precnb.analysis.tolerance import Tolerance
from precnb.schema import entry_dtype, entry_meta

__all__ = ["first_divergence", "first_divergence_stepwise", "noise_floor", "pair_comparison", "searched_differences",
           "structural_differences", "two_frameworks"]

MAX_LISTED = 200


def _any_per_node(pres: np.ndarray, inv: np.ndarray, n_nodes: int) -> np.ndarray:
    """(step, rank, node): whether any tensor of the node (``inv``: each tensor's node index) is set in *pres*."""
    if not n_nodes:
        return np.zeros((*pres.shape[:2], 0), bool)
    order = np.argsort(inv, kind="stable")  # every node has a tensor: one run of columns per node, in node order
    starts = np.flatnonzero(np.r_[True, np.diff(inv[order]) != 0])
    return np.logical_or.reduceat(pres[:, :, order], starts, axis=2)


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
        node_m, node_o = _any_per_node(m, inv, n_nodes), _any_per_node(o, inv, n_nodes)
        rank_has_other: np.ndarray = np.any(o, axis=2)  # the other run recorded this (step, rank) at all
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


def _nothing(b: xr.Dataset, t: xr.Dataset, names: tuple[str, str], alignment: Any, step_offset: Any,
             steps: Sequence[int] | None, ranks: Sequence[int] | None) -> Finding:
    """The "nothing compared" finding of a pair (the baseline in the target's names when aligned)."""
    if alignment is not None:
        b = alignment.apply(b)
    off = step_offset if isinstance(step_offset, int) and not isinstance(step_offset, bool) else 0
    return nothing_compared(b, t, names, step_offset=off, steps=steps, ranks=ranks)


def _dtype_note_text(notes: dict[str, tuple[str, str, str]], names: tuple[str, str]) -> str:
    """One hint for the tensors whose dtypes differ but hold the same values."""
    shown = [f"{lbl}: {a} in {names[0]} vs {b} in {names[1]} ({why})" for lbl, (a, b, why) in list(notes.items())[:3]]
    more = f"; and {len(notes) - 3} more" if len(notes) > 3 else ""
    return (f"{len(notes)} tensor(s) differ in dtype only (the same values in another dtype: compared on their "
            f"statistics, the dtype is not a difference): {'; '.join(shown)}{more}")


def _first_of_kind(mask: np.ndarray, seq: np.ndarray, kinds: np.ndarray, kind: str) -> int | None:
    return first_by_seq(mask & (kinds == kind), seq)


def pair_comparison(baseline: xr.Dataset, target: xr.Dataset, *, alignment: Any = None,
                    tolerance: Tolerance | None = None, **kw: Any) -> Comparison:
    """The :class:`Comparison` the first-divergence search judges.

    :func:`compare_runs`, and for two frameworks without a tolerance, again with the tolerance
    calibrated on their noise floor (:func:`noise_floor`; ``calibration`` holds it). *kw* goes to
    :func:`compare_runs` (``runs``, ``steps``, ``ranks``, ``step_offset``, ``tensor_metrics``, ...).
    """
    aligned = alignment is not None and not getattr(alignment, "identical", True)
    cmp = compare_runs(baseline, target, tolerance=tolerance, alignment=alignment if aligned else None, **kw)
    if two_frameworks(alignment) and tolerance is None and bool(cmp.both.any()):
        # two frameworks: calibrate from how well the aligned pair agrees before any real difference
        noise, calibrated = noise_floor(cmp)
        if calibrated is not None:
            cmp = compare_runs(baseline, target, tolerance=calibrated, alignment=alignment, **kw)
        cmp.calibration = noise
    return cmp


def first_divergence(  # noqa: C901
    baseline: xr.Dataset,
    target: xr.Dataset | None = None,
    *,
    runs: tuple[str, str] | None = None,
    tolerance: Tolerance | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    step_offset: int | Literal["auto"] | None = None,
    crc: Literal["report", "strict"] = "report",
    alignment: Any = "auto",
    tensor_metrics: xr.Dataset | None = None,
    tensor_thresholds: Any = None,
    precision_aware: bool = True,
    comparison: Comparison | None = None,
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
    alignment : Alignment, "auto" or None
        How the baseline's names map onto the target's. ``"auto"`` (default): :func:`precnb.align`
        pairs them (identity, at no cost, when both runs have the same names); None compares
        names as they are. The finding's ``node``, ``tensor`` and ``module`` are the target's;
        its ``baseline`` field holds the baseline's names.
    tensor_metrics : xarray.Dataset, optional
        :func:`precnb.tensor_metrics` of the pair: entries whose tensors were compared are
        judged on them first (msprobe's thresholds, see :mod:`precnb.analysis.tensor.verdicts`),
        the others on statistics.
    tensor_thresholds : TensorThresholds, optional
        Bounds of the tensor verdict (e.g. :meth:`TensorThresholds.calibrate` on a healthy pair).
    precision_aware : bool
        A run in systematic lower precision (autocast) is compared with that precision's
        tolerance and says so (:mod:`precnb.analysis.precision`); an isolated dtype change stays
        a finding.
    comparison : Comparison, optional
        The pair as already compared with these options (the pipeline builds it once for the
        search and the views); the search then does not compare the runs again.

    Returns
    -------
    Finding
        Kind ``first_divergence``, or ``none``.

    Notes
    -----
    Dask-backed (lazily opened) inputs are searched step by step (see
    :func:`first_divergence_stepwise`): only the steps up to the
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
    if is_lazy(baseline) or is_lazy(target):  # out of core: load the steps up to the fault only
        b, t, pair = split_runs(baseline, target, runs=runs)
        try:
            return _first_divergence_lazy(b, t, names=pair, tolerance=tolerance, steps=steps, ranks=ranks,
                                          step_offset=step_offset, crc=crc, alignment=alignment,
                                          tensor_metrics=tensor_metrics, tensor_thresholds=tensor_thresholds,
                                          precision_aware=precision_aware)
        except NothingToCompareError:
            return _nothing(b, t, pair, None, step_offset, steps, ranks)
    b_in, t_in, pair = split_runs(baseline, target, runs=runs)
    hooks = {"tensor_metrics": tensor_metrics, "tensor_thresholds": tensor_thresholds,
             "precision_aware": precision_aware}  # issue #17
    if isinstance(alignment, str) and alignment == "auto":
        from precnb.analysis.align import Alignment, align

        # one dataset holding both runs (precnb.open_runs) already has the baseline in the target's names
        alignment = (Alignment.of(baseline) if target is None else None) or align(b_in, t_in)
    aligned = alignment is not None and not alignment.identical
    try:
        cmp = comparison if comparison is not None else pair_comparison(
            b_in, t_in, runs=pair, tolerance=tolerance, steps=steps, ranks=ranks, step_offset=step_offset,
            alignment=alignment, **hooks)
    except NothingToCompareError:  # no step or rank in common: nothing compared is the answer, not an error
        return _nothing(b_in, t_in, pair, alignment if aligned else None, step_offset, steps, ranks)
    if not bool(cmp.both.any()):
        return _nothing(b_in, t_in, pair, alignment if aligned else None, cmp.step_offset, steps, ranks)
    noise = cmp.calibration
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
    if aligned:
        stats["alignment"] = alignment.summary()
    aside = cmp.set_aside()
    if aside:
        stats["set_aside_entries"] = sum(a["entries"] for a in aside)
    # two codebases: the calls the alignment set aside as their organisation (masks, identity dropout, ...)
    codebase_aside = alignment.set_aside() if aligned else []
    if noise is not None:
        stats["cross_framework_noise"] = noise
    b, t = ds.isel(run=0), ds.isel(run=1)
    hints: list[str] = []
    # -- issue #17 hook: say how precision and tensor data were used (precnb.analysis.tensor.findings)
    from precnb.analysis.tensor.findings import comparison_notes

    notes = comparison_notes(cmp, stats)
    hints += notes
    if cmp.dtype_notes:  # dtypes that hold the same values (precnb.dtypes): a note on the pair, not a difference
        stats["dtype_notes"] = {k: {names[0]: a, names[1]: c, "why": why}
                                for k, (a, c, why) in list(cmp.dtype_notes.items())[:MAX_LISTED]}
        hints.append(_dtype_note_text(cmp.dtype_notes, names))
    world = int(ds.sizes["rank"])
    gh = grad_ratio_hint(b, t, cmp.both, world, names) or ratio_hint(b, t, diff, world, names)
    if gh:
        hints.append(gh)
    hints += zero_parameter_hints(b, t, cmp.both, names)
    hints += structural_hints(structural, names)
    hints += version_structural_hints(structural, names, (b_in, t_in))
    if aside:
        hints.append("set aside, not compared (by construction): " + "; ".join(
            f"{a['entries']} differing entr{'y' if a['entries'] == 1 else 'ies'} {a['why']} (e.g. "
            f"{a['examples'][0]['tensor']})" for a in aside))
    if codebase_aside:
        hints.append("set aside, not compared (each codebase's own organisation): " + "; ".join(
            f"{sum(a['nodes'].values())} node(s) {a['why'].removeprefix('organisation: ')} (e.g. "
            f"{a['examples'][0]['node']})" for a in codebase_aside[:4]))
    aside = aside + codebase_aside
    struct_out = [{"node": s["node"], "only_in": s["only_in"], "step": s["step"], "rank": s["rank"],
                   "count": s["count"]} for s in structural[:MAX_LISTED]]
    seq = b["seq"].where(b["seq"] >= 0, t["seq"])
    late, late_ex = late_inplace_inputs(cmp, diff, releases=(releases_of(b_in), releases_of(t_in)))
    if late_ex:  # how one run's msprobe release records in-place ops: a version difference
        diff = diff & ~late
        stats["version_differences"] = int(late.sum())
        hints.append(late_inplace_text(late_ex))
    isolated: list[dict[str, Any]] = []
    if two_frameworks(alignment):  # two frameworks record some backward ops differently
        diff, isolated = _drop_isolated(diff, seq, cmp)
    if isolated:
        stats["isolated_differences"] = len(isolated)
        hints.append(f"{len(isolated)} difference(s) did not propagate (the records right after agree again), "
                     f"e.g. {isolated[0]['tensor']} at step {isolated[0]['step']}: a recording difference "
                     "(what the two runs capture at that op), not a divergence")
    part = compared_part(int(cmp.both.sum()), b_in, t_in, names, stats)
    any_step = diff.any(["rank", "tensor"])
    if not bool(any_step.any()):
        reason = "no value divergence beyond tolerance"
        if part:
            reason += f" ({part})"
        if structural:
            reason += f"; {len(structural)} node(s) recorded in one run only"
        if stats["crc_only_records"]:
            reason += (f"; {stats['crc_only_records']} CRC-only difference(s) with identical statistics "
                       "(typically in-place ops whose checksum is taken while the buffer changes)")
        if cmp.precision is not None and cmp.precision.systematic:
            reason += f"; {cmp.precision.statement()}"
        evidence_none: dict[str, Any] = {"alignment": alignment.describe()} if aligned else {}
        if aside:
            evidence_none["set_aside"] = aside
        if isolated:
            evidence_none["isolated_differences"] = isolated[:MAX_LISTED]
        return Finding(kind="none", reason=reason, structural=struct_out, crc_only=crc_only,
                       hints=hints, stats=stats, evidence=evidence_none)
    step = int(ds["step"].values[int(np.argmax(any_step.values))])
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
    own_meta = entry_meta(cmp.targ, tensor, step, r)  # the target rank's own (a label may name another op elsewhere)
    module = own_meta["module"] or str(b["module"].values[j]) or None
    vb = entry_values(cmp.base, step=step, rank=r, tensor=tensor)
    vt = entry_values(cmp.targ, step=step, rank=r, tensor=tensor)
    values: dict[str, Any] = {names[0]: vb, names[1]: vt, "rel_diff": float(cmp.rel.values[si, ri, j]),
                              "rtol": float(cmp.rtol.values[j])}
    # -- issue #17 hook: the origin's tensor metrics and the rule that fired
    from precnb.analysis.tensor.findings import origin_tensor_values

    values.update(origin_tensor_values(cmp, step=step, rank=r, tensor=tensor))
    if tensor in cmp.dtype_notes:
        values["dtype_note"] = "{} vs {}: {}".format(*cmp.dtype_notes[tensor])
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
    copies = _replica_reason(cmp, si, ri, j, tensor)
    if copies:
        why = copies
    same_shard = _same_shard_reason(cmp, tensor)
    if same_shard:
        hints.insert(0, f"{tensor}: {same_shard}")
    reason = f"{origin.node} at step {step}, rank {r}: {why}"
    if part:
        hints.append(f"{part}: the rest was not compared (steps, ranks or tensors one run does not hold)")
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
                         f"first difference on rank {e.rank}, {after_collectives(e.epoch)}", "epoch": e.epoch})
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
    evidence = node_evidence(cmp.targ, origin.node, step=step, rank=r, tensor=tensor) or {}  # the target's own
    if j_api is not None:
        evidence["first_api_node"] = str(b["node"].values[j_api])
    # the first differing module: the innermost module around the first differing API, and the
    # first Module record (msprobe writes a module's record when it completes) that differs
    parent = (own_meta["parent"] or str(b["parent"].values[j])) if str(b["kind"].values[j]) == "api" else origin.node
    evidence["first_module"] = module or ""
    evidence["first_module_node"] = parent
    if j_mod is not None:
        evidence["first_differing_module_record"] = str(b["node"].values[j_mod])
    evidence["ranks_with_differences"] = [e.rank for e in events]
    if aside:
        evidence["set_aside"] = aside
    culprit = _culprit(cmp, diff.values[si, ri], si, ri, origin.node)
    if culprit is not None:
        evidence["culprit"] = culprit
        module = culprit["module"] or module
    if aligned:
        evidence["alignment"] = alignment.describe()
    # an op that exists in one run only and runs before the first value difference is the cause
    side_of = {names[0]: 0, names[1]: 1}
    # a computation one run makes at an earlier step can only matter when the differing step starts
    # from differing state (a parameter, or an input before any recorded op); if the step started in
    # agreement, what happened before it had no visible effect
    first_seq = int(np.min(np.where(cmp.both.values[si, ri], sq, np.iinfo(np.int64).max)))
    state_differs = role in ("parameter", "grad") or (
        role == "input" and not origin.inherited and int(origin.seq) <= first_seq)
    pre = []
    for x in structural:
        if x["step"] < step:
            if state_differs:
                pre.append(x)
        elif x["step"] == step and x["rank"] == r and x["seq"] >= 0:
            own = int(ds["seq"].isel(run=side_of[x["only_in"]]).values[si, ri, j])
            if own >= 0 and x["seq"] < own:
                pre.append(x)
    if pre:
        x = pre[0]
        evidence["first_value_difference"] = {"step": step, "rank": r, "node": origin.node, "tensor": tensor,
                                              "reason": reason}
        evidence.update({k: v for k, v in node_evidence(cmp.base if x["only_in"] == names[0] else cmp.targ,
                                                        x["node"], step=x["step"], rank=x["rank"]).items()})
        missing = names[1] if x["only_in"] == names[0] else names[0]
        reason = (f"{x['node']} runs in {x['only_in']} but not in {missing} (step {x['step']}, rank {x['rank']}), "
                  f"before the first value difference ({origin.node}, step {step}, rank {r})")
        suspects.insert(0, {"step": x["step"], "rank": x["rank"], "node": x["node"], "tensor": x["tensor"],
                            "why": f"only in {x['only_in']}"})
        own_ds = cmp.base if x["only_in"] == names[0] else cmp.targ
        pre_values = {x["only_in"]: entry_values(own_ds, step=x["step"], rank=x["rank"], tensor=x["tensor"]),
                      "first_value_difference": {"tensor": tensor, **values}}
        f = Finding(kind="first_divergence", reason=reason, step=x["step"], rank=x["rank"], node=x["node"],
                    tensor=x["tensor"], module=x["module"] or None, values=pre_values, structural=struct_out,
                    crc_only=crc_only, hints=hints, suspects=suspects, evidence=evidence, stats=stats)
        if x["only_in"] == names[0]:  # a computation only the baseline has: its name is the baseline's
            f.tensor = str(x["tensor"]).removesuffix(" (baseline)")
            f.baseline = {"node": x["node"], "tensor": f.tensor, "module": x["module"] or None}
            f.evidence["only_in"] = names[0]
            return f
        return _with_baseline_names(f, alignment if aligned else None)
    f = Finding(kind="first_divergence", reason=reason, step=step, rank=r, node=origin.node,
                tensor=tensor, module=module, values=values, structural=struct_out,
                crc_only=crc_only, hints=hints, suspects=suspects, evidence=evidence, stats=stats)
    return _with_baseline_names(f, alignment if aligned else None)


def first_divergence_stepwise(
    load: StepLoader,
    steps: Sequence[int],
    *,
    names: tuple[str, str] = ("baseline", "target"),
    tolerance: Tolerance | None = None,
    ranks: Sequence[int] | None = None,
    step_offset: int = 0,
    crc: Literal["report", "strict"] = "report",
    on_batch: Callable[[list[int]], Any] | None = None,
    alignment: Any = "auto",
    **hooks: Any,
) -> Finding:
    """First divergence, loading steps in growing batches until one is found.

    Parameters
    ----------
    load : callable
        ``load(baseline_steps)`` returns ``(baseline, target)`` datasets holding those
        baseline steps and the target steps ``step + step_offset``.
    steps : sequence of int
        Baseline steps to search, in any order (searched ascending).
    names : (str, str)
        Run names for the finding.
    tolerance, ranks, crc
        As for :func:`first_divergence`.
    step_offset : int
        Target step = baseline step + offset (already resolved: not ``"auto"``).
    on_batch : callable, optional
        Called with each batch of steps before it is loaded (progress reporting).
    alignment : Alignment, "auto" or None
        As for :func:`first_divergence`; ``"auto"`` aligns the names once, on the first batch,
        and reuses that alignment for every later batch.
    **hooks
        Passed on to :func:`first_divergence` (``tensor_metrics``, ``tensor_thresholds``,
        ``precision_aware``).

    Returns
    -------
    Finding
        As :func:`first_divergence` over all *steps* would return, with
        ``stats["steps_not_searched"]`` listing the steps never loaded.

    Raises
    ------
    ValueError
        When *steps* is empty.

    Examples
    --------
    >>> import precnb
    >>> def load(batch):  # doctest: +SKIP
    ...     return precnb.open_run("gpu", steps=batch), precnb.open_run("npu", steps=batch)
    >>> first_divergence_stepwise(load, [0, 1, 2, 3]).step  # doctest: +SKIP
    1
    """
    def search(base: xr.Dataset, targ: xr.Dataset, aligned: Any) -> Finding:
        return first_divergence(base, targ, runs=names, tolerance=tolerance, ranks=ranks,
                                step_offset=step_offset, crc=crc, alignment=aligned, **hooks)

    return search_stepwise(load, steps, search, on_batch=on_batch, alignment=alignment)


def _first_divergence_lazy(
    baseline: xr.Dataset,
    target: xr.Dataset,
    *,
    names: tuple[str, str],
    tolerance: Tolerance | None,
    steps: Sequence[int] | None,
    ranks: Sequence[int] | None,
    step_offset: int | Literal["auto"] | None,
    crc: Literal["report", "strict"],
    alignment: Any = "auto",
    **hooks: Any,
) -> Finding:
    """:func:`first_divergence_stepwise` over two dask-backed datasets (loaded batch by batch)."""
    from precnb.analysis.compare import align_steps

    off = align_steps(baseline, target, step_offset)
    tsteps = {int(s) for s in target["step"].values}
    search = [int(s) for s in baseline["step"].values if int(s) + off in tsteps]
    if steps is not None:
        search = [s for s in search if s in set(steps)]
    if not search:
        raise NothingToCompareError(
            f"the runs share no step to compare (baseline steps {baseline['step'].values.tolist()}, "
            f"target steps {sorted(tsteps)} after offset {off})")

    def load(batch: list[int]) -> tuple[xr.Dataset, xr.Dataset]:
        return (baseline.sel(step=batch).load(),
                target.sel(step=[s + off for s in batch]).load())

    f = first_divergence_stepwise(load, search, names=names, tolerance=tolerance, ranks=ranks,
                                  step_offset=off, crc=crc, alignment=alignment, **hooks)
    if f.kind == "none" and "compared_records" in f.stats and not f.stats.get("nothing_compared"):
        # "compared N of M" against the whole runs, as the in-memory search says it (the batches hold
        # only the steps both runs have)
        clean = "no value divergence beyond tolerance"
        f.reason = re.sub(r"^no value divergence beyond tolerance \(compared [^)]*\)", clean, f.reason)
        part = compared_part(int(f.stats["compared_records"]), baseline, target, names, f.stats)
        if part and f.reason.startswith(clean):
            f.reason = f"{clean} ({part})" + f.reason[len(clean):]
    return f


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


def _culprit(cmp: Comparison, diff: np.ndarray, si: int, ri: int, node: str) -> dict[str, Any] | None:
    """The innermost module call around *node* whose inputs agree and whose output differs."""
    from precnb.naming import parse_node
    from precnb.schema import side_table

    ds = cmp.ds
    nodes = ds["node"].values
    roles = ds["role"].values
    both = cmp.both.values[si, ri]
    by_node: dict[str, list[int]] = {}
    for j, n in enumerate(nodes.tolist()):
        by_node.setdefault(str(n), []).append(j)
    tree = side_table(cmp.targ, "construct")
    module_calls: dict[str, list[str]] = {}
    for n in by_node:
        p = parse_node(n)
        if p.kind == "module" and p.direction == "forward":
            module_calls.setdefault(p.module, []).append(n)
    chain: list[str] = []
    cur, seen = node, {node}
    while True:
        parent = tree.get(cur)
        if not parent or parent in seen:
            p = parse_node(cur)  # no parent recorded: the call of the nearest enclosing module path
            path = p.module if p.kind in ("module", "param_grad") else str(ds["module"].values[by_node[cur][0]]) \
                if cur in by_node else ""
            if p.kind == "module" and "." in path:
                path = path.rsplit(".", 1)[0]
            elif p.kind == "module":
                path = ""
            parent = None
            while path:
                if path in module_calls:
                    parent = sorted(module_calls[path])[0]
                    break
                path = path.rsplit(".", 1)[0] if "." in path else ""
            if parent is None or parent in seen:
                break
        chain.append(parent)
        seen.add(parent)
        cur = parent
    for cand in ([node, *chain]):
        p = parse_node(cand)
        if p.kind != "module" or cand not in by_node:
            continue
        idx = by_node[cand]
        ins = [j for j in idx if roles[j] == "input" and both[j]]
        outs = [j for j in idx if roles[j] == "output" and both[j]]
        if outs and any(diff[j] for j in outs) and not any(diff[j] for j in ins):
            return {"module": p.module, "node": cand, "api": node if parse_node(node).kind == "api" else None,
                    "why": "its inputs agree and its output differs"}
    return None
