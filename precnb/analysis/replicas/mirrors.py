"""Copies of a replicated value: the candidates one dumped step shows by itself (issue #47 item 3).

The replica check compares the tensors a TP (or CP) group must hold identically. Which those are it learns from
the steps where the copies agree (:mod:`precnb.analysis.replicas.candidates`) or from an op whose inputs agree;
a dump of the one step where a rank departs shows neither for a tensor that departs there: a row-parallel
layer's output, its copies made identical by the all-reduce inside it, then scaled on one rank. The step itself
says it: on the ranks that did not depart, the tensor is, bit for bit, a value that is identical on every rank of
the group at that step (the all-reduce's output). A tensor whose copies differ while one rank's copy equals such
a replicated value (all four statistics and the element count; finite, not constant, not whole numbers) should
be a copy on every rank: it is a candidate, and the ranks whose copy is not that value are the ones that depart
(which decides a pair).

Examples
--------
>>> import numpy as np
>>> v = np.array([[[1.0, -1.0, 0.1, 2.0], [1.0, -1.0, 0.1, 2.0]],     # rank 0: an all-reduce, the module output
...               [[1.0, -1.0, 0.1, 2.0], [1.1, -1.1, 0.11, 2.2]]])   # rank 1: the module output scaled
>>> copies_of_replicated(v, np.ones((2, 2), np.int64), np.ones(2, bool))
array([[False,  True],
       [False, False]])
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from precnb.dtypes import dtype_kind
from precnb.schema import STATS

__all__ = ["copies_of_replicated", "copy_candidates", "mirrored"]


def copies_of_replicated(stats: np.ndarray, numel: np.ndarray, usable: np.ndarray,
                         parts: np.ndarray | None = None) -> np.ndarray:
    """(n, tensor): whether member *k*'s copy of a tensor whose copies differ equals a value replicated on all *n*.

    *stats*: (n, tensor, 4) the group's Max, Min, Mean and Norm at one step; *numel*: (n, tensor); *usable*:
    (tensor,) the entries to consider (present on every member, floating point, not set aside); *parts*:
    (tensor,) the inputs of collectives. A tensor that is, on some member, a collective's input is that rank's
    part of a reduction, not a copy: the rank holding every extreme of a max all-reduce has its part equal to the
    result by design.
    """
    n, t = stats.shape[:2]
    out = np.zeros((n, t), bool)
    with np.errstate(invalid="ignore"):
        ok = usable & np.isfinite(stats).all(axis=(0, 2)) & (stats[0, :, 0] != stats[0, :, 1])
        whole = (stats[..., :3] == np.round(stats[..., :3])).all(axis=(0, 2))
    ok &= ~whole
    same = ok & (stats == stats[:1]).all(axis=(0, 2)) & (numel == numel[:1]).all(axis=0)
    differ = ok & ~same
    if not same.any() or not differ.any():
        return out
    keys = np.concatenate([stats, numel[..., None].astype(np.float64)], axis=-1)  # (n, t, 5)
    void = np.dtype((np.void, keys.dtype.itemsize * 5))
    replicated = np.ascontiguousarray(keys[0, same]).view(void).ravel()
    if parts is not None and parts.any():
        fed = np.zeros(t, bool)
        for k in range(n):
            ins = np.ascontiguousarray(keys[k, parts]).view(void).ravel()
            fed |= np.isin(np.ascontiguousarray(keys[k]).view(void).ravel(), ins)
        differ &= ~fed
    cols = np.flatnonzero(differ)
    mine = np.ascontiguousarray(keys[:, cols]).view(void).reshape(n, len(cols))
    out[:, cols] = np.isin(mine, replicated)
    return out


def mirrored(ds: xr.Dataset, groups: list[list[int]], ranks: list[int], present: np.ndarray) -> np.ndarray:
    """(step, rank, tensor): the copies that equal a value replicated on their group at that step.

    A tensor with such a copy on some member is a candidate there (:func:`copies_of_replicated`).
    """
    from precnb.naming import is_communication

    out = np.zeros(ds["present"].shape, bool)
    parts = (ds["role"].values == "input") & np.fromiter((is_communication(str(n)) for n in ds["node"].values), bool,
                                                         ds.sizes["tensor"])
    floats = np.fromiter((dtype_kind(str(d)) == "float" for d in ds["dtype"].values), bool, ds.sizes["tensor"])
    values = [np.asarray(ds[s].values) for s in STATS]  # (step, rank, tensor) each: one group's slice stacked below
    numel = np.asarray(ds["numel"].values)
    pos = {r: k for k, r in enumerate(ranks)}
    for g in groups:
        idx = [pos[r] for r in g]
        for si in range(ds.sizes["step"]):
            usable = floats & present[si, idx].all(axis=0)
            stats = np.stack([v[si, idx] for v in values], axis=-1)  # (n, tensor, 4)
            out[si, idx] = copies_of_replicated(stats, numel[si, idx], usable, parts & usable)
    return out


def copy_candidates(ds: xr.Dataset, groups: list[list[int]], ranks: list[int], present: np.ndarray,
                    families: list[int], cand: np.ndarray) -> np.ndarray:
    """Add to *cand* (family, step, tensor; in place) the tensors with a copy of a replicated value on some member.

    Returns the (step, rank, tensor) copies (:func:`mirrored`): they name the members that hold the value.
    """
    mirror = mirrored(ds, groups, ranks, present)
    pos = {r: k for k, r in enumerate(ranks)}
    for g, fam in zip(groups, families, strict=True):
        cand[fam] |= mirror[:, [pos[r] for r in g], :].any(axis=1)
    return mirror
