"""How a pre-flight result is ordered in among a triage's findings (used by the pipeline itself).

Kept apart from :mod:`precnb.pipeline.preflight` (the public ``precnb.preflight``, which calls
the pipeline) so that the pipeline never imports the module that imports it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["note_later", "with_preflight"]


def with_preflight(pre: Any, div: Any) -> Any:
    """*div* (a step-by-step divergence triage) with the pre-flight result of *pre* ordered in."""
    from precnb.analysis import registry

    f = pre.result("preflight")
    results = [("preflight", f), *((k, v) for k, v in div.results.items())]
    div.findings = registry.order_findings(results, warn_first=False)  # the search says what it compared
    note_later(div.findings)
    div.checks = [*pre.checks, *div.checks]
    div.results = {"preflight": f, **div.results}
    steps = sorted({int(s) for s in pre.baseline["step"].values}) if pre.baseline is not None else []
    div.notes.append(f"pre-flight checks on baseline steps {', '.join(map(str, steps))}")
    div.load_failures.extend(x for x in pre.load_failures if x not in div.load_failures)
    return div


def note_later(findings: list[Any]) -> None:
    """A failing pre-flight finding first: it names the findings after it (they may be consequences).

    ``evidence["later_findings"]`` holds their kind, step, rank, node, tensor and reason, so the one
    JSON object ``precnb diff --json`` prints (the pre-flight finding) still says where the runs
    first diverge.
    """
    if not findings or findings[0].kind != "preflight":
        return
    later = [f for f in findings[1:] if f.found]
    if not later:
        return
    head = findings[0]
    head.evidence["later_findings"] = [{k: getattr(f, k) for k in ("kind", "step", "rank", "node", "tensor",
                                                                    "reason")} for f in later]
    texts = [f"{f.kind} at step {f.step}, rank {f.rank}" + (f", {f.node}" if f.node else "") for f in later]
    head.evidence["later_findings_text"] = texts
    head.hints.append("found after the pre-flight failure (possibly its consequence): " + "; ".join(texts))
