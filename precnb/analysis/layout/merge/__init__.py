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

import json
from collections.abc import Hashable
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.layout import Layout, LayoutError
from precnb.analysis.layout.merge.classify import _copies, _data_parallel_kinds, classify_shards
from precnb.analysis.layout.pp import relabel_pipeline
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
) -> tuple[xr.Dataset, Layout]:
    """Merge one sharding dimension (``"tp"``, ``"cp"``, or ``"dp"``: replicas on parts of the batch) of *ds*.

    *like*: a dataset merged before (earlier steps of the same run) whose classification is kept
    for the tensors it has, so that merging step by step gives what merging all steps at once gives.
    """
    groups = layout.groups(dim)
    new_layout = layout.reduced(dim)
    from precnb.analysis.step_groups import rebased, step_groups

    parts = step_groups(ds) if like is None else []
    if len(parts) < 2:  # every label names one call at every step (or an earlier batch's classes decide)
        parts = [np.arange(ds.sizes["step"])]
    by_step = np.empty((ds.sizes["step"], ds.sizes["tensor"]), object)
    first: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    for steps in parts:  # classified on the steps whose labels name the same calls
        part, ref = (ds, reference) if len(parts) == 1 else (rebased(ds, steps), _same_steps(reference, ds, steps))
        kinds, reasons, shard_dim = classify_shards(part, groups, rtol=rtol, reference=ref)
        if like is not None and f"shard_kind_{dim}" in like.coords:
            _keep_like(part, like, dim, kinds, reasons, shard_dim)
        if dim == "dp":
            members = [[list(part["rank"].values).index(r) for r in g] for g in groups]
            kinds, reasons = _data_parallel_kinds(part, kinds, reasons, shard_dim, ref, members)
        if first is not None:  # a module's record names the same call at every step: its first class stands
            _keep_module_classes(ds, parts[0], steps, first, (kinds, reasons, shard_dim))
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
    if new_ranks != sorted(new_ranks):  # (sorting copies every coordinate: only when needed)
        out = out.sortby("rank")
    return out, new_layout


def _same_steps(reference: xr.Dataset | None, ds: xr.Dataset, steps: np.ndarray) -> xr.Dataset | None:
    """*reference* at the steps of *ds* numbered *steps*, with those steps' own label coordinates.

    The reference as it is when it lacks one of them.
    """
    if reference is None:
        return None
    from precnb.analysis.step_groups import rebased

    have = {int(s): i for i, s in enumerate(reference["step"].values.tolist())}
    at = [have.get(int(s)) for s in ds["step"].values[steps]]
    return reference if any(i is None for i in at) else rebased(reference, np.asarray(at, np.int64))


def _keep_module_classes(ds: xr.Dataset, first_steps: np.ndarray, steps: np.ndarray,
                         first: tuple[np.ndarray, np.ndarray, np.ndarray],
                         now: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """Later steps' classes of module records (forward, backward, parameter gradients) set to the first steps'.

    An API call's counter shifts when another call of its API is made at one step only, so its classes are
    decided per group of steps; a module record is numbered by its module's own calls: where its module,
    parent and shape stay the same it names the same call, and a replicated tensor whose copies differ later
    (a fault on one rank from step 1) is a replica departure, not a shard (in place on *now*).
    """
    from precnb.analysis.step_groups import label_meanings

    meaning = label_meanings(ds)
    present = np.asarray(ds["present"].values[first_steps].any(axis=(0, 1)), bool)
    module = np.isin(ds["kind"].values, ("module", "param_grad"))
    keep = module & present & (meaning[first_steps[0]] == meaning[steps[0]])
    for a, b in zip(now, first, strict=True):
        a[keep] = b[keep]


def _keep_like(ds: xr.Dataset, like: xr.Dataset, dim: str, kinds: np.ndarray, reasons: np.ndarray,
               shard_dim: np.ndarray) -> None:
    """The classes of *like* (merged before) for the tensors it has, in place."""
    prev = {str(t): j for j, t in enumerate(like["tensor"].values)}
    pk, pr, pd = (like[f"shard_{x}_{dim}"].values for x in ("kind", "reason", "dim"))
    same = _same_call(ds, like)
    for j, lbl in enumerate(ds["tensor"].values.tolist()):
        k = prev.get(str(lbl))
        if k is not None and same(j, k, str(pk[k]), pd[k]):
            kinds[j], reasons[j], shard_dim[j] = pk[k], pr[k], pd[k]


def _same_call(ds: xr.Dataset, like: xr.Dataset) -> Any:
    """``same(j, k, kind)``: label *j* of *ds* names the same call as label *k* of *like* (merged before).

    msprobe numbers API calls per step, so a label can name another op at a later step (Megatron's rotary
    embedding computes its frequencies at the first step only: every later ``Tensor.__add__`` counter shifts
    by one). A class is kept only where the label's module, parent call, role and dtype are the same, and, for a
    tensor that was not split, its shape too (a split tensor's merged shape is the whole tensor's: the same
    rank and sizes but along the split dim). At level L1 there is no module or parent to tell two calls apart:
    the shape is all there is.
    """
    keys = [c for c in ("module", "parent", "role", "dtype") if c in ds.coords and c in like.coords]
    mine = [ds[c].values for c in keys]
    theirs = [like[c].values for c in keys]
    shape_a, shape_b = ds["shape"].values, like["shape"].values

    def same(j: int, k: int, kind: str, split: Any = None) -> bool:
        if any(a[j] != b[k] for a, b in zip(mine, theirs, strict=True)):
            return False
        if kind != "sharded":
            return bool(shape_a[j] == shape_b[k])
        return _same_but_split(shape_a[j], shape_b[k], split)

    return same


def _dims(shape: Any) -> list[int] | None:
    """A shape as a list of sizes (the coordinate holds JSON text), None when it is not one."""
    if isinstance(shape, str):
        try:
            shape = json.loads(shape)
        except ValueError:
            return None
    if isinstance(shape, (list, tuple)) and all(isinstance(x, int) for x in shape):
        return list(shape)
    return None


def _same_but_split(part: Any, whole: Any, split: Any) -> bool:
    """Whether a shard's shape *part* fits the merged shape *whole*: equal but along the split dim.

    >>> _same_but_split([8, 1, 32], [8, 2, 32], -2), _same_but_split([32], [8, 2, 4, 8], -3)
    (True, False)
    >>> _same_but_split(None, [4], 0), _same_but_split("[8, 1]", "[8, 2]", -1)  # unknown shapes: nothing to say
    (True, True)
    """
    part, whole = _dims(part), _dims(whole)
    if part is None or whole is None:
        return True
    if len(part) != len(whole):
        return False
    try:  # the split dim is stored negative (0: none known)
        d = int(split) % len(whole) if split and len(whole) else None
    except (TypeError, ValueError):
        d = None
    return all(a == b for i, (a, b) in enumerate(zip(part, whole, strict=True)) if i != d)


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
    local = (kinds == "local")[:, None, :]
    present = np.where(local, pres.any(axis=2), allp)
    seq = ds["seq"].values[:, [g[0] for g in idx], :]
    local_pos = None
    if local.any():  # recorded on some members only (an expert on the rank that holds it): that member's entry
        local_pos = _take_local(ds, idx, pres, local, out_vals, out_null, out_numel, seq)
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
        data.update(_departing_copies(ds, idx, same, differ_now))
    data.update(_shard_holders(ds, idx, kinds))
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


def _shard_holders(ds: xr.Dataset, idx: list[list[int]], kinds: np.ndarray) -> dict[Hashable, Any]:
    """For each merged shard entry, the member behind it, should it differ from a baseline (dump ranks, -1: none).

    ``shard_max_rank`` / ``shard_min_rank``: the one member that holds the merged Max / Min (-1 on a tie);
    ``shard_odd_rank``: a member whose statistics are not finite while another's are, or, failing that, the
    first member whose statistics equal a lower member's (it holds a copy of another rank's shard). A merged
    shard is compared whole, so a baseline cannot say which shard departs; these name the member that
    supplies a differing extreme, or the one that is odd among its group
    (:func:`precnb.analysis.findings.evidence.shard_suspect`).
    """
    dims = ("step", "rank", "tensor")
    n_s, n_t = ds.sizes["step"], ds.sizes["tensor"]
    sharded = np.asarray(kinds == "sharded")
    if not sharded.any() or len(idx[0]) < 2:
        return {}
    pos = np.asarray(idx)  # (G, n)
    mx, mn = ds["max"].values[:, pos, :], ds["min"].values[:, pos, :]  # (step, G, n, tensor)
    stats = np.stack([mx, mn, ds["mean"].values[:, pos, :], ds["norm"].values[:, pos, :]], axis=-1)
    with np.errstate(invalid="ignore"):
        top, bottom = np.nanmax(np.where(np.isnan(mx), -np.inf, mx), axis=2), np.nanmin(
            np.where(np.isnan(mn), np.inf, mn), axis=2)
        at_max = mx == top[:, :, None, :]
        at_min = mn == bottom[:, :, None, :]
    max_pos = np.where(at_max.sum(axis=2) == 1, np.argmax(at_max, axis=2), -1)
    min_pos = np.where(at_min.sum(axis=2) == 1, np.argmax(at_min, axis=2), -1)
    finite = np.isfinite(stats).all(axis=-1)  # (step, G, n, tensor)
    bad = ~finite & finite.any(axis=2, keepdims=True)
    odd_pos = np.where(bad.any(axis=2), np.argmax(bad, axis=2), -1)
    dup = copied_shards(stats, finite & sharded[:, None, None, :])
    odd_pos = np.where(odd_pos >= 0, odd_pos, np.where(dup.any(axis=2), np.argmax(dup, axis=2), -1))
    si = np.arange(n_s)[:, None, None]
    ti = np.arange(n_t)[None, None, :]
    gi = np.arange(pos.shape[0])[None, :, None]
    source = ds["source_rank"].values if "source_rank" in ds.data_vars else None
    ranks = np.asarray([int(r) for r in ds["rank"].values])
    out: dict[Hashable, Any] = {}
    for name, member in (("shard_max_rank", max_pos), ("shard_min_rank", min_pos), ("shard_odd_rank", odd_pos)):
        at = pos[gi, np.maximum(member, 0)]  # (step, G, tensor) dump positions
        rank = source[si, at, ti] if source is not None else ranks[at]
        out[name] = (dims, np.where((member >= 0) & sharded[:, None, :], rank, -1).astype(np.int32))
    return out


def copied_shards(stats: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """(step, G, n, tensor) whether a member's shard is a copy of another member's, at that step or before.

    *stats*: (step, G, n, tensor, 4) the members' Max, Min, Mean and Norm; *usable*: the entries to consider.
    Identical statistics, bit for bit, are the same tensor: among the entries of one group and tensor with the
    same four values, the first (by step, then member) is the original and an entry of another member is a copy
    (a rank that loaded another rank's shard, from this step's or an earlier step's state). Constant tensors
    (Max = Min: zeros, ones) say nothing.

    >>> st = np.zeros((2, 1, 2, 1, 4))
    >>> st[0, 0, 0, 0], st[0, 0, 1, 0] = [3, -1, 0.5, 4], [2, -2, 0.1, 3]
    >>> st[1, 0, 0, 0], st[1, 0, 1, 0] = [3.1, -1, 0.5, 4], [3, -1, 0.5, 4]  # member 1 holds member 0's step-0 shard
    >>> copied_shards(st, np.ones((2, 1, 2, 1), bool))[:, 0, :, 0].tolist()
    [[False, False], [False, True]]
    """
    out = np.zeros(usable.shape, bool)
    usable = usable & (stats[..., 0] != stats[..., 1])
    at = np.nonzero(usable)  # (step, group, member, tensor) of each usable entry, in step order then member
    if not len(at[0]):
        return out
    keys = np.concatenate([np.stack([at[1], at[3]], axis=1).astype(np.float64), stats[at]], axis=1)
    rows = np.ascontiguousarray(keys).view(np.dtype((np.void, keys.dtype.itemsize * keys.shape[1]))).ravel()
    _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    original = first[inverse]  # the first entry with the same group, tensor and statistics
    copy = at[2] != at[2][original]
    out[tuple(a[copy] for a in at)] = True
    return out


def _take_local(ds: xr.Dataset, idx: list[list[int]], pres: np.ndarray, local: np.ndarray,
                out_vals: dict[str, np.ndarray], out_null: np.ndarray, out_numel: np.ndarray, seq: np.ndarray
                ) -> np.ndarray:
    """For tensors recorded on some members of a group only: the first member that recorded it, in place.

    Returns each (step, group, tensor)'s chosen dump position.
    """
    member = np.argmax(pres, axis=2)  # (step, G, tensor)
    pos = np.asarray(idx)[np.arange(len(idx))[None, :, None], member]  # dump positions
    si = np.arange(pos.shape[0])[:, None, None]
    ti = np.arange(pos.shape[2])[None, None, :]
    for s in out_vals:
        out_vals[s][...] = np.where(local, ds[s].values[si, pos, ti], out_vals[s])
    out_null[...] = np.where(local, ds["null_stats"].values[si, pos, ti], out_null)
    out_numel[...] = np.where(local, ds["numel"].values[si, pos, ti], out_numel)
    seq[...] = np.where(local, ds["seq"].values[si, pos, ti], seq)
    return np.asarray(pos)


def _departing_copies(ds: xr.Dataset, idx: list[list[int]], same: np.ndarray, differ: np.ndarray
                      ) -> dict[Hashable, Any]:
    """Where a replicated tensor's copies differ: the first copy unlike the group's first member's.

    ``copy_max`` … ``copy_norm`` hold that copy (the merged entry carries the first member's), ``copy_rank`` its
    dump rank and ``copy_first_rank`` the first member's.

    With a baseline, the comparison decides which of the two departs (:mod:`precnb.analysis.divergence.origin`);
    ``copy_rank`` is -1 where the copies agree.
    """
    ranks = np.asarray([int(r) for r in ds["rank"].values])
    member = np.argmax(~same, axis=2)  # (step, G, tensor): the first member unlike member 0
    dims = ("step", "rank", "tensor")
    pos = np.asarray(idx)  # (G, n) positions of the members
    src = np.take_along_axis(np.broadcast_to(pos[None, :, :, None], (*member.shape[:2], pos.shape[1],
                                                                         member.shape[2])),
                             member[:, :, None, :], axis=2)[:, :, 0, :]  # (step, G, tensor) rank positions
    si = np.arange(member.shape[0])[:, None, None]
    ti = np.arange(member.shape[2])[None, None, :]
    if "source_rank" in ds.data_vars:  # pipeline stages stitched first: each entry's own dump rank
        source = ds["source_rank"].values
        copy_rank, firsts = source[si, src, ti], source[si, pos[:, 0][None, :, None], ti]
    else:
        copy_rank, firsts = ranks[src], ranks[pos[:, 0]][None, :, None]
    out: dict[Hashable, Any] = {"copy_rank": (dims, np.where(differ, copy_rank, -1).astype(np.int64)),
                                "copy_first_rank": (dims, np.where(differ, firsts, -1).astype(np.int64))}
    for s in ("max", "min", "mean", "norm"):
        out[f"copy_{s}"] = (dims, np.where(differ, ds[s].values[si, src, ti], np.nan))
    return out


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
        out, lay = relabel_pipeline(out, lay)
    if reference is not None:  # the reference's calls under this run's labels (call counters can differ)
        from precnb.analysis.layout.ref_names import in_target_names

        reference = in_target_names(reference, out)
    for dim in ("tp", "cp", *(("dp",) if merge_dp else ())):
        if (lay.dp if dim == "dp" else getattr(lay, dim)) > 1:
            ref = reference_shapes(out, lay.groups("tp"), reference) if dim == "tp" else reference
            out, lay = merge_group_dim(out, lay, dim, rtol=rtol, reference=ref, like=like)
    out.attrs["merged_layout"] = layout.describe()
    return validate(out)
