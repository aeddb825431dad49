"""Exact merge of TP / CP shards (and PP / VPP / EP relabelling) into whole-layer statistics.

For each tensor and each group of ranks that shard it (a TP or CP group) the tensor is
classified, with the reason kept in the ``shard_reason`` coordinate:

``replicated``
    every shard has the same statistics (bit-identical by default) — keep one;
``partial_sum``
    each rank holds an addend of the full tensor: its statistics equal the input of a later
    all-reduce / reduce-scatter on the same rank, or (with a reference run) it is the output of
    an op that reads a shard (a row-parallel matmul) and has the full shape although the copies
    differ — the full Mean is Σ Meanᵢ; Max, Min and Norm cannot be derived from shard statistics
    and become null;
``replicas_differ``
    a tensor that must be replicated but whose copies differ at the first step that shows it:
    the op's tensor inputs are replicated and its output has their shape (or the reference's),
    or, with a reference run, it has the full shape on every rank and nothing in it reads a shard
    (a random op seeded differently on one rank — ``torch.normal`` has no tensor input —, a
    replicated parameter whose copies drifted apart, and what is computed from them), or, in a
    group of three or more, some copies agree and others do not (a missed broadcast). A merge
    never invents a value for it: no sum of means that no rank holds. The merged entry keeps the group's first
    copy and the ``replicas_differ`` variable marks every (step, rank) whose copies differ, which
    the comparison counts as a difference (:func:`precnb.analysis.compare.compare_runs`);
``rank_dependent``
    tensor-parallel glue: computed by a call whose scalar arguments differ between the ranks (a TP
    rank's vocabulary range in Megatron's ``VocabParallelEmbedding`` and vocab-parallel cross entropy),
    or from such a value until a collective combines the ranks' parts (:mod:`precnb.analysis.layout.rank_args`).
    No whole-model counterpart: the comparison sets it aside, the alignment calls it organisation;
``partial_max``
    each rank's maximum, the input of a later ``MAX`` all-reduce (the reduce op is read from the
    record): the whole tensor's Max is the largest shard Max; Min, Mean and Norm become null;
``sharded``
    otherwise — Max = max Maxᵢ, Min = min Minᵢ, Mean = Σ(Meanᵢ·numelᵢ)/Σ numelᵢ (numel-weighted,
    exact for unequal shards), Norm = √Σ Normᵢ², numel = Σ numelᵢ.

NaN and ±inf propagate (a NaN shard makes the merged Max NaN). PP stages are stitched into
one rank after renumbering ``layers.N`` to global layer indices and offsetting API call
counters; VPP model-chunk prefixes (``Module.{chunk}.``) are folded; EP local expert indices
become global.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.layout import Layout, LayoutError
from precnb.analysis.layout.merge.classify import _copies, classify_shards
from precnb.analysis.layout.merge.data_parallel import EXPERT_SUM, data_parallel_kinds
from precnb.analysis.layout.merge.members import (
    copied_shards,
    departing_copies,
    nan_members,
    shard_holders,
    take_local,
)
from precnb.analysis.layout.merge.steps import keep_like, keep_module_classes, refined, same_steps
from precnb.analysis.layout.pp import relabel_pipeline
from precnb.analysis.layout.pp_tails import merge_stage_tails
from precnb.analysis.layout.rank_args import mark_rank_args
from precnb.analysis.layout.shard_shapes import reference_shapes, shape_table
from precnb.analysis.undefined import mark_undefined
from precnb.schema import (
    NULL_BITS,
    dtype_changes,
    encode_dtype_changes,
    encode_meta_changes,
    encode_stack_changes,
    meta_changes,
    stack_changes,
    validate,
)

__all__ = ["classify_shards", "copied_shards", "merge_group_dim", "merge_shards"]


def merge_group_dim(
    ds: xr.Dataset,
    layout: Layout,
    dim: str,
    *,
    rtol: float = 0.0,
    reference: xr.Dataset | None = None,
    like: xr.Dataset | None = None,
    expert_copies: int | None = None,
) -> tuple[xr.Dataset, Layout]:
    """Merge one sharding dimension (``"tp"``, ``"cp"``, or ``"dp"``: replicas on parts of the batch) of *ds*.

    *like*: a dataset merged before (earlier steps of the same run) whose classification is kept
    for the tensors it has, so that merging step by step gives what merging all steps at once gives.
    *expert_copies*: the original layout's expert data-parallel size (the copies of each expert), for ``dp``.
    """
    groups = layout.groups(dim)
    new_layout = layout.reduced(dim)
    from precnb.analysis.step_groups import rebased, step_groups

    parts = step_groups(ds) if like is None else []
    if like is None and reference is not None and "step" in reference.dims and "present" in reference.data_vars:
        parts = refined(parts, ds, reference)  # the reference's labels name other calls there: so may this run's
    if len(parts) < 2:  # every label names one call at every step (or an earlier batch's classes decide)
        parts = [np.arange(ds.sizes["step"])]
    by_step = np.empty((ds.sizes["step"], ds.sizes["tensor"]), object)
    first: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    for steps in parts:  # classified on the steps whose labels name the same calls
        part, ref = (ds, reference) if len(parts) == 1 else (rebased(ds, steps), same_steps(reference, ds, steps))
        kinds, reasons, shard_dim = classify_shards(part, groups, rtol=rtol, reference=ref)
        if like is not None and f"shard_kind_{dim}" in like.coords:
            keep_like(part, like, dim, kinds, reasons, shard_dim, reference=ref)
        if dim == "dp":
            members = [[list(part["rank"].values).index(r) for r in g] for g in groups]
            kinds, reasons = data_parallel_kinds(part, kinds, reasons, shard_dim, ref, members, expert_copies)
        if first is not None:  # a module's record names the same call at every step: its first class stands
            keep_module_classes(ds, parts[0], steps, first, (kinds, reasons, shard_dim))
        by_step[steps] = kinds[None, :]
        first = first or (kinds, reasons, shard_dim)
    assert first is not None
    kinds, reasons, shard_dim = first  # the coordinates: the first steps' classes
    ranks = [int(r) for r in ds["rank"].values]
    idx = [[ranks.index(r) for r in g] for g in groups]
    data = _merged_values(ds, idx, by_step, rtol, batch_split=(dim == "dp") & (np.asarray(shard_dim) != 0))
    new_ranks = [new_layout.rank_of(**{k: c for k, c in layout.coords(g[0]).items() if k != dim})
                 for g in groups]
    coords = {k: v for k, v in ds.coords.items() if k != "rank" and "rank" not in v.dims}
    out = xr.Dataset(data, coords={**coords, "rank": np.asarray(new_ranks, np.int64)}, attrs=dict(ds.attrs))
    _first_rank_attrs(out, ds, {ranks[g[0]]: new for g, new in zip(idx, new_ranks, strict=True)}, kinds)
    out = out.assign_coords({f"shard_kind_{dim}": ("tensor", kinds.astype(object)),
                             f"shard_reason_{dim}": ("tensor", reasons.astype(object)),
                             f"shard_dim_{dim}": ("tensor", shard_dim)})
    if reference is not None:
        ref_shape = shape_table(reference)
        shapes = out["shape"].values.copy()
        for j, lbl in enumerate(out["tensor"].values):
            if kinds[j] == "sharded" and shard_dim[j] and lbl in ref_shape:
                shapes[j] = ref_shape[lbl]
        out = out.assign_coords(shape=("tensor", shapes))
    if dim == "dp":
        out = _aside_own_entries(out, by_step)
    if new_ranks != sorted(new_ranks):  # (sorting copies every coordinate: only when needed)
        out = out.sortby("rank")
    return out, new_layout


_OWN_AT_STEP = ("data-parallel: the replica's own value at this step (the label names another call here than at "
                "its first step: its gradients over its part of the batch, or its part of unequal size); no "
                "whole-batch counterpart")


def _aside_own_entries(out: xr.Dataset, by_step: np.ndarray) -> xr.Dataset:
    """Entries whose step classes them as a replica's own value, set aside one by one (``undefined``).

    The comparison sets a label aside at every step by its coordinate (the first steps' class), but a label can
    name another call at later steps (msprobe numbers calls per step: Megatron's rotary embedding makes calls at
    the first step only) whose class there is the replica's own value: its merged entry is one member's, not
    the whole batch's. A NaN is never by construction: entries whose statistics are NaN stay compared.
    """
    own = np.asarray(by_step == "dp_local", bool)  # (step, tensor)
    if not own.any():
        return out
    with np.errstate(invalid="ignore"):
        nan = np.isnan(out["max"].values) & ((out["null_stats"].values & NULL_BITS["max"]) == 0)
    mask = own[:, None, :] & np.asarray(out["present"].values, bool) & ~nan
    if not mask.any():
        return out
    und = np.asarray(out["undefined"].values, bool) if "undefined" in out.data_vars else np.zeros(mask.shape, bool)
    why = (out["undefined_why"].values.astype(object).copy() if "undefined_why" in out.coords
           else np.full(out.sizes["tensor"], "", object))
    for j in np.flatnonzero(mask.any(axis=(0, 1))).tolist():
        if not why[j]:
            why[j] = _OWN_AT_STEP
    return out.assign(undefined=(("step", "rank", "tensor"), und | mask)).assign_coords(undefined_why=("tensor", why))


def _merged_stats(ds: xr.Dataset, idx: list[list[int]], kinds: np.ndarray, batch_split: Any = False
                  ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """(statistics, null bits, numel) of each group's merged entry, by each tensor's class (see the module).

    *kinds*: each (step, tensor)'s class; *batch_split*: per tensor, split along the batch by data parallelism
    (a replica's own gradient of it counts the whole batch's elements).
    """
    v = {s: ds[s].values[:, idx, :] for s in ("max", "min", "mean", "norm")}
    numel = ds["numel"].values[:, idx, :].astype(np.float64)
    null = ds["null_stats"].values[:, idx, :]
    first = {s: a[:, :, 0, :] for s, a in v.items()}
    with np.errstate(invalid="ignore", over="ignore"):
        sh = {
            "max": v["max"].max(axis=2),
            "min": v["min"].min(axis=2),
            "mean": (v["mean"] * numel).sum(axis=2) / numel.sum(axis=2),
            "norm": np.sqrt((v["norm"] ** 2).sum(axis=2)),
        }
        ps_mean = v["mean"].sum(axis=2)
    is_sh = (kinds == "sharded")[:, None, :]
    is_ps = (kinds == "partial_sum")[:, None, :]
    is_pm = (kinds == "partial_max")[:, None, :]
    out_vals = {}
    for s in ("max", "min", "mean", "norm"):
        val = np.where(is_sh | (is_pm & (s == "max")), sh[s], first[s])
        if s == "mean":
            val = np.where(is_ps, ps_mean, val)
        out_vals[s] = val
    null_or = np.bitwise_or.reduce(null, axis=2)
    out_null = np.where(is_sh | is_ps | is_pm, null_or, null[:, :, 0, :]).astype(np.uint8)
    ps_bits = NULL_BITS["max"] | NULL_BITS["min"] | NULL_BITS["norm"]
    out_null = np.where(is_ps, out_null | ps_bits, out_null).astype(np.uint8)
    pm_bits = NULL_BITS["min"] | NULL_BITS["mean"] | NULL_BITS["norm"]
    out_null = np.where(is_pm, out_null | pm_bits, out_null).astype(np.uint8)
    for s, bit in NULL_BITS.items():
        out_vals[s] = np.where(out_null & bit, np.nan, out_vals[s])
    # a replica's own value of a tensor split along the batch (its gradient): the size of the whole batch's tensor
    split = np.broadcast_to(np.asarray(batch_split, bool), (kinds.shape[1],))
    whole = is_sh | ((kinds == "dp_local") & split[None, :])[:, None, :]
    out_numel = np.where(whole, numel.sum(axis=2), numel[:, :, 0, :]).astype(np.int64)
    return out_vals, out_null, out_numel


def _merged_values(ds: xr.Dataset, idx: list[list[int]], kinds: np.ndarray, rtol: float, batch_split: Any = False
                   ) -> dict[Hashable, Any]:
    """The merged run's (step, rank, tensor) variables, one rank per group (*kinds*: (step, tensor) classes)."""
    pres = ds["present"].values[:, idx, :]
    allp = pres.all(axis=2)
    out_vals, out_null, out_numel = _merged_stats(ds, idx, kinds, batch_split)
    out_numel = np.where(allp, out_numel, -1)
    local = np.isin(kinds, ("local", EXPERT_SUM))[:, None, :]
    present = np.where(local, pres.any(axis=2), allp)
    seq = ds["seq"].values[:, [g[0] for g in idx], :]
    local_pos = None
    if local.any():  # recorded on some members only (an expert on the rank that holds it): that member's entry
        local_pos = take_local(ds, idx, pres, local, out_vals, out_null, out_numel, seq)
        summed = (kinds == EXPERT_SUM)[:, None, :]  # over every replica's own loss: divided by their count
        if summed.any():
            for s in ("max", "min", "mean", "norm"):
                out_vals[s] = np.where(summed, out_vals[s] / len(idx[0]), out_vals[s])
    nan_own, nan_pos = nan_members(ds, idx, pres, kinds == "dp_local")
    if nan_own.any():  # a replica's own value gone NaN: kept, from that member (a NaN is never by construction)
        present = present | nan_own
        for s in out_vals:
            out_vals[s] = np.where(nan_own, np.nan, out_vals[s])
        out_null = np.where(nan_own, 0, out_null)
        member = np.take_along_axis(ds["seq"].values[:, idx, :], nan_pos[:, :, None, :], axis=2)[:, :, 0, :]
        seq = np.where(nan_own, member, seq)
        at = np.asarray(idx)[np.arange(len(idx))[None, :, None], nan_pos]  # the member's dump position
        local_pos = np.where(nan_own, at, local_pos if local_pos is not None else 0)
        local = local | nan_own
    # every copy of a replicated tensor is checked at every step before the first copy stands for the group:
    # a replica that departs later (a fault on one TP rank) is a difference, not hidden behind rank 0's copy
    same = _copies(ds, idx, rtol)[4]
    checked = np.isin(kinds, ("replicated", "replicas_differ"))[:, None, :]
    differ_now = ~same.all(axis=2) & allp & checked
    if "replicas_differ" in ds.data_vars:  # merged along another dimension before (cp after tp)
        differ_now |= ds["replicas_differ"].values[:, idx, :].any(axis=2)
    dims = ("step", "rank", "tensor")
    data: dict[Hashable, Any] = {s: (dims, np.where(present, out_vals[s], np.nan)) for s in out_vals}
    if differ_now.any():
        data.update(departing_copies(ds, idx, same, differ_now))
    data.update(shard_holders(ds, idx, kinds))
    data["present"] = (dims, present)
    data["null_stats"] = (dims, np.where(present, out_null, 0).astype(np.uint8))
    data["seq"] = (dims, np.where(present, seq, -1).astype(np.int32))
    data["numel"] = (dims, np.where(present, out_numel, -1).astype(np.int64))
    data["replicas_differ"] = (dims, differ_now & present)
    for name in ds.data_vars:
        if name in data or ds[name].dims != dims:
            continue
        data[name] = (dims, ds[name].values[:, [g[0] for g in idx], :])
    if local_pos is not None:  # a local entry's dump rank: the member it was taken from
        si, ti = np.arange(local_pos.shape[0])[:, None, None], np.arange(local_pos.shape[2])[None, None, :]
        ranks = np.asarray([int(r) for r in ds["rank"].values])
        own = ds["source_rank"].values[si, local_pos, ti] if "source_rank" in ds.data_vars else ranks[local_pos]
        first = data["source_rank"][1] if "source_rank" in data else np.full(local_pos.shape, -1, np.int64)
        data["source_rank"] = (dims, np.where(local & present, own, first).astype(np.int64))
    return data


def _first_rank_attrs(out: xr.Dataset, ds: xr.Dataset, rep: dict[int, int], kinds: np.ndarray) -> None:
    """The merged entries' dtype, metadata and stack exceptions: the group's first rank's, on the new ranks."""
    changes = dtype_changes(ds)
    if changes:  # entries take the group's first rank's values: so do their dtypes
        moved = {t: {(s, rep[r]): d for (s, r), d in where.items() if r in rep} for t, where in changes.items()}
        out.attrs["dtype_changes"] = encode_dtype_changes({t: w for t, w in moved.items() if w})
    for name, text in _first_rank_meta(ds, rep, kinds).items():
        if text:
            out.attrs[name] = text
        else:
            out.attrs.pop(name, None)


def _first_rank_meta(ds: xr.Dataset, rep: dict[int, int], kinds: np.ndarray) -> dict[str, Any]:
    """``meta_changes`` / ``stack_changes`` of the merged entries: the group's first rank's, on the new ranks.

    A sharded tensor's merged shape is the whole tensor's, not a shard's: its shape exceptions are dropped.
    """
    out: dict[str, Any] = {"meta_changes": "", "stack_changes": ""}
    sharded = {str(t) for t, k in zip(ds["tensor"].values, kinds, strict=True) if k == "sharded"}
    meta = {f: {t: {(s, rep[r]): v for (s, r), v in where.items() if r in rep}
                for t, where in by_tensor.items() if not (f == "shape" and t in sharded)}
            for f, by_tensor in meta_changes(ds).items()}
    meta = {f: {t: w for t, w in by_tensor.items() if w} for f, by_tensor in meta.items()}
    if any(meta.values()):
        out["meta_changes"] = encode_meta_changes({f: bt for f, bt in meta.items() if bt})
    stacks = {n: {(s, rep[r]): fr for (s, r), fr in where.items() if r in rep}
              for n, where in stack_changes(ds).items()}
    if any(stacks.values()):
        out["stack_changes"] = encode_stack_changes({n: w for n, w in stacks.items() if w})
    return out


def merge_shards(
    ds: xr.Dataset,
    layout: Layout,
    *,
    reference: xr.Dataset | None = None,
    rtol: float = 0.0,
    like: xr.Dataset | None = None,
    merge_dp: bool = False,
) -> xr.Dataset:
    """Merge a sharded run into whole-layer statistics (one entry per model replica).

    Parameters
    ----------
    ds : xarray.Dataset
        One run whose ranks are 0 .. world_size-1.
    layout : Layout
    reference : xarray.Dataset, optional
        An unsharded run of the same model; its shapes name the split dimension and single
        out partial sums by shape.
    rtol : float
        Relative tolerance for "identical on every rank" (replicated). Default 0: copies of one
        computation are bit-identical, while different shards' statistics can coincide to 1e-5 (the
        scores of a causal attention are dominated by its mask fill).
    like : xarray.Dataset, optional
        The same run's earlier steps, merged: their shard classification is kept (a step-by-step
        merge equals a merge of all steps).
    merge_dp : bool
        Also merge the data-parallel replicas (each on its part of the global batch) into one rank, to
        compare with a run on the whole batch (*reference* names the batch dimension).

    Returns
    -------
    xarray.Dataset
        Ranks of the reduced layout (tp = cp = pp = ep = 1: one per data-parallel replica);
        coordinates ``shard_kind_tp`` / ``shard_reason_tp`` / ``shard_dim_tp`` (and ``_cp``)
        record the classification; ``attrs["merged_layout"]`` the layout.

    Examples
    --------
    >>> import precnb
    >>> merged = precnb.merge_shards(tp2, precnb.Layout(2, tp=2), reference=tp1)  # doctest: +SKIP
    """
    if "run" in ds.dims:
        raise ValueError("merge_shards works on one run; select it with ds.sel(run=...)")
    ranks = sorted(int(r) for r in ds["rank"].values)
    if ranks != list(range(layout.world_size)):
        raise LayoutError(
            f"layout {layout.describe()} needs ranks 0..{layout.world_size - 1}, the run has "
            f"{len(ranks)} rank(s) {ranks[:8]}{'…' if len(ranks) > 8 else ''}")
    out = mark_rank_args(mark_undefined(ds))  # facts the reader keyed by the ranks and names as read
    lay = layout
    if layout.pp > 1 or layout.vpp > 1 or layout.ep > 1:
        raw = out
        out, lay = relabel_pipeline(out, lay)
        out = merge_stage_tails(out, raw, layout)  # what each stage runs once after its backward pass, made one
    if reference is not None:  # the reference's calls under this run's labels (call counters can differ)
        from precnb.analysis.layout.ref_names import in_target_names

        reference = in_target_names(reference, out)
    for dim in ("tp", "cp", *(("dp",) if merge_dp else ())):
        if (lay.dp if dim == "dp" else getattr(lay, dim)) > 1:
            ref = reference_shapes(out, lay.groups("tp"), reference) if dim == "tp" else reference
            out, lay = merge_group_dim(out, lay, dim, rtol=rtol, reference=ref, like=like,
                                       expert_copies=layout.edp if layout.has_experts else None)
    out.attrs["merged_layout"] = layout.describe()
    return validate(out)
