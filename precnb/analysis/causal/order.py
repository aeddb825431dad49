"""Causal ordering helpers shared by the divergence and NaN-origin searches.

Within one (step, rank), execution order is ``seq``. Across ranks, collectives are the only
synchronisation points: a rank's *epoch* at a tensor is the number of distinct communication
nodes it executed before that tensor. A difference (or NaN) first seen at the output of a
collective on a rank whose earlier tensors are clean was *inherited* from another rank; the
origin is the rank whose own first event is not inherited, in the earliest epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from precnb.analysis._memo import DatasetMemo
from precnb.naming import is_communication
from precnb.schema import read_side_table

__all__ = ["RankEvent", "after_collectives", "comm_mask", "first_event_per_rank", "pick_origin"]


COMM_MONITOR_FAMILIES = ("grad_reduced", "cc")


_COMM = DatasetMemo(size=4)


def comm_mask(ds: xr.Dataset) -> np.ndarray:
    """Boolean per tensor: the tensor belongs to a communication node.

    For monitor data, ``grad_reduced`` (after the data-parallel all-reduce) and ``cc``
    families count as communication. Read once per dataset (the NaN search and the explorer's
    "first bad" order of the same run ask for it; each caller gets its own copy).
    """
    return _COMM.get([ds], "comm_mask", lambda: _comm_mask(ds), copy=np.copy, holds=False)


def _comm_mask(ds: xr.Dataset) -> np.ndarray:
    nodes = ds["node"].values
    apis = ds["api"].values
    kinds = ds["kind"].values
    return np.fromiter(
        (is_communication(str(n)) or (k == "monitor" and a in COMM_MONITOR_FAMILIES)
         for n, a, k in zip(nodes, apis, kinds, strict=True)),
        bool, ds.sizes["tensor"])


def after_collectives(epoch: int) -> str:
    """A rank event's epoch in words: how many collectives that rank ran before it at that step.

    Examples
    --------
    >>> after_collectives(0), after_collectives(2)
    ('before any collective at that step', 'after 2 collectives at that step')
    """
    if epoch <= 0:
        return "before any collective at that step"
    return f"after {epoch} collective{'s' if epoch > 1 else ''} at that step"


@dataclass
class RankEvent:
    """The first event (difference, NaN…) of one rank at one step."""

    step: int
    rank: int
    tensor: str
    node: str
    seq: int
    epoch: int
    inherited: bool
    via: str = ""  # "p2p": an input after a pipeline receive from a peer stage that differs first


def first_event_per_rank(event: xr.DataArray, seq: xr.DataArray, ds: xr.Dataset, step: int,
                         *, inherited_if_comm_output: bool = True) -> list[RankEvent]:
    """For one step, each rank's first tensor (by seq) where *event* is True.

    Parameters
    ----------
    event : DataArray (step, rank, tensor) of bool
    seq : DataArray (step, rank, tensor) of int
        Execution order (-1 where absent).
    ds : Dataset
        Supplies the ``node`` and ``role`` coordinates.
    step : int
    """
    ev = event.sel(step=step)
    sq = seq.sel(step=step)
    comm = comm_mask(ds)
    nodes = ds["node"].values
    roles = ds["role"].values
    kinds = ds["kind"].values
    labels = ds["tensor"].values
    out: list[RankEvent] = []
    for r in ev["rank"].values:
        e = ev.sel(rank=r).values
        if not e.any():
            continue
        s = sq.sel(rank=r).values.astype(np.int64)
        s_ev = np.where(e & (s >= 0), s, np.iinfo(np.int64).max)
        j = int(np.argmin(s_ev))
        if s_ev[j] == np.iinfo(np.int64).max:  # events without seq (should not happen): take first
            j = int(np.flatnonzero(e)[0])
        first_seq = int(s[j])
        earlier_comm = comm & (s >= 0) & (s < first_seq)
        epoch = len(set(nodes[earlier_comm].tolist()))
        # a collective's output; a monitor row of a communication family (grad_reduced: the gradient after
        # the data-parallel all-reduce) is itself what the collective returned, whatever its role
        inherited = bool(comm[j]) and (roles[j] == "output" or kinds[j] == "monitor" or not inherited_if_comm_output)
        out.append(RankEvent(int(step), int(r), str(labels[j]), str(nodes[j]), first_seq, epoch, inherited))
    _inherited_via_p2p(out, ds, sq, roles, nodes)
    return out


_P2P = ("batch_isend_irecv", ".irecv.", ".recv.")


def _p2p_peers(ds: xr.Dataset) -> dict[int, list[int]]:
    """Rank -> the ranks it exchanged point-to-point with (the reader's ``p2p_peers``; {} when unreadable)."""
    try:
        return {int(r): [int(p) for p in ps] for r, ps in read_side_table(ds, "p2p_peers").items()}
    except (TypeError, ValueError, AttributeError):
        return {}


def _inherited_via_p2p(events: list[RankEvent], ds: xr.Dataset, sq: xr.DataArray, roles: np.ndarray,
                       nodes: np.ndarray) -> None:
    """Mark, in place, a rank's first event that is an input read after a pipeline receive as inherited.

    msprobe records an irecv buffer before the wait (no defined value: set aside), so the tensor a stage received
    never shows as a differing collective output; the next stage's first difference is then an input that "no
    recorded op changed". When that rank received from a peer stage (``p2p_peers``) before it, and the peer has a
    first event of its own at this step, the difference was sent: the peer is the origin.
    """
    peers = _p2p_peers(ds)
    if not peers or len(events) < 2:
        return
    ranks_with = {e.rank for e in events}
    labels = list(ds["tensor"].values)
    p2p = np.fromiter((any(k in str(n) for k in _P2P) for n in nodes), bool, len(nodes))
    if not p2p.any():
        return
    for e in events:
        if e.inherited or not any(p in ranks_with for p in peers.get(e.rank, ())):
            continue
        if roles[labels.index(e.tensor)] != "input":
            continue
        s = sq.sel(rank=e.rank).values.astype(np.int64)
        if (p2p & (s >= 0) & (s < e.seq)).any():
            e.inherited, e.via = True, "p2p"


def pick_origin(events: list[RankEvent]) -> tuple[RankEvent | None, list[RankEvent]]:
    """The origin among per-rank first events, and the others ranked.

    Non-inherited events win over inherited ones; then the earliest epoch; then the lowest
    rank (ranks in the same epoch run concurrently: they are all listed as suspects).
    """
    if not events:
        return None, []
    ranked = sorted(events, key=lambda e: (e.inherited, e.epoch, e.seq, e.rank))
    return ranked[0], ranked[1:]
