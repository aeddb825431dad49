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
from collections.abc import Hashable
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.layout import Layout
from precnb.naming import parse_node
from precnb.schema import ENTRY_CHANGE_ATTRS

__all__ = ["layer_containers", "relabel_pipeline", "rename_node"]

_LAYER = re.compile(r"(?<![A-Za-z0-9_])(layers?)\.(\d+)(?=\.|$)")  # the fallback when no tree says more
_NOT_LAYERS = ("experts", "local_experts")
_EXPERT = re.compile(r"(?<![A-Za-z0-9_])(experts\.local_experts|experts)\.(\d+)(?=\.|$)")
_CHUNK = re.compile(r"^(Module|Cell)\.(\d+)\.")


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


def _global_calls(ds: xr.Dataset, members: list[int], layout: Layout, layers: re.Pattern[str] | None
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
        for api, calls in entries.items():
            for new, (_, r, old) in enumerate(sorted(calls, key=lambda x: (x[0], x[1]))):
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
    """Stitch PP stages (and EP ranks) into one rank per (tp, cp, dp) position.

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
    for r in ranks:
        c = layout.coords(r)
        new = reduced.rank_of(tp=c["tp"], cp=c["cp"], dp=c["dp"] // layout.ep)
        groups[new].append(r)
    # per-rank label maps
    label_maps: dict[int, np.ndarray] = {}
    node_maps: dict[int, dict[str, str]] = {}
    orders: dict[tuple[int, int], dict[str, tuple[Any, ...]]] = {}
    member_order: dict[int, tuple[int, int]] = {}
    for members in groups.values():
        members.sort(key=lambda r: (layout.coords(r)["pp"], layout.coords(r)["ep"]))
        offsets: dict[str, int] = defaultdict(int)
        stage_offset = _stage_offsets(ds, members, layout, layers_rx, present, nodes) if not fold else {}
        calls, dups, order = _global_calls(ds, members, layout, layers_rx) if layout.pp > 1 else ({}, {}, {})
        orders.update(order)
        for r in members:
            c = layout.coords(r)
            i = ranks.index(r)
            pres_any: np.ndarray = np.any(present[:, i, :], axis=0)
            expert_nodes = [str(n) for n, ok in zip(nodes, pres_any, strict=True) if ok]
            n_local = _max_index(expert_nodes, _EXPERT) + 1 if layout.ep > 1 else 0
            api_off = dict(offsets) if layout.pp > 1 else {}
            labels = ds["tensor"].values
            new_nodes: dict[str, str] = {}
            mapped = np.full((ds.sizes["step"], len(labels)), "", dtype=object)
            for si in range(ds.sizes["step"]):
                pres_s = present[si, i, :]
                if not pres_s.any():
                    continue
                own_calls = calls.get((r, si), {})
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
                    new_nodes.setdefault(n, v)  # the first step's names: the module tree's
                cols = np.flatnonzero(pres_s)
                mapped[si, cols] = [step_nodes[str(nodes[j])] + str(labels[j])[len(str(nodes[j])):]
                                    if str(nodes[j]) not in drop else "" for j in cols]
            label_maps[r] = mapped
            node_maps[r] = new_nodes
            member_order[r] = (c["pp"], c["ep"])
            if layout.pp > 1 and c["ep"] == 0:
                for api, k in _api_calls(ds.isel(rank=i), pres_any).items():
                    offsets[api] += k
    out = _assemble_groups(ds, layout, reduced, groups, label_maps, orders)
    out = _rename_requires_grad(out, ds, label_maps)
    sources: dict[str, dict[str, str]] = defaultdict(dict)  # stitched node -> dump rank -> its own name there
    for r, nm in node_maps.items():
        for old_name, new_name in nm.items():
            sources[new_name].setdefault(str(r), old_name)
    out.attrs["stitch_sources"] = json.dumps(sources)
    out = _stage_local_optimizer(out) if layout.pp > 1 else out
    return _rename_tree(out, ds, groups, label_maps, node_maps), reduced


STAGE_LOCAL = "stage_local"  # ``shard_kind_pp`` of a tensor with no whole-model counterpart
_P2P_APIS = ("batch_isend_irecv", "isend", "irecv", "send", "recv")


def _stage_local_optimizer(out: xr.Dataset) -> xr.Dataset:
    """Mark the stage-local calls' tensors: optimizer calls and point-to-point hand-overs between stages.

    Each stage's optimizer call updates its own parameters in its own list order.
    """
    from precnb.analysis.rank_args import is_optimizer_api

    kinds = np.full(out.sizes["tensor"], "", dtype=object)
    reasons = np.full(out.sizes["tensor"], "", dtype=object)
    mods, apis = out["module"].values, out["api"].values
    for j in range(out.sizes["tensor"]):
        if mods[j] == "optimizer" or is_optimizer_api(str(apis[j])):
            kinds[j] = STAGE_LOCAL
            reasons[j] = ("pipeline organisation: each stage's optimizer call updates that stage's parameters, "
                          "listed in its own order (the parameters and their gradients are compared in their "
                          "module records)")
        elif str(apis[j]).rsplit(".", 1)[-1] in _P2P_APIS:
            kinds[j] = STAGE_LOCAL
            reasons[j] = ("pipeline organisation: an activation or its gradient handed to the next or previous "
                          "stage (the same tensor is compared in the layers' records)")
    if not (kinds != "").any():
        return out
    return out.assign_coords(shard_kind_pp=("tensor", kinds), shard_reason_pp=("tensor", reasons))


def _rename_requires_grad(out: xr.Dataset, ds: xr.Dataset, label_maps: dict[int, np.ndarray]) -> xr.Dataset:
    """The reader's ``requires_grad`` table (parameter label → bool) in the stitched labels."""
    text = ds.attrs.get("requires_grad")
    if not text:
        return out
    import json

    try:
        table = json.loads(text)
    except (TypeError, ValueError):
        return out
    labels = [str(t) for t in ds["tensor"].values]
    renamed: dict[str, bool] = {}
    for mapped in label_maps.values():
        for row in mapped:
            for old, new in zip(labels, row, strict=True):
                if new and old in table:
                    renamed[str(new)] = renamed.get(str(new), True) and bool(table[old])
    out.attrs = {**out.attrs, "requires_grad": json.dumps(renamed)}
    return out


def _rename_tree(out: xr.Dataset, ds: xr.Dataset, groups: dict[int, list[int]], label_maps: dict[int, np.ndarray],
                 node_maps: dict[int, dict[str, str]]) -> xr.Dataset:
    """The ``parent`` coordinate and the construct.json side table in the stitched names.

    Each stage's module tree is renamed with its own node map (its local layer ``blocks.0`` is
    the global ``blocks.2``); the parents of a tensor are those of the stage it was taken from.
    """
    from precnb.schema import side_table, side_text

    construct = side_table(ds, "construct")
    by_rank = _construct_ranks(ds)  # parents a (step, rank) gives its own node names (a stage's local names)
    steps = [int(x) for x in ds["step"].values]
    first_step = {r: next((steps[si] for si in range(len(steps)) if (label_maps[r][si] != "").any()), steps[0]
                          if steps else 0) for rs in groups.values() for r in rs}
    merged: dict[str, Any] = {}
    for members in groups.values():
        for r in members:
            nm = node_maps.get(r, {})
            at = f"{first_step[r]},{r}"
            for child, parent in construct.items():
                if child not in nm and parse_node(child).kind == "api":
                    continue  # a call this member did not make (another stage's local name)
                parent = by_rank.get(child, {}).get(at, parent)
                nc = nm.get(child) or _rename_like(child, nm)
                np_ = (nm.get(parent) or _rename_like(parent, nm)) if isinstance(parent, str) and parent else parent
                merged.setdefault(nc, np_)
    # the parent coordinate: each stitched label's parent, renamed with the map of the rank it came from
    src_rank: dict[str, int] = {}
    src_step: dict[str, int] = {}
    for members in groups.values():
        for r in members:
            for si, row in enumerate(label_maps[r]):
                for lbl in row[row != ""].tolist():
                    if str(lbl) not in src_rank:
                        src_rank[str(lbl)], src_step[str(lbl)] = r, steps[si]
    parents = np.asarray(out["parent"].values, dtype=object).copy()
    old_node = {r: {v: k for k, v in nm.items()} for r, nm in node_maps.items()}
    nodes_out = out["node"].values
    for k, lbl in enumerate(out["tensor"].values.tolist()):
        src = src_rank.get(str(lbl))
        if src is None:
            continue
        own = by_rank.get(old_node.get(src, {}).get(str(nodes_out[k]), ""), {}).get(f"{src_step[str(lbl)]},{src}")
        if own is not None:  # this stage's own parent, not the one another stage gave the same name
            parents[k] = own
        if not parents[k]:
            continue
        nm = node_maps.get(src, {})
        parents[k] = nm.get(str(parents[k])) or _rename_like(str(parents[k]), nm)
    # an API call's module is its (renamed) parent module's: stage 1's layers.0 call is in the global layers.2
    modules = np.asarray(out["module"].values, dtype=object).copy()
    kinds = out["kind"].values
    for k in np.flatnonzero(kinds == "api").tolist():
        if parents[k]:
            p = parse_node(str(parents[k]))
            if p.kind == "module" and p.module:
                modules[k] = p.module
    out = out.assign_coords(parent=("tensor", parents), module=("tensor", modules))
    out.attrs = {**out.attrs, "construct": side_text(merged)}
    return out


def _construct_ranks(ds: xr.Dataset) -> dict[str, dict[str, str]]:
    """The reader's ``construct_ranks``: node → rank → parent where ranks give one node name other parents."""
    import json

    try:
        table = json.loads(ds.attrs.get("construct_ranks") or "{}")
    except (TypeError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def _rename_like(node: str, node_map: dict[str, str]) -> str:
    """*node* renamed the way *node_map* renamed the other nodes of its module (for construct-only nodes)."""
    p = parse_node(node)
    if p.kind == "api" or not node_map:
        return node
    for old, new in node_map.items():
        po = parse_node(old)
        if po.kind == "module" and po.module == p.module and old != new:
            pn = parse_node(new)
            return node.replace(f".{p.module}.", f".{pn.module}.", 1)
    # a module that recorded nothing itself: rename its path prefix like a recorded descendant's
    for old, new in node_map.items():
        po = parse_node(old)
        if po.kind == "module" and po.module.startswith(p.module + ".") and old != new:
            pn = parse_node(new)
            tail = po.module[len(p.module):]
            if pn.module.endswith(tail):
                return node.replace(f".{p.module}.", f".{pn.module[: len(pn.module) - len(tail)]}.", 1)
    return node


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


def _entry_table(ds: xr.Dataset, attr: str) -> dict[tuple[str, int, int], str]:
    """``(label, step, rank) -> value`` of a reader's per-entry exception table (``shape_changes``, ...)."""
    import json

    try:
        table = json.loads(ds.attrs.get(attr) or "{}")
    except (TypeError, ValueError):
        return {}
    out: dict[tuple[str, int, int], str] = {}
    for label, by_value in (table.items() if isinstance(table, dict) else ()):
        for value, where in (by_value.items() if isinstance(by_value, dict) else ()):
            for st, r in where:
                out[(str(label), int(st), int(r))] = str(value)
    return out


def _position(node: str, stage: int, layout: Layout) -> int:
    """The pipeline position of a record: its virtual stage (``chunk * pp + stage``), or its stage."""
    m = _CHUNK.match(node) if layout.vpp > 1 else None
    return int(m.group(2)) * layout.pp + stage if m else stage


def _pick(role: str, direction: str, cands: list[int]) -> int:
    if len(cands) == 1:
        return cands[0]
    late = (direction == "forward" and role == "output") or (direction == "backward" and role == "input")
    return cands[-1] if late else cands[0]


def _assemble_groups(ds: xr.Dataset, layout: Layout, reduced: Layout, groups: dict[int, list[int]],  # noqa: C901
                     label_maps: dict[int, np.ndarray],
                     orders: dict[tuple[int, int], dict[str, tuple[Any, ...]]] | None = None) -> xr.Dataset:
    """The stitched dataset; ``label_maps[r]`` is (step, tensor): each entry's stitched label ("" dropped).

    *orders*: (member, step index) -> node -> its place in the one-rank execution order; without it the
    stages' records follow each other (stage 0's, then stage 1's).
    """
    ranks = [int(r) for r in ds["rank"].values]
    roles = ds["role"].values
    dirs = ds["direction"].values
    nodes = ds["node"].values
    n_s = ds.sizes["step"]
    order: dict[str, int] = {}
    per_group: dict[int, list[dict[str, tuple[int, int]]]] = {}
    for new in sorted(groups):
        steps_chosen = []
        for si in range(n_s):
            chosen: dict[str, list[tuple[int, int]]] = defaultdict(list)
            for r in groups[new]:
                row = label_maps[r][si]
                for j in np.flatnonzero(row != "").tolist():
                    lbl = row[j]
                    chosen[lbl].append((r, j))
                    order.setdefault(lbl, len(order))
            for c in chosen.values():  # pipeline order: (virtual) stage of each copy
                if len(c) > 1:
                    c.sort(key=lambda x: _position(str(nodes[x[1]]), layout.coords(x[0])["pp"], layout))
            steps_chosen.append({lbl: (c[_pick(str(roles[c[0][1]]), str(dirs[c[0][1]]), list(range(len(c))))])
                                 for lbl, c in chosen.items()})
        per_group[new] = steps_chosen
    labels = list(order)
    n_r, n_t = len(groups), len(labels)
    pos = {lbl: k for k, lbl in enumerate(labels)}
    new_ranks = sorted(groups)
    data: dict[Hashable, Any] = {}
    coords_src = np.full(n_t, -1, np.int64)  # original tensor index for coordinates
    src_at: dict[int, tuple[int, int]] = {}  # stitched column -> the (step, rank) its coordinates come from
    steps = [int(x) for x in ds["step"].values]
    for new in new_ranks:
        for si, picked in enumerate(per_group[new]):
            for lbl, (r, j) in picked.items():
                if coords_src[pos[lbl]] < 0:
                    coords_src[pos[lbl]] = j
                    src_at[pos[lbl]] = (steps[si], r)
    picks: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # (gi, si) -> columns
    for gi, new in enumerate(new_ranks):
        for si, picked in enumerate(per_group[new]):
            if picked:
                items = list(picked.items())
                picks[(gi, si)] = (np.fromiter((pos[lbl] for lbl, _ in items), np.int64, len(items)),
                                   np.fromiter((ranks.index(r) for _, (r, _j) in items), np.int64, len(items)),
                                   np.fromiter((j for _, (_r, j) in items), np.int64, len(items)))
    for name, var in ds.data_vars.items():
        if var.dims != ("step", "rank", "tensor"):
            continue
        fill: Any = {"b": False, "i": -1, "u": 0, "f": np.nan}.get(var.dtype.kind, "")
        arr = np.full((n_s, n_r, n_t), fill, dtype=var.dtype)
        vals = var.values
        for (gi, si), (dst, src_r, src_j) in picks.items():
            arr[si, gi, dst] = vals[si, src_r, src_j]
        data[name] = (("step", "rank", "tensor"), arr)
    source = np.full((n_s, n_r, n_t), -1, np.int64)  # the dump rank each stitched entry was taken from
    for (gi, si), (dst, src_r, _src_j) in picks.items():
        source[si, gi, dst] = np.asarray(ranks, np.int64)[src_r]
    data["source_rank"] = (("step", "rank", "tensor"), source)
    # seq: the one-rank execution order (micro-batch, forward then backward, stage), else stage after stage
    seq = data["seq"][1]
    for gi, new in enumerate(new_ranks):
        for si, picked in enumerate(per_group[new]):
            if orders:
                placed = sorted((orders.get((r, si), {}).get(str(nodes[j]), (1 << 31, 0, 0, 0)), r, pos[lbl])
                                for lbl, (r, j) in picked.items())
                for place, (_, _, col) in enumerate(placed):
                    if seq[si, gi, col] >= 0:
                        seq[si, gi, col] = place
                continue
            base = 0
            for r in groups[new]:
                cols = [pos[lbl] for lbl, (rr, _j) in picked.items() if rr == r]
                if not cols:
                    continue
                block = seq[si, gi, cols]
                seq[si, gi, cols] = np.where(block >= 0, block + base, -1)
                base = int(seq[si, gi, cols].max()) + 1
    coords: dict[Hashable, Any] = {"step": ds["step"].values, "rank": np.asarray(new_ranks, np.int64),
                                   "tensor": np.asarray(labels, dtype=object)}
    for name, c in ds.coords.items():
        if c.dims == ("tensor",) and name != "tensor":
            coords[name] = ("tensor", c.values[coords_src])
    # a stage's own shape and dtype where another stage records the same (local) label otherwise
    old_labels = ds["tensor"].values
    for name, attr in (("shape", "shape_changes"), ("dtype", "dtype_changes")):
        own = _entry_table(ds, attr)
        if own and name in coords:
            fixed = np.asarray(coords[name][1], dtype=object).copy()
            for col_k, (st, r) in src_at.items():
                v = own.get((str(old_labels[coords_src[col_k]]), st, r))
                if v is not None:
                    fixed[col_k] = v
            coords[name] = ("tensor", fixed)
    # node/module/parent follow the renamed labels
    new_node = []
    for lbl, j in zip(labels, coords_src.tolist(), strict=True):
        old_node, old_label = str(ds["node"].values[j]), str(ds["tensor"].values[j])
        suffix = old_label[len(old_node):]
        new_node.append(lbl[: len(lbl) - len(suffix)] if suffix and lbl.endswith(suffix) else lbl)
    coords["node"] = ("tensor", np.asarray(new_node, dtype=object))
    modules = []
    for n, m in zip(new_node, coords["module"][1], strict=True):
        p = parse_node(n)
        modules.append(p.module if p.kind != "api" else str(m))
    coords["module"] = ("tensor", np.asarray(modules, dtype=object))
    # per-entry dtype exceptions are keyed by the old labels and ranks: not carried over (the
    # dtype coordinate, first seen, stays)
    out = xr.Dataset(data, coords=coords, attrs={k: v for k, v in ds.attrs.items() if k not in ENTRY_CHANGE_ATTRS})
    out.attrs["pipeline_stitched"] = f"pp={layout.pp} vpp={layout.vpp} ep={layout.ep} -> {reduced.describe()}"
    return out
