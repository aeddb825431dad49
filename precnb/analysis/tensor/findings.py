"""What a divergence finding says about precision and tensor data (pure helpers for ``first_divergence``).

:func:`comparison_notes` turns a :class:`~precnb.analysis.compare.Comparison`'s precision verdict
and tensor-verdict coverage into hints and ``stats`` entries; :func:`origin_tensor_values` gives the
origin entry's tensor metrics and the rule that made it differ.
"""

from __future__ import annotations

import math
from typing import Any

from precnb.analysis.tensor.metrics import FLOAT_METRICS
from precnb.analysis.tensor.verdicts import TensorThresholds, magnitude, verdict_reason

__all__ = ["comparison_notes", "origin_tensor_values"]


def comparison_notes(cmp: Any, stats: dict[str, Any]) -> list[str]:
    """Hints for the finding; fills ``stats["precision"]`` and ``stats["tensor_judged_records"]``.

    Parameters
    ----------
    cmp : Comparison
    stats : dict
        The finding's ``stats`` (updated in place).

    Returns
    -------
    list of str
    """
    hints: list[str] = []
    ctx = getattr(cmp, "precision", None)
    if ctx is not None:
        stats["precision"] = ctx.to_dict()
        if ctx.systematic:
            hints.append(f"{ctx.statement()} ({ctx.reason}; float tolerance "
                         f"{float(cmp.rtol.max()):.3g} relative)")
        else:
            hints.append(ctx.reason)
    judged = getattr(cmp, "tensor_judged", None)
    if judged is not None:
        n = int(judged.sum())
        stats["tensor_judged_records"] = n
        stats["statistics_judged_records"] = int(cmp.both.sum()) - n
        if n:
            hints.append(f"{n} record(s) judged on whole-tensor metrics (msprobe's thresholds), "
                         f"{stats['statistics_judged_records']} on statistics")
    return hints


def origin_tensor_values(cmp: Any, *, step: int, rank: int, tensor: str) -> dict[str, Any]:
    """``{"tensor_metrics": {...}}`` for the origin entry when it was judged on tensor metrics."""
    judged = getattr(cmp, "tensor_judged", None)
    metrics = getattr(cmp, "tensor_metrics", None)
    if judged is None or metrics is None:
        return {}
    try:
        if not bool(judged.sel(step=step, rank=rank, tensor=tensor)):
            return {}
        entry = metrics.sel(step=step, rank=rank, tensor=tensor)
    except KeyError:
        return {}
    out: dict[str, Any] = {}
    for v in (*FLOAT_METRICS, "bitwise_equal", "status"):
        if v in entry:
            x = entry[v].item()
            out[v] = (None if isinstance(x, float) and math.isnan(x) else x)
    ctx = getattr(cmp, "precision", None)
    low = bool(ctx is not None and ctx.systematic)
    scale = 1.0
    if low:
        mag = magnitude(cmp.baseline.sel(step=[step], rank=[rank], tensor=[tensor]))
        scale = max(1.0, float(mag.reshape(-1)[0])) if math.isfinite(float(mag.reshape(-1)[0])) else 1.0
    thresholds = getattr(cmp, "tensor_thresholds", None) or TensorThresholds()
    rtol = float(cmp.rtol.sel(tensor=tensor))
    out["verdict"] = verdict_reason({k: (math.nan if v is None else v) for k, v in out.items()}, rtol,
                                    thresholds, low_precision=low, scale=scale, tensor=tensor)
    return {"tensor_metrics": out}
