"""Findings handed to a report: normalising them, ordering them, picking the one the charts focus on.

The report does not choose or run diagnoses: :func:`precnb.diagnose` does. These helpers only
accept findings a caller passes explicitly (``findings=``) in the pipeline's order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["normalize_findings", "primary", "sort_findings"]


def sort_findings(findings: Iterable[Any]) -> list[Any]:
    """The pipeline's order (:func:`precnb.analysis.registry.order_findings`, the one place findings are ordered)."""
    from precnb.analysis.registry import order_findings

    return order_findings(findings)


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
