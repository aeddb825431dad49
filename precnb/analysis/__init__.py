"""Pure analysis functions on canonical datasets: Dataset(s) in, Finding / Dataset out.

Nothing here reads files, prints or plots.

One subpackage per family: ``align`` (pairing runs whose names differ), ``compare`` (two runs tensor by
tensor, tolerances), ``divergence`` (first divergence), ``nan`` (NaN/Inf origin), ``causal`` (execution order
and data flow), ``replicas`` (replica consistency, departures, devices), ``layout`` (parallel layouts, PP
stitching, shard merging), ``anomalies`` (series over steps), ``spike`` (loss spikes), ``preflight``,
``tensor`` (whole-tensor metrics) and ``findings`` (the finding, its evidence and dump plan). At the root, the
core they share: ``registry`` and ``diagnoses``, ``masks``, ``undefined``, ``events``, ``summary``.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from precnb.analysis.align import Alignment, align
    from precnb.analysis.anomalies import SpikeRule, anomalies, anomaly_table
    from precnb.analysis.compare import Comparison, compare_runs
    from precnb.analysis.compare.tolerance import Tolerance, relative_difference
    from precnb.analysis.divergence import first_divergence, first_divergence_stepwise, structural_differences
    from precnb.analysis.findings import FINDING_SCHEMA, Finding, to_json
    from precnb.analysis.layout import Layout, LayoutError
    from precnb.analysis.layout.merge import classify_shards, merge_shards
    from precnb.analysis.masks import nonfinite, recorded, stat_vars
    from precnb.analysis.nan import nan_origin
    from precnb.analysis.replicas import check_replicas
    from precnb.analysis.summary import summarize
    from precnb.analysis.tensor.verdicts import TensorThresholds

#: name -> module, imported on first use: the registry (and the command line built from it) without xarray
_LAZY = {
    "Alignment": "precnb.analysis.align",
    "align": "precnb.analysis.align",
    "SpikeRule": "precnb.analysis.anomalies",
    "anomalies": "precnb.analysis.anomalies",
    "anomaly_table": "precnb.analysis.anomalies",
    "Comparison": "precnb.analysis.compare",
    "compare_runs": "precnb.analysis.compare",
    "Tolerance": "precnb.analysis.compare.tolerance",
    "relative_difference": "precnb.analysis.compare.tolerance",
    "first_divergence": "precnb.analysis.divergence",
    "first_divergence_stepwise": "precnb.analysis.divergence",
    "structural_differences": "precnb.analysis.divergence",
    "FINDING_SCHEMA": "precnb.analysis.findings",
    "Finding": "precnb.analysis.findings",
    "to_json": "precnb.analysis.findings",
    "Layout": "precnb.analysis.layout",
    "LayoutError": "precnb.analysis.layout",
    "classify_shards": "precnb.analysis.layout.merge",
    "merge_shards": "precnb.analysis.layout.merge",
    "nonfinite": "precnb.analysis.masks",
    "recorded": "precnb.analysis.masks",
    "stat_vars": "precnb.analysis.masks",
    "nan_origin": "precnb.analysis.nan",
    "check_replicas": "precnb.analysis.replicas",
    "summarize": "precnb.analysis.summary",
    "TensorThresholds": "precnb.analysis.tensor.verdicts",
}

__all__ = [
    "FINDING_SCHEMA",
    "Alignment",
    "Comparison",
    "Finding",
    "Layout",
    "LayoutError",
    "SpikeRule",
    "TensorThresholds",
    "Tolerance",
    "align",
    "anomalies",
    "anomaly_table",
    "check_replicas",
    "classify_shards",
    "compare_runs",
    "first_divergence",
    "first_divergence_stepwise",
    "merge_shards",
    "nan_origin",
    "nonfinite",
    "recorded",
    "relative_difference",
    "stat_vars",
    "structural_differences",
    "summarize",
    "to_json",
]


#: exported functions named like the subpackage that defines them: the import system binds the subpackage to the
#: package's attribute when it is imported, so the function is what attribute access returns
_SHADOWED = frozenset({"align", "anomalies"})


class _Analysis(types.ModuleType):
    def __getattribute__(self, name: str) -> Any:
        if name in _SHADOWED:
            return getattr(importlib.import_module(f"precnb.analysis.{name}"), name)
        return super().__getattribute__(name)


sys.modules[__name__].__class__ = _Analysis


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
