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
    or from such a value until a collective combines the ranks' parts (:mod:`precnb.analysis.rank_args`).
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

import re
from collections.abc import Hashable
from functools import lru_cache
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.layout import Layout, LayoutError
from precnb.analysis.pp import relabel_pipeline
from precnb.analysis.rank_args import RANK_DEPENDENT, mark_rank_args, rank_dependent
from precnb.analysis.shard_shapes import reference_shapes, shape_table
from precnb.analysis.undefined import mark_undefined
from precnb.naming import is_communication
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

__all__ = ["classify_shards", "merge_group_dim", "merge_shards"]

_REDUCERS = re.compile(r"(all_reduce|reduce_scatter|_reduce_scatter_base|reduce_scatter_tensor)")


def _partial_by_reduce_inputs(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Per tensor: at some (step, rank) its statistics equal a later reduction's input — (sum, max) reductions.

    The second mask holds the inputs of ``MAX`` reductions (a vocab-parallel cross entropy's logits max): an
    elementwise maximum over the ranks, whose only derivable statistic is the Max; ``MIN``, product and other
    reductions count as neither (their ``reduce_op`` is read from the records: :mod:`precnb.analysis.rank_args`).
    """
    from precnb.analysis.rank_args import REDUCE_CODES, reduce_ops

    nodes = ds["node"].values
    roles = ds["role"].values
    is_red_in = np.fromiter(((is_communication(str(n)) and bool(_REDUCERS.search(str(n))) and r == "input")
                             for n, r in zip(nodes, roles, strict=True)), bool, ds.sizes["tensor"])
    comm = np.fromiter((is_communication(str(n)) for n in nodes), bool, ds.sizes["tensor"])
    codes = reduce_ops(ds)
    out = is_red_in.copy()  # the input of a reduction is itself an addend
    out_max = np.zeros_like(out)
    if codes is not None:  # a non-sum reduction's input: no addend
        red_code = np.where(ds["present"].values & is_red_in[None, None, :], codes, 0).max(axis=(0, 1))
        out &= red_code == 0
        out_max |= is_red_in & (red_code == REDUCE_CODES["MAX"])
    if not is_red_in.any():
        return out, out_max
    stats = np.stack([ds[s].values for s in ("max", "min", "mean", "norm")], axis=-1)
    present = ds["present"].values
    seq = ds["seq"].values
    for si in range(ds.sizes["step"]):
        for ri in range(ds.sizes["rank"]):
            red = np.flatnonzero(is_red_in & present[si, ri])
            if not len(red):
                continue
            code = codes[si, ri] if codes is not None else np.zeros(ds.sizes["tensor"], np.int8)
            sig = {stats[si, ri, j].tobytes(): (int(seq[si, ri, j]), int(code[j])) for j in red}
            cand = np.flatnonzero(present[si, ri] & ~comm)
            for j in cand:
                s = sig.get(stats[si, ri, j].tobytes())
                if s is not None and seq[si, ri, j] < s[0] and np.isfinite(stats[si, ri, j]).any():
                    if s[1] == 0:
                        out[j] = True
                    elif s[1] == REDUCE_CODES["MAX"]:
                        out_max[j] = True
    return out, out_max & ~out


def _close(a: np.ndarray, b: np.ndarray, scale: np.ndarray, rtol: float) -> np.ndarray:
    same_nf = (np.isnan(a) & np.isnan(b)) | ((a == b) & np.isinf(a))
    with np.errstate(invalid="ignore", over="ignore"):
        ok = np.abs(a - b) <= rtol * scale
    return ok | same_nf


def _copies(ds: xr.Dataset, idx: list[list[int]], rtol: float
            ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """The group members' copies as (step, G, n, tensor) arrays, and which equal the first member's.

    Returns (present, statistics, numel, scale, same): *same* compares each member's copy with
    the first member's (relative *rtol* on the group's scale).
    """
    pres = ds["present"].values[:, idx, :]  # (step, G, n, tensor)
    stats = {s: ds[s].values[:, idx, :] for s in ("max", "min", "mean", "norm")}
    numel = ds["numel"].values[:, idx, :]
    rms = np.abs(stats["norm"]) / np.sqrt(np.maximum(numel, 1))
    scale = np.fmax(np.fmax(np.abs(stats["max"]), np.abs(stats["min"])), rms)
    scale = np.where(np.isfinite(scale), scale, 0)
    scale = np.fmax(scale.max(axis=2, keepdims=True), 1e-30)
    same = np.ones(pres.shape, bool)
    for v in stats.values():
        same &= _close(v, v[:, :, :1], scale, rtol)
    same &= numel == numel[:, :, :1]
    return pres, stats, numel, scale, same


def classify_shards(
    ds: xr.Dataset,
    groups: list[list[int]],
    *,
    rtol: float = 0.0,
    reference: xr.Dataset | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Classify each tensor across rank groups.

    Returns
    -------
    kinds : ndarray of str
        ``replicated`` / ``sharded`` / ``partial_sum`` / ``replicas_differ`` / ``rank_dependent``
        (tensor-parallel glue, :mod:`precnb.analysis.rank_args`) / ``local`` (never on all members).
    reasons : ndarray of str
    shard_dim : ndarray of int
        Negative dim index of the shard split when a reference shape says so, else 0.
    """
    ranks = [int(r) for r in ds["rank"].values]
    idx = [[ranks.index(r) for r in g] for g in groups]
    pres, stats, numel, scale, same = _copies(ds, idx, rtol)
    all_present: np.ndarray = np.all(pres, axis=2)  # (step, G, tensor)
    # classified at the first step every member recorded it: what is replicated by design is
    # replicated there (a replica that drifts later is what the replica check reports), and the
    # answer does not depend on how many later steps are loaded (a step-by-step read gets the same)
    # (a constant tensor, e.g. optimizer state still zero at the first step, says nothing: the first
    # step where it varies decides, else the first recorded one)
    same_sg = same.all(axis=2)  # (step, G, tensor)
    any_present = np.any(all_present, axis=(0, 1))
    constant = (stats["max"] == stats["min"]).all(axis=2)  # (step, G, tensor) on every member
    informative = all_present & ~constant
    use = np.where(informative.any(axis=0), informative, all_present)
    first = np.argmax(use, axis=0)  # (G, tensor)
    at_first = np.take_along_axis(same_sg, first[None], axis=0)[0]  # (G, tensor)
    ever = all_present.any(axis=0)  # (G, tensor)
    replicated = (at_first | ~ever).all(axis=0) & any_present
    partial, partial_max = _partial_by_reduce_inputs(ds)
    n_t = ds.sizes["tensor"]
    by_copies, odd = _majority(stats, numel, scale, first, rtol) if idx and len(idx[0]) >= 3 else \
        (np.zeros(n_t, bool), None)
    ref_shapes = shape_table(reference) if reference is not None else None
    by_inputs = _should_be_replicated(ds, replicated, ref_shapes)
    # tensor-parallel glue: computed with the rank's own constants (or from such a value): no replicas
    glue, glue_why = rank_dependent(ds, groups)
    differ = (by_copies | by_inputs) & ~replicated & ~partial & ~partial_max & any_present & ~glue
    by_shape = np.zeros(n_t, bool)  # full shape, copies differ, reads no shard: replicas that differ
    shard_dim = np.zeros(n_t, np.int64)
    ref_reason = np.full(n_t, "", dtype=object)
    same_shard: dict[int, int] = {}  # tensor -> split dim: identical on every rank, yet split in the reference
    if reference is not None:
        from precnb.analysis.dataflow import scalar_only_nodes

        ref_shape = ref_shapes or {}
        scalar_only = scalar_only_nodes(ds)
        local = ds["shape"].values
        k = len(groups[0]) if groups else 1
        for j, lbl in enumerate(ds["tensor"].values):
            full = ref_shape.get(lbl)
            if not full or not local[j]:
                continue
            a, b = _shape(local[j]), _shape(full)
            if a is None or b is None or len(a) != len(b):
                continue
            if differ[j] or partial_max[j] or glue[j]:
                continue
            if replicated[j]:
                diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
                if len(diff) == 1 and a[diff[0]] * k == b[diff[0]]:
                    replicated[j] = False  # equal shards (all zeros at first) of a split tensor: sharded
                    same_shard[j] = diff[0] - len(a)
                else:
                    continue
            if a == b and _reads_a_shard(ds, j, ref_shape, scalar_only):
                partial[j] = True
                ref_reason[j] = "same shape as the reference but shards differ, and its op reads a shard"
            elif a == b:  # no sign of an addend: the copies of a whole tensor disagree (no value is invented)
                by_shape[j] = True
            else:
                diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
                if len(diff) == 1 and a[diff[0]] * k == b[diff[0]]:
                    shard_dim[j] = diff[0] - len(a)
    kinds = np.full(n_t, "sharded", dtype=object)
    reasons = np.full(n_t, "shards differ: statistics merged as one tensor split across ranks", dtype=object)
    kinds[replicated] = "replicated"
    reasons[replicated] = "identical statistics on every rank of the group"
    pmask = partial & ~replicated
    kinds[pmask] = "partial_sum"
    reasons[pmask] = "equals the input of a later all-reduce/reduce-scatter (an addend of the full tensor)"
    for j in np.flatnonzero(pmask & (ref_reason != "")).tolist():
        reasons[j] = str(ref_reason[j])
    mmask = partial_max & ~replicated & ~pmask
    kinds[mmask] = "partial_max"
    reasons[mmask] = ("equals the input of a later MAX all-reduce (each rank's maximum): the whole tensor's Max "
                      "is the largest of the ranks' Maxes, its other statistics are unknown")
    by_shape &= ~replicated & ~partial & ~partial_max & any_present & ~glue
    differ |= by_shape
    kinds[differ] = "replicas_differ"
    for jd in np.flatnonzero(differ).tolist():
        reasons[jd] = _differ_reason(jd, "inputs" if by_inputs[jd] else "shape" if by_shape[jd] else "copies",
                                     same, first, groups, odd)
    kinds[glue & any_present] = RANK_DEPENDENT
    labels = ds["tensor"].values
    for jg in np.flatnonzero(glue & any_present).tolist():
        reasons[jg] = glue_why.get(str(labels[jg]), "tensor-parallel glue")
    local_only = ~any_present
    kinds[local_only] = "local"
    reasons[local_only] = "not recorded on every rank of the group"
    for j in np.flatnonzero(kinds == "sharded").tolist():
        if shard_dim[j]:
            reasons[j] = f"shards differ; split along dim {shard_dim[j]} (reference shape)"
        if j in same_shard:
            reasons[j] = (f"identical on every rank of the group, although the reference is {len(groups[0])}x larger "
                          f"along dim {same_shard[j]}: the ranks hold the same shard (a rank loaded another rank's "
                          "shard, or the shards are still equal, e.g. zeros); merged as a split tensor")
    return kinds, reasons, shard_dim


_WHY_REPLICATED = {
    "inputs": "its op's inputs are identical on every rank",
    "shape": "it has the reference's full shape on every rank and nothing in it reads a shard",
    "copies": "some copies agree, others do not",
}


def _differ_reason(j: int, by: str, same: np.ndarray, first: np.ndarray, groups: list[list[int]],
                   odd: np.ndarray | None) -> str:
    """Why tensor *j* must be replicated (*by*: inputs / shape / copies), and which ranks' copies differ."""
    why = _WHY_REPLICATED[by]
    for g, members in enumerate(groups):
        st = int(first[g, j])
        flags = odd[g, :, j] if odd is not None and odd[g, :, j].any() else ~same[st, g, :, j]
        bad = [members[m] for m in np.flatnonzero(flags)]
        if bad:
            good = [m for m in members if m not in bad]
            return (f"must be replicated ({why}) but its copies differ: rank(s) {bad} differ from "
                    f"rank(s) {good}")
    return f"must be replicated ({why}) but its copies differ"


def _reads_a_shard(ds: xr.Dataset, j: int, ref_shape: dict[Any, Any], scalar_only: set[str]) -> bool:
    """Tensor *j* may be an addend: an API op's output one of whose inputs is a shard (not the reference's shape).

    An output whose op's inputs were not recorded (a dump of outputs alone) may be one too; an op
    that reads no tensor (*scalar_only*) is not.
    """
    roles, kinds, nodes = ds["role"].values, ds["kind"].values, ds["node"].values
    backward = kinds[j] == "module" and ".backward." in str(nodes[j])
    if kinds[j] == "param_grad" or backward:  # a module's backward records and parameter gradients are addends
        # when its forward call returns a shard of the whole output (sequence parallelism: each rank's part of the
        # sequence, a replicated norm weight's gradient summed over it); a row-parallel module whose output is
        # all-reduced returns the whole tensor: its differing copies are no partial sums
        fwd = str(nodes[j]).replace(".parameters_grad.", ".forward.").replace(".backward.", ".forward.")
        cols = np.flatnonzero((nodes == fwd) & (roles == "output"))
        labels, shapes = ds["tensor"].values, ds["shape"].values
        return any(ref_shape.get(labels[c]) and shapes[c] and shapes[c] != ref_shape.get(labels[c]) for c in cols)
    if roles[j] != "output" or kinds[j] != "api" or is_communication(str(nodes[j])):
        return False
    cols = np.flatnonzero((nodes == nodes[j]) & (roles == "input"))
    if not len(cols):
        return str(nodes[j]) not in scalar_only
    labels, shapes = ds["tensor"].values, ds["shape"].values
    return any(ref_shape.get(labels[c]) and shapes[c] and shapes[c] != ref_shape.get(labels[c]) for c in cols)


def _should_be_replicated(ds: xr.Dataset, replicated: np.ndarray,
                           ref_shape: dict[Any, Any] | None) -> np.ndarray:
    """Per tensor: an API op's output whose tensor inputs are all replicated and whose shape is theirs.

    With identical inputs on every rank an op computes identical outputs, unless it is random or
    reads the rank; a rank-dependent op (a TP split) returns a shard, of another shape than its
    input's (or than the reference's full tensor), so the shape test keeps those out.
    """
    n_t = ds.sizes["tensor"]
    nodes, roles, kinds = ds["node"].values, ds["role"].values, ds["kind"].values
    shapes = ds["shape"].values
    labels = ds["tensor"].values
    inputs: dict[str, list[int]] = {}
    for j in range(n_t):
        if roles[j] == "input":
            inputs.setdefault(str(nodes[j]), []).append(j)
    out = np.zeros(n_t, bool)
    for j in range(n_t):
        if roles[j] != "output" or kinds[j] != "api" or is_communication(str(nodes[j])):
            continue
        ins = inputs.get(str(nodes[j]))
        if not ins or not all(replicated[i] for i in ins):
            continue
        full = ref_shape.get(labels[j]) if ref_shape is not None else None
        out[j] = (shapes[j] == full) if full else any(shapes[i] == shapes[j] for i in ins)
    return out


def _majority(stats: dict[str, np.ndarray], numel: np.ndarray, scale: np.ndarray, first: np.ndarray,
              rtol: float) -> tuple[np.ndarray, np.ndarray]:
    """Copies that partly agree, at each tensor's first informative step.

    Returns (per tensor: in some group of ≥ 3 some copies agree and others do not; per group,
    member and tensor: the member disagrees with the largest agreeing set).
    """
    n = numel.shape[2]
    pick = lambda a: np.take_along_axis(a, first[None, :, None, :], axis=0)[0]  # noqa: E731
    at = {s: pick(v) for s, v in stats.items()}  # (G, n, tensor)
    sc, ne = pick(scale), pick(numel)

    def agree_with(a: Any) -> np.ndarray:
        """(G, n, tensor): which copies agree with member *a*'s (a: an int, or a (G, 1, tensor) index)."""
        pick_a = (lambda v: v[:, a:a + 1]) if isinstance(a, int) else (lambda v: np.take_along_axis(v, a, axis=1))
        ok = ne == pick_a(ne)
        for v in at.values():
            ok = ok & _close(v, pick_a(v), sc, rtol)
        return ok

    # how many copies agree with each member (itself included), one member at a time: O(G·n·tensor) memory
    size = np.stack([agree_with(a).sum(axis=1) for a in range(n)], axis=1)  # (G, n, tensor)
    best = size.max(axis=1)  # (G, tensor)
    mixed = (n >= 3) & (best >= 2) & (best < n)
    lead = np.argmax(size, axis=1)  # (G, tensor)
    odd = ~agree_with(lead[:, None, :])  # (G, n, tensor): the members that disagree with the largest set
    return mixed.any(axis=0), odd


def _shape(text: Any) -> list[int] | None:
    got = _parsed_shape(str(text))
    return list(got) if got is not None else None


@lru_cache(maxsize=4096)
def _parsed_shape(text: str) -> tuple[int, ...] | None:
    try:
        import json

        v = json.loads(text)
        return tuple(int(x) for x in v) if isinstance(v, list) else None
    except (ValueError, TypeError):
        return None


DP_LOCAL = "dp_local"


def _backward_phase(ds: xr.Dataset) -> np.ndarray:
    """Per tensor: recorded during a backward pass (a backward record, or a call that runs inside one).

    A call's own direction is forward even when the backward of a module makes it (Megatron's linear layers
    and cross entropy compute their gradients with recorded ops): it runs in the backward pass when its
    parent is a backward module call, or — a call outside any module — when the next module record on its
    rank (records are written when a call completes) is a backward one. Read at each tensor's first entry.
    """
    from precnb.naming import parse_node

    n_t = ds.sizes["tensor"]
    out = np.asarray(ds["direction"].values == "backward") | np.asarray(ds["kind"].values == "param_grad")
    if ds.sizes.get("step", 0) == 0 or ds.sizes.get("rank", 0) == 0:
        return out
    nodes, parents, kinds = ds["node"].values, ds["parent"].values, ds["kind"].values
    pres = ds["present"].values[0, 0]
    seq = ds["seq"].values[0, 0]
    mods = sorted((int(seq[j]), str(nodes[j])) for j in range(n_t) if kinds[j] == "module" and pres[j])
    mod_q = [q for q, _ in mods]
    for j in range(n_t):
        if out[j] or kinds[j] != "api" or not pres[j]:
            continue
        par = parse_node(str(parents[j])) if parents[j] else None
        if par is not None and par.kind == "module":
            out[j] = par.direction == "backward"
            continue
        k = int(np.searchsorted(mod_q, int(seq[j]), side="right"))
        out[j] = k < len(mods) and parse_node(mods[k][1]).direction == "backward"
    return out


def _data_parallel_kinds(ds: xr.Dataset, kinds: np.ndarray, reasons: np.ndarray, shard_dim: np.ndarray,
                         reference: xr.Dataset | None) -> tuple[np.ndarray, np.ndarray]:
    """Data-parallel replicas merged into one: what is each rank's own, what concatenates along the batch.

    Each replica runs the whole model on its part of the batch: a forward tensor the reference holds larger
    along one dim is that part (sharded); its loss, its gradients (of its own loss, before the gradient
    reduction) and anything else that differs between the replicas are the replica's own (``dp_local``:
    compared after the reduction, in the optimizer's inputs and the next step's parameters). Parameters
    that differ stay ``replicas_differ``.
    """
    kind, role = ds["kind"].values, ds["role"].values
    backward = _backward_phase(ds)
    kinds, reasons = kinds.copy(), reasons.copy()
    for j in range(len(kinds)):
        k = str(kinds[j])
        if k in ("replicated", "local") or (k == "replicas_differ" and role[j] == "parameter"):
            continue
        batch_part = (k == "sharded" and bool(shard_dim[j]) and not backward[j] and kind[j] != "param_grad"
                      and "hold the same shard" not in str(reasons[j]))  # equal on every replica: its own indices
        if batch_part:
            reasons[j] = f"each data-parallel replica's part of the batch (split along dim {shard_dim[j]})"
            continue
        kinds[j] = DP_LOCAL
        reasons[j] = ("data-parallel: the replica's own value (its loss and gradients over its part of the batch, "
                      "before the gradient reduction); no whole-batch counterpart")
    return kinds, reasons


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
    kinds, reasons, shard_dim = classify_shards(ds, groups, rtol=rtol, reference=reference)
    if like is not None and f"shard_kind_{dim}" in like.coords:
        prev = {str(t): j for j, t in enumerate(like["tensor"].values)}
        pk, pr, pd = (like[f"shard_{x}_{dim}"].values for x in ("kind", "reason", "dim"))
        for j, lbl in enumerate(ds["tensor"].values.tolist()):
            k = prev.get(str(lbl))
            if k is not None:
                kinds[j], reasons[j], shard_dim[j] = pk[k], pr[k], pd[k]
    if dim == "dp":
        kinds, reasons = _data_parallel_kinds(ds, kinds, reasons, shard_dim, reference)
    ranks = [int(r) for r in ds["rank"].values]
    idx = [[ranks.index(r) for r in g] for g in groups]
    pres = ds["present"].values[:, idx, :]
    allp = pres.all(axis=2)
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
    is_sh = (kinds == "sharded")[None, None, :]
    is_ps = (kinds == "partial_sum")[None, None, :]
    is_pm = (kinds == "partial_max")[None, None, :]
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
    out_numel = np.where(is_sh, numel.sum(axis=2), numel[:, :, 0, :]).astype(np.int64)
    out_numel = np.where(allp, out_numel, -1)
    present = np.where((kinds == "local")[None, None, :], pres[:, :, 0, :], allp)
    seq = ds["seq"].values[:, [g[0] for g in idx], :]
    differ_now = ~_copies(ds, idx, rtol)[4].all(axis=2) & allp & (kinds == "replicas_differ")[None, None, :]
    if "replicas_differ" in ds.data_vars:  # merged along another dimension before (cp after tp)
        differ_now |= ds["replicas_differ"].values[:, idx, :].any(axis=2)
    new_ranks = [new_layout.rank_of(**{k: c for k, c in layout.coords(g[0]).items() if k != dim})
                 for g in groups]
    dims = ("step", "rank", "tensor")
    data: dict[Hashable, Any] = {s: (dims, np.where(present, out_vals[s], np.nan)) for s in out_vals}
    data["present"] = (dims, present)
    data["null_stats"] = (dims, np.where(present, out_null, 0).astype(np.uint8))
    data["seq"] = (dims, np.where(present, seq, -1).astype(np.int32))
    data["numel"] = (dims, np.where(present, out_numel, -1).astype(np.int64))
    data["replicas_differ"] = (dims, differ_now & present)
    for name in ds.data_vars:
        if name in data or ds[name].dims != dims:
            continue
        data[name] = (dims, ds[name].values[:, [g[0] for g in idx], :])
    coords = {k: v for k, v in ds.coords.items() if k != "rank" and "rank" not in v.dims}
    out = xr.Dataset(data, coords={**coords, "rank": np.asarray(new_ranks, np.int64)}, attrs=dict(ds.attrs))
    changes = dtype_changes(ds)
    rep = {ranks[g[0]]: new for g, new in zip(idx, new_ranks, strict=True)}
    if changes:  # entries take the group's first rank's values: so do their dtypes
        moved = {t: {(s, rep[r]): d for (s, r), d in where.items() if r in rep} for t, where in changes.items()}
        out.attrs["dtype_changes"] = encode_dtype_changes({t: w for t, w in moved.items() if w})
    for name, text in _first_rank_meta(ds, rep, kinds).items():
        if text:
            out.attrs[name] = text
        else:
            out.attrs.pop(name, None)
    prev_kind = out.coords.get(f"shard_kind_{dim}")
    del prev_kind
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
    for dim in ("tp", "cp", *(("dp",) if merge_dp else ())):
        if (lay.dp if dim == "dp" else getattr(lay, dim)) > 1:
            ref = reference_shapes(out, lay.groups("tp"), reference) if dim == "tp" else reference
            out, lay = merge_group_dim(out, lay, dim, rtol=rtol, reference=ref, like=like)
    out.attrs["merged_layout"] = layout.describe()
    return validate(out)
