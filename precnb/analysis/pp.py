"""Pipeline (PP / VPP) and expert (EP) relabelling: stitch stages into whole-model ranks.

* PP: local layer indices ``layers.N`` (or ``layer.N``) become global,
  ``N + (chunk * pp + stage) * layers_per_chunk``; API call counters of stage *p* are offset by
  the calls of the same API on stages before it, so they line up with a single-stage run.
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
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.layout import Layout
from precnb.naming import parse_node

__all__ = ["relabel_pipeline", "rename_node"]

_LAYER = re.compile(r"(?<![A-Za-z0-9_])(layers?)\.(\d+)(?=\.|$)")
_EXPERT = re.compile(r"(?<![A-Za-z0-9_])(experts\.local_experts|experts)\.(\d+)(?=\.|$)")
_CHUNK = re.compile(r"^(Module|Cell)\.(\d+)\.")


def _max_index(paths: list[str], rx: re.Pattern[str]) -> int:
    best = -1
    for p in paths:
        for m in rx.finditer(p):
            best = max(best, int(m.group(2)))
    return best


def rename_node(node: str, *, layer_offset: int = 0, fold_chunk: bool = False, expert_offset: int = 0,
                api_offsets: dict[str, int] | None = None, layers_per_chunk: int = 0,
                pp_stage: int = 0, pp: int = 1) -> str:
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
    if layout.num_layers:
        lpc = layout.num_layers // (layout.pp * layout.vpp)
    else:
        stripped = [_CHUNK.sub(lambda m: f"{m.group(1)}.", n) if fold else n for n in mod_nodes]
        lpc = _max_index(stripped, _LAYER) + 1
    reduced = layout.reduced("pp", "ep")
    groups: dict[int, list[int]] = defaultdict(list)
    for r in ranks:
        c = layout.coords(r)
        new = reduced.rank_of(tp=c["tp"], cp=c["cp"], dp=c["dp"] // layout.ep)
        groups[new].append(r)
    # per-rank label maps
    label_maps: dict[int, np.ndarray] = {}
    member_order: dict[int, tuple[int, int]] = {}
    for members in groups.values():
        members.sort(key=lambda r: (layout.coords(r)["pp"], layout.coords(r)["ep"]))
        offsets: dict[str, int] = defaultdict(int)
        for r in members:
            c = layout.coords(r)
            i = ranks.index(r)
            pres_any = present[:, i, :].any(axis=0)
            expert_nodes = [str(n) for n, ok in zip(nodes, pres_any, strict=True) if ok]
            n_local = _max_index(expert_nodes, _EXPERT) + 1 if layout.ep > 1 else 0
            api_off = dict(offsets) if layout.pp > 1 else {}
            new_nodes = {}
            for n in set(nodes[pres_any].tolist()):
                new_nodes[n] = rename_node(
                    n, layer_offset=0 if fold else c["pp"] * lpc, fold_chunk=fold,
                    expert_offset=c["ep"] * n_local, api_offsets=api_off,
                    layers_per_chunk=lpc, pp_stage=c["pp"], pp=layout.pp)
            labels = ds["tensor"].values
            mapped = np.array([(new_nodes.get(str(nd), str(nd)) + str(lb)[len(str(nd)):]) if ok else ""
                               for lb, nd, ok in zip(labels, nodes, pres_any, strict=True)], dtype=object)
            label_maps[r] = mapped
            member_order[r] = (c["pp"], c["ep"])
            if layout.pp > 1 and c["ep"] == 0:
                for api, k in _api_calls(ds.isel(rank=i), pres_any).items():
                    offsets[api] += k
    return _assemble_groups(ds, layout, reduced, groups, label_maps), reduced


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
    data: dict[str, Any] = {}
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
    coords: dict[str, Any] = {"step": ds["step"].values, "rank": np.asarray(new_ranks, np.int64),
                              "tensor": np.asarray(labels, dtype=object)}
    for name, c in ds.coords.items():
        if c.dims == ("tensor",) and name != "tensor":
            coords[name] = ("tensor", c.values[coords_src])
    # node/module/parent follow the renamed labels
    new_node = []
    for lbl, j in zip(labels, coords_src, strict=True):
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
    out = xr.Dataset(data, coords=coords, attrs={k: v for k, v in ds.attrs.items() if k != "dtype_changes"})
    out.attrs["pipeline_stitched"] = f"pp={layout.pp} vpp={layout.vpp} ep={layout.ep} -> {reduced.describe()}"
    return out
