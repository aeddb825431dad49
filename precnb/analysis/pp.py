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
    return re.compile(rf"^((?:Module|Cell)\.(?:{alts})\.)(\d+)(?=\.)")


def _layer_indices(nodes: list[str], rx: re.Pattern[str] | None) -> set[int]:
    out: set[int] = set()
    for n in nodes:
        m = rx.match(n) if rx is not None else _LAYER.search(n)
        if m:
            out.add(int(m.group(2)))
    return out


def rename_node(node: str, *, layer_offset: int = 0, fold_chunk: bool = False, expert_offset: int = 0,
                api_offsets: dict[str, int] | None = None, layers_per_chunk: int = 0,
                pp_stage: int = 0, pp: int = 1, layers: re.Pattern[str] | None = None) -> str:
    """Rename one node for stitching (see the module docstring).

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
    member_order: dict[int, tuple[int, int]] = {}
    for members in groups.values():
        members.sort(key=lambda r: (layout.coords(r)["pp"], layout.coords(r)["ep"]))
        offsets: dict[str, int] = defaultdict(int)
        stage_offset = _stage_offsets(ds, members, layout, layers_rx, present, nodes) if not fold else {}
        for r in members:
            c = layout.coords(r)
            i = ranks.index(r)
            pres_any: np.ndarray = np.any(present[:, i, :], axis=0)
            expert_nodes = [str(n) for n, ok in zip(nodes, pres_any, strict=True) if ok]
            n_local = _max_index(expert_nodes, _EXPERT) + 1 if layout.ep > 1 else 0
            api_off = dict(offsets) if layout.pp > 1 else {}
            new_nodes = {}
            for n in set(nodes[pres_any].tolist()):
                new_nodes[n] = rename_node(
                    n, layer_offset=0 if fold else stage_offset.get(r, 0), fold_chunk=fold,
                    expert_offset=c["ep"] * n_local, api_offsets=api_off,
                    layers_per_chunk=lpc, pp_stage=c["pp"], pp=layout.pp, layers=layers_rx)
            labels = ds["tensor"].values
            mapped = np.array([(new_nodes.get(str(nd), str(nd)) + str(lb)[len(str(nd)):]) if ok else ""
                               for lb, nd, ok in zip(labels, nodes, pres_any, strict=True)], dtype=object)
            label_maps[r] = mapped
            node_maps[r] = new_nodes
            member_order[r] = (c["pp"], c["ep"])
            if layout.pp > 1 and c["ep"] == 0:
                for api, k in _api_calls(ds.isel(rank=i), pres_any).items():
                    offsets[api] += k
    out = _assemble_groups(ds, layout, reduced, groups, label_maps)
    return _rename_tree(out, ds, groups, label_maps, node_maps), reduced


def _rename_tree(out: xr.Dataset, ds: xr.Dataset, groups: dict[int, list[int]], label_maps: dict[int, np.ndarray],
                 node_maps: dict[int, dict[str, str]]) -> xr.Dataset:
    """The ``parent`` coordinate and the construct.json side table in the stitched names.

    Each stage's module tree is renamed with its own node map (its local layer ``blocks.0`` is
    the global ``blocks.2``); the parents of a tensor are those of the stage it was taken from.
    """
    from precnb.schema import side_table, side_text

    construct = side_table(ds, "construct")
    merged: dict[str, Any] = {}
    for members in groups.values():
        for r in members:
            nm = node_maps.get(r, {})
            for child, parent in construct.items():
                nc = nm.get(child) or _rename_like(child, nm)
                np_ = (nm.get(parent) or _rename_like(parent, nm)) if isinstance(parent, str) and parent else parent
                merged.setdefault(nc, np_)
    # the parent coordinate: each stitched label's parent, renamed with the map of the rank it came from
    src_rank: dict[str, int] = {}
    for members in groups.values():
        for r in members:
            for lbl in label_maps[r]:
                if lbl:
                    src_rank.setdefault(str(lbl), r)
    parents = np.asarray(out["parent"].values, dtype=object).copy()
    for k, lbl in enumerate(out["tensor"].values.tolist()):
        src = src_rank.get(str(lbl))
        if src is None or not parents[k]:
            continue
        nm = node_maps.get(src, {})
        parents[k] = nm.get(str(parents[k])) or _rename_like(str(parents[k]), nm)
    out = out.assign_coords(parent=("tensor", parents))
    out.attrs = {**out.attrs, "construct": side_text(merged)}
    return out


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


def _pick(role: str, direction: str, cands: list[int]) -> int:
    if len(cands) == 1:
        return cands[0]
    late = (direction == "forward" and role == "output") or (direction == "backward" and role == "input")
    return cands[-1] if late else cands[0]


def _assemble_groups(ds: xr.Dataset, layout: Layout, reduced: Layout, groups: dict[int, list[int]],
                     label_maps: dict[int, np.ndarray]) -> xr.Dataset:
    ranks = [int(r) for r in ds["rank"].values]
    roles = ds["role"].values
    dirs = ds["direction"].values
    order: dict[str, int] = {}
    per_group: dict[int, dict[str, tuple[int, int]]] = {}
    for new in sorted(groups):
        chosen: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for r in groups[new]:
            for j, lbl in enumerate(label_maps[r]):
                if lbl:
                    chosen[lbl].append((r, j))
                    order.setdefault(lbl, len(order))
        per_group[new] = {lbl: (c[_pick(str(roles[c[0][1]]), str(dirs[c[0][1]]), list(range(len(c))))])
                          for lbl, c in chosen.items()}
    labels = list(order)
    n_s, n_r, n_t = ds.sizes["step"], len(groups), len(labels)
    pos = {lbl: k for k, lbl in enumerate(labels)}
    new_ranks = sorted(groups)
    data: dict[Hashable, Any] = {}
    coords_src = np.full(n_t, -1, np.int64)  # original tensor index for coordinates
    for name, var in ds.data_vars.items():
        if var.dims != ("step", "rank", "tensor"):
            continue
        fill: Any = {"b": False, "i": -1, "u": 0, "f": np.nan}.get(var.dtype.kind, "")
        arr = np.full((n_s, n_r, n_t), fill, dtype=var.dtype)
        vals = var.values
        for gi, new in enumerate(new_ranks):
            for lbl, (r, j) in per_group[new].items():
                arr[:, gi, pos[lbl]] = vals[:, ranks.index(r), j]
                coords_src[pos[lbl]] = j
        data[name] = (("step", "rank", "tensor"), arr)
    # seq: offset later stages so that stage order is kept
    seq = data["seq"][1]
    for gi, new in enumerate(new_ranks):
        base = 0
        for r in groups[new]:
            cols = [pos[lbl] for lbl, (rr, _j) in per_group[new].items() if rr == r]
            if not cols:
                continue
            block = seq[:, gi, cols]
            seq[:, gi, cols] = np.where(block >= 0, block + base, -1)
            base = int(seq[:, gi, cols].max()) + 1
    coords: dict[Hashable, Any] = {"step": ds["step"].values, "rank": np.asarray(new_ranks, np.int64),
                              "tensor": np.asarray(labels, dtype=object)}
    for name, c in ds.coords.items():
        if c.dims == ("tensor",) and name != "tensor":
            coords[name] = ("tensor", c.values[coords_src])
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
