"""Bounded aggregation of (step, rank, tensor) arrays into (step bucket, rank bucket, row) cells.

Pure numpy. Every cell keeps its maximum score *and where it came from* (the step, rank
and tensor of the arg-max), so a click on an aggregated cell can still name one record.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Grid", "bucket_size", "reduce_grid"]


def bucket_size(n: int, max_groups: int) -> int:
    """Smallest bucket size that splits *n* items into at most *max_groups* buckets.

    Examples
    --------
    >>> bucket_size(1000, 32), bucket_size(5, 48), bucket_size(0, 8)
    (32, 1, 1)
    """
    if n <= 0 or max_groups <= 0:
        return 1
    return max(1, -(-n // max_groups))


@dataclass
class Grid:
    """Result of :func:`reduce_grid`; arrays are (step bucket, rank bucket, group)."""

    score: np.ndarray
    arg_step: np.ndarray
    arg_rank: np.ndarray
    arg_tensor: np.ndarray
    nonfinite: np.ndarray
    records: np.ndarray
    step_size: int
    rank_size: int
    first_seq: np.ndarray  # per group: earliest execution position (row order)


def _blocks(a: np.ndarray, ss: int, rs: int, fill: float | int) -> np.ndarray:
    """(S, R, T) → (Sb, Rb, T, ss*rs), padded with *fill*."""
    s, r, t = a.shape
    sb, rb = -(-s // ss) if s else 0, -(-r // rs) if r else 0
    if (sb * ss, rb * rs) != (s, r):
        pad = np.full((sb * ss, rb * rs, t), fill, dtype=a.dtype)
        pad[:s, :r] = a
        a = pad
    return a.reshape(sb, ss, rb, rs, t).transpose(0, 2, 4, 1, 3).reshape(sb, rb, t, ss * rs)


def reduce_grid(
    score: np.ndarray,
    nonfinite: np.ndarray,
    present: np.ndarray,
    seq: np.ndarray,
    groups: np.ndarray,
    n_groups: int,
    *,
    step_size: int = 1,
    rank_size: int = 1,
) -> Grid:
    """Reduce (S, R, T) arrays over step buckets, rank buckets and tensor groups.

    Parameters
    ----------
    score : ndarray of float, (S, R, T)
        What "worst" means; ``-inf`` for records that must never be picked.
    nonfinite, present : ndarray of bool, (S, R, T)
        Counted per cell.
    seq : ndarray of int, (S, R, T)
        Execution position (``-1`` absent), used for the row order.
    groups : ndarray of int, (T,)
        Group (row) index of every tensor, ``0 <= g < n_groups``; every group non-empty.
    n_groups : int
    step_size, rank_size : int
        Bucket sizes along step and rank.

    Returns
    -------
    Grid

    Examples
    --------
    >>> s = np.arange(8, dtype=float).reshape(2, 2, 2)
    >>> g = reduce_grid(s, s > 6, s >= 0, np.zeros((2, 2, 2), int), np.array([0, 0]), 1,
    ...                 rank_size=2)
    >>> g.score[:, 0, 0].tolist(), g.arg_rank[:, 0, 0].tolist(), g.nonfinite.sum()
    ([3.0, 7.0], [1, 1], np.int64(1))
    """
    ss, rs = max(1, step_size), max(1, rank_size)
    v = _blocks(np.asarray(score, dtype=np.float64), ss, rs, -np.inf)
    arg = v.argmax(axis=-1)
    vmax = np.take_along_axis(v, arg[..., None], axis=-1)[..., 0]
    nf = _blocks(np.asarray(nonfinite, dtype=np.int32), ss, rs, 0).sum(axis=-1)
    rec = _blocks(np.asarray(present, dtype=np.int32), ss, rs, 0).sum(axis=-1)
    order = np.argsort(groups, kind="stable")
    counts = np.bincount(groups, minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.intp)
    vo = vmax[..., order]
    gmax = np.maximum.reduceat(vo, starts, axis=-1)
    eq = vo == np.repeat(gmax, counts, axis=-1)
    pos = np.where(eq, np.arange(len(order)), len(order))
    first = np.minimum.reduceat(pos, starts, axis=-1)
    first = np.minimum(first, len(order) - 1)
    t_idx = order[first]  # (Sb, Rb, G) tensor index of the arg-max
    k = np.take_along_axis(arg, t_idx, axis=-1)
    sb_idx = np.arange(gmax.shape[0])[:, None, None]
    rb_idx = np.arange(gmax.shape[1])[None, :, None]
    arg_step = sb_idx * ss + k // rs
    arg_rank = rb_idx * rs + k % rs
    big = np.iinfo(np.int64).max
    sq = np.asarray(seq, dtype=np.int64)
    tfirst = np.where(sq >= 0, sq, big).min(axis=(0, 1)) if sq.size else np.full(len(order), big)
    return Grid(
        score=gmax,
        arg_step=arg_step,
        arg_rank=arg_rank,
        arg_tensor=t_idx,
        nonfinite=np.add.reduceat(nf[..., order], starts, axis=-1),
        records=np.add.reduceat(rec[..., order], starts, axis=-1),
        step_size=ss,
        rank_size=rs,
        first_seq=np.minimum.reduceat(tfirst[order], starts),
    )
