"""Placing a pipeline stage's API calls without a module tree (a level-L1 dump): micro-batch phases and copies.

A stitch numbers the stages' API calls as one rank running the whole model would: micro-batch by micro-batch,
forward through every stage, backward through them in reverse. With module records the calling layer's call
counter names the micro-batch (:func:`precnb.analysis.layout.pp._global_calls`). A level-L1 dump has none, and
numbering stage by stage makes the k-th call of an op another layer's (or another micro-batch's) call than the
unsharded run's k-th. Here the rank's own calls say it: the point-to-point exchanges a schedule makes between
micro-batches cut the rank's calls into segments; in a segment, the calls before its first backward record run
one micro-batch's forward pass (counted in order), the rest that micro-batch's backward pass (counted in
order), and what follows the rank's last backward pass (gradient reduction, optimizer) comes after every
micro-batch (a stage that sends the last gradient on runs that backward pass up to the sending exchange). A call
every stage makes at the start of its first forward pass with the first stage's values (a
rotary embedding table) is a copy of the first stage's call, as a module record would show.

Examples
--------
>>> from precnb.naming import parse_node
>>> here = [(0, "Torch.matmul.0.forward"), (1, "Distributed.batch_isend_irecv.0.forward"),
...         (2, "Torch.matmul.1.forward"), (3, "Torch.matmul.1.backward"), (4, "Torch.add.0.forward")]
>>> phases(here, {n: parse_node(n) for _, n in here})["Torch.matmul.1.forward"]
(1, 0)
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import xarray as xr

from precnb.naming import NodeName

__all__ = ["AFTER", "L1Values", "first_stage_copies", "phases", "place_l1"]

AFTER = (1 << 30, 0)  # after every micro-batch
_P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list")


def _is_p2p(p: NodeName) -> bool:
    head, _, op = p.api.rpartition(".")
    return head in ("Distributed", "MintDistributed") and op in _P2P


def phases(here: list[tuple[int, str]], parsed: dict[str, NodeName]) -> dict[str, tuple[int, int]]:
    """Per node of one rank's step (*here*: ``(seq, node)`` in call order): ``(micro-batch, 0 forward / 1 backward)``.

    Nodes after the rank's last backward record are :data:`AFTER`. A point-to-point call takes the phase of
    the call before it.
    """
    last_back = max((k for k, (_, n) in enumerate(here) if parsed[n].direction == "backward"), default=-1)
    if last_back >= 0:  # the last backward pass runs on to the exchange that sends its gradient, if any
        last_back = next((k for k in range(last_back + 1, len(here)) if _is_p2p(parsed[here[k][1]])), last_back)
    out: dict[str, tuple[int, int]] = {}
    n_fwd = n_bwd = 0
    seg_fwd = seg_bwd = None  # this segment's forward / backward micro-batch, once it has one
    prev: tuple[int, int] | None = None
    for k, (_, n) in enumerate(here):
        p = parsed[n]
        if _is_p2p(p):
            seg_fwd = seg_bwd = None
            out[n] = prev if prev is not None else (0, 0)
            continue
        if last_back >= 0 and k > last_back:
            out[n] = AFTER
            continue
        if p.direction == "backward" or seg_bwd is not None:
            if seg_bwd is None:
                seg_bwd, n_bwd = n_bwd, n_bwd + 1
            out[n] = prev = (seg_bwd, 1)
            continue
        if seg_fwd is None:
            seg_fwd, n_fwd = n_fwd, n_fwd + 1
        out[n] = prev = (seg_fwd, 0)
    return out


def place_l1(here: list[tuple[int, str]], parsed: dict[str, NodeName], ph: dict[str, tuple[int, int]],
             where: tuple[int, int], copies: set[str], keys: dict[str, tuple[Any, ...]],
             entries: dict[str, list[tuple[tuple[Any, ...], int, int]]]) -> None:
    """One rank's step at level L1 in the stitched order: ``keys[node] = (micro-batch, backward, ±stage, seq)``.

    *where*: (rank, stage). A forward API call (not a first-stage copy) is numbered among its API's calls:
    ``entries[api]`` gains ``(key, rank, call)``.
    """
    rank, stage = where
    for q, n in here:
        p = parsed[n]
        if p.kind == "api" and p.direction == "forward" and p.call < 0:
            keys[n] = (1 << 30, 2, stage, q)
            continue
        if n in copies or n not in ph:
            continue
        mb, back = ph[n]
        keys[n] = (mb, back, -stage if back else stage, q)
        if p.kind == "api" and p.direction == "forward":
            entries[p.api].append((keys[n], rank, p.call))


def first_stage_copies(here: list[tuple[int, str]], parsed: dict[str, NodeName], ph: dict[str, tuple[int, int]],
                       sig: Any, first: dict[str, list[Any]]) -> set[str]:
    """The API forward calls at the start of a later stage's first forward pass that repeat the first stage's.

    *sig* maps a node to the signature of its recorded values (None when it has none); *first* holds, per API,
    the signatures of the first stage's first forward pass in call order. The copies are the longest run of
    leading calls each equal to a not yet used first-stage call of its API.
    """
    used: dict[str, int] = {}
    out: set[str] = set()
    for _, n in here:
        p = parsed[n]
        if _is_p2p(p):
            continue
        if ph.get(n) != (0, 0) or p.kind != "api" or p.direction != "forward":
            break
        s = sig(n)
        cands = first.get(p.api, [])
        k = next((i for i in range(used.get(p.api, 0), len(cands)) if s is not None and _same(cands[i], s)), None)
        if k is None:
            break
        used[p.api] = k + 1
        out.add(n)
    return out


def _same(a: Any, b: Any) -> bool:
    return bool(len(a) == len(b) and np.array_equal(np.asarray(a, float), np.asarray(b, float), equal_nan=True))


class L1Values:
    """A step's calls of a pipeline run without module records: phases and first-stage copies (see the module)."""

    def __init__(self, ds: xr.Dataset, nodes: list[str]) -> None:
        self.ds, self.nodes = ds, nodes  # read on first use: a dump with module records never needs them
        self._cols: dict[str, list[int]] | None = None
        self.first: dict[int, dict[str, list[Any]]] = {}  # step index -> api -> the first stage's signatures

    def sig(self, si: int, i: int, n: str) -> Any:
        """The statistics of node *n*'s outputs at (step index *si*, rank index *i*), or None."""
        if self._cols is None:
            self._cols = defaultdict(list)
            for j, (node, role) in enumerate(zip(self.nodes, self.ds["role"].values, strict=True)):
                if role == "output":
                    self._cols[node].append(j)
        present = self.ds["present"].values
        cols = [j for j in self._cols.get(n, []) if present[si, i, j]]
        if not cols:
            return None
        return np.array([self.ds[v].values[si, i, cols] for v in ("max", "min", "mean", "norm")]).T.ravel()

    def phases(self, here: list[tuple[int, str]], parsed: dict[str, Any], si: int, i: int, stage: int
               ) -> dict[str, tuple[int, int]]:
        """:func:`phases` of one rank's step; on the first stage, its first forward pass's signatures are kept."""
        ph = phases(here, parsed)
        if stage == 0 and si not in self.first:
            first: dict[str, list[Any]] = defaultdict(list)
            for _, n in here:
                p = parsed[n]
                if ph.get(n) == (0, 0) and p.kind == "api" and p.direction == "forward":
                    s = self.sig(si, i, n)
                    if s is not None:
                        first[p.api].append(s)
            self.first[si] = first
        return ph

    def copies(self, here: list[tuple[int, str]], parsed: dict[str, Any], ph: dict[str, tuple[int, int]],
               si: int, i: int) -> set[str]:
        """:func:`first_stage_copies` of a later stage's step."""
        return first_stage_copies(here, parsed, ph, lambda n: self.sig(si, i, n), self.first.get(si, {}))
