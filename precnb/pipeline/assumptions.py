"""What the pipeline assumed about its inputs, as data: every finding and every front end says it.

An *assumption* is something :func:`precnb.diagnose` decided that the user did not give and the
answer depends on. Each is a dict with ``kind``, ``text`` (one line, for people) and the values
it rests on:

* ``inferred_layout`` — a run's parallel layout read from its dumps (``role``: ``target`` /
  ``baseline``; ``layout``, e.g. ``"tp=2"``; ``why``: the dumps' evidence); never when the layout
  was given (``--target-layout`` / ``--baseline-layout``);
* ``step_offset`` — the pair's step offset detected from the parameters' statistics because the
  runs hold other step numbers and none was given (``offset``; ``baseline_steps``,
  ``target_steps``);
* ``aligned_by_structure`` / ``aligned_by_shape`` / ``aligned_by_value`` — nodes of two runs
  whose names differ, paired by their place in the module tree, by tensor shapes, or by equal
  values (``count``; ``examples``: a few ``{"baseline", "target"}`` pairs). Pairs by name, or
  from the user's mapping file, are not assumptions;
* ``random_by_design`` — the first-divergence search stopped at a random op whose draw the two layouts
  change by design (``node``, ``step``, ``rank``, ``why``; :mod:`precnb.analysis.divergence.random_draws`): the
  runs were not compared past it.

The pipeline collects them once (:func:`collect`) into :attr:`precnb.pipeline.Triage.assumptions`
and copies them into every finding (``Finding.assumptions``, the ``assumptions`` list of the
``precnb.finding/1`` JSON, also when nothing is found); the command line prints them under
``assumed:``, the HTML report and the explorer show them.

**Names in the layout's terms** (:func:`attach_layout_names`): findings named in both the dumps' and the whole
model's terms when a layout is involved. A merged target's finding (``diff`` across layouts) is at a whole-model
record: this adds the dump rank(s) and the name the record has there (``evidence["dump"]``: the pipeline stage's
local layer name, its TP group). A finding on a run as dumped (``nan``, ``replicas`` of a pipeline run) is at a
local name: this adds the whole-model name (``evidence["global_node"]`` / ``["global_module"]``, layers numbered
globally, chunks folded) and says it in the reason.

Examples
--------
>>> a = inferred_layout("target", "tp=2", ["8 of 8 tensor-parallel groups agree"])
>>> a["kind"], a["layout"], a["text"]
('inferred_layout', 'tp=2', 'target layout tp=2 read from the dumps (not given): 8 of 8 tensor-parallel groups agree')
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.replicas.returned_grad import returned_grad_departures

__all__ = ["attach", "attach_layout_names", "collect", "dump_location", "horizons", "inferred_layout", "layout_spec",
           "step_offset"]

_BY = {"structure": "their place in the module tree", "shape": "their tensor shapes", "value": "equal values"}


def layout_spec(layout: Any) -> str:
    """The short, ``--target-layout``-style spelling of a :class:`~precnb.analysis.Layout` (its sizes above 1).

    Examples
    --------
    >>> from precnb.analysis import Layout
    >>> layout_spec(Layout(4, tp=2, pp=2)), layout_spec(Layout(2)), layout_spec(Layout(4, tp=2, order="tp-dp-pp-cp-ep"))
    ('tp=2,pp=2', 'dp=2', 'tp=2,dp=2,order=tp-dp-pp-cp-ep')
    """
    parts = [f"{d}={getattr(layout, d)}" for d in ("tp", "cp", "ep", "dp", "pp", "vpp") if getattr(layout, d) > 1]
    if getattr(layout, "ep", 1) > 1 and getattr(layout, "etp", layout.tp) != layout.tp:
        parts.insert(parts.index(f"ep={layout.ep}") + 1, f"etp={layout.etp}")
    if layout.order != "tp-cp-ep-dp-pp":
        parts.append(f"order={layout.order}")
    return ",".join(parts) or "dp=1"


def inferred_layout(role: str, layout: Any, evidence: Sequence[str]) -> dict[str, Any]:
    """The assumption that *role*'s run has *layout* (a Layout, or its spec), read from its dumps for *evidence*."""
    why = "; ".join(str(e) for e in evidence)
    spec = layout if isinstance(layout, str) else layout_spec(layout)
    out = {"kind": "inferred_layout", "role": role, "layout": spec, "why": why,
           "text": f"{role} layout {spec} read from the dumps (not given)" + (f": {why}" if why else "")}
    if not isinstance(layout, str):
        out["describe"] = layout.describe()
    return out


def step_offset(offset: int, baseline_steps: Sequence[int], target_steps: Sequence[int]) -> dict[str, Any]:
    """The assumption that target step = baseline step + *offset* (detected, not given).

    Examples
    --------
    >>> a = step_offset(3, [0, 1, 2, 3], [3, 4])
    >>> a["offset"], a["text"].split("; ")[1]
    (3, 'baseline steps 0-3, target steps 3-4)')
    """
    from precnb.analysis.summary import format_ranges

    b, t = sorted(int(s) for s in baseline_steps), sorted(int(s) for s in target_steps)
    return {"kind": "step_offset", "offset": int(offset), "how": "detected from parameter statistics",
            "baseline_steps": b, "target_steps": t,
            "text": f"step offset {offset} detected from parameter statistics (target step = baseline step + "
                    f"{offset}; baseline steps {format_ranges(b)}, target steps {format_ranges(t)})"}


def _aligned(alignment: Any) -> list[dict[str, Any]]:
    """One assumption per way of pairing nodes that is not by name nor the user's."""
    if alignment is None or getattr(alignment, "identical", True):
        return []
    out = []
    for how, what in _BY.items():
        pairs = [p for p in alignment.nodes if p.how == how]
        if not pairs:
            continue
        mods = sum(1 for p in alignment.modules if p.how == how)
        ex = [{"baseline": p.baseline, "target": p.target} for p in pairs[:3]]
        out.append({"kind": f"aligned_by_{how}", "count": len(pairs), "modules": mods, "examples": ex,
                    "text": f"{len(pairs)} node(s) of differently named runs paired by {what}"
                            + (f" ({mods} module pair(s) too)" if mods else "")
                            + f", e.g. {ex[0]['baseline']} -> {ex[0]['target']}"})
    return out


def _offset(options: Any, ctx: Any) -> list[dict[str, Any]]:
    """The detected step offset of a pair (none when it was given, or both runs hold the same steps)."""
    given = getattr(options, "step_offset", None)
    if ctx.baseline is None or ctx.step_offset is None or (isinstance(given, int) and not isinstance(given, bool)):
        return []
    rb = ctx.raw_baseline if ctx.raw_baseline is not None else ctx.baseline
    rt = ctx.raw_target if ctx.raw_target is not None else ctx.target
    b, t = [int(s) for s in rb["step"].values], [int(s) for s in rt["step"].values]
    if given is None and sorted(b) == sorted(t):
        return []
    return [step_offset(int(ctx.step_offset), b, t)]


def collect(ctx: Any, options: Any, layouts: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Every assumption of one pipeline run: the inferred *layouts*, the detected step offset, the alignment.

    *ctx* is the diagnoses' :class:`~precnb.analysis.registry.Context` (its resolved step offset and
    alignment), *options* the pipeline's :class:`~precnb.pipeline.Options` (what the user gave).
    """
    out: list[dict[str, Any]] = []
    for a in layouts:
        if a not in out:
            out.append(dict(a))
    return out + _offset(options, ctx) + _aligned(ctx.alignment)


def horizons(findings: Sequence[Any]) -> list[dict[str, Any]]:
    """The ``random_by_design`` assumption of each finding whose search stopped at a horizon.

    (:mod:`precnb.analysis.divergence.random_draws`: a random op the layouts draw differently by design; the
    runs were not compared past it.)
    """
    from precnb.analysis.divergence.random_draws import horizon_assumption

    out: list[dict[str, Any]] = []
    for f in findings:
        h = (getattr(f, "stats", None) or {}).get("horizon")
        if isinstance(h, dict) and h.get("node"):
            a = horizon_assumption(h)
            if a not in out:
                out.append(a)
    return out


def attach(findings: Sequence[Any], assumptions: Sequence[dict[str, Any]]) -> None:
    """Give every finding the triage's assumptions (its own copy of the list)."""
    for f in findings:
        f.assumptions = [dict(a) for a in assumptions]


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


def _tp_group(layout: Any, rank: int) -> list[int]:
    """The TP group holding dump rank *rank* (itself alone without TP)."""
    if layout.tp <= 1:
        return [rank]
    return next((list(g) for g in layout.groups("tp") if rank in g), [rank])


def _summed(merged: xr.Dataset, tensor: str) -> bool:
    """Whether a merged entry is the sum of its members' addends (partial sums, an expert's per-replica gradients)."""
    if tensor not in merged.indexes["tensor"]:
        return False
    return any(str(merged[c].sel(tensor=tensor).values) in ("partial_sum", "expert_sum")
               for c in merged.coords if str(c).startswith("shard_kind_"))


def _say_undecided(f: Any, where: dict[str, Any], members: list[int], *, sharded: bool, dp: bool,
                   summed: bool = False, copies: list[int] | None = None) -> None:
    """Say that no member of a merged entry is told apart as the one behind its difference (in place).

    A merged shard whose whole-tensor statistics differ, when neither extremes, copies nor the rank's own records
    say whose shard it is; or a data-parallel entry whose copies agree (a reduced gradient: both replicas hold
    the value their own parts made). The dump rank named stays the entry's first member.
    """
    ranks = ", ".join(map(str, members))
    if copies:
        members = list(copies)
        why = (f"ranks {', '.join(map(str, copies))} hold copies of one random draw that differ from each other, and "
               "the baseline's layout draws it apart from both by design: which copy departs is not told by the "
               "baseline (the healthy twin, or a third copy, decides)")
    elif sharded:
        why = (f"the difference is in the shard of one of ranks {ranks}; the whole tensor's statistics cannot say "
               "which (a tensor dump of these ranks, or the healthy twin, decides)")
    elif dp:
        why = (f"ranks {ranks} hold the same value, reduced over their own parts of the batch: which replica's "
               "part made the difference is not told by the statistics (the healthy twin decides)")
    elif summed:
        why = (f"the entry is the sum of the addends of ranks {ranks} (each over its own tokens or part): which "
               "addend made the difference is not told by the statistics of the sum (the healthy twin decides)")
    else:
        return
    where["ranks_undecided"] = list(members)
    f.values["shard_why"] = why
    f.reason += f" (dump rank undecided: {why})"


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
                    held = ", ".join(map(str, vouched))
                    f.values["shard_why"] = (f"the merged {by} with the baseline and are rank(s) {held}'s: a "
                                             f"change of rank(s) {held}'s whole shard would have moved them, so "
                                             f"the difference is most likely in rank {rest[0]}'s shard (a few "
                                             f"changed elements of rank(s) {held}'s are not ruled out: a tensor "
                                             "dump of these ranks decides)")
                if copy is not None:  # a rank holding a copy of another rank's shard (now or earlier)
                    where["rank"] = copy
                    f.values["shard_rank"] = copy
                    f.values["shard_why"] = (f"rank {copy}'s shard is a copy, bit for bit, of another rank's "
                                             "shard at this step or an earlier one")
                    f.reason += f" (dump rank {copy}: {f.values['shard_why']})"
                elif shard is not None:  # a merged shard: the member behind the difference
                    where["rank"] = int(shard)
                    f.reason += f" (dump rank {int(shard)}: {f.values.get('shard_why')})"
                elif len(members) > 1 and f.tensor and str(f.tensor).startswith(str(f.node)):
                    _say_undecided(f, where, members, sharded=_is_sharded(merged, str(f.tensor)),
                                   dp="shard_kind_dp" in merged.coords, summed=_summed(merged, str(f.tensor)),
                                   copies=(f.values or {}).get("copies_undecided"))
            if where is not None:
                where["ranks"] = _tp_group(layout, int(where["rank"]))  # the rank may have moved to a copy
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
