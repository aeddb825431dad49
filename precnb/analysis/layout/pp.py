"""Pipeline (PP / VPP) and expert (EP) relabelling: stitch stages into whole-model ranks.

* PP: local layer indices become global. The layer stack is found from the module tree, not
  from a name: any repeated container whose numbered items are modules of one class
  (``layers.N``, ``blocks.N``, ``h.N``, ``decoder.layer.N``, ...; see :func:`layer_containers`).
  Stage *p*'s indices are offset by the layers of the stages before it (each stage's own count,
  so unequal stages stitch right); a stage already numbered globally is left as it is. With
  VPP the offset is ``(chunk * pp + stage) * layers_per_chunk``. API call counters of stage *p*
  are offset by the calls of the same API on stages before it, so they line up with a
  single-stage run.
* VPP: model-chunk prefixes (``Module.{chunk}.`` / ``Cell.{chunk}.``) are folded away.
* EP: local expert indices (``experts.local_experts.N`` / ``experts.N``) become global,
  ``ep_index * local_experts + N``.

Tensors recorded on several members (the top-level module on every stage, non-expert tensors
on every EP rank) are taken from one member: forward inputs from the first stage, forward
outputs from the last; backward the other way round.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.layout import Layout
from precnb.analysis.layout.ep import stitched_numbers
from precnb.analysis.layout.pp_l1 import L1Values, place_l1
from precnb.analysis.layout.pp_stitch import CHUNK as _CHUNK
from precnb.analysis.layout.pp_stitch import assemble_groups
from precnb.analysis.layout.pp_tree import (
    _construct_ranks,
    _rename_requires_grad,
    _rename_tree,
    _stage_local_optimizer,
    stitched_meta,
)
from precnb.naming import parse_node

__all__ = ["layer_containers", "relabel_pipeline", "rename_node"]

_LAYER = re.compile(r"(?<![A-Za-z0-9_])(layers?)\.(\d+)(?=\.|$)")  # the fallback when no tree says more
_NOT_LAYERS = ("experts", "local_experts")
_EXPERT = re.compile(r"(?<![A-Za-z0-9_])(experts\.local_experts|experts)\.(\d+)(?=\.|$)")


def _max_index(paths: list[str], rx: re.Pattern[str]) -> int:
    best = -1
    for p in paths:
        for m in rx.finditer(p):
            best = max(best, int(m.group(2)))
    return best


def layer_containers(nodes: list[str]) -> list[str]:
    """Module paths of the layer stacks: repeated containers of numbered modules of one class.

    A path ``C`` qualifies when modules ``C.0``, ``C.1``, ... exist (any numbers) and at least
    two thirds of them share a class; expert lists are not layer stacks, and a list inside an
    item of another stack (a per-layer list) is not one either. VPP chunk prefixes
    (``Module.<chunk>.``) are not part of the paths.

    Examples
    --------
    >>> layer_containers(["Module.blocks.0.Block.forward.0", "Module.blocks.1.Block.forward.0",
    ...                   "Module.blocks.1.mlp.experts.0.Expert.forward.0", "Module.head.Linear.forward.0"])
    ['blocks']
    >>> layer_containers(["Module.model.decoder.layer.0.Layer.forward.0"])
    ['model.decoder.layer']
    """
    items: dict[str, dict[str, str]] = defaultdict(dict)
    for n in nodes:
        p = parse_node(_CHUNK.sub(lambda m: f"{m.group(1)}.", n))
        if p.kind != "module" or not p.module:
            continue
        segs = p.module.split(".")
        if len(segs) >= 2 and segs[-1].isdigit() and not segs[-2].isdigit():
            items[".".join(segs[:-1])][segs[-1]] = p.api
    found = []
    for c, kids in items.items():
        if c.rsplit(".", 1)[-1] in _NOT_LAYERS or not kids:
            continue
        top = max(list(kids.values()).count(k) for k in set(kids.values()))
        if 3 * top >= 2 * len(kids):
            found.append(c)
    outer = [c for c in found if not any(c != o and c.startswith(o + ".") for o in found)]
    return sorted(outer)


def _layer_rx(containers: list[str]) -> re.Pattern[str] | None:
    if not containers:
        return None
    alts = "|".join(re.escape(c) for c in sorted(containers, key=len, reverse=True))
    # a model-chunk prefix (Megatron passes its chunks as a list: Module.0.decoder.layers.N) may come first
    return re.compile(rf"^((?:Module|Cell)\.(?:\d+\.)?(?:{alts})\.)(\d+)(?=\.)")


def _layer_indices(nodes: list[str], rx: re.Pattern[str] | None) -> set[int]:
    out: set[int] = set()
    for n in nodes:
        m = rx.match(n) if rx is not None else _LAYER.search(n)
        if m:
            out.add(int(m.group(2)))
    return out


def rename_node(node: str, *, layer_offset: int = 0, fold_chunk: bool = False, expert_offset: int = 0,
                api_offsets: dict[str, int] | None = None, layers_per_chunk: int = 0,
                pp_stage: int = 0, pp: int = 1, layers: re.Pattern[str] | None = None,
                api_calls: dict[tuple[str, int], int] | None = None) -> str:
    """Rename one node for stitching (see the module docstring).

    *api_calls* (``(api, call) -> call`` of the stitched run, :func:`_global_calls`) renumbers API calls;
    *api_offsets* (``api -> offset``) shifts them when it has no entry.

    Examples
    --------
    >>> rename_node("Module.decoder.layers.1.mlp.MLP.forward.0", layer_offset=4)
    'Module.decoder.layers.5.mlp.MLP.forward.0'
    >>> rename_node("Module.1.decoder.layers.0.MLP.forward.0", fold_chunk=True, layers_per_chunk=2,
    ...             pp_stage=1, pp=2)
    'Module.decoder.layers.6.MLP.forward.0'
    >>> rename_node("Functional.linear.3.forward", api_offsets={"Functional.linear": 10})
    'Functional.linear.13.forward'
    >>> rename_node("Module.blocks.0.attn.Attention.forward.0", layer_offset=2,
    ...             layers=_layer_rx(["blocks"]))
    'Module.blocks.2.attn.Attention.forward.0'
    """
    p = parse_node(node)
    if p.kind == "api":
        if api_calls and (p.api, p.call) in api_calls and p.direction:
            return f"{p.api}.{api_calls[(p.api, p.call)]}.{p.direction}"
        if api_offsets and p.api in api_offsets and p.call >= 0:
            return f"{p.api}.{p.call + api_offsets[p.api]}.{p.direction}" if p.direction else node
        return node
    name = node
    offset = layer_offset
    if fold_chunk:
        m = _CHUNK.match(name)
        if m:
            chunk = int(m.group(2))
            name = f"{m.group(1)}." + name[m.end():]
            offset = (chunk * pp + pp_stage) * layers_per_chunk
    if offset:
        if layers is not None:
            name = layers.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + offset}", name, count=1)
        else:
            name = _LAYER.sub(lambda m: f"{m.group(1)}.{int(m.group(2)) + offset}", name)
    if expert_offset:
        name = _EXPERT.sub(lambda m: f"{m.group(1)}.{int(m.group(2)) + expert_offset}", name)
    return name


def _global_calls(ds: xr.Dataset, members: list[int], layout: Layout, layers: re.Pattern[str] | None,
                  experts: Any = None
                  ) -> tuple[dict[tuple[int, int], dict[tuple[str, int], int]], dict[tuple[int, int], set[str]],
                             dict[tuple[int, int], dict[str, tuple[Any, ...]]]]:
    """Per (member rank, step index): ``(api, local call) -> call`` numbering the group's API calls as one rank would.

    Also per (member, step): the API calls (forward nodes) that duplicate another member's — calls inside a
    module call every stage makes (a rotary embedding), taken from the first stage like the module's record —
    and every record's place in that one-rank execution order (the stitched ``seq``).

    Without pipelining each micro-batch runs forward through every layer, then backward through them in
    reverse; an API counter counts calls in that order. A stage's call is placed by its *anchor*, the module
    call it runs in — a module record is written when the call completes, so a parent recorded *before* the
    API call is not running it (msprobe keeps the last module of an earlier micro-batch as the parent of
    Megatron's P2P and loss calls in 1F1B) and the next module record on that rank is the anchor instead —
    ordered by (micro-batch, forward before backward, stage or virtual stage: ascending forward, descending
    backward, position on the rank). Calls after every module record (optimizer, gradient reduction) come
    last, by stage. Each step is numbered on its own: a step may run other calls (Megatron caches its rotary
    embedding after the first step, which shifts every later counter).
    """
    ranks = [int(r) for r in ds["rank"].values]
    steps = [int(x) for x in ds["step"].values]
    nodes = [str(n) for n in ds["node"].values]
    parent_col = ds["parent"].values
    by_key = _construct_ranks(ds)
    parsed = {n: parse_node(n) for n in set(nodes)}
    first_col: dict[str, int] = {}
    for j, n in enumerate(nodes):
        first_col.setdefault(n, j)
    seq = ds["seq"].values
    present = ds["present"].values
    l1 = L1Values(ds, nodes) if layout.vpp == 1 else None
    out: dict[tuple[int, int], dict[tuple[str, int], int]] = defaultdict(dict)
    dup: dict[tuple[int, int], set[str]] = defaultdict(set)
    order: dict[tuple[int, int], dict[str, tuple[Any, ...]]] = defaultdict(dict)
    for si in range(len(steps)):
        entries: dict[str, list[tuple[tuple[Any, ...], int, int]]] = defaultdict(list)
        anchors_of: dict[str, tuple[int, int]] = {}  # module call outside the layers -> (member, chunk) running it
        for r in members:
            i = ranks.index(r)
            stage = layout.coords(r)["pp"]
            here = sorted((int(seq[si, i, j]), n) for n, j in first_col.items() if present[si, i, j])
            if not here:
                continue
            at = f"{steps[si]},{r}"
            mods = [(q, n) for q, n in here if parsed[n].kind == "module"]
            mod_seq = {n: q for q, n in mods}
            mod_q = [q for q, _ in mods]
            keys = order[(r, si)]
            if l1 is not None and not mods:  # level L1: placed by the rank's own micro-batch phases
                ph = l1.phases(here, parsed, si, i, stage)
                if stage > 0:  # a stage repeating the first stage's calls (no module record says so)
                    dup[(r, si)] |= l1.copies(here, parsed, ph, si, i)
                place_l1(here, parsed, ph, (r, stage), dup[(r, si)], keys, entries)
                continue
            for q, n in here:
                p = parsed[n]
                if p.kind != "api":  # a module call (or its gradients): placed by its own micro-batch and stage
                    m1 = _CHUNK.match(n)
                    pos1 = (int(m1.group(2)) * layout.pp + stage) if (m1 and layout.vpp > 1) else stage
                    back1 = p.direction == "backward"
                    keys[n] = (max(p.call, 0), int(back1), -pos1 if back1 else pos1, q)
                    continue
                if p.call < 0 or p.direction != "forward":
                    keys[n] = (1 << 30, 2, stage, q)  # placed after its forward below
                    continue
                parent = str(by_key.get(n, {}).get(at) or parent_col[first_col[n]] or "")
                anchor = parent if mod_seq.get(parent, -1) > q else None
                if anchor is None:
                    k = int(np.searchsorted(mod_q, q, side="right"))
                    anchor = mods[k][1] if k < len(mods) else None
                m0 = _CHUNK.match(anchor) if anchor is not None else None
                if anchor is not None and parent == anchor and not (layers is not None and layers.match(anchor)):
                    akey = _CHUNK.sub(lambda m: f"{m.group(1)}.", anchor) if layout.vpp > 1 else anchor
                    who = (r, int(m0.group(2)) if m0 else 0)
                    if anchors_of.setdefault(akey, who) != who:
                        dup[(r, si)].add(n)  # a module every stage runs: its calls are taken from one stage
                        continue
                if anchor is None:
                    key: tuple[Any, ...] = (1 << 30, 0, stage, q)
                else:
                    a = parsed[anchor]
                    pos = (int(m0.group(2)) * layout.pp + stage) if (m0 and layout.vpp > 1) else stage
                    back = a.direction == "backward"
                    key = (a.call, int(back), -pos if back else pos, q)
                keys[n] = key
                entries[p.api].append((key, r, p.call))
            for q, n in here:  # an API's backward record: where its recorded position falls among the rest
                p = parsed[n]
                if p.kind == "api" and p.direction == "backward":
                    k = int(np.searchsorted(mod_q, q, side="right"))
                    nxt = mods[k][1] if k < len(mods) else None
                    keys[n] = (*keys[nxt][:3], q) if nxt is not None and nxt in keys else (1 << 30, 0, stage, q)
        for api, calls in entries.items():  # with EP: the other EP ranks' expert calls counted (ep.stitched_numbers)
            turn = [(r, old) for _, r, old in sorted(calls, key=lambda x: (x[0], x[1]))]
            for (r, old), new in zip(turn, stitched_numbers(api, turn, si, experts), strict=True):
                out[(r, si)][(api, old)] = new
    return out, dup, order


def _api_calls(ds: xr.Dataset, present_any: np.ndarray) -> dict[str, int]:
    calls: dict[str, int] = defaultdict(int)
    for n, ok in zip(ds["node"].values, present_any, strict=True):
        if not ok:
            continue
        p = parse_node(str(n))
        if p.kind == "api" and p.direction == "forward" and p.call >= 0:
            calls[p.api] = max(calls[p.api], p.call + 1)
    return calls


def relabel_pipeline(ds: xr.Dataset, layout: Layout) -> tuple[xr.Dataset, Layout]:
    """Stitch PP stages into one rank per (tp, cp, dp) position; local expert indices become global.

    Expert-parallel ranks are not stitched: they hold different data (EP over data-parallel ranks) or
    different shards of the dense layers (EP folded onto TP). Each keeps its own experts under their global
    index (``ep_rank · experts_per_rank + local``), and the TP / DP merges take each expert from the rank that
    holds it.

    Returns the stitched dataset and the layout with pp = vpp = ep = 1.
    """
    ranks = [int(r) for r in ds["rank"].values]
    present = ds["present"].values  # (step, rank, tensor)
    nodes = ds["node"].values
    mod_nodes = [str(n) for n in nodes if parse_node(str(n)).kind != "api"]
    fold = layout.vpp > 1
    stacks = layer_containers(mod_nodes)
    layers_rx = _layer_rx(stacks)
    stripped = [_CHUNK.sub(lambda m: f"{m.group(1)}.", n) if fold else n for n in mod_nodes]
    if layout.num_layers:
        lpc = layout.num_layers // (layout.pp * layout.vpp)
    else:
        lpc = max(_layer_indices(stripped, layers_rx), default=-1) + 1
    reduced = layout.reduced("pp", "ep")
    groups: dict[int, list[int]] = defaultdict(list)
    for r in ranks:  # the stages of one dense (tp, cp, dp) position; EP ranks keep their own dense data
        c = layout.coords(r)
        new = reduced.rank_of(tp=c["tp"], cp=c["cp"], dp=c["dp"])
        groups[new].append(r)
    label_maps: dict[int, np.ndarray] = {}  # per-rank label maps; names a later step numbers otherwise:
    shifted: dict[str, dict[str, dict[str, str]]] = defaultdict(lambda: defaultdict(dict))
    node_maps: dict[int, dict[str, str]] = {}
    orders: dict[tuple[int, int], dict[str, tuple[Any, ...]]] = {}
    member_order: dict[int, tuple[int, int]] = {}
    n_locals, e_calls, e_gaps = _expert_numbering(ds, layout)
    for members in groups.values():
        members.sort(key=lambda r: (layout.coords(r)["pp"], layout.coords(r)["ep"]))
        offsets: dict[str, int] = defaultdict(int)
        stage_offset = _stage_offsets(ds, members, layout, layers_rx, present, nodes) if not fold else {}
        calls, dups, order = (_global_calls(ds, members, layout, layers_rx, e_gaps or None)
                              if layout.pp > 1 else ({}, {}, {}))
        orders.update(order)
        for r in members:
            c = layout.coords(r)
            i = ranks.index(r)
            pres_any: np.ndarray = np.any(present[:, i, :], axis=0)
            n_local = n_locals[r]
            api_off = dict(offsets) if layout.pp > 1 else {}
            labels = ds["tensor"].values
            new_nodes: dict[str, str] = {}
            mapped = np.full((ds.sizes["step"], len(labels)), "", dtype=object)
            for si in range(ds.sizes["step"]):
                pres_s = present[si, i, :]
                if not pres_s.any():
                    continue
                own_calls = calls.get((r, si)) or e_calls.get((r, si), {})
                drop = dups.get((r, si), set())
                drop = drop | {n[: -len(".forward")] + ".backward" for n in drop}
                step_nodes: dict[str, str] = {}
                for n in set(nodes[pres_s].tolist()):
                    step_nodes[n] = rename_node(
                        n, layer_offset=0 if fold else stage_offset.get(r, 0), fold_chunk=fold,
                        expert_offset=c["ep"] * n_local, api_offsets=api_off,
                        layers_per_chunk=lpc, pp_stage=c["pp"], pp=layout.pp, layers=layers_rx,
                        api_calls=own_calls)
                for n, v in step_nodes.items():
                    if new_nodes.setdefault(n, v) != v:  # the first step's names: the module tree's
                        shifted[str(int(ds["step"].values[si]))][v][str(r)] = n
                cols = np.flatnonzero(pres_s)
                mapped[si, cols] = [step_nodes[str(nodes[j])] + str(labels[j])[len(str(nodes[j])):]
                                    if str(nodes[j]) not in drop else "" for j in cols]
            label_maps[r] = mapped
            node_maps[r] = new_nodes
            member_order[r] = (c["pp"], c["ep"])
            if layout.pp > 1 and c["ep"] == 0:
                for api, k in _api_calls(ds.isel(rank=i), pres_any).items():
                    offsets[api] += k
    out = assemble_groups(ds, layout, reduced, groups, label_maps, orders)
    out = _rename_requires_grad(out, ds, label_maps)
    sources: dict[str, dict[str, str]] = defaultdict(dict)  # stitched node -> dump rank -> its own name there
    for r, nm in node_maps.items():
        for old_name, new_name in nm.items():
            sources[new_name].setdefault(str(r), old_name)
    out.attrs["stitch_sources"] = json.dumps(sources)
    out.attrs["stitch_step_sources"] = json.dumps(shifted)  # step -> stitched node -> dump rank -> own name there
    if layout.ep > 1:
        out.attrs["expert_parallel"] = f"ep={layout.ep} etp={layout.etp} edp={layout.edp}"
    out = _stage_local_optimizer(out) if layout.pp > 1 else out
    out = _rename_tree(out, ds, groups, label_maps, node_maps)
    return stitched_meta(out, ds, groups, label_maps, node_maps), reduced


def _expert_numbering(ds: xr.Dataset, layout: Layout) -> tuple[dict[int, int], dict[tuple[int, int], dict[Any, int]],
                                                                Any]:
    """Experts each rank holds, its API calls numbered as one rank holding every expert of its stage, and gaps.

    The gaps are the other EP ranks' calls next to each own call (:func:`precnb.analysis.layout.ep.expert_calls`).
    """
    ranks = [int(r) for r in ds["rank"].values]
    nodes, present = ds["node"].values, ds["present"].values
    n_locals = {r: (_max_index([str(n) for n, ok in zip(nodes, np.any(present[:, i, :], axis=0), strict=True) if ok],
                               _EXPERT) + 1 if layout.ep > 1 else 0) for i, r in enumerate(ranks)}
    gaps: dict[Any, Any] = {}
    if layout.ep <= 1:
        return n_locals, {}, gaps
    from precnb.analysis.layout.ep import expert_calls

    return n_locals, expert_calls(ds, layout, n_locals, _construct_ranks(ds), gaps), gaps


def _stage_offsets(ds: xr.Dataset, members: list[int], layout: Layout, layers_rx: re.Pattern[str] | None,
                   present: np.ndarray, nodes: np.ndarray) -> dict[int, int]:
    """Per rank of one stitch group (sorted by stage): the layer offset of its stage.

    Each stage's offset is the number of layers on the stages before it (counted on that stage,
    so unequal stages stitch right). A stage whose indices already start at or after the layers
    before it is numbered globally: offset 0.
    """
    ranks = [int(r) for r in ds["rank"].values]
    by_stage: dict[int, set[int]] = defaultdict(set)
    for r in members:
        i = ranks.index(r)
        pres_any: np.ndarray = np.any(present[:, i, :], axis=0)
        local = [str(n) for n, ok in zip(nodes, pres_any, strict=True) if ok and parse_node(str(n)).kind != "api"]
        by_stage[layout.coords(r)["pp"]] |= _layer_indices(local, layers_rx)
    offsets: dict[int, int] = {}
    before = 0
    for stage in sorted(by_stage):
        idx = by_stage[stage]
        offsets[stage] = 0 if (idx and min(idx) >= before and before > 0) else before
        if idx:
            before = max(before, offsets[stage] + max(idx) + 1)
    return {r: offsets.get(layout.coords(r)["pp"], 0) for r in members}
