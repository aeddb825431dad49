"""Merging each run's shards into whole-layer statistics before two runs are compared (TP/PP/VPP/CP/EP, DP).

Used by the triage (:mod:`precnb.pipeline.run`) and by the explorer's reruns (:mod:`precnb.pipeline.reuse`).
"""

from __future__ import annotations

from typing import Any

import xarray as xr

__all__ = ["is_sharded", "merge_layouts"]


def _same_layout(a: Any, b: Any, base: xr.Dataset, target: xr.Dataset) -> bool:
    """Two runs laid out alike (same sizes, order and ranks): rank r holds the same part of the model in both."""
    keys = ("world_size", "tp", "pp", "vpp", "cp", "ep", "etp", "order")
    if not all(getattr(a, k) == getattr(b, k) for k in keys) or (
            base["rank"].values.tolist() != target["rank"].values.tolist()):
        return False
    from precnb.naming import is_communication

    def collectives(ds: xr.Dataset) -> set[str]:  # sequence parallelism trades all-reduces for gathers/scatters
        return {str(a) for a, n in zip(ds["api"].values, ds["node"].values, strict=True) if is_communication(str(n))}

    return collectives(base) == collectives(target)


def is_sharded(layout: Any) -> bool:
    """Whether *layout* splits the model (tp, pp, vpp, cp or ep above 1)."""
    return layout is not None and bool(layout.sharded)


def merge_layouts(base: xr.Dataset | None, target: xr.Dataset, b_lay: Any, t_lay: Any,
                  notes: list[str] | None = None, *, like: tuple[Any, Any] | None = None
                  ) -> tuple[xr.Dataset | None, xr.Dataset]:
    """Merge each run's shards into whole-layer statistics (the other run names split dims).

    Parameters
    ----------
    base, target : xarray.Dataset
    b_lay, t_lay : Layout or None
        Only layouts with tp/pp/vpp/cp/ep > 1 merge anything.
    notes : list of str, optional
        What was merged is appended here.
    like : (Dataset, Dataset), optional
        (baseline, target) merged from earlier steps: their shard classification is reused.
    """
    from precnb.analysis import merge_shards

    b_dp = b_lay.dp if b_lay is not None else (int(base.sizes["rank"]) if base is not None else 1)
    t_dp = t_lay.dp if t_lay is not None else int(target.sizes["rank"])
    # replicas on parts of the batch against a run on the whole batch: merged too, the other run naming the batch dim
    t_dp_merge = base is not None and t_lay is not None and t_dp > 1 and b_dp == 1
    b_dp_merge = base is not None and b_lay is not None and b_dp > 1 and t_dp == 1
    b_m = b_lay if is_sharded(b_lay) or b_dp_merge else None
    t_m = t_lay if is_sharded(t_lay) or t_dp_merge else None
    if base is not None and b_m is not None and t_m is not None and _same_layout(b_m, t_m, base, target):
        if notes is not None:  # rank r is the same shard of the same stage in both: the dump's own ranks answer
            notes.append(f"the same layout on both sides ({t_m.describe()}): compared rank by rank, unmerged")
        return base, target
    merged_base = base
    if base is not None and b_m is not None:
        merged_base = merge_shards(base, b_m, reference=None if t_m else target, like=like[0] if like else None,
                                   merge_dp=b_dp_merge)
        if notes is not None:
            notes.append(f"baseline shards merged ({b_m.describe()})")
    raw_target = target
    if t_m is not None:
        target = merge_shards(target, t_m, reference=None if (b_m or base is None) else base,
                              like=like[1] if like else None, merge_dp=t_dp_merge)
        if notes is not None:
            notes.append(f"target shards merged ({t_m.describe()})")
    if merged_base is not None:  # a pipeline run's stage-local optimizer lists in the other run's order
        from precnb.analysis.layout.optimizer_lists import align_optimizer_lists

        staged = [lay is not None and (lay.pp > 1 or lay.vpp > 1) for lay in (b_m, t_m)]
        if staged[1] and not staged[0]:
            target, n = align_optimizer_lists(target, merged_base, raw=raw_target)
        elif staged[0] and not staged[1]:
            merged_base, n = align_optimizer_lists(merged_base, target, raw=base)
        else:
            n = 0
        if n and notes is not None:
            notes.append(f"the pipeline stages' optimizer lists renamed to the other run's order by the parameter "
                         f"each entry holds ({n} entries)")
    return merged_base, target
