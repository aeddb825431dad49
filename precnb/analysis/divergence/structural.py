"""Structural differences: nodes recorded in one run only, at a (step, rank) both runs recorded."""

from __future__ import annotations

from typing import Any

import numpy as np

from precnb.analysis.compare import Comparison

__all__ = ["structural_differences"]


def _any_per_node(pres: np.ndarray, inv: np.ndarray, n_nodes: int) -> np.ndarray:
    """(step, rank, node): whether any tensor of the node (``inv``: each tensor's node index) is set in *pres*."""
    if not n_nodes:
        return np.zeros((*pres.shape[:2], 0), bool)
    order = np.argsort(inv, kind="stable")  # every node has a tensor: one run of columns per node, in node order
    starts = np.flatnonzero(np.r_[True, np.diff(inv[order]) != 0])
    return np.logical_or.reduceat(pres[:, :, order], starts, axis=2)


def structural_differences(cmp: Comparison) -> list[dict[str, Any]]:
    """Nodes recorded in one run only, at a (step, rank) both runs recorded.

    Returns a list of ``{"node", "only_in", "step", "rank", "count"}`` in execution order
    (first occurrence), one entry per node and side.
    """
    ds = cmp.ds
    nodes = ds["node"].values
    out: list[dict[str, Any]] = []
    pres_b = ds["present"].isel(run=0)
    pres_t = ds["present"].isel(run=1)
    # node-level presence per (step, rank)
    uniq, inv = np.unique(nodes, return_inverse=True)
    for side, (mine, other, run) in enumerate(
            ((pres_b, pres_t, cmp.names[0]), (pres_t, pres_b, cmp.names[1]))):
        m = mine.values  # (step, rank, tensor)
        o = other.values
        n_nodes = len(uniq)
        node_m, node_o = _any_per_node(m, inv, n_nodes), _any_per_node(o, inv, n_nodes)
        rank_has_other: np.ndarray = np.any(o, axis=2)  # the other run recorded this (step, rank) at all
        only = node_m & ~node_o & rank_has_other[:, :, None]
        seq = ds["seq"].isel(run=side).values
        for k in np.flatnonzero(only.any(axis=(0, 1))):
            si, ri = np.argwhere(only[:, :, k])[0]
            cols = np.flatnonzero(inv == k)
            sv = seq[si, ri, cols]
            first_seq = int(sv[sv >= 0].min()) if (sv >= 0).any() else -1
            out.append({"node": str(uniq[k]), "only_in": run, "step": int(ds["step"].values[si]),
                        "rank": int(ds["rank"].values[ri]), "count": int(only[:, :, k].sum()),
                        "seq": first_seq, "tensor": str(ds["tensor"].values[cols[0]]),
                        "module": str(ds["module"].values[cols[0]])})
    out.sort(key=lambda d: (d["step"], d["seq"], d["rank"]))
    return out
