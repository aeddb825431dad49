"""Which tensors must be replicated across a group: the candidates the replica check compares.

Parameters (and the monitor's replicated families) on data-parallel groups; on tensor/context-parallel groups the
tensors bit-identical on every rank at most of the steps that name the same call, or at the first step that shows
them (a replica that departs for good later is still a departure there). Used by
:func:`precnb.analysis.replicas.replica_mismatches`.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from precnb.dtypes import dtype_kind
from precnb.schema import STATS

__all__ = ["REPLICATED_MONITOR_FAMILIES", "candidates"]

REPLICATED_MONITOR_FAMILIES = ("param_origin", "param_updated", "grad_reduced", "exp_avg", "exp_avg_sq")


def candidates(ds: xr.Dataset, dim: str, groups: list[list[int]], ranks: list[int], rtol: float,
                present: np.ndarray, families: list[int]) -> np.ndarray:
    """(family, step, tensor): tensors that must be replicated on the groups of each family (pipeline stage).

    The vote "replicated at most steps" pools the steps whose labels name the same calls
    (:func:`precnb.analysis.step_groups.step_groups`): a label that names another op from step 1 on is judged
    at step 0 by step 0 alone.
    """
    from precnb.analysis.step_groups import step_groups

    out = np.zeros((max(families, default=0) + 1, ds.sizes["step"], ds.sizes["tensor"]), bool)
    parts = step_groups(ds)
    for idx in parts:
        out[:, idx, :] = _candidates_of(ds.isel(step=idx), dim, groups, ranks, rtol, present[idx],
                                        families)[:, None, :]
    if len(parts) > 1:  # a module's records are numbered by its own calls: judged over every step at once
        from precnb.analysis.step_groups import label_meanings

        # (and an optimizer call's list entries: one call per step, whatever the API counters before it)
        module = np.isin(ds["kind"].values, ("module", "param_grad")) | (ds["module"].values == "optimizer")
        meaning = label_meanings(ds)
        same_call = (meaning == meaning[:1]).all(axis=0)
        keep = module & same_call
        if keep.any():
            whole = _candidates_of(ds, dim, groups, ranks, rtol, present, families)
            out[:, :, keep] = whole[:, None, keep]
    return out


def _candidates_of(ds: xr.Dataset, dim: str, groups: list[list[int]], ranks: list[int], rtol: float,
                   present: np.ndarray, families: list[int]) -> np.ndarray:
    """(family, tensor): :func:`_candidates` on steps whose labels name the same calls."""
    roles = ds["role"].values
    apis = ds["api"].values
    kinds = ds["kind"].values
    n_f = max(families, default=0) + 1
    must = (roles == "parameter") | ((kinds == "monitor") & np.isin(apis, REPLICATED_MONITOR_FAMILIES))
    if dim == "dp":
        # an optimizer call's list entries (parameters, reduced gradients, moments) are copies on every DP replica
        # unless the optimizer is distributed (then each replica holds its own shard and they never agree): judged
        # by the same vote as a TP group's tensors, so a moment that departs on one replica is seen at the step it
        # enters the update, not a step later in the parameters it changed
        opt = (ds["module"].values == "optimizer") & (kinds != "monitor")
        out = np.repeat(must[None, :], n_f, axis=0)
        if opt.any():
            out |= _by_list(ds, _voted(ds, groups, ranks, present, families), opt)
        return out
    # (the training monitor's optimizer-state families are per-shard across TP; an optimizer call's list entries, a
    # replicated parameter's gradient and state among them, are judged like any tensor)
    not_opt = (ds["module"].values != "optimizer") | (kinds != "monitor")
    return _voted(ds, groups, ranks, present, families) & not_opt[None, :]


def _by_list(ds: xr.Dataset, voted: np.ndarray, opt: np.ndarray) -> np.ndarray:
    """(family, tensor): an optimizer call's list entries whose parameter is a copy on every replica.

    A replicated parameter's gradient and moments are copies too (a distributed optimizer shards them all, an
    expert's parameter is its rank's own): entry *i* of every list is a candidate when entry *i* of the first list
    (the parameters) is. An entry whose moment departs from the first step it exists is never seen agreeing
    itself, and is still a copy of its replica's.
    """
    out = voted & opt[None, :]
    col = {str(t): j for j, t in enumerate(ds["tensor"].values.tolist())}
    for j in np.flatnonzero(opt):
        head, _, entry = str(ds["tensor"].values[j]).rpartition(".")
        node, _, lst = head.rpartition(".")
        param = col.get(f"{node}.0.{entry}") if lst.isdigit() and entry.isdigit() else None
        if param is not None:
            out[:, j] |= voted[:, param]
    return out


def _voted(ds: xr.Dataset, groups: list[list[int]], ranks: list[int], present: np.ndarray,
           families: list[int]) -> np.ndarray:
    """(family, tensor): tensors replicated on the groups at most of the steps, or at the first step that shows them.

    Replicated (and not all-zero) at most of the steps recorded on the stage's groups; replicated means bit-identical
    here (copies of one computation are; different heads' softmax statistics can agree to 1e-6, the departure
    tolerance).
    """
    rtol = 0.0
    n_f = max(families, default=0) + 1
    pres = present
    n_t = ds.sizes["tensor"]
    rep_steps = np.zeros((n_f, n_t), np.int64)
    rec_steps = np.zeros((n_f, n_t), np.int64)
    first_ok = np.ones((n_f, n_t), bool)  # bit-identical at the first step that says anything
    floats = np.fromiter((dtype_kind(str(d)) == "float" for d in ds["dtype"].values), bool, n_t)
    node_id, is_input, own_inputs = _op_inputs(ds)
    # what holds an op's value after it: the next op's input, the output of the module that returns it
    holders = is_input | ((ds["role"].values == "output") & (ds["kind"].values != "api"))
    for g, fam in zip(groups, families, strict=True):
        idx = [ranks.index(r) for r in g]
        allp = pres[:, idx, :].all(axis=1)  # (step, tensor)
        same = np.ones(allp.shape, bool)
        for s in STATS:
            v = ds[s].values[:, idx, :]  # (step, n, tensor)
            ref = v[:, :1, :]
            scale = np.fmax(np.abs(ref), 1e-30)
            with np.errstate(invalid="ignore"):
                ok = (np.abs(v - ref) <= rtol * scale) | (np.isnan(v) & np.isnan(ref)) | (v == ref)
            same &= ok.all(axis=1)
        mx, mn = ds["max"].values[:, idx[0], :], ds["min"].values[:, idx[0], :]
        # all zeros, or not finite (NaN on every rank after a fault is equal everywhere and says nothing)
        degenerate = ((mx == 0) & (mn == 0)) | ~np.isfinite(mx) | ~np.isfinite(mn)
        # small whole numbers (token counts per expert, indices, masks) agree by chance across ranks that count
        # different things: a step where every statistic is a whole number does not vote "replicated"
        mean0 = ds["mean"].values[:, idx[0], :]
        with np.errstate(invalid="ignore"):
            whole = (mx == np.round(mx)) & (mn == np.round(mn)) & (np.isnan(mean0) | (mean0 == np.round(mean0)))
        rep_steps[fam] += (allp & same & ~degenerate & ~whole).sum(axis=0)
        rec_steps[fam] += allp.sum(axis=0)
        informative = allp & ~degenerate
        first = np.argmax(informative, axis=0)
        # equal outputs of an op whose inputs differ on the group at that step agree by chance (a masked softmax's
        # copies over other heads, the mask's zeros dominating): only inputs that agree make a copy of one step
        differ = np.zeros((int(node_id.max(initial=-1)) + 1, allp.shape[0]), np.int64)  # (node, step)
        np.add.at(differ, node_id[is_input], (~(same & allp))[:, is_input].T.astype(np.int64))
        inputs_agree = ~own_inputs[None, :] | (differ[node_id].T == 0)
        ok_first = informative.any(axis=0) & np.take_along_axis(same, first[None, :], axis=0)[0]
        chance = ok_first & ~np.take_along_axis(inputs_agree, first[None, :], axis=0)[0]
        for _ in range(8):  # passed on: the next op's input holds it, and that op's output agrees by chance too
            passed = _passed_on(ds, idx[0], first, chance, holders & ok_first & ~chance)
            fed = np.zeros(int(node_id.max(initial=-1)) + 1, bool)
            fed[node_id[passed]] = True
            new = passed | (ok_first & own_inputs & fed[node_id] & ~chance)
            if not new.any():
                break
            chance |= new
        first_ok[fam] &= ok_first & ~chance
    # replicated at most steps, or (a floating-point tensor) bit-identical at the first step that shows it: a
    # replica that departs for good at a later step is still a departure there
    # a parameter gradient is a candidate like any tensor of the stage: replicated parameters' gradients are copies
    # of one computation on every TP rank (a row-parallel bias, a layernorm without sequence parallelism); a
    # sharded or partial one differs at every step and never qualifies
    return (rec_steps > 0) & ((2 * rep_steps >= rec_steps) | (first_ok & floats[None, :]))


def _op_inputs(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per tensor: its node's index, whether it is an input, whether it is an op's output with recorded inputs.

    A collective's output is left out (its inputs are the ranks' parts by design), and so is a module's: a module
    call may run a collective inside (a row-parallel linear's sharded input, its all-reduced output).

    >>> from precnb.schema import empty_dataset
    >>> [a.shape for a in _op_inputs(empty_dataset())]
    [(0,), (0,), (0,)]
    """
    from precnb.naming import is_communication

    nodes = [str(n) for n in ds["node"].values]
    ids = {n: i for i, n in enumerate(dict.fromkeys(nodes))}
    node_id = np.fromiter((ids[n] for n in nodes), np.int64, len(nodes))
    roles = ds["role"].values
    is_input = roles == "input"
    has_inputs = np.zeros(len(ids), bool)
    has_inputs[node_id[is_input]] = True
    comm = np.fromiter((is_communication(n) for n in ids), bool, len(ids))
    own = (roles == "output") & has_inputs[node_id] & ~comm[node_id] & (ds["kind"].values == "api")
    return node_id, is_input, own


def _passed_on(ds: xr.Dataset, ri: int, first: np.ndarray, chance: np.ndarray, inputs: np.ndarray) -> np.ndarray:
    """Per tensor: a holder among *inputs* holding, at its first step, bit for bit an output that agrees by chance.

    The next op's input is the value an earlier op produced (the attention dropout's input is the softmax's
    output), and so is the output of the module that returns it: when that output's copies agree only by chance,
    so do theirs.
    """
    out = np.zeros(ds.sizes["tensor"], bool)
    if not chance.any() or not inputs.any():
        return out
    stats = np.stack([ds[s].values[:, ri, :] for s in STATS], axis=-1)  # (step, tensor, 4)
    seen = {(int(first[j]), stats[first[j], j].tobytes()) for j in np.flatnonzero(chance).tolist()}
    for j in np.flatnonzero(inputs).tolist():
        out[j] = (int(first[j]), stats[first[j], j].tobytes()) in seen
    return out

