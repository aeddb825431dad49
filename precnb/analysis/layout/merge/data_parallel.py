"""Data-parallel replicas merged into one: what is each replica's own and what concatenates along the batch.

Used by :func:`precnb.analysis.layout.merge.merge_group_dim` when it merges the ``dp`` dimension.
"""

from __future__ import annotations

import re

import numpy as np
import xarray as xr

__all__ = ["DP_LOCAL", "EXPERT_SUM", "backward_phase", "data_parallel_kinds", "expert_sum_factor"]

DP_LOCAL = "dp_local"
EXPERT_SUM = "expert_sum"
_IN_EXPERT = re.compile(r"(?<![A-Za-z0-9_])experts\.local_experts\.\d+\.")


def backward_phase(ds: xr.Dataset) -> np.ndarray:
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


def _in_expert(ds: xr.Dataset) -> np.ndarray:
    """Per tensor: recorded inside one expert of an MoE layer (its node or its parent call is the expert's)."""
    nodes, parents = ds["node"].values, ds["parent"].values
    return np.asarray([bool(_IN_EXPERT.search(str(n)) or _IN_EXPERT.search(str(p or "")))
                       for n, p in zip(nodes, parents, strict=True)], bool)


def _first_ratios(ds: xr.Dataset, cols: np.ndarray, reference: xr.Dataset) -> dict[int, float]:
    """Per tensor of *cols* both runs hold: this run's Norm over the reference's at the first step both hold it."""
    ref_at = reference.indexes["tensor"]
    labels = ds["tensor"].values
    n_steps = min(ds.sizes["step"], reference.sizes["step"])
    norm, pres = ds["norm"].values, ds["present"].values
    r_norm, r_pres = reference["norm"].values, reference["present"].values
    out: dict[int, float] = {}
    for j in cols.tolist():
        if labels[j] not in ref_at:
            continue
        rj = ref_at.get_loc(labels[j])
        for si in range(n_steps):
            have = np.flatnonzero(pres[si, :, j])
            if not len(have) or not r_pres[si, 0, rj]:
                continue
            a, b = float(norm[si, have[0], j]), float(r_norm[si, 0, rj])
            if np.isfinite(a) and np.isfinite(b) and a > 0 and b > 0:
                out[j] = a / b
            break
    return out


def expert_sum_factor(ds: xr.Dataset, cols: np.ndarray, reference: xr.Dataset | None, replicas: int
                      ) -> float | None:
    """How an expert's backward records over every replica's tokens relate to the whole-batch run's: the factor.

    With one copy of each expert (expert data-parallel size 1) the rank that holds an expert runs its backward
    for the tokens of every data-parallel replica, each replica's with the gradient of that replica's own
    loss: where each replica's loss is normalised over its part of the batch (Megatron's default) the gradients
    are *replicas* times the whole-batch run's, and the data-parallel reduction divides them afterwards; with
    per-token losses (normalised after the reduction) they are equal. Read from the data, not assumed: the
    median, over the expert module records *cols* (gradients in and out of a module, parameter gradients) both
    runs hold, of this run's Norm over the reference's at the first step both hold it, when it is within 1e-3
    of *replicas* or of 1 (a fault in one expert does not move a median); else None.

    >>> from precnb.schema import empty_dataset
    >>> expert_sum_factor(empty_dataset(), np.zeros(0, np.int64), None, 2) is None
    True
    """
    if reference is None or not len(cols) or "norm" not in reference.data_vars:
        return None
    ratios = list(_first_ratios(ds, cols, reference).values())
    if len(ratios) < 3:
        return None
    med = float(np.median(ratios))
    return next((f for f in (float(replicas), 1.0) if abs(med / f - 1.0) < 1e-3), None)


def data_parallel_kinds(ds: xr.Dataset, kinds: np.ndarray, reasons: np.ndarray, shard_dim: np.ndarray,
                         reference: xr.Dataset | None, groups_idx: list[list[int]] | None = None,
                         expert_copies: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Data-parallel replicas merged into one: what is each rank's own, what concatenates along the batch.

    Each replica runs the whole model on its part of the batch: a forward tensor the reference holds larger
    along one dim is that part (sharded); its loss, its gradients (of its own loss, before the gradient
    reduction) and anything else that differs between the replicas are the replica's own (``dp_local``:
    compared after the reduction, in the optimizer's inputs and the next step's parameters). Parameters
    that differ stay ``replicas_differ``.

    *expert_copies*: the expert data-parallel size of the layout (None: unknown). With 1, each expert lives on
    one rank and its backward runs over every replica's tokens: a whole-batch value with no replica; its module
    records (gradients in and out of the expert's modules, its parameter gradients) are compared
    with the reference's after division by the replica count when the data say so (:data:`EXPERT_SUM`, see
    :func:`expert_sum_factor`) or as it is (``local``); with more copies each copy sees some replicas' tokens
    only: the replica's own value.
    """
    kind, role = ds["kind"].values, ds["role"].values
    backward = backward_phase(ds)
    engine = _engine_calls(ds) & ~backward  # by its stack only (no module record says so: level L1)
    kinds, reasons = kinds.copy(), reasons.copy()
    # module records only: an API label can name an expert's call at one step and another module's at the next
    expert_local = (np.asarray(kinds == "local") & (backward | (kind == "param_grad"))
                    & np.isin(kind, ("module", "param_grad")) & _in_expert(ds))
    factor = None
    if expert_copies == 1 and expert_local.any():
        factor = expert_sum_factor(ds, np.flatnonzero(expert_local), reference, len((groups_idx or [[0]])[0]))
    whole = expert_local if factor is not None else np.zeros_like(expert_local)
    for j in np.flatnonzero(whole).tolist():
        if factor != 1.0:
            kinds[j] = EXPERT_SUM
            reasons[j] = (f"an expert's backward over every data-parallel replica's tokens (one copy of the "
                          f"expert: expert data-parallel size 1), each with its replica's own loss: "
                          f"{factor:g} times the whole-batch value, divided by {factor:g}")
        else:
            reasons[j] = ("an expert's backward over every data-parallel replica's tokens (one copy of the "
                          "expert: expert data-parallel size 1): the whole-batch value")
    for j in range(len(kinds)):
        k = str(kinds[j])
        if engine[j] and k == "sharded" and not _whole_of_parts(ds, j, reference, groups_idx or [[0]]):
            kinds[j] = DP_LOCAL  # a gradient of the replica's own loss, found by its stack
            reasons[j] = ("data-parallel: the replica's own value (a call made by the backward, its stack "
                          "shows: a gradient over its part of the batch, before the gradient reduction); "
                          "no whole-batch counterpart")
            continue
        if whole[j] or k == EXPERT_SUM:  # (kept from earlier steps merged before)
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
