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
from precnb.analysis.layout.merge.data_parallel import DP_LOCAL
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
    replicated = _list_entries_follow_parameters(ds, replicated, _varies(pres, stats))
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


def _varies(pres: np.ndarray, stats: dict[str, np.ndarray]) -> np.ndarray:
    """Per tensor: recorded by every member of a group with Max != Min at some step (not a constant tensor)."""
    return (np.all(pres, axis=2) & ~(stats["max"] == stats["min"]).all(axis=2)).any(axis=(0, 1))


def _list_entries_follow_parameters(ds: xr.Dataset, replicated: np.ndarray, varies: np.ndarray) -> np.ndarray:
    """*replicated* with an optimizer call's list entries replicated where their parameter is.

    Entry *i* of every list of a fused optimizer call (reduced gradients, moments) belongs to the parameter that
    is entry *i* of the first list: where that parameter is a copy on every member, so are they. Judged by their own
    first informative step, a moment that departs from the step it stops being zero (a fault at step 1) would be
    the replica's own value, and the same run read step by step (step 0's zeros deciding) would compare it: a
    departure is a departure however many steps are read. An expert's or a distributed optimizer's parameters
    differ across the members, and so stay their entries; a parameter that is constant wherever it is read (a
    zero-initialised bias shard at step 0) proves nothing (*varies*: per tensor, not constant somewhere).

    >>> import xarray as xr
    >>> lbl = ["Torch._fused_adamw_.0.forward.input.0.3", "Torch._fused_adamw_.0.forward.input.3.3"]
    >>> ds = xr.Dataset(coords={"tensor": lbl, "module": ("tensor", ["optimizer", "optimizer"])})
    >>> _list_entries_follow_parameters(ds, np.array([True, False]), np.array([True, True])).tolist()
    [True, True]
    >>> _list_entries_follow_parameters(ds, np.array([True, False]), np.array([False, True])).tolist()
    [True, False]
    """
    opt = np.flatnonzero(ds["module"].values == "optimizer") if "module" in ds.coords else np.array([], int)
    if not len(opt):
        return replicated
    labels = ds["tensor"].values
    col = {str(labels[j]): j for j in opt.tolist()}
    out = replicated.copy()
    for j in opt.tolist():
        head, _, entry = str(labels[j]).rpartition(".")
        node, _, lst = head.rpartition(".")
        if lst.isdigit() and entry.isdigit() and lst != "0":
            param = col.get(f"{node}.0.{entry}")
            if param is not None and replicated[param] and varies[param]:
                out[j] = True
    return out


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


