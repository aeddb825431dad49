"""What follows a stitched pipeline run's new labels: its module tree, ``requires_grad``, stage-local optimizer state.

Used by :func:`precnb.analysis.layout.pp.relabel_pipeline`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np
import xarray as xr

from precnb.naming import module_path_of, parse_node

__all__ = ["STAGE_LOCAL", "stitched_meta"]

STAGE_LOCAL = "stage_local"  # ``shard_kind_pp`` of a tensor with no whole-model counterpart
_P2P_APIS = ("batch_isend_irecv", "isend", "irecv", "send", "recv")

def _stage_local_optimizer(out: xr.Dataset) -> xr.Dataset:
    """Mark the stage-local calls' tensors: optimizer calls and point-to-point hand-overs between stages.

    Each stage's optimizer call updates its own parameters in its own list order.
    """
    from precnb.analysis.layout.rank_args import is_optimizer_api

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


def stitched_meta(out: xr.Dataset, ds: xr.Dataset, groups: dict[int, list[int]], label_maps: dict[int, np.ndarray],
                   node_maps: dict[int, dict[str, str]]) -> xr.Dataset:
    """Each stitched entry's own module, parent and shape where its label's coordinate (the first step's) differs.

    Call counters renumbered per step name another call at a later step (Megatron's rotary embedding runs at the
    first step only): the ``meta_changes`` exceptions the reader keeps for that carry over to the stitched
    labels, in the stitched names, so that a step is classified and aligned with its own calls.
    """
    from precnb.schema import encode_meta_changes, meta_changes

    old = meta_changes(ds)
    old_labels = [str(t) for t in ds["tensor"].values]
    old_coord = {f: ds[f].values for f in ("module", "parent", "shape")}
    kinds = ds["kind"].values
    coord = {f: out[f].values for f in ("module", "parent", "shape")}
    col_new = {str(t): k for k, t in enumerate(out["tensor"].values.tolist())}
    out_rank = {int(r): i for i, r in enumerate(out["rank"].values.tolist())}
    source = out["source_rank"].values if "source_rank" in out.data_vars else None
    steps = [int(x) for x in ds["step"].values]
    changes: dict[str, dict[str, dict[tuple[int, int], str]]] = {f: defaultdict(dict) for f in coord}
    for new_rank, members in groups.items():
        ni = out_rank.get(int(new_rank))
        if ni is None:
            continue
        for r in members:
            nm = node_maps.get(r, {})
            for si, step in enumerate(steps):
                row = label_maps[r][si]
                for j in np.flatnonzero(row != "").tolist():
                    k = col_new.get(str(row[j]))
                    if k is None or (source is not None and int(source[si, ni, k]) not in (-1, r)):
                        continue
                    lbl = old_labels[j]
                    parent = old.get("parent", {}).get(lbl, {}).get((step, r)) or str(old_coord["parent"][j] or "")
                    new_parent = nm.get(parent, parent)
                    shape = old.get("shape", {}).get(lbl, {}).get((step, r)) or str(old_coord["shape"][j])
                    # an API call's module is its parent's path, a scope parent ("optimizer", "clip_grad") its
                    # own name, as the reader sets it (not parse_node's: "" for a scope, an exception everywhere)
                    module = (module_path_of(new_parent) if kinds[j] == "api" and new_parent
                              else str(coord["module"][k]))
                    for f, v in (("parent", new_parent), ("shape", shape), ("module", module)):
                        if v != str(coord[f][k] or ""):
                            changes[f][str(row[j])][(step, int(new_rank))] = v
    table = {f: dict(v) for f, v in changes.items() if v}
    if table:
        merged = meta_changes(out)
        for f, by_tensor in table.items():
            for t, where in by_tensor.items():
                merged.setdefault(f, {}).setdefault(t, {}).update(where)
        out.attrs["meta_changes"] = encode_meta_changes(merged)
    return out
