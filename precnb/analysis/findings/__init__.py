"""Findings: the one machine-readable shape every diagnosis returns.

JSON shape (``schema`` = :data:`FINDING_SCHEMA`)::

    {
      "schema": "precnb.finding/1",
      "kind": "first_divergence" | "nan_origin" | "anomaly" | "replica_mismatch" | "preflight" | "loss_spike"
              | "none",
      "step": int | null, "rank": int | null,
      "device": {"host": str, "device": str},   # only with a rank table: where the rank ran
      "node": str | null,          # msprobe node, e.g. "Functional.linear.3.forward"
      "tensor": str | null,        # tensor label, e.g. "Functional.linear.3.forward.output.0"
      "module": str | null,        # module path, e.g. "blocks.1.attn"
      "reason": str,               # one sentence
      "values": {...},             # statistics, both sides where relevant
      "structural": [{"node": str, "only_in": str}, ...],
      "crc_only": [{"step", "rank", "tensor"}, ...],   # CRC differs, statistics identical
      "hints": [str, ...],         # likely causes
      "suspects": [{...}, ...],    # ranked, most likely first
      "evidence": {"stack": [...], "module_path": [...], ...},
      "stats": {...},              # counts: compared, differing, ...
      "baseline": {"node", "tensor", "module"},  # two runs: the baseline's names of the same place
      "causes": [{"cause": "0/0", "text": str, "certain": bool}, ...],   # NaN/Inf causes, likeliest first
                                   # (a loss spike's: "data" | "optimizer" | "hardware" | "numerics", each
                                   # with the step, rank, node, tensor, module of its origin)
      "gap": {...} | null,         # uncaptured region that produced the bad input (causal.coverage.find_gap)
      "dump_plan": {...} | null,   # msprobe config.json to confirm / close the gap (findings.plan.plan_dump)
      "assumptions": [{"kind": str, "text": str, ...}, ...]   # what the pipeline assumed (always present,
                                   # [] when nothing): "inferred_layout" {role, layout, why}, "step_offset"
                                   # {offset, baseline_steps, target_steps}, "aligned_by_structure" /
                                   # "_shape" / "_value" {count, modules, examples}, "random_by_design"
                                   # {step, rank, node, why} (precnb.pipeline.assumptions)
    }

Non-finite floats are written as the strings ``"nan"``, ``"inf"`` and ``"-inf"`` so the
output is strict JSON.

What a finding carries beside its diagnosis's answer lives with it:
:mod:`~precnb.analysis.findings.evidence` (an entry's statistics, stack frames, module path),
:mod:`~precnb.analysis.findings.enrich` (what the pipeline adds to every finding: gap, ratio hint, plan) and
:mod:`~precnb.analysis.findings.plan` (the smallest msprobe dump that confirms it). Nothing of them is
imported here; :mod:`~precnb.analysis.findings.text` (the summary's lines wrapped at a width) is.

Examples
--------
>>> f = Finding(kind="none", reason="no divergence")
>>> f.to_dict()["schema"]
'precnb.finding/1'
>>> to_json({"x": float("nan")})
'{"x": "nan"}'
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from precnb.analysis.findings.text import Statement, Verbatim, wrap_lines
from precnb.analysis.findings.why import cause_lines, why_lines

__all__ = ["FINDING_SCHEMA", "Finding", "assumed_lines", "cause_lines", "device_text", "jsonable", "shown_record",
           "to_json", "why_lines", "wrap_lines"]

FINDING_SCHEMA = "precnb.finding/1"
Kind = str
"""A registered diagnosis kind (:func:`precnb.analysis.registry.kinds`) or ``"none"``."""


def jsonable(obj: Any) -> Any:
    """Convert numpy scalars/arrays and non-finite floats into strict-JSON values."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return f
    return obj


def to_json(obj: Any, *, indent: int | None = None) -> str:
    """Strict JSON text of *obj* (non-finite floats as strings)."""
    return json.dumps(jsonable(obj), indent=indent, allow_nan=False)


@dataclass
class Finding:
    """A diagnosis result; see the module docstring for the JSON shape."""

    kind: Kind
    reason: str
    step: int | None = None
    rank: int | None = None
    node: str | None = None
    tensor: str | None = None
    module: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    structural: list[dict[str, Any]] = field(default_factory=list)
    crc_only: list[dict[str, Any]] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    suspects: list[dict[str, Any]] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    causes: list[dict[str, Any]] = field(default_factory=list)
    gap: dict[str, Any] | None = None
    dump_plan: dict[str, Any] | None = None
    #: host and device of ``rank`` (from a rank table, :mod:`precnb.io.rank_table`); left out of the JSON when None
    device: dict[str, str] | None = None
    #: what the pipeline assumed and the user did not give (:mod:`precnb.pipeline.assumptions`); set by diagnose
    assumptions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def found(self) -> bool:
        """False for kind ``"none"``."""
        return self.kind != "none"

    @property
    def nothing_compared(self) -> bool:
        """True for the answer of a pair that had no record in common (:mod:`precnb.analysis.compare.compared`)."""
        return self.kind == "none" and bool(isinstance(self.stats, dict) and self.stats.get("nothing_compared"))

    @property
    def title(self) -> str:
        """The heading every front end shows: the diagnosis' title, or "Nothing compared"."""
        from precnb.analysis.registry import title as kind_title

        return "Nothing compared" if self.nothing_compared else kind_title(self.kind)

    @property
    def headline(self) -> str:
        """``"{title}: {reason}"``, the reason without the words the title already says."""
        reason = self.reason.removeprefix("nothing was compared: ") if self.nothing_compared else self.reason
        return f"{self.title}: {reason}"

    def plan(self) -> dict[str, Any]:
        """The msprobe ``config.json`` (a dict) that confirms this finding, or closes its gap, on the next run.

        Set by the pipeline (:func:`precnb.diagnose`); see :func:`precnb.analysis.findings.plan.plan_dump`.

        Raises
        ------
        ValueError
            For a finding with nothing to dump (kind ``none``) or without a plan.
        """
        import copy

        if not self.found:
            raise ValueError("nothing was found: there is nothing to confirm")
        if not self.dump_plan:
            raise ValueError("this finding has no dump plan (findings from precnb.diagnose carry one)")
        return copy.deepcopy(self.dump_plan["config"])

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict (strict JSON values)."""
        d = {"schema": FINDING_SCHEMA, **asdict(self)}
        if d.get("device") is None:
            d.pop("device", None)
        return jsonable(d)

    def to_json(self, *, indent: int | None = 2) -> str:
        """Strict JSON text."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def summary(self, width: int | None = None) -> str:
        """A readable multi-line summary (what the CLI prints without ``--json``, 120 columns wide).

        Parameters
        ----------
        width : int or None
            Wrap the lines longer than *width* at a space, with a hanging indent (:func:`wrap_lines`: every
            word kept, none broken; stack frames and code to paste are not wrapped); None: one line per item.

        Returns
        -------
        str
            The summary's lines.
        """
        from precnb.analysis.registry import checklist

        checks = checklist(self)  # the pre-flight checks
        if checks:
            return "\n".join(wrap_lines(_checklist_summary(self, checks).split("\n"), width))
        title, _, reason = self.headline.partition(": ")
        lines = [f"{title.upper().replace('NAN/INF', 'NaN/Inf')}: {reason}"]
        for part in (_where_lines, _value_lines, _gap_lines, _difference_lines, _trend_lines, _plan_lines,
                     assumed_lines):
            lines += part(self)
        return "\n".join(wrap_lines(lines, width))


def _checklist_summary(f: Finding, checks: list[dict[str, Any]]) -> str:
    failed = sum(1 for c in checks if c.get("status") == "fail")
    n = {s: sum(1 for c in checks if c.get("status") == s) for s in ("pass", "warn", "skip")}
    head = (f"PRE-FLIGHT CHECK FAILED: {failed} of {len(checks)} checks" if f.found else
            f"PRE-FLIGHT: NO CHECK FAILED, {n['warn']} WARNING{'S' if n['warn'] > 1 else ''}: "
            f"{n['pass']} pass, {n['warn']} warn, {n['skip']} skip" if n["warn"] else
            f"PRE-FLIGHT CHECKS PASSED: {n['pass']} pass, {n['skip']} skip")
    tail = [f"  hint: {h}" for h in f.hints if h.startswith("later differences")]
    tail += [f"  then: {h}" for h in f.evidence.get("later_findings_text", [])]
    return "\n".join([head, *checklist_lines(checks), *tail, *assumed_lines(f)])


def _where_lines(f: Finding) -> list[str]:
    """Step, rank, device, node, tensor, module (and the baseline's where they differ); alignment; steps not read."""
    lines: list[str] = []
    if f.kind != "none":
        lines.append(f"  step {f.step}, rank {f.rank}{device_text(f.device)}")
        if f.node:
            lines.append(f"  node   {f.node}")
        if f.tensor:
            lines.append(f"  tensor {f.tensor}")
        if f.module:
            lines.append(f"  module {f.module}")
        b = f.baseline or {}
        differ = [k for k in ("node", "tensor", "module") if b.get(k) and b.get(k) != getattr(f, k)]
        for k in differ:
            lines.append(f"  baseline {k:<6} {b[k]}")
    aligned = f.evidence.get("alignment") if isinstance(f.evidence, dict) else None
    if aligned:
        lines.append(f"  aligned: {aligned}")
    skipped = f.stats.get("steps_not_searched") if isinstance(f.stats, dict) else None
    if skipped:
        from precnb.analysis.summary import format_ranges

        why = ("past the horizon (a random draw the layouts change by design) the runs are not comparable"
               if f.stats.get("horizon") else "a later step cannot come first")
        lines.append(f"  steps  {format_ranges(skipped)} not read: {why}")
    return lines


def _value_lines(f: Finding) -> list[str]:
    """The finding's values (one line per group, nested groups indented) and its causes."""
    lines: list[str] = []
    for k, v in f.values.items():
        if isinstance(v, dict):
            flat = {a: b for a, b in v.items() if not isinstance(b, dict)}
            vs = "  ".join(f"{a}={_fmt(b)}" for a, b in flat.items())
            lines.append(f"  {k:<9} {vs}")
            for a, b in v.items():
                if isinstance(b, dict):
                    lines.append(f"    {a:<9} " + "  ".join(f"{c}={_fmt(d)}" for c, d in b.items()))
    lines += [f"  {c}" for c in cause_lines(f)]
    return lines


def _gap_lines(f: Finding) -> list[str]:
    """The coverage gap (what the dump missed, how to capture it) and the hints."""
    lines: list[str] = []
    if f.gap:
        g = f.gap
        lines.append(f"  gap    in {g.get('module') or 'the model'}: {g['missing']}")
        for t in g.get("last_clean") or []:
            lines.append(f"    last clean  {t['tensor']}  {t['shape']}")
        lines.append(f"    first bad   {g['first_bad']['tensor']}  {g['first_bad']['shape']}")
        if g["capture"].get("register_custom_api"):  # a statement to paste and its comment
            lines.append(Statement(f"    capture     {g['capture']['register_custom_api']}"))
        lines.append(f"    capture     level {g['capture']['level']}, list {g['capture']['list']}")
    lines += [f"  hint: {h}" for h in f.hints]
    return lines


def _difference_lines(f: Finding) -> list[str]:
    """Structural and CRC-only differences, and the suspects (a few of each)."""
    lines: list[str] = []
    if f.structural:
        lines.append(f"  structural differences: {len(f.structural)} node(s) in one run only, e.g.")
        lines += [f"    {s['node']} (only in {s['only_in']})" for s in f.structural[:5]]
    if f.crc_only:
        lines.append(f"  CRC-only differences (statistics identical): {len(f.crc_only)}, e.g.")
        lines += [f"    step {c['step']} rank {c['rank']} {c['tensor']}" for c in f.crc_only[:3]]
    if f.suspects:
        lines.append("  suspects:")
        for s in f.suspects[:5]:
            lines.append(f"    step {s.get('step')} rank {s.get('rank')}{device_text(s.get('device'))} "
                         f"{s.get('tensor') or s.get('node')}"
                         f"  ({s.get('why', '')})")
    return lines


def _trend_lines(f: Finding) -> list[str]:
    """Modules by how many steps they led the loss / grad-norm change."""
    trend = f.evidence.get("trend") if isinstance(f.evidence, dict) else None
    if not trend:
        return []
    ch = trend.get("first_reference_change")
    lines = ["  trend  modules by lead time"
             + (f" before the loss / grad-norm change at step {ch}:" if ch is not None else
                " (no loss / grad-norm change recorded):")]
    for m in trend.get("modules", [])[:6]:
        lead = f", lead {m['lead_steps']} step(s)" if m.get("lead_steps") is not None else ""
        lines.append(f"    {m.get('module') or m['node']}: {m['stat']} {m['direction']} from step "
                     f"{m['onset_step']} (rank {m['rank']}{lead})")
    return lines


def _plan_lines(f: Finding) -> list[str]:
    """The dump plan (and its repro) and the innermost frames of the stack."""
    lines: list[str] = []
    if f.dump_plan:
        p = f.dump_plan
        lines.append(f"  plan: {p['summary']} (`precnb plan` writes the msprobe config.json)")
        if p.get("repro"):  # a tensor dump: the departing op re-run on its dumped inputs
            lines.append(Verbatim(f"  repro: {p['repro']}"))  # a command to paste: not wrapped
    stack = f.evidence.get("stack") or []
    if stack:
        lines.append("  stack (innermost first):")
        lines += [Verbatim("    " + fr.replace("\n", " ").strip()) for fr in stack[:4]]
    return lines

def assumed_lines(f: Any) -> list[str]:
    """The ``assumed:`` block of a finding's text: one line per assumption of the pipeline (none: no block).

    Examples
    --------
    >>> assumed_lines(Finding(kind="none", reason="", assumptions=[{"kind": "step_offset", "text": "offset 3"}]))
    ['  assumed:', '    offset 3']
    """
    got = [str(a.get("text") or a.get("kind")) for a in getattr(f, "assumptions", None) or []]
    return ["  assumed:", *(f"    {t}" for t in got)] if got else []


def device_text(device: Any) -> str:
    """`` (host 10.0.0.1, device 3)`` for a device dict, ``""`` for None.

    Examples
    --------
    >>> device_text({"host": "10.0.0.1", "device": "3"})
    ' (host 10.0.0.1, device 3)'
    """
    if not isinstance(device, dict) or "host" not in device:
        return ""
    return f" (host {device['host']}, device {device.get('device')})"


def shown_record(finding: Any, ranks: Any = ()) -> tuple[int, int, str] | None:
    """The (step, rank, tensor) a front end opens on for *finding*, or None when it names no record.

    The origin record (``values["origin"]``) when the finding has one — a loss spike's ``step`` is
    where the loss departs, its origin may come a step earlier; an origin rank of None (every
    rank) is the first of *ranks* —, else its own step, rank and tensor.

    Examples
    --------
    >>> f = Finding(kind="loss_spike", reason="", step=7, values={"origin": {"step": 6, "rank": None,
    ...             "tensor": "Tensor.add_.0.forward.output.0"}})
    >>> shown_record(f, ranks=[0, 1])
    (6, 0, 'Tensor.add_.0.forward.output.0')
    """
    if not getattr(finding, "found", False):
        return None
    origin = (finding.values or {}).get("origin") if isinstance(finding.values, dict) else None
    step, rank, tensor = finding.step, finding.rank, finding.tensor
    if isinstance(origin, dict) and origin.get("tensor") and origin.get("step") is not None:
        step, rank, tensor = origin["step"], origin.get("rank"), origin["tensor"]
        if rank is None and len(ranks):
            rank = ranks[0]
    if step is None or rank is None or tensor is None:
        return None
    return int(step), int(rank), str(tensor)


def checklist_lines(checks: list[dict[str, Any]]) -> list[str]:
    """One line per pre-flight check: ``  [FAIL] frozen: frozen in the target only: ...``.

    Examples
    --------
    >>> checklist_lines([{"name": "frozen", "status": "fail", "message": "w frozen"}])
    ['  [FAIL] frozen: w frozen']
    """
    return [f"  [{str(c.get('status', '')).upper():4}] {c.get('name')}: {' '.join(str(c.get('message', '')).split())}"
            for c in checks]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)
