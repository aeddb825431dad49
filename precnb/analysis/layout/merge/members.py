"""Which member of a merged group stands behind an entry: local tensors, departing copies, shard holders.

Used by :func:`precnb.analysis.layout.merge.merge_group_dim`: a tensor recorded on some members only is taken
from the member that has it; where replicated copies differ the first differing copy is kept beside the entry;
and for a merged shard the members holding its extremes, or odd in the group, are kept for the comparison to
name the rank behind a difference (:func:`precnb.analysis.findings.evidence.shard_suspect`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import xarray as xr

__all__ = ["copied_shards", "departing_copies", "nan_members", "shard_holders", "take_local"]


def shard_holders(ds: xr.Dataset, idx: list[list[int]], kinds: np.ndarray) -> dict[Hashable, Any]:
    """For each merged shard entry, the member behind it, should it differ from a baseline (dump ranks, -1: none).

    ``shard_max_rank`` / ``shard_min_rank``: the one member that holds the merged Max / Min (-1 on a tie);
    ``shard_odd_rank``: a member whose statistics are not finite while another's are. A merged shard is compared
    whole, so a baseline cannot say which shard departs; these name the member that supplies a differing
    extreme, or the one that is odd among its group (:func:`precnb.analysis.findings.evidence.shard_suspect`).
    Whether a member holds a copy of another's shard is asked only of the finding's own entry, over every step
    read (:func:`copied_shards`, by :mod:`precnb.pipeline.assumptions`): not of every entry of every merge.
    """
    dims = ("step", "rank", "tensor")
    n_s, n_t = ds.sizes["step"], ds.sizes["tensor"]
    sharded = np.asarray(kinds == "sharded")
    if not sharded.any() or len(idx[0]) < 2:
        return {}
    pos = np.asarray(idx)  # (G, n)
    mx, mn = ds["max"].values[:, pos, :], ds["min"].values[:, pos, :]  # (step, G, n, tensor)
    stats = np.stack([mx, mn, ds["mean"].values[:, pos, :], ds["norm"].values[:, pos, :]], axis=-1)
    with np.errstate(invalid="ignore"):
        top, bottom = np.nanmax(np.where(np.isnan(mx), -np.inf, mx), axis=2), np.nanmin(
            np.where(np.isnan(mn), np.inf, mn), axis=2)
        at_max = mx == top[:, :, None, :]
        at_min = mn == bottom[:, :, None, :]
    max_pos = np.where(at_max.sum(axis=2) == 1, np.argmax(at_max, axis=2), -1)
    min_pos = np.where(at_min.sum(axis=2) == 1, np.argmax(at_min, axis=2), -1)
    finite = np.isfinite(stats).all(axis=-1)  # (step, G, n, tensor)
    bad = ~finite & finite.any(axis=2, keepdims=True)
    odd_pos = np.where(bad.any(axis=2), np.argmax(bad, axis=2), -1)
    si = np.arange(n_s)[:, None, None]
    ti = np.arange(n_t)[None, None, :]
    gi = np.arange(pos.shape[0])[None, :, None]
    source = ds["source_rank"].values if "source_rank" in ds.data_vars else None
    ranks = np.asarray([int(r) for r in ds["rank"].values])
    out: dict[Hashable, Any] = {}
    for name, member in (("shard_max_rank", max_pos), ("shard_min_rank", min_pos), ("shard_odd_rank", odd_pos)):
        at = pos[gi, np.maximum(member, 0)]  # (step, G, tensor) dump positions
        rank = source[si, at, ti] if source is not None else ranks[at]
        out[name] = (dims, np.where((member >= 0) & sharded[:, None, :], rank, -1).astype(np.int32))
    return out


def copied_shards(stats: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """(step, G, n, tensor) whether a member's shard is a copy of another member's, at that step or before.

    *stats*: (step, G, n, tensor, 4) the members' Max, Min, Mean and Norm; *usable*: the entries to consider.
    Identical statistics, bit for bit, are the same tensor: among the entries of one group and tensor with the
    same four values, the first (by step, then member) is the original and an entry of another member is a copy
    (a rank that loaded another rank's shard, from this step's or an earlier step's state). Constant tensors
    (Max = Min: zeros, ones) say nothing.

    >>> st = np.zeros((2, 1, 2, 1, 4))
    >>> st[0, 0, 0, 0], st[0, 0, 1, 0] = [3, -1, 0.5, 4], [2, -2, 0.1, 3]
    >>> st[1, 0, 0, 0], st[1, 0, 1, 0] = [3.1, -1, 0.5, 4], [3, -1, 0.5, 4]  # member 1 holds member 0's step-0 shard
    >>> copied_shards(st, np.ones((2, 1, 2, 1), bool))[:, 0, :, 0].tolist()
    [[False, False], [False, True]]
    """
    out = np.zeros(usable.shape, bool)
    usable = usable & (stats[..., 0] != stats[..., 1])
    at = np.nonzero(usable)  # (step, group, member, tensor) of each usable entry, in step order then member
    if not len(at[0]):
        return out
    keys = np.concatenate([np.stack([at[1], at[3]], axis=1).astype(np.float64), stats[at]], axis=1)
    rows = np.ascontiguousarray(keys).view(np.dtype((np.void, keys.dtype.itemsize * keys.shape[1]))).ravel()
    _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    original = first[inverse]  # the first entry with the same group, tensor and statistics
    copy = at[2] != at[2][original]
    out[tuple(a[copy] for a in at)] = True
    return out


def take_local(ds: xr.Dataset, idx: list[list[int]], pres: np.ndarray, local: np.ndarray,
                out_vals: dict[str, np.ndarray], out_null: np.ndarray, out_numel: np.ndarray, seq: np.ndarray
                ) -> np.ndarray:
    """For tensors recorded on some members of a group only: the first member that recorded it, in place.

    Returns each (step, group, tensor)'s chosen dump position.
    """
    member = np.argmax(pres, axis=2)  # (step, G, tensor)
    pos = np.asarray(idx)[np.arange(len(idx))[None, :, None], member]  # dump positions
    si = np.arange(pos.shape[0])[:, None, None]
    ti = np.arange(pos.shape[2])[None, None, :]
    for s in out_vals:
        out_vals[s][...] = np.where(local, ds[s].values[si, pos, ti], out_vals[s])
    out_null[...] = np.where(local, ds["null_stats"].values[si, pos, ti], out_null)
    out_numel[...] = np.where(local, ds["numel"].values[si, pos, ti], out_numel)
    seq[...] = np.where(local, ds["seq"].values[si, pos, ti], seq)
    return np.asarray(pos)


def departing_copies(ds: xr.Dataset, idx: list[list[int]], same: np.ndarray, differ: np.ndarray
                      ) -> dict[Hashable, Any]:
    """Where a replicated tensor's copies differ: the first copy unlike the group's first member's.

    ``copy_max`` … ``copy_norm`` hold that copy (the merged entry carries the first member's), ``copy_rank`` its
    dump rank and ``copy_first_rank`` the first member's.

    With a baseline, the comparison decides which of the two departs (:mod:`precnb.analysis.divergence.origin`);
    ``copy_rank`` is -1 where the copies agree.
    """
    ranks = np.asarray([int(r) for r in ds["rank"].values])
    member = np.argmax(~same, axis=2)  # (step, G, tensor): the first member unlike member 0
    dims = ("step", "rank", "tensor")
    pos = np.asarray(idx)  # (G, n) positions of the members
    src = np.take_along_axis(np.broadcast_to(pos[None, :, :, None], (*member.shape[:2], pos.shape[1],
                                                                         member.shape[2])),
                             member[:, :, None, :], axis=2)[:, :, 0, :]  # (step, G, tensor) rank positions
    si = np.arange(member.shape[0])[:, None, None]
    ti = np.arange(member.shape[2])[None, None, :]
    if "source_rank" in ds.data_vars:  # pipeline stages stitched first: each entry's own dump rank
        source = ds["source_rank"].values
        copy_rank, firsts = source[si, src, ti], source[si, pos[:, 0][None, :, None], ti]
    else:
        copy_rank, firsts = ranks[src], ranks[pos[:, 0]][None, :, None]
    out: dict[Hashable, Any] = {"copy_rank": (dims, np.where(differ, copy_rank, -1).astype(np.int64)),
                                "copy_first_rank": (dims, np.where(differ, firsts, -1).astype(np.int64))}
    for s in ("max", "min", "mean", "norm"):
        out[f"copy_{s}"] = (dims, np.where(differ, ds[s].values[si, src, ti], np.nan))
    return out


def nan_members(ds: xr.Dataset, idx: list[list[int]], pres: np.ndarray, own: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """(step, group, tensor) entries of a replica's own value (*own*) where a member went NaN, and that member.

    A data-parallel replica's own gradient has no whole-batch counterpart, so its merged entry holds no values;
    but a NaN is never by construction: the entry keeps the NaN (and the member it came from) so that a NaN on
    one replica is not hidden by the merge. An empty tensor's null statistics are not a NaN.
    """
    went = np.zeros(pres.shape, bool)
    cols = np.flatnonzero(own.any(axis=0))  # only a replica's own values are looked at (the merge's hot path)
    if len(cols):
        part = np.zeros(pres[..., cols].shape, bool)
        for s in ("max", "min", "mean", "norm"):
            part |= np.isnan(ds[s].values[:, :, cols][:, idx, :])
        went[..., cols] = part & (ds["null_stats"].values[:, :, cols][:, idx, :] == 0) & pres[..., cols]
    return own[:, None, :] & went.any(axis=2), np.argmax(went, axis=2)
