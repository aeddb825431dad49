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

from precnb.analysis.replicas.returned_grad import returned_grad_departures

__all__ = ["attach_layout_names", "dump_location"]


def dump_location(merged: xr.Dataset, layout: Any, step: int, rank: int, tensor: str, node: str
                  ) -> dict[str, Any] | None:
    """Where a merged run's entry comes from: ``{"rank", "node", "ranks"}`` (None when it was not merged)."""
    if layout is None or layout.world_size <= 1:
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


def _copied_member(raws: list[xr.Dataset], members: list[int], tensor: str, step: int) -> int | None:
    """The member whose entry of *tensor* at *step* is a copy of another member's (at that step or before).

    *raws*: the run as dumped (earlier steps first, when read in batches); see
    :func:`precnb.analysis.layout.merge.copied_shards`.
    """
    from precnb.analysis.layout.merge import copied_shards

    rows: dict[int, np.ndarray] = {}
    for raw in raws:
        if tensor not in raw.indexes["tensor"] or not set(members) <= {int(r) for r in raw["rank"].values}:
            continue
        e = raw.sel(tensor=tensor, rank=members)
        stats = np.stack([e[v].values for v in ("max", "min", "mean", "norm")], axis=-1)  # (step, n, 4)
        stats = np.where(e["present"].values[..., None], stats, np.nan)
        for i, st in enumerate(int(x) for x in raw["step"].values):
            if st <= step:
                rows.setdefault(st, stats[i])
    if step not in rows or len(members) < 2:
        return None
    steps = sorted(rows)
    arr = np.stack([rows[st] for st in steps])[:, None, :, None, :]  # (step, 1, n, 1, 4)
    copies = copied_shards(arr, np.isfinite(arr).all(axis=-1))[steps.index(step), 0, :, 0]
    return members[int(np.argmax(copies))] if copies.any() else None


def _merged_members(merged: xr.Dataset, layout: Any, src: int) -> list[int]:
    """The dump ranks merged into the entry of dump rank *src*: its TP/CP group, and DP replicas when merged."""
    dims = [d for d in ("tp", "cp", "dp") if f"shard_kind_{d}" in merged.coords]
    c = layout.coords(src)
    return [r for r in range(layout.world_size)
            if all(layout.coords(r)[d] == c[d] for d in c if d not in dims and d in ("tp", "cp", "dp", "pp"))]


def _is_sharded(merged: xr.Dataset, tensor: str) -> bool:
    """Whether a merged entry concatenates its members' shards (along TP, CP or the batch)."""
    if tensor not in merged.indexes["tensor"]:
        return False
    return any(str(merged[c].sel(tensor=tensor).values) == "sharded"
               for c in merged.coords if str(c).startswith("shard_kind_"))


def attach_layout_names(findings: list[Any], *, raw: xr.Dataset | None, merged: xr.Dataset | None,
                        layout: Any, was_merged: bool, earlier: xr.Dataset | None = None) -> None:
    """Add the dump's or the whole model's names to each finding that names a record (in place).

    *earlier*: the target as dumped at steps before *raw*'s (the first step batch, when read in batches): a
    rank whose shard is a copy of another rank's earlier shard is found across them.
    """
    if layout is None:
        return
    names: dict[tuple[int, str], str] | None = None
    for f in findings:
        if not f.found or not f.node or f.step is None or f.rank is None:
            continue
        if was_merged and merged is not None:
            where = dump_location(merged, layout, int(f.step), int(f.rank), str(f.tensor or ""), str(f.node))
            departing = (f.values or {}).get("departing_rank")
            shard = (f.values or {}).get("shard_rank")
            if where is not None and departing is not None:  # a replica departed: its own rank, not the group's
                where["rank"] = int(departing)
                f.reason += f" (dump rank {int(departing)})"
            elif where is not None:
                copy = None
                members = _merged_members(merged, layout, int(where["rank"]))
                if raw is not None and f.tensor and str(f.tensor).startswith(str(f.node)) and \
                        _is_sharded(merged, str(f.tensor)):
                    local = str(where["node"]) + str(f.tensor)[len(str(f.node)):]
                    raws = [r for r in (earlier, raw) if r is not None]
                    at = int((f.values or {}).get("target_step", f.step))  # the target's own step number
                    copy = _copied_member(raws, members, local, at)
                if copy is None and shard is None and raw is not None and f.tensor and \
                        str(f.tensor).startswith(str(f.node)) and ".parameters_grad." in str(f.tensor):
                    local = str(where["node"]) + str(f.tensor)[len(str(f.node)):]
                    at = int((f.values or {}).get("target_step", f.step))
                    own = returned_grad_departures(raw, local, step=at, ranks=members)
                    if own is not None:  # copies of a returned parameter's gradient: the rank's own records
                        shard = f.values["shard_rank"] = own["rank"]
                        f.values["shard_why"] = own["why"]
                vouched = (f.values or {}).get("shard_vouched") or []
                rest = [r for r in members if r not in vouched]
                if copy is None and shard is None and vouched and len(rest) == 1:
                    shard = f.values["shard_rank"] = rest[0]
                    stats = f.values.get("shard_vouched_by") or ["Max", "Min"]
                    by = " and ".join(stats) + (" agree" if len(stats) > 1 else " agrees")
                    f.values["shard_why"] = (f"the merged {by} with the baseline and are rank(s) "
                                             f"{', '.join(map(str, vouched))}'s: the difference is in rank "
                                             f"{rest[0]}'s shard")
                if copy is not None:  # a rank holding a copy of another rank's shard (now or earlier)
                    where["rank"] = copy
                    f.values["shard_rank"] = copy
                    f.values["shard_why"] = (f"rank {copy}'s shard is a copy, bit for bit, of another rank's "
                                             "shard at this step or an earlier one")
                    f.reason += f" (dump rank {copy}: {f.values['shard_why']})"
                elif shard is not None:  # a merged shard: the member behind the difference
                    where["rank"] = int(shard)
                    f.reason += f" (dump rank {int(shard)}: {f.values.get('shard_why')})"
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
