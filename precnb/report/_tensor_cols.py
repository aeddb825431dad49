"""Tensor-metric columns for the report's tables (issue #17), when both runs saved their tensors.

The metrics come from the pipeline's (:attr:`precnb.Triage.tensor_metrics`, computed once, issue #27 item 3:
the report reads no tensor file at render time). Only without them (``tensor_metrics=False``) are the
records a table shows compared here (:func:`precnb.tensor_metrics` on those labels at one step and rank),
so a report of a large tensor-mode pair reads a few dozen tensor files, not all.
"""

from __future__ import annotations

from typing import Any

__all__ = ["METRIC_HEADERS", "metric_columns"]

METRIC_HEADERS = {"cosine": "cosine", "max_abs_err": "max abs err", "max_rel_err": "max rel err",
                  "one_thousandth_err_ratio": "1‰ err ratio"}
"""msprobe compare's headline metrics shown in the detail table (variable → column header)."""


def metric_columns(data: Any, *, step: int, rank: int, tensors: list[str]) -> dict[str, dict[str, Any]] | None:
    """Map tensor → {metric: value} for *tensors* at (step, rank); None when the pair has no tensor files.

    Parameters
    ----------
    data : ReportData
    step, rank : int
        Baseline step numbering (as in the comparison).
    tensors : list of str
        Target labels.
    """
    from precnb.pipeline.tensors import has_tensor_files, pairing

    base = data.raw_baseline if data.raw_baseline is not None else data.baseline
    targ = data.raw_target if data.raw_target is not None else data.target
    if base is None or not tensors or data.layout is not None or data.baseline_layout is not None:
        return None
    if not (has_tensor_files(base) and has_tensor_files(targ)):
        return None
    labels = [t for t in tensors if t in targ.indexes["tensor"]]
    m = _computed(getattr(data, "tensor_metrics", None), step=step, rank=rank, labels=labels)
    if m is None:  # not computed by the pipeline (tensor_metrics=False, or a report built from datasets)
        from precnb.tensor_compare import tensor_metrics

        offset = data.step_offset if isinstance(data.step_offset, int) else 0
        try:
            m = tensor_metrics(base, targ, tensors=labels, steps=[step], ranks=[rank], step_offset=offset,
                               alignment=pairing(getattr(data, "alignment", None)))
        except (ValueError, KeyError):
            return None
    out: dict[str, dict[str, Any]] = {}
    for j, t in enumerate(m["tensor"].values):
        if str(m["status"].values[0, 0, j]) == "no_data":
            continue
        out[str(t)] = {v: float(m[v].values[0, 0, j]) for v in METRIC_HEADERS}
    return out or None


def _computed(metrics: Any, *, step: int, rank: int, labels: list[str]) -> Any:
    """The (step, rank, labels) part of the pipeline's tensor metrics, or None when it does not hold them all."""
    if metrics is None or not labels:
        return None
    idx = metrics.indexes
    if step not in idx["step"] or rank not in idx["rank"] or any(t not in idx["tensor"] for t in labels):
        return None
    return metrics.sel(step=[step], rank=[rank], tensor=labels).transpose("step", "rank", "tensor")
