"""The diagnoses a report runs when it is not handed findings.

One run: NaN/Inf origin, then anomalies (NaN/Inf transitions and spikes). With a baseline:
first divergence. With a layout: replica check of the (unmerged) target. The most relevant
finding comes first: something found before nothing found, divergence before replicas.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from precnb.report._inputs import ReportData

__all__ = ["checks_run", "default_findings", "normalize_findings", "primary", "sort_findings"]

_RANK = {"first_divergence": 0, "nan_origin": 1, "replica_mismatch": 2, "anomaly": 3, "none": 9}


def default_findings(data: ReportData, *, tolerance: Any = None) -> list[Any]:
    """Run the diagnoses that fit *data*.

    Parameters
    ----------
    data : ReportData
    tolerance : precnb.analysis.Tolerance, optional
        For the first-divergence search (default: by dtype).

    Returns
    -------
    list of Finding
        Found ones first (divergence, NaN origin, replica mismatch, anomaly), then the
        "nothing found" ones, so that a healthy run still says what was checked.
    """
    from precnb.analysis import anomalies, check_replicas, first_divergence, nan_origin

    out: list[Any] = []
    if data.baseline is not None:
        out.append(first_divergence(data.baseline, data.target, tolerance=tolerance,
                                    step_offset=data.step_offset))
    else:
        nan = nan_origin(data.target)
        out.append(nan)
        anom = anomalies(data.target, limit=50)
        # with a NaN origin and no spike, the anomaly list only repeats it: keep it only with spikes
        if anom.found and (not nan.found or "first_spike" in anom.values):
            out.append(anom)
    if data.layout is not None:
        raw = data.raw_target if data.raw_target is not None else data.target
        out.append(check_replicas(raw, data.layout))
    return sort_findings(out)


def checks_run(data: ReportData) -> list[str]:
    """What :func:`default_findings` looks for, in words (the report says it)."""
    out = (["first divergence (values with dtype tolerances, structural differences)"] if data.compared else
           ["NaN/Inf origin (mask infinities ignored)", "anomalies (NaN/Inf transitions, spikes against history)"])
    if data.layout is not None:
        out.append(f"replica check ({data.layout.describe()})")
    return out


def sort_findings(findings: Iterable[Any]) -> list[Any]:
    """Found before not found; stable otherwise."""
    items = list(findings)
    return sorted(items, key=lambda f: (not f.found, _RANK.get(f.kind, 5) if f.found else 0))


def normalize_findings(findings: Any) -> list[Any]:
    """Accept one Finding, a sequence of them, or Finding dicts (``Finding.to_dict()``)."""
    from precnb.analysis import Finding

    if findings is None:
        return []
    if isinstance(findings, (Finding, dict)):
        findings = [findings]
    out = []
    for f in findings:
        if isinstance(f, dict):
            kw = {k: v for k, v in f.items() if k in Finding.__dataclass_fields__}
            f = Finding(**kw)
        out.append(f)
    return out


def primary(findings: list[Any]) -> Any:
    """The finding the charts focus on: the first one that names a tensor."""
    for f in findings:
        if f.found and f.tensor:
            return f
    return None
