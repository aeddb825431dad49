"""Rank-dependent ops: tensor-parallel glue that computes on the rank's own constants.

A TP rank runs some ops with constants of its own: Megatron's ``VocabParallelEmbedding`` and
vocab-parallel cross entropy compare the token ids with the rank's vocabulary range
(``Tensor.__lt__(ids, vocab_start)``, ``__ge__``, ``__sub__``) and mask and look up with the result.
Given identical tensor inputs such an op gives different outputs on each rank *by design*; what is
computed from those outputs is the rank's part of the answer until a collective combines it. None of
these tensors has a whole-model counterpart, and none is a replica that should agree.

This is known from the records, not guessed: the reader keeps a checksum of each API call's scalar
arguments per (step, rank) where it varies (``attrs["scalar_signatures"]``,
:func:`precnb.io._runfacts.scalar_signature`); :func:`mark_rank_args` makes it a data variable
(``scalar_sig``) that pipeline stitching carries along; :func:`rank_dependent` finds, in each group of
ranks, the calls whose tensor inputs agree but whose scalar arguments differ (*seeds*) and follows their
outputs (the same statistics read again by a later call on that rank: :mod:`precnb.analysis.causal.dataflow`'s
rule) through the non-collective calls after them.

Examples
--------
>>> from precnb.schema import empty_dataset
>>> scalar_sigs(empty_dataset()) is None
True
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.undefined import undefined_mask
from precnb.naming import is_communication

__all__ = ["RANK_DEPENDENT", "REDUCE_CODES", "glue_aside", "glue_labels", "mark_rank_args", "rank_dependent",
           "reduce_ops", "scalar_sigs"]

_VAR = "scalar_sig"
#: the shard kind of a rank-dependent tensor (``shard_kind_tp``)
RANK_DEPENDENT = "rank_dependent"


def _table(ds: xr.Dataset) -> dict[str, Any]:
    text = ds.attrs.get("scalar_signatures")
    if not text:
        return {}
    try:
        table = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def scalar_sigs(ds: xr.Dataset) -> np.ndarray | None:
    """(step, rank, tensor) int64 checksums of the scalar arguments of the calls whose arguments vary, else None.

    0 where nothing varies (the call has the same arguments on every (step, rank) it was read at, or has none).
    """
    if _VAR in ds.data_vars:
        return np.asarray(ds[_VAR].values, np.int64)
    table = _table(ds)
    if not table:
        return None
    nodes = ds["node"].values
    cols: dict[str, list[int]] = {}
    for j, n in enumerate(nodes.tolist()):
        if n in table:
            cols.setdefault(n, []).append(j)
    if not cols:
        return None
    steps = {int(s): i for i, s in enumerate(ds["step"].values.tolist())}
    ranks = {int(r): i for i, r in enumerate(ds["rank"].values.tolist())}
    out = np.zeros((ds.sizes["step"], ds.sizes["rank"], ds.sizes["tensor"]), np.int64)
    for node, js in cols.items():
        for st, entry in table[node].items():  # step -> the signature of most ranks and the ranks that differ
            si = steps.get(int(st))
            if si is None or not isinstance(entry, dict):
                continue
            out[si][:, js] = int(entry.get("default", 0))
            for r, v in (entry.get("at") or {}).items():
                ri = ranks.get(int(r))
                if ri is not None:
                    out[si, ri, js] = int(v)
    return out


#: codes of the ``reduce_op`` variable: the reduction of a collective that is not a sum
REDUCE_CODES = {"MAX": 1, "MIN": 2}
_OTHER_REDUCE = 3


def reduce_ops(ds: xr.Dataset) -> np.ndarray | None:
    """(step, rank, tensor) int8: 1 max, 2 min, 3 another non-sum reduction, 0 a sum or no collective.

    None when every reduction is a sum.
    """
    if "reduce_op" in ds.data_vars:
        return np.asarray(ds["reduce_op"].values, np.int8)
    text = ds.attrs.get("reduce_ops")
    try:
        table = json.loads(text) if text else {}
    except (TypeError, ValueError):
        table = {}
    if not isinstance(table, dict) or not table:
        return None
    ranks = {int(r): i for i, r in enumerate(ds["rank"].values.tolist())}
    out = np.zeros((ds.sizes["step"], ds.sizes["rank"], ds.sizes["tensor"]), np.int8)
    for j, n in enumerate(ds["node"].values.tolist()):
        for op, rs in (table.get(n) or {}).items():
            code = REDUCE_CODES.get(str(op).rsplit(".", 1)[-1].upper(), _OTHER_REDUCE)
            for r in rs:
                if int(r) in ranks:
                    out[:, ranks[int(r)], j] = code
    return out


def mark_rank_args(ds: xr.Dataset) -> xr.Dataset:
    """*ds* with the ``scalar_sig`` and ``reduce_op`` variables where the run has them (else unchanged)."""
    if "run" in ds.dims:
        return ds
    add = {}
    if _VAR not in ds.data_vars:
        sigs = scalar_sigs(ds)
        if sigs is not None:
            add[_VAR] = (("step", "rank", "tensor"), sigs)
    if "reduce_op" not in ds.data_vars:
        ops = reduce_ops(ds)
        if ops is not None:
            add["reduce_op"] = (("step", "rank", "tensor"), ops)
    return ds.assign(add) if add else ds


_ENTRY = ("numel", "max", "min", "mean", "norm")


def _shape_key(arr: dict[str, np.ndarray], si: int, ri: int, j: int, dtypes: np.ndarray) -> tuple[int, str]:
    return int(arr["numel"][si, ri, j]), str(dtypes[j])


def _signature(arr: dict[str, np.ndarray], si: int, ri: int, j: int, dtypes: np.ndarray) -> bytes | None:
    """Element count, dtype and statistics of one entry (a view keeps them: ``view`` / ``reshape`` are not dumped)."""
    numel = int(arr["numel"][si, ri, j])
    if numel <= 1:
        return None  # scalars and empty tensors match too much
    vals = np.array([arr[s][si, ri, j] for s in ("max", "min", "mean", "norm")], np.float64)
    if np.isnan(vals).any():
        return None  # NaN statistics name no tensor: every tensor a NaN reached has them (a by-design -inf fill does)
    return f"{numel}|{dtypes[j]}|".encode() + vals.tobytes()


def _mask_key(arr: dict[str, np.ndarray], si: int, ri: int, j: int, dtypes: np.ndarray) -> bytes | None:
    """Element count, Max and Min of a 0/1 tensor (a bool mask, or one cast to numbers: ``mask.float()``)."""
    numel = int(arr["numel"][si, ri, j])
    mx, mn = float(arr["max"][si, ri, j]), float(arr["min"][si, ri, j])
    if numel <= 1 or mx not in (0.0, 1.0) or mn not in (0.0, 1.0):
        return None
    return f"mask|{numel}|{mx}|{mn}".encode()


def _in_place(api: str) -> bool:
    """An API that changes its first argument (``__setitem__``, ``__iadd__``, ``masked_fill_``, ``div_``, ...)."""
    short = api.rsplit(".", 1)[-1]
    if short.startswith("__") and short.endswith("__"):
        return short == "__setitem__" or (short.startswith("__i") and short not in ("__invert__", "__index__"))
    return short.endswith("_")


def rank_dependent(ds: xr.Dataset, groups: list[list[int]], present: np.ndarray | None = None
                   ) -> tuple[np.ndarray, dict[str, str]]:
    """Per tensor: computed by (or from) a call whose scalar arguments differ between the ranks of a group.

    A *seed* is a call whose tensor inputs are bit-identical on every rank of the group and whose scalar
    arguments are not: the op is rank-dependent by design. (A call whose inputs already differ — attention
    over each rank's own heads — is an ordinary sharded computation, whatever its arguments: a scale set
    differently on one rank is a difference, not glue.)

    Parameters
    ----------
    ds : xarray.Dataset
        One run, its ranks as read (or PP-stitched, the ``scalar_sig`` variable carried along).
    groups : list of list of int
        Groups of ranks that run the same calls (a TP group).
    present : ndarray, optional
        (step, rank, tensor) entries to consider (default ``ds["present"]``).

    Returns
    -------
    mask : ndarray of bool
        Per tensor.
    why : dict
        Tensor label → the reason (which call, which argument differs).
    """
    n_t = ds.sizes["tensor"]
    out = np.zeros(n_t, bool)
    why: dict[str, str] = {}
    sigs = scalar_sigs(ds)
    if sigs is None or not groups:
        return out, why
    pres = np.asarray(ds["present"].values, bool) if present is None else present
    pres = pres & ~undefined_mask(ds)  # a buffer the op ignores is no input
    by_node: dict[str, list[int]] = {}
    for j, n in enumerate(ds["node"].values.tolist()):
        by_node.setdefault(n, []).append(j)
    seeds = _seeds(ds, groups, sigs, pres, by_node)
    if not seeds:
        return out, why
    derived: dict[str, str] = {n: f"{n} is rank-dependent by design: its tensor inputs agree across the group, "
                                  "its scalar arguments do not" for n in seeds}
    collective_inputs = _propagate(ds, groups, pres, by_node, derived)
    roles, labels = ds["role"].values, ds["tensor"].values
    for j in collective_inputs:  # the rank's part handed to the collective (its output is the whole)
        out[j] = True
        why[str(labels[j])] = "tensor-parallel glue: the rank's part of a tensor a collective combines"
    for n, reason in derived.items():  # a seed's inputs agree across the group: only its outputs are its own
        for node in (n, n[: -len(".forward")] + ".backward"):
            for j in by_node.get(node, []):
                if node != n or n not in seeds or roles[j] != "input":
                    out[j] = True
                    why[str(labels[j])] = f"tensor-parallel glue: {reason}"
    return out, why


def _seeds(ds: xr.Dataset, groups: list[list[int]], sigs: np.ndarray, pres: np.ndarray,
           by_node: dict[str, list[int]]) -> set[str]:
    """The forward API calls whose tensor inputs agree across a group and whose scalar arguments do not."""
    ranks = [int(r) for r in ds["rank"].values]
    nodes, roles, kinds = ds["node"].values, ds["role"].values, ds["kind"].values
    seeds: set[str] = set()
    stats = np.stack([ds[s].values for s in ("max", "min", "mean", "norm")], axis=-1)
    for g in groups:
        idx = [ranks.index(r) for r in g if r in ranks]
        if len(idx) < 2:
            continue
        s = sigs[:, idx, :]
        allp = pres[:, idx, :].all(axis=1)
        differ = (s != s[:, :1, :]).any(axis=1) & allp & (s != 0).all(axis=1)  # (step, tensor)
        v = stats[:, idx]
        same = ((v == v[:, :1]) | (np.isnan(v) & np.isnan(v[:, :1]))).all(axis=(1, 3)) & allp  # (step, tensor)
        for si, j in np.argwhere(differ):
            node = str(nodes[j])
            if kinds[j] != "api" or is_communication(node) or not node.endswith(".forward") or node in seeds:
                continue
            ins = [k for k in by_node[node] if roles[k] == "input" and pres[si, idx[0], k]]
            if ins and all(same[si, k] for k in ins):  # the same tensors in, other constants: rank-dependent
                seeds.add(node)
    return seeds


def _propagate(ds: xr.Dataset, groups: list[list[int]], pres: np.ndarray, by_node: dict[str, list[int]],
               derived: dict[str, str]) -> set[int]:
    """The calls computed from a rank-dependent value (added to *derived*), in each rank's execution order.

    Returns the inputs of the collectives that combine such values (the glue ends there).
    """
    ranks = [int(r) for r in ds["rank"].values]
    kinds = ds["kind"].values
    walk = _Walk(ds, pres, by_node, derived)
    fwd = [n for n, js in by_node.items() if kinds[js[0]] == "api" and n.endswith(".forward")]
    members = sorted({ranks.index(r) for g in groups for r in g if r in ranks})
    seq = ds["seq"].values
    for si in range(ds.sizes["step"]):
        for ri in members:
            order = sorted((int(seq[si, ri, by_node[n][0]]), n) for n in fwd if pres[si, ri, by_node[n]].any())
            walk.rank_step(si, ri, [n for _, n in order])
    return walk.collective_inputs


class _Walk:
    """One rank's calls in execution order at one step: which compute on a rank-dependent value."""

    def __init__(self, ds: xr.Dataset, pres: np.ndarray, by_node: dict[str, list[int]],
                 derived: dict[str, str]) -> None:
        self.pres, self.by_node, self.derived = pres, by_node, derived
        self.roles, self.apis, self.dtypes = ds["role"].values, ds["api"].values, ds["dtype"].values
        self.parents = ds["parent"].values
        self.arr = {s: ds[s].values for s in _ENTRY}  # read once: the loops below index single entries
        self.collective_inputs: set[int] = set()

    def rank_step(self, si: int, ri: int, order: list[str]) -> None:
        """Walk the forward calls *order* of rank index *ri* at step index *si*."""
        arr, dtypes, roles = self.arr, self.dtypes, self.roles
        made: dict[bytes, str] = {}
        # scope -> ((numel, dtype), writer): a tensor a rank-dependent in-place call changed, whose new
        # statistics no record holds; the next call in that scope reading such a tensor reads it
        mutated: dict[str, tuple[tuple[int, str], str]] = {}
        for n in order:
            js = self.by_node[n]
            scope = str(self.parents[js[0]])
            ins = [j for j in js if roles[j] == "input" and self.pres[si, ri, j]]
            if is_communication(n):  # a collective combines the ranks' parts: the glue ends here
                hit = [j for j in ins if _signature(arr, si, ri, j, dtypes) in made or (
                    scope in mutated and _shape_key(arr, si, ri, j, dtypes) == mutated[scope][0])]
                self.collective_inputs.update(hit)
                if hit:
                    mutated.pop(scope, None)
                continue
            if n not in self.derived:
                self._derive(n, si, ri, ins, scope, made, mutated)
            if n not in self.derived:
                continue
            for j in js:
                if roles[j] == "output" and self.pres[si, ri, j]:
                    sig = _signature(arr, si, ri, j, dtypes)
                    if sig is not None:
                        made[sig] = n
                    cast = _mask_key(arr, si, ri, j, dtypes)
                    if cast is not None and "bool" in str(dtypes[j]):
                        made[cast] = n
            if _in_place(str(self.apis[js[0]])) and ins:
                mutated[scope] = (_shape_key(arr, si, ri, ins[0], dtypes), n)

    def _derive(self, n: str, si: int, ri: int, ins: list[int], scope: str, made: dict[bytes, str],
                mutated: dict[str, tuple[tuple[int, str], str]]) -> None:
        """Mark *n* derived when one of its inputs is a rank-dependent output (or a tensor changed in place)."""
        arr, dtypes = self.arr, self.dtypes
        for j in ins:
            sig = _signature(arr, si, ri, j, dtypes)
            cast = _mask_key(arr, si, ri, j, dtypes)  # a rank's mask read again as 0/1 numbers
            src = made.get(sig) if sig is not None else None
            src = src or (made.get(cast) if cast is not None else None)
            if src is not None:
                self.derived[n] = f"{n} computes on the rank-dependent output of {src}"
                return
            if scope in mutated and _shape_key(arr, si, ri, j, dtypes) == mutated[scope][0]:
                self.derived[n] = f"{n} reads the tensor {mutated[scope][1]} changed in place"
                return


_OPTIMIZER_APIS = ("_fused_adam", "_fused_sgd", "_fused_adagrad", "_foreach_")


def is_optimizer_api(api: str) -> bool:
    """A fused / foreach optimizer kernel (one call over a list of parameters)."""
    return any(m in api for m in _OPTIMIZER_APIS)


def glue_labels(ds: xr.Dataset) -> dict[str, str]:
    """Tensor label → why, for the tensors with no whole-model counterpart by construction.

    Those a merge classified :data:`RANK_DEPENDENT` (``shard_kind_tp`` / ``_cp``) and a pipeline stitch marked
    stage-local (``shard_kind_pp``: the stages' optimizer calls).
    """
    out: dict[str, str] = {}
    labels = ds["tensor"].values
    for dim in ("tp", "cp", "pp", "dp"):
        kind = ds.coords.get(f"shard_kind_{dim}")
        if kind is None:
            continue
        reason = ds.coords.get(f"shard_reason_{dim}")
        glue = np.isin(np.asarray(kind.values), (RANK_DEPENDENT, "stage_local", "dp_local"))
        for j in np.flatnonzero(glue).tolist():
            out.setdefault(str(labels[j]), str(reason.values[j]) if reason is not None else "tensor-parallel glue")
    return out


def glue_aside(ds: xr.Dataset, glue: np.ndarray, why: dict[str, str]) -> list[dict[str, Any]]:
    """One set-aside entry per rank-dependent call (its node, why, how many of its tensors)."""
    nodes, labels = ds["node"].values, ds["tensor"].values
    by_node: dict[str, list[str]] = {}
    for j in np.flatnonzero(glue).tolist():
        by_node.setdefault(str(nodes[j]), []).append(str(labels[j]))
    return [{"why": why.get(ts[0], "tensor-parallel glue"), "node": n, "entries": len(ts), "tensors": len(ts),
             "examples": [{"tensor": t} for t in ts[:3]]} for n, ts in by_node.items()]
