"""Shard classes: which of a tensor's TP/CP/EP copies are replicas, shards along a dimension, or partial sums.

:func:`classify_shards` reads it from the shards' shapes, the statistics of the copies, the communication ops
that reduce them and the model's own linear layers; :func:`precnb.analysis.layout.merge.merge_shards` merges by it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.layout.merge._reference import _Reference
from precnb.analysis.layout.merge.partials import _inherit_partial, moe_glue
from precnb.analysis.layout.rank_args import RANK_DEPENDENT, rank_dependent
from precnb.analysis.layout.shard_shapes import shape_table
from precnb.naming import is_communication

__all__ = ["DP_LOCAL", "classify_shards"]

_REDUCERS = re.compile(r"(all_reduce|reduce_scatter|_reduce_scatter_base|reduce_scatter_tensor)")


def _partial_by_reduce_inputs(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Per tensor: at some (step, rank) its statistics equal a later reduction's input — (sum, max) reductions.

    The second mask holds the inputs of ``MAX`` reductions (a vocab-parallel cross entropy's logits max): an
    elementwise maximum over the ranks, whose only derivable statistic is the Max; ``MIN``, product and other
    reductions count as neither (their ``reduce_op`` is read from the records:
    :mod:`precnb.analysis.layout.rank_args`).
    """
    from precnb.analysis.layout.rank_args import REDUCE_CODES, reduce_ops

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
        (tensor-parallel glue, :mod:`precnb.analysis.layout.rank_args`) / ``local`` (never on all members).
    reasons : ndarray of str
    shard_dim : ndarray of int
        Negative dim index of the shard split when a reference shape says so, else 0.
    """
    ranks = [int(r) for r in ds["rank"].values]
    idx = [[ranks.index(r) for r in g] for g in groups]
    pres, stats, numel, scale, same = _copies(ds, idx, rtol)
    replicated, first, any_present = _replicated_at_first(pres, stats, same)
    partial, partial_max = _partial_by_reduce_inputs(ds)
    # the input of a sum reduction is an addend by definition, even where the ranks' addends happen to agree
    # (token counts over each rank's own tokens): the reduction's output is their sum
    nodes_, roles_ = ds["node"].values, ds["role"].values
    red_in = np.fromiter(((r == "input" and is_communication(str(n)) and bool(_REDUCERS.search(str(n))))
                          for n, r in zip(nodes_, roles_, strict=True)), bool, ds.sizes["tensor"])
    replicated = replicated & ~(partial & red_in)
    n_t = ds.sizes["tensor"]
    by_copies, odd = _majority(stats, numel, scale, first, rtol) if idx and len(idx[0]) >= 3 else \
        (np.zeros(n_t, bool), None)
    ref_shapes = shape_table(reference) if reference is not None else None
    by_inputs = _should_be_replicated(ds, replicated, ref_shapes)
    # tensor-parallel glue: computed with the rank's own constants (or from such a value): no replicas
    glue, glue_why = rank_dependent(ds, groups)
    differ = (by_copies | by_inputs) & ~replicated & ~partial & ~partial_max & any_present & ~glue
    ref = _Reference(n_t)
    if reference is not None:
        ref.read(ds, groups, ref_shapes or {}, skip=differ | partial_max | glue, replicated=replicated,
                 partial=partial)
    kinds = np.full(n_t, "sharded", dtype=object)
    reasons = np.full(n_t, "shards differ: statistics merged as one tensor split across ranks", dtype=object)
    kinds[replicated] = "replicated"
    reasons[replicated] = "identical statistics on every rank of the group"
    pmask = partial & ~replicated
    kinds[pmask] = "partial_sum"
    reasons[pmask] = "equals the input of a later all-reduce/reduce-scatter (an addend of the full tensor)"
    for j in np.flatnonzero(pmask & (ref.reason != "")).tolist():
        reasons[j] = str(ref.reason[j])
    mmask = partial_max & ~replicated & ~pmask
    kinds[mmask] = "partial_max"
    reasons[mmask] = ("equals the input of a later MAX all-reduce (each rank's maximum): the whole tensor's Max "
                      "is the largest of the ranks' Maxes, its other statistics are unknown")
    by_shape = ref.by_shape & ~replicated & ~partial & ~partial_max & any_present & ~glue
    differ |= by_shape
    kinds[differ] = "replicas_differ"
    for jd in np.flatnonzero(differ).tolist():
        reasons[jd] = _differ_reason(jd, "inputs" if by_inputs[jd] else "shape" if by_shape[jd] else "copies",
                                     same, first, groups, odd)
    _inherit_partial(ds, stats, first, kinds, reasons)
    glue, glue_why = moe_glue(ds, replicated, ref.local_index, glue, glue_why)
    kinds[glue & any_present] = RANK_DEPENDENT
    labels = ds["tensor"].values
    for jg in np.flatnonzero(glue & any_present).tolist():
        reasons[jg] = glue_why.get(str(labels[jg]), "tensor-parallel glue")
    kinds[~any_present] = "local"
    reasons[~any_present] = "not recorded on every rank of the group"
    ref.sharded_reasons(kinds, reasons, len(groups[0]) if groups else 1)
    return kinds, reasons, ref.shard_dim


def _replicated_at_first(pres: np.ndarray, stats: dict[str, np.ndarray], same: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(replicated per tensor, the first step that decides per (group, tensor), recorded anywhere per tensor).

    Classified at the first step every member recorded it: what is replicated by design is replicated there
    (a replica that drifts later is what the replica check reports), and the answer does not depend on how many
    later steps are loaded (a step-by-step read gets the same). A constant tensor (optimizer state still zero at
    the first step) says nothing: the first step where it varies decides, else the first recorded one.
    """
    all_present: np.ndarray = np.all(pres, axis=2)  # (step, G, tensor)
    same_sg = same.all(axis=2)  # (step, G, tensor)
    any_present = np.any(all_present, axis=(0, 1))
    constant = (stats["max"] == stats["min"]).all(axis=2)  # (step, G, tensor) on every member
    informative = all_present & ~constant
    use = np.where(informative.any(axis=0), informative, all_present)
    first = np.argmax(use, axis=0)  # (G, tensor)
    at_first = np.take_along_axis(same_sg, first[None], axis=0)[0]  # (G, tensor)
    ever = all_present.any(axis=0)  # (G, tensor)
    return (at_first | ~ever).all(axis=0) & any_present, first, any_present


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


def _should_be_replicated(ds: xr.Dataset, replicated: np.ndarray,
                           ref_shape: dict[Any, Any] | None) -> np.ndarray:
    """Per tensor: an API op's output whose tensor inputs are all replicated and whose shape is theirs.

    An input whose statistics agree on every rank but whose reference is larger is a shard with equal statistics
    (a boolean mask's max and min), not a replica.

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

    def _split_in_ref(i: int) -> bool:  # equal statistics of a shard (a boolean mask's max 1 and min 0): no replica
        full = ref_shape.get(labels[i]) if ref_shape is not None else None
        return bool(full) and full != shapes[i]

    for j in range(n_t):
        if roles[j] != "output" or kinds[j] != "api" or is_communication(str(nodes[j])):
            continue
        ins = inputs.get(str(nodes[j]))
        if not ins or not all(replicated[i] and not _split_in_ref(i) for i in ins):
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
    # a call on another rank only (an expert there): decided by its parent
    anywhere: np.ndarray = np.asarray(ds["present"].values.any(axis=(0, 1)), bool)
    for j in range(n_t):
        if out[j] or kinds[j] != "api" or not anywhere[j]:
            continue
        par = parse_node(str(parents[j])) if parents[j] else None
        if par is not None and par.kind == "module":
            out[j] = par.direction == "backward"
            continue
        if not pres[j]:
            continue
        k = int(np.searchsorted(mod_q, int(seq[j]), side="right"))
        out[j] = k < len(mods) and parse_node(mods[k][1]).direction == "backward"
    return out


_ENGINE_FRAME = re.compile(r", in (?:_engine_run_backward|run_backward)\b")


def _engine_calls(ds: xr.Dataset) -> np.ndarray:
    """Per tensor: its call's recorded stack runs inside PyTorch's autograd engine (made by a backward).

    msprobe records the stack of every API call; at level L1 no module record tells the backward pass from the
    forward one, but a call made while gradients are computed has the engine's ``_engine_run_backward`` frame.

    >>> from precnb.schema import empty_dataset
    >>> _engine_calls(empty_dataset()).shape
    (0,)
    """
    from precnb.schema import side_table

    try:
        stacks = side_table(ds, "stacks")
    except ValueError:
        stacks = {}
    inside = {str(node) for node, frames in stacks.items()
              if isinstance(frames, list) and any(_ENGINE_FRAME.search(str(f)) for f in frames)}
    return np.asarray([str(n) in inside for n in ds["node"].values], bool)


def _whole_of_parts(ds: xr.Dataset, j: int, reference: xr.Dataset | None, groups_idx: list[list[int]]) -> bool:
    """Whether tensor *j*'s replicas, concatenated, give the reference's (whole-batch) Max, Min and Norm.

    Read at the first step where both hold it, to 1e-5: a value the replicas hold parts of (an activation saved
    for the backward), not a replica's own gradient (the gradient of its own loss is scaled by the replica count).
    """
    if reference is None or ds["tensor"].values[j] not in reference.indexes["tensor"]:
        return False
    lbl = ds["tensor"].values[j]
    rj = reference.indexes["tensor"].get_loc(lbl)
    members = groups_idx[0]
    for si in range(min(ds.sizes["step"], reference.sizes["step"])):
        pres = ds["present"].values[si, members, j]
        if not pres.all() or not bool(reference["present"].values[si, 0, rj]):
            continue
        mx = float(np.max(ds["max"].values[si, members, j]))
        mn = float(np.min(ds["min"].values[si, members, j]))
        nm = float(np.sqrt(np.sum(ds["norm"].values[si, members, j] ** 2)))
        ref = [float(reference[v].values[si, 0, rj]) for v in ("max", "min", "norm")]
        return bool(np.allclose([mx, mn, nm], ref, rtol=1e-5, atol=0.0))
    return False


def _data_parallel_kinds(ds: xr.Dataset, kinds: np.ndarray, reasons: np.ndarray, shard_dim: np.ndarray,
                         reference: xr.Dataset | None, groups_idx: list[list[int]] | None = None
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Data-parallel replicas merged into one: what is each rank's own, what concatenates along the batch.

    Each replica runs the whole model on its part of the batch: a forward tensor the reference holds larger
    along one dim is that part (sharded); its loss, its gradients (of its own loss, before the gradient
    reduction) and anything else that differs between the replicas are the replica's own (``dp_local``:
    compared after the reduction, in the optimizer's inputs and the next step's parameters). Parameters
    that differ stay ``replicas_differ``.
    """
    kind, role = ds["kind"].values, ds["role"].values
    backward = _backward_phase(ds)
    engine = _engine_calls(ds) & ~backward  # by its stack only (no module record says so: level L1)
    kinds, reasons = kinds.copy(), reasons.copy()
    for j in range(len(kinds)):
        k = str(kinds[j])
        if engine[j] and k == "sharded" and not _whole_of_parts(ds, j, reference, groups_idx or [[0]]):
            kinds[j] = DP_LOCAL  # a gradient of the replica's own loss, found by its stack
            reasons[j] = ("data-parallel: the replica's own value (a call made by the backward, its stack "
                          "shows: a gradient over its part of the batch, before the gradient reduction); "
                          "no whole-batch counterpart")
            continue
        if k == "local" and (backward[j] or kind[j] == "param_grad"):
            # an expert on the rank that holds it (expert parallelism over the data-parallel ranks): its forward
            # sees every replica's tokens routed to it (whole), its backward the sum of the replicas' own losses
            kinds[j] = DP_LOCAL
            reasons[j] = ("data-parallel: an expert's gradients over every replica's tokens, each from that "
                          "replica's own loss (before the gradient reduction); no whole-batch counterpart")
            continue
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
