"""How a pre-flight result is ordered in among a triage's findings (used by the pipeline itself).

Kept apart from :mod:`precnb.pipeline.preflight` (the public ``precnb.preflight``, which calls
the pipeline) so that the pipeline never imports the module that imports it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["note_later", "with_first_steps", "with_preflight"]


def with_first_steps(pre: Any, div: Any) -> Any:
    """*div* (a step-wise search's triage) with the results of *pre* (diagnoses of its first steps) ordered in.

    *pre* ran the diagnoses that need the first steps only (:attr:`Diagnosis.first_steps`; the pre-flight
    checks) on the steps the search read.
    """
    from precnb.analysis import registry

    extra = list(pre.results.items())
    results = [*extra, *((k, v) for k, v in div.results.items())]
    div.findings = registry.order_findings(results, warn_first=False)  # the search says what it compared
    note_later(div.findings)
    div.checks = [*pre.checks, *div.checks]
    div.results = {**dict(extra), **div.results}
    steps = sorted({int(s) for s in pre.baseline["step"].values}) if pre.baseline is not None else []
    titles = ", ".join(registry.title(k).lower() for k, _ in extra)
    div.notes.append(f"{titles} on baseline steps {', '.join(map(str, steps))}")
    div.load_failures.extend(x for x in pre.load_failures if x not in div.load_failures)
    from precnb.pipeline.assumptions import attach

    div.assumptions += [a for a in pre.assumptions if a not in div.assumptions]
    attach(div.findings, div.assumptions)  # the first steps' findings say the search's assumptions too
    return div


with_preflight = with_first_steps  # the name it had when the pre-flight checks were the only such diagnosis


def note_later(findings: list[Any]) -> None:
    """A failing pre-flight finding first: it names the findings after it (they may be consequences).

    ``evidence["later_findings"]`` holds their kind, step, rank, node, tensor and reason, so the one
    JSON object ``precnb diff --json`` prints (the pre-flight finding) still says where the runs
    first diverge.
    """
    from precnb.analysis import registry

    head_d = registry.lookup(findings[0].kind) if findings else None
    if head_d is None or not head_d.clean_last:  # a precondition check (the pre-flight checks) heads the list
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
