"""Expert parallelism: API calls numbered as one rank holding every expert would number them.

msprobe numbers API calls per rank (``Tensor.__truediv__.3``): on an expert-parallel rank the counters run over
its own experts only, so the same label names a call of expert 0 on EP rank 0 and of expert 2 on EP rank 1, and
every later counter differs from a run with every expert on one rank. :func:`expert_calls` renumbers each rank's
forward API calls in the order of that one rank: outside the experts in the rank's own order; inside an MoE
layer's experts (``….experts.local_experts.N`` and the expert container), global expert 0, 1, … in turn, each
counted from the rank that holds it. The result feeds :func:`precnb.analysis.layout.pp.rename_node`
(``api_calls``): a label then names one call on every rank (an expert's calls exist on its owner only), and the
run's labels are those of the run without expert parallelism wherever both run the same calls.

Examples
--------
>>> expert_segment("Module.0.decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.ColumnParallelLinear.forward.0")
('Module.0.decoder.layers.1.mlp.experts', 1)
>>> expert_segment("Module.0.decoder.layers.1.mlp.router.TopKRouter.forward.0") is None
True
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.layout import Layout
from precnb.naming import parse_node

__all__ = ["expert_calls", "expert_segment"]

_SEGMENT = re.compile(r"^(.*?(?<![A-Za-z0-9_])experts)(?:\.local_experts\.(\d+))?(?=\.)")

Item = tuple[str, int, Any]  # (api, local call, segment)
BACKWARD = "#backward"  # the segment of calls made in an expert module's backward
Gaps = dict[tuple[int, int], dict[tuple[str, int], list[int]]]


def expert_segment(parent: str) -> tuple[str, int | None] | None:
    """``(experts container, local expert or None)`` of a call made under an MoE layer's experts, else None."""
    m = _SEGMENT.match(parent)
    if m is None:
        return None
    return m.group(1), (int(m.group(2)) if m.group(2) is not None else None)


def _sequence(ds: xr.Dataset, si: int, i: int, rank: int, by_key: dict[str, dict[str, str]]) -> list[Item]:
    """One rank's forward API calls at one step, in record order, with their expert segment."""
    seq = ds["seq"].values[si, i]
    present = ds["present"].values[si, i]
    nodes = ds["node"].values
    parents = ds["parent"].values
    at = f"{int(ds['step'].values[si])},{rank}"
    first: dict[str, int] = {}
    for j in np.flatnonzero(present).tolist():
        n = str(nodes[j])
        if n not in first or seq[j] < seq[first[n]]:
            first[n] = j
    out = []
    for n, j in sorted(first.items(), key=lambda kv: int(seq[kv[1]])):
        p = parse_node(n)
        if p.kind != "api" or p.direction != "forward" or p.call < 0:
            continue
        parent = str(by_key.get(n, {}).get(at) or parents[j] or "")
        seg = expert_segment(parent)
        if seg is not None and ".backward" in parent:  # a backward block: autograd visits the experts in reverse
            seg = (seg[0] + BACKWARD, seg[1])
        out.append((p.api, p.call, seg))
    return out


def _blocks(items: list[Item]) -> tuple[list[Any], dict[tuple[str, int], dict[int, list[Item]]]]:
    """The rank's calls as shared items and expert blocks (one per MoE layer call), each block by local expert.

    A container-level call (``experts`` itself, between experts) goes with the expert that runs next (the last
    one when none follows).
    """
    layout_items: list[Any] = []
    blocks: dict[tuple[str, int], dict[int, list[Item]]] = {}
    seen: dict[str, int] = defaultdict(int)
    k = 0
    while k < len(items):
        seg = items[k][2]
        if seg is None:
            layout_items.append(items[k])
            k += 1
            continue
        container = seg[0]
        end = k
        while end < len(items) and items[end][2] is not None and items[end][2][0] == container:
            end += 1
        run = items[k:end]
        locs = [it[2][1] for it in run]
        nxt: list[int | None] = [None] * len(run)
        cur = None
        for idx in range(len(run) - 1, -1, -1):  # container calls: the next expert's, else the last one's
            cur = locs[idx] if locs[idx] is not None else cur
            nxt[idx] = cur
        last = next((x for x in reversed(locs) if x is not None), 0)
        per: dict[int, list[Item]] = defaultdict(list)
        for it, loc in zip(run, nxt, strict=True):
            per[loc if loc is not None else last].append(it)
        key = (container, seen[container])
        seen[container] += 1
        blocks[key] = dict(per)
        layout_items.append(("block", key))
        k = end
    return layout_items, blocks


def expert_calls(ds: xr.Dataset, layout: Layout, n_local: dict[int, int],
                 by_key: dict[str, dict[str, str]], gaps: Gaps | None = None
                 ) -> dict[tuple[int, int], dict[tuple[str, int], int]]:
    """Per (rank, step index): ``(api, local call) -> call`` as one rank holding every expert numbers them.

    *n_local*: the experts each rank holds. A rank's expert block at one MoE layer call is matched with the same
    block (layer, call) on the other ranks of its expert-parallel group; global expert ``g`` is counted from EP
    rank ``g // n_local`` (in a backward block from the last expert down, as autograd runs them). Ranks whose blocks
    do not line up keep their own numbering. *gaps* (filled when given): per (rank, step index) and own call,
    ``[lead, trail]``: the other EP ranks' calls of that API counted just before it and just after it (in its
    block: before its first own call, after its last one).
    """
    ranks = [int(r) for r in ds["rank"].values]
    out: dict[tuple[int, int], dict[tuple[str, int], int]] = {}
    for si in range(ds.sizes["step"]):
        for group in layout.groups("ep"):
            members = sorted((r for r in group if r in ranks), key=lambda r: layout.expert_coords(r)["ep"])
            parsed = {r: _blocks(_sequence(ds, si, ranks.index(r), r, by_key)) for r in members}
            for r in members:
                items, _ = parsed[r]
                count: dict[str, int] = defaultdict(int)
                mine: dict[tuple[str, int], int] = {}
                gap: dict[tuple[str, int], list[int]] = {}
                carry: dict[str, int] = defaultdict(int)  # other ranks' calls not yet placed next to an own call
                state = (count, mine, gap, carry)
                for it in items:
                    if it[0] != "block":
                        _own(state, it[0], it[1])
                        continue
                    key = it[1]
                    back = str(key[0]).endswith(BACKWARD)
                    last: dict[str, int] = {}
                    for q in (members[::-1] if back else members):  # EP rank q holds n_local[q] global experts
                        block = parsed[q][1].get(key)
                        if block is None:
                            continue
                        locs = range(n_local.get(q, 0))
                        for loc in (locs[::-1] if back else locs):
                            for api, call, _seg in block.get(loc, []):
                                if q == r:
                                    _own(state, api, call)
                                    last[api] = call
                                else:
                                    carry[api] += 1
                                    count[api] += 1
                    for api, call in last.items():  # the block's other calls after this rank's last one
                        gap[(api, call)][1] += carry.pop(api, 0)
                out[(r, si)] = mine
                if gaps is not None:
                    ends = {api: call for api, call in mine}  # the rank's last own call of each API
                    for api, k in carry.items():
                        if api in ends:
                            gap[(api, ends[api])][1] += k
                    gaps[(r, si)] = gap
    return out


def _own(state: tuple[Any, ...], api: str, call: int) -> None:
    """Number one of the rank's own calls (after the other ranks' calls carried so far, its lead)."""
    count, mine, gap, carry = state
    mine[(api, call)] = count[api]
    gap[(api, call)] = [carry.pop(api, 0), 0]
    count[api] += 1


def stitched_numbers(api: str, order: list[tuple[int, int]], si: int, gaps: Gaps | None) -> list[int]:
    """The stitched call numbers of one API's calls *order* (``(member rank, local call)`` in stitched order).

    Without *gaps* the calls are numbered in turn. With them (:func:`expert_calls`' gaps: the stages of an
    expert-parallel run), the calls of the experts other EP ranks hold are counted where they run, as one rank
    holding every stage and every expert counts them: just before or after the member's own calls in that block.

    >>> stitched_numbers("t", [(0, 0), (0, 1), (2, 0)], 0, {(0, 0): {("t", 0): [0, 0], ("t", 1): [0, 2]}})
    [0, 1, 4]
    >>> stitched_numbers("t", [(1, 0), (1, 1), (3, 0)], 0, {(1, 0): {("t", 0): [2, 0], ("t", 1): [0, 0]}})
    [2, 3, 4]
    """
    out, shift = [], 0
    for i, (r, old) in enumerate(order):
        lead, trail = (gaps or {}).get((r, si), {}).get((api, old), (0, 0))
        shift += lead
        out.append(i + shift)
        shift += trail
    return out
