"""How early each anomalous record comes, in the causal order the searches use.

The first-divergence and NaN-origin searches order records by step, then — within a step —
rank by rank as :func:`precnb.analysis.causal.order.pick_origin` ranks each rank's first event
(a rank whose first event is its own comes before one that inherited it through a
collective; then the earlier communication epoch, the earlier execution position, the lower
rank), then by execution order (``seq``) on the rank. :func:`causal_positions` gives every
flagged record its place in that order, so a heat map can colour a cell by how early its first
flagged record comes ("first bad"): the origin is position 0.

:func:`bad_records` says which records are flagged: NaN and unexpected ±inf for one run
(:func:`precnb.analysis.events.event_mask`), differences beyond tolerance and records
present in one run only for two (:func:`precnb.analysis.compare.compare_runs`).

Examples
--------
>>> import numpy as np
>>> bad = np.zeros((2, 2, 3), bool)
>>> bad[0, 1, 2] = bad[0, 0, 1] = bad[1, 0, 0] = True
>>> seq = np.broadcast_to(np.arange(3), (2, 2, 3))
>>> comm = np.zeros(3, bool)
>>> pos = causal_positions(bad, seq, comm, np.array(["output"] * 3))
>>> pos[0, 0, 1], pos[0, 1, 2], pos[1, 0, 0]
(np.float64(0.0), np.float64(1.0), np.float64(2.0))
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from precnb.analysis.causal.order import comm_mask
from precnb.analysis.events import event_mask

__all__ = ["bad_records", "causal_positions", "causal_positions_of", "pair_bad_records"]

_BIG = np.iinfo(np.int64).max // 4


def _comm_starts(seq: np.ndarray, comm_cols: np.ndarray, node_ids: np.ndarray, n_nodes: int) -> np.ndarray:
    """(S, R, K) first execution position of every communication node, sorted (absent: _BIG)."""
    s, r = seq.shape[:2]
    if not len(comm_cols):
        return np.full((s, r, 0), _BIG, np.int64)
    sq = seq[:, :, comm_cols].astype(np.int64)
    sq = np.where(sq >= 0, sq, _BIG)
    order = np.argsort(node_ids, kind="stable")
    counts = np.bincount(node_ids, minlength=n_nodes)
    starts_idx = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.intp)
    first = np.minimum.reduceat(sq[:, :, order], starts_idx, axis=-1)
    return np.sort(first, axis=-1)


def causal_positions(
    bad: np.ndarray,
    seq: np.ndarray,
    comm: np.ndarray,
    role: np.ndarray,
    *,
    nodes: np.ndarray | None = None,
    first: tuple[int, int, int] | None = None,
) -> np.ndarray:
    """Position of every flagged record in causal order (0 = first), NaN where not flagged.

    Parameters
    ----------
    bad : ndarray of bool, (step, rank, tensor)
        Flagged records; steps and ranks in the order of the dataset (ascending).
    seq : ndarray of int, (step, rank, tensor)
        Execution position (-1 where absent).
    comm : ndarray of bool, (tensor,)
        Tensors of communication nodes (:func:`precnb.analysis.causal.order.comm_mask`).
    role : ndarray of str, (tensor,)
        ``input`` / ``output`` / ...: a flagged output of a collective is *inherited*.
    nodes : ndarray of str, (tensor,), optional
        Node of every tensor (communication epochs count distinct nodes); default one node per tensor.
    first : (step index, rank index, tensor index), optional
        A record put first whatever the order says (the diagnosis' own answer).

    Returns
    -------
    ndarray of float, (step, rank, tensor)
    """
    bad = np.asarray(bad, bool)
    out = np.full(bad.shape, np.nan)
    s_n, r_n, _t = bad.shape
    if first is not None:
        bad = bad.copy()
        bad[first] = True
    idx = np.argwhere(bad)
    if not len(idx):
        return out
    si, ri, ti = idx[:, 0], idx[:, 1], idx[:, 2]
    sq = np.asarray(seq, np.int64)[si, ri, ti]
    sq_key = np.where(sq >= 0, sq, _BIG)
    # communication epoch of every flagged record: distinct communication nodes started before it
    comm = np.asarray(comm, bool)
    comm_cols = np.flatnonzero(comm)
    names = np.asarray(nodes)[comm_cols] if nodes is not None else comm_cols
    _, node_ids = np.unique(names, return_inverse=True)
    starts = _comm_starts(np.asarray(seq), comm_cols, node_ids.ravel(), int(node_ids.max()) + 1 if len(
        node_ids) else 0)
    k = starts.shape[-1]
    if k:
        row = si * r_n + ri
        top = max(int(np.max(sq, initial=0)), 0) + 1  # absent: after every recorded position
        span = np.int64(top + 1)
        flat = np.minimum(starts.reshape(-1), top)  # rows ascending, each sorted: one global search
        keys = flat + np.repeat(np.arange(s_n * r_n, dtype=np.int64), k) * span
        epoch = np.searchsorted(keys, np.minimum(sq_key, top) + row * span, side="left") - row * k
    else:
        epoch = np.zeros(len(idx), np.int64)
    inherited = comm[ti] & (np.asarray(role)[ti] == "output")
    # each (step, rank)'s first flagged record, ranked per step as pick_origin ranks them
    by_sr = np.lexsort((ti, sq_key, ri, si))
    lead = np.ones(len(idx), bool)
    lead[1:] = (si[by_sr][1:] != si[by_sr][:-1]) | (ri[by_sr][1:] != ri[by_sr][:-1])
    heads = by_sr[lead]
    h_order = np.lexsort((ri[heads], sq_key[heads], epoch[heads], inherited[heads], si[heads]))
    rank_pos = np.zeros((s_n, r_n), np.int64)
    ranked = heads[h_order]
    step_start = np.searchsorted(si[ranked], si[ranked], side="left")
    rank_pos[si[ranked], ri[ranked]] = np.arange(len(ranked)) - step_start
    pinned = np.zeros(len(idx), bool)
    if first is not None:
        pinned = (si == first[0]) & (ri == first[1]) & (ti == first[2])
    order = np.lexsort((ti, sq_key, rank_pos[si, ri], si, ~pinned))
    out[si[order], ri[order], ti[order]] = np.arange(len(order), dtype=np.float64)
    return out


def causal_positions_of(ds: xr.Dataset, bad: np.ndarray, *, seq: np.ndarray | None = None,
                        first: Any = None) -> np.ndarray:
    """:func:`causal_positions` with the coordinates of *ds* (one run, or a comparison's grid).

    *first* may be a ``(step, rank, tensor label)`` triple or a Finding (its step, rank and
    tensor, when *ds* holds them).
    """
    if first is not None and not isinstance(first, tuple):
        first = (getattr(first, "step", None), getattr(first, "rank", None), getattr(first, "tensor", None))
    pin = None
    if first is not None and None not in first:
        st, rk, tn = first
        found = [ds.indexes[d].get_indexer(pd.Index([v]))[0] for d, v in (("step", st), ("rank", rk),
                                                                           ("tensor", str(tn)))]
        if min(found) >= 0:
            pin = (int(found[0]), int(found[1]), int(found[2]))
    sq = np.asarray(ds["seq"].values if seq is None else seq)
    return causal_positions(bad, sq, comm_mask(ds), ds["role"].values.astype(str),
                            nodes=ds["node"].values.astype(str), first=pin)


def pair_bad_records(cmp: Any, *, crc: str = "report", differs: np.ndarray | None = None,
                     structural: bool = True) -> np.ndarray:
    """Flagged records of a :class:`~precnb.analysis.compare.Comparison` (over its grid).

    Differences beyond tolerance (and CRC differences with ``crc="strict"``) — or *differs*, the
    ones a search counted (:func:`precnb.analysis.divergence.searched_differences`) — and, with
    *structural*, records present in one run only at a (step, rank) the other run recorded.
    """
    if differs is None:
        differs = (cmp.differs | cmp.crc_differs).values if crc == "strict" else cmp.differs.values
    diff = np.asarray(differs, bool)
    if not structural:
        return diff
    pres = np.asarray(cmp.ds["present"].values, bool)  # (run, step, rank, tensor)
    other_b = pres[1].any(axis=-1, keepdims=True)  # the target recorded this (step, rank)
    other_t = pres[0].any(axis=-1, keepdims=True)
    only = (np.asarray(cmp.only_baseline.values, bool) & other_b) | (np.asarray(cmp.only_target.values, bool)
                                                                    & other_t)
    return diff | only


def pair_seq(cmp: Any) -> np.ndarray:
    """Execution positions of a comparison's grid: the baseline's, the target's where the baseline lacks it."""
    seq = np.asarray(cmp.ds["seq"].values)
    return np.where(seq[0] >= 0, seq[0], seq[1])


def bad_records(target: xr.Dataset, comparison: Any = None, *, crc: str = "report", differs: np.ndarray | None = None,
                structural: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(flagged, seq) arrays over *target*'s (step, rank, tensor) grid.

    One run (no *comparison*): NaN and unexpected ±inf. Two runs: :func:`pair_bad_records` of the
    comparison (*differs*, *structural* as there), put on *target*'s grid (the comparison's steps
    are the baseline's; *target* is the comparison's target side, or a dataset with the same labels).
    """
    if comparison is None:
        events, _benign = event_mask(target)
        return np.asarray(events.values, bool), np.asarray(target["seq"].values)
    grid = comparison.ds
    bad = pair_bad_records(comparison, crc=crc, differs=differs, structural=structural)
    seq = pair_seq(comparison)
    same = all(grid.indexes[d].equals(target.indexes[d]) for d in ("step", "rank", "tensor"))
    if same:
        return bad, seq
    out = np.zeros(tuple(target.sizes[d] for d in ("step", "rank", "tensor")), bool)
    oseq = np.full(out.shape, -1, np.int64)
    pos = [target.indexes[d].get_indexer(grid.indexes[d]) for d in ("step", "rank", "tensor")]
    keep = [p >= 0 for p in pos]
    sub = np.ix_(*[np.flatnonzero(k) for k in keep])
    dst = np.ix_(*[p[k] for p, k in zip(pos, keep, strict=True)])
    out[dst] = bad[sub]
    oseq[dst] = seq[sub]
    return out, oseq
