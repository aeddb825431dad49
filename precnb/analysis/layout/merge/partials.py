"""Shard classes an MoE layout adds, and partial sums followed through the ops that pass them on.

Used by :func:`precnb.analysis.layout.merge.classify.classify_shards`: token-dispatch bookkeeping of an MoE layer and
rank-local integer positions are glue (no whole-model value), an expert-parallel rank's optimizer list is glue (its
entries name other parameters than the whole model's), and a partial sum stays one through an input that copies it
and through sums with other partial sums.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import xarray as xr

__all__ = ["moe_glue"]


def moe_glue(ds: xr.Dataset, replicated: np.ndarray, local_index: np.ndarray, glue: np.ndarray,
             glue_why: dict[str, str]) -> tuple[np.ndarray, dict[str, str]]:
    """The glue mask with what an MoE layout adds: rank-local indices, token-dispatch bookkeeping, EP optimizer lists.

    *local_index*: integer tensors identical on every rank although the reference is larger
    (:class:`~precnb.analysis.layout.merge._reference._Reference`); updated in place with the dispatch bookkeeping.
    """
    labels = ds["tensor"].values
    if ds.attrs.get("expert_parallel"):  # each rank's optimizer lists its own experts after or among the dense
        opt = ds["module"].values == "optimizer"  # parameters: entry i is another parameter on each rank, and in
        if opt.any():  # a run without expert parallelism
            glue = glue | opt
            glue_why = dict(glue_why)
            for jo in np.flatnonzero(opt).tolist():
                glue_why[str(labels[jo])] = (
                    "optimizer list entry of an expert-parallel rank: its list holds the rank's own experts, so "
                    "entry i names another parameter than on other ranks or in a run without expert parallelism "
                    "(the update shows in the next step's parameters and gradients)")
    # copies that agree on Max and Min alone (msprobe's integer statistics) agree by chance as often as not: a
    # stage's two ranks that routed as many tokens each (counts 9 and 7 on both) are not one computation
    dispatch = _dispatch_bookkeeping(ds) & ~(replicated & ~_weak(ds))
    if dispatch.any():
        local_index |= dispatch
    if local_index.any():
        glue = glue | local_index
        glue_why = dict(glue_why)
        for jl in np.flatnonzero(local_index).tolist():
            glue_why[str(labels[jl])] = (
                "token-dispatch bookkeeping of an MoE layer (indices and counts over the rank's own tokens and "
                "experts): no whole-model counterpart" if dispatch[jl] else
                "integer indices identical on every rank while the reference is larger along a split dimension: "
                "positions each rank numbers from 0 in its own part (its tokens under sequence parallelism); no "
                "whole-model counterpart")
    return glue, glue_why


def _weak(ds: xr.Dataset) -> np.ndarray:
    """Per tensor: integer or boolean with no Mean anywhere recorded, so equal copies prove little."""
    from precnb.dtypes import weak_identity

    has_mean = np.isfinite(ds["mean"].values).any(axis=(0, 1)) if "mean" in ds else np.zeros(ds.sizes["tensor"], bool)
    return np.fromiter((weak_identity(str(d), bool(m)) for d, m in zip(ds["dtype"].values, has_mean, strict=True)),
                       bool, ds.sizes["tensor"])


def _dispatch_bookkeeping(ds: xr.Dataset) -> np.ndarray:
    """Integer and boolean tensors of an MoE layer's token dispatch (outside its router and experts).

    Permutation indices, token counts per expert and rank, split sizes: each rank computes them over its own
    tokens and experts, so a layout with other token or expert groups has other values by construction (the
    tokens themselves, floats, merge as any split tensor).
    """
    from precnb.dtypes import is_index

    modules = ds["module"].values
    dtypes = ds["dtype"].values
    kinds = ds["kind"].values
    containers = {str(m)[: -len(".experts")] for m in set(modules.tolist()) if str(m).endswith(".experts")}
    out = np.zeros(ds.sizes["tensor"], bool)
    if not containers:
        return out
    for j, m in enumerate(modules.tolist()):
        if kinds[j] == "api" and str(m) in containers and is_index(dtypes[j]):
            out[j] = True
    return out


def _inherit_partial(ds: xr.Dataset, stats: dict[str, np.ndarray], first: np.ndarray, kinds: np.ndarray,
                     reasons: np.ndarray) -> None:
    """An op's input whose copies differ, equal on every member to a partial sum's copies: that partial sum, passed on.

    An input is not computed where it is recorded: the value an earlier op produced on the rank is (a router's
    token counts per expert, each rank's over its own tokens, accumulated into a buffer). In place.
    """
    from precnb.dtypes import weak_identity

    labels, roles, shapes = ds["tensor"].values, ds["role"].values, ds["shape"].values
    # copies that differ, or integer copies that agree by chance (max and min alone): the partial sum passed on
    weak = np.fromiter((weak_identity(d, False) for d in ds["dtype"].values), bool, len(labels))
    want = np.flatnonzero(((kinds == "replicas_differ") | ((kinds == "replicated") & weak)) & (roles == "input"))
    have = np.flatnonzero((kinds == "partial_sum") & (roles == "output"))
    if not len(want) or not len(have) or not first.size:
        return
    packed = np.stack([stats[s_][:, 0] for s_ in ("max", "min", "mean", "norm")], axis=-1)  # (step, n, tensor, 4)
    by_step: dict[int, dict[tuple[Any, bytes], int]] = {}
    for j in want.tolist():
        si = int(first[0, j])
        table = by_step.get(si)
        if table is None:
            table = by_step[si] = {(shapes[k], np.ascontiguousarray(packed[si, :, k]).tobytes()): int(k)
                                   for k in have.tolist()}
        k = table.get((shapes[j], np.ascontiguousarray(packed[si, :, j]).tobytes()))
        if k is not None:
            kinds[j] = "partial_sum"
            reasons[j] = f"equals on every rank the partial sum {labels[k]} (an addend of the full tensor, passed on)"
    _sums_of_partials(ds, stats, kinds, reasons)


_ADDITIVE = re.compile(r"^(?:Tensor|Torch|Functional)\.(?:__i?r?add__|add_?|__i?r?sub__|sub_?)$")


def _sums_of_partials(ds: xr.Dataset, stats: dict[str, np.ndarray], kinds: np.ndarray, reasons: np.ndarray) -> None:
    """A sum (or difference) of partial sums and zeros whose copies differ: a partial sum (Σᵣ(aᵣ + bᵣ) = Σa + Σb)."""
    nodes, roles, apis = ds["node"].values, ds["role"].values, ds["api"].values
    inputs: dict[str, list[int]] = {}
    for j in np.flatnonzero(roles == "input").tolist():
        inputs.setdefault(str(nodes[j]), []).append(j)
    zero = np.nan_to_num((stats["max"] == 0) & (stats["min"] == 0)).astype(bool).all(axis=(0, 1, 2))
    for j in np.flatnonzero(np.isin(kinds, ("replicas_differ", "replicated")) & (roles == "output")).tolist():
        if not _ADDITIVE.match(str(apis[j])):
            continue
        ins = inputs.get(str(nodes[j]), [])
        if ins and any(kinds[i] == "partial_sum" for i in ins) and all(  # (copies of a sum that agree by chance
                kinds[i] == "partial_sum" or (kinds[i] == "replicated" and zero[i]) for i in ins):  # are addends too)
            kinds[j] = "partial_sum"
            reasons[j] = "a sum of partial sums (and zeros): an addend of the full tensor"
