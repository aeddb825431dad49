"""Findings named in both the dumps' and the whole model's terms when a layout is involved.

A merged target's finding (``diff`` across layouts) is at a whole-model record: this adds the dump
rank(s) and the name the record has there (``evidence["dump"]``: the pipeline stage's local layer
name, its TP group). A finding on a run as dumped (``nan``, ``replicas`` of a pipeline run) is at a
local name: this adds the whole-model name (``evidence["global_node"]`` / ``["global_module"]``,
layers numbered globally, chunks folded) and says it in the reason.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import xarray as xr

__all__ = ["attach_layout_names", "dump_location"]


def dump_location(merged: xr.Dataset, layout: Any, step: int, rank: int, tensor: str, node: str
                  ) -> dict[str, Any] | None:
    """Where a merged run's entry comes from: ``{"rank", "node", "ranks"}`` (None when it was not merged)."""
    if layout is None or not layout.sharded:
        return None
    src = None
    if "source_rank" in merged.data_vars and tensor in merged.indexes["tensor"]:
        v = merged["source_rank"].sel(step=step, rank=rank, tensor=tensor).values
        src = int(v) if int(v) >= 0 else None
    local = node
    if src is not None:
        try:
            sources = json.loads(merged.attrs.get("stitch_sources") or "{}")
        except (TypeError, ValueError):
            sources = {}
        local = sources.get(node, {}).get(str(src), node)
    if src is None:  # TP/CP merged only: the merged rank's group
        reduced = layout.reduced("tp", "cp")
        coords = reduced.coords(rank) if rank < reduced.world_size else None
        cands = [r for r in range(layout.world_size) if coords is not None and all(
            layout.coords(r)[d] == coords[d] for d in ("dp", "pp", "ep"))]
        src = cands[0] if cands else rank
    group = next((g for g in layout.groups("tp") if src in g), [src]) if layout.tp > 1 else [src]
    return {"rank": src, "node": local, "ranks": list(group)}


def _parent_at(raw: xr.Dataset, node: str, step: int, rank: int) -> str:
    """The parent module of *node* in the (step, rank) file (another stage may give the same name another one)."""
    from precnb.analysis.layout.pp_tree import _construct_ranks

    own = _construct_ranks(raw).get(node, {}).get(f"{step},{rank}")
    if own is not None:
        return str(own)
    j = np.flatnonzero(raw["node"].values == node)
    return str(raw["parent"].values[j[0]]) if len(j) else ""


def _global_names(raw: xr.Dataset, layout: Any) -> dict[tuple[int, str], str]:
    from precnb.analysis.layout.pp import relabel_pipeline

    stitched, _ = relabel_pipeline(raw, layout)
    try:
        sources = json.loads(stitched.attrs.get("stitch_sources") or "{}")
    except (TypeError, ValueError):
        return {}
    return {(int(r), old): new for new, by in sources.items() for r, old in by.items()}


def attach_layout_names(findings: list[Any], *, raw: xr.Dataset | None, merged: xr.Dataset | None,
                        layout: Any, was_merged: bool) -> None:
    """Add the dump's or the whole model's names to each finding that names a record (in place)."""
    if layout is None:
        return
    names: dict[tuple[int, str], str] | None = None
    for f in findings:
        if not f.found or not f.node or f.step is None or f.rank is None:
            continue
        if was_merged and merged is not None:
            where = dump_location(merged, layout, int(f.step), int(f.rank), str(f.tensor or ""), str(f.node))
            departing = (f.values or {}).get("departing_rank")
            if where is not None and departing is not None:  # a replica departed: its own rank, not the group's
                where["rank"] = int(departing)
                f.reason += f" (dump rank {int(departing)})"
            if where is not None:
                f.evidence["dump"] = where
            continue
        if raw is None or (layout.pp <= 1 and layout.vpp <= 1):
            continue
        if names is None:
            names = _global_names(raw, layout)
        glob = names.get((int(f.rank), str(f.node)))
        if glob and glob != f.node:
            from precnb.naming import parse_node

            p = parse_node(glob)
            f.evidence["global_node"] = glob
            module = p.module if p.kind != "api" else None
            if module is None:
                parent = _parent_at(raw, str(f.node), int(f.step), int(f.rank))
                gp = names.get((int(f.rank), parent))
                module = parse_node(gp).module if gp else None
            if module:
                f.evidence["global_module"] = module.removeprefix("0.") if module.startswith("0.") else module
                f.reason += f" (whole-model name: {f.evidence['global_module']})"
