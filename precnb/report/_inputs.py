"""What a report is about: the runs a :class:`precnb.Triage` prepared (one run, or a target and its baseline).

:func:`from_triage` turns the pipeline's outcome into a :class:`ReportData` holding single-run
datasets, display names and the comparison settings; the report never loads or merges runs itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import xarray as xr

__all__ = ["ReportData", "from_triage"]


@dataclass
class ReportData:
    """The runs of one report.

    Attributes
    ----------
    target : xarray.Dataset
        The run the report is about (single run; shards merged when a layout asked for it).
    baseline : xarray.Dataset or None
        The run it is compared with.
    names : (str, str)
        Display names (baseline, target); ``("", name)`` without a baseline.
    raw_target, raw_baseline : xarray.Dataset
        The runs before shard merging (the replica check and the header look at these).
    layout, baseline_layout : Layout or None
    step_offset : int or "auto"
        Target step = baseline step + offset.
    notes : list of str
        What was done to the inputs (merges), for the header.
    alignment : Alignment or None
        How the baseline's names map onto the target's.
    step_offset_asked : int, "auto" or None
        The step-offset option as given (the header says when it was found automatically).
    tensor_metrics : xarray.Dataset or None
        The pair's tensor metrics the pipeline computed (:attr:`precnb.Triage.tensor_metrics`): the
        report's metric columns come from it, without reading tensor files again.
    assumptions : list of dict
        What the pipeline assumed (:attr:`precnb.Triage.assumptions`), for the header's "assumed" block.
    """

    target: xr.Dataset
    baseline: xr.Dataset | None = None
    names: tuple[str, str] = ("", "run")
    raw_target: xr.Dataset | None = None
    raw_baseline: xr.Dataset | None = None
    layout: Any = None
    baseline_layout: Any = None
    step_offset: int | str = 0
    notes: list[str] = field(default_factory=list)
    alignment: Any = None
    step_offset_asked: Any = None
    tensor_metrics: xr.Dataset | None = None
    assumptions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def compared(self) -> bool:
        """True with a baseline."""
        return self.baseline is not None


def from_triage(triage: Any) -> ReportData:
    """The report's view of a :class:`precnb.Triage` (the pipeline's prepared runs)."""
    from precnb.pipeline.sources import in_memory

    target = in_memory(triage.target)
    base = in_memory(triage.baseline) if triage.baseline is not None else None
    raw_t = in_memory(triage.raw_target) if triage.raw_target is not None else target
    raw_b = in_memory(triage.raw_baseline) if triage.raw_baseline is not None else base
    return ReportData(target=target, baseline=base, names=tuple(triage.names), raw_target=raw_t,
                      raw_baseline=raw_b, layout=triage.target_layout, baseline_layout=triage.baseline_layout,
                      step_offset=triage.step_offset if triage.step_offset is not None else 0,
                      notes=list(triage.notes), alignment=triage.alignment,
                      step_offset_asked=triage.options.step_offset,
                      tensor_metrics=getattr(triage, "tensor_metrics", None),
                      assumptions=list(getattr(triage, "assumptions", None) or []))
