"""Plain view models of findings and tables for the report template (strings, no HTML).

Everything returned here is text; the template escapes it (jinja2 autoescape), so module
names, node names, file paths, stack frames and hints from a dump are always shown as text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from precnb.analysis.findings.evidence import parse_frame

__all__ = [
    "Cell",
    "diagnosis_sections",
    "finding_view",
    "fmt",
    "parse_frame",
    "preflight_view",
]

STATS = ("max", "min", "mean", "norm")


def _checked(kind: str) -> str:
    from precnb.analysis.registry import get

    try:
        return get(kind).description
    except KeyError:
        return ""


class Cell(str):
    """A table cell's text, with a CSS class (``nf`` non-finite, ``num`` number, ...)."""

    cls: str = ""

    def __new__(cls, text: Any, css: str = "") -> Cell:
        obj = super().__new__(cls, "" if text is None else str(text))
        obj.cls = css
        return obj


def pair_cell(target: Cell, baseline: Cell) -> Cell:
    r"""One cell holding the target's value over the baseline's (class ``pair``; ``nf`` if either is).

    Examples
    --------
    >>> c = pair_cell(fmt(1.5), fmt(float("nan")))
    >>> c.split("\n"), c.cls
    (['1.5', 'nan'], 'num pair nf')
    """
    flags = " nf" if "nf" in target.cls or "nf" in baseline.cls else ""
    return Cell(f"{target}\n{baseline}", f"num pair{flags}")


def fmt(v: Any) -> Cell:
    """Format a value for a table cell: 6 significant digits, non-finite flagged ``nf``.

    Examples
    --------
    >>> fmt(0.1234567), fmt(float("nan")).cls, fmt("inf").cls, fmt(None)
    ('0.123457', 'nf num', 'nf num', 'null')
    """
    if v is None:
        return Cell("null", "null")
    if isinstance(v, (bool, np.bool_)):
        return Cell(str(bool(v)).lower())
    if isinstance(v, (int, np.integer)):
        return Cell(str(int(v)), "num")
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isnan(f):
            return Cell("nan", "nf num")
        if math.isinf(f):
            return Cell("inf" if f > 0 else "-inf", "nf num")
        return Cell(f"{f:.6g}", "num")
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return Cell(v, "nf num")
    if isinstance(v, (list, tuple)):
        return Cell(", ".join(str(x) for x in v))
    return Cell(str(v))


def _is_side(v: Any) -> bool:
    return isinstance(v, dict) and ("present" in v or any(s in v for s in STATS))


def _values_tables(values: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """Statistics of each side (baseline / target / entry) as one table, plus scalars."""
    sides = [(k, v) for k, v in values.items() if _is_side(v)]
    scalars = [(k, v) for k, v in values.items() if not isinstance(v, dict) and k != "present"]
    nested = [(k, v) for k, v in values.items() if isinstance(v, dict) and not _is_side(v)]
    tables: list[dict[str, Any]] = []
    if sides or scalars:
        stats = [s for s in STATS if any(s in v for _, v in sides)]
        extra = sorted({k for _, v in sides for k, x in v.items()
                        if k not in (*STATS, "present", "dtype", "shape", "crc") and not isinstance(x, dict)})
        rows = []
        for s in [*stats, *extra]:
            rows.append({"label": s, "cells": [fmt(v.get(s)) if s in v else Cell("—", "absent")
                                               for _, v in sides]})
        for meta in ("dtype", "shape", "crc"):
            if any(meta in v for _, v in sides):
                rows.append({"label": meta, "cells": [Cell(v.get(meta, "—"), "meta") for _, v in sides]})
        if any(v.get("present") is False for _, v in sides):
            rows.append({"label": "recorded", "cells": [Cell("yes" if v.get("present", True) else "no")
                                                        for _, v in sides]})
        tables.append({"title": title, "columns": [k for k, _ in sides], "rows": rows,
                       "scalars": [(k, fmt(v)) for k, v in scalars]})
    for k, v in nested:
        sub_title = f"{k.replace('_', ' ')}" + (f": {v['tensor']}" if isinstance(v.get("tensor"), str) else "")
        inner = {a: b for a, b in v.items() if a != "tensor"}
        if any(_is_side(b) for b in inner.values()):
            tables += _values_tables(inner, sub_title)
        else:
            tables.append({"title": sub_title, "columns": [], "rows": [],
                           "scalars": [(a, fmt(b)) for a, b in inner.items() if not isinstance(b, dict)]})
    return tables


def _suspects(rows: Sequence[dict[str, Any]], limit: int) -> dict[str, Any]:
    keys = ["step", "rank", "node", "tensor", "why"]
    if any(isinstance(r.get("device"), dict) for r in rows):  # a rank table: the device beside the rank
        keys.insert(2, "device")
        rows = [{**r, "device": f"{r['device'].get('host')}:{r['device'].get('device')}"}
                if isinstance(r.get("device"), dict) else r for r in rows]
    extra = [k for k in ("stat", "value", "reference", "score", "rel_diff", "epoch", "group")
             if any(k in r for r in rows)]
    out = []
    for i, r in enumerate(rows[:limit]):
        cells = [Cell(str(i + 1), "num")] + [
            (Cell(r[k], "name") if k in ("node", "tensor") else fmt(r.get(k))) if k in r else Cell("")
            for k in keys + extra]
        out.append(cells)
    return {"columns": ["#", *keys, *extra], "rows": out, "total": len(rows)}


def _device_text(d: dict[str, Any]) -> str:
    """``10.0.0.1:1 — suspect`` for a finding dict's device, marked from its replica departure's candidates."""
    dev = d["device"]
    text = f"{dev.get('host')}:{dev.get('device')}"
    cands = (d.get("evidence") or {}).get("candidates") or []
    mine = [c for c in cands if c.get("rank") == d.get("rank")]
    if mine and mine[0].get("wrong_side"):
        return text + " — suspect device (the wrong side of the departure)"
    if mine and len(cands) > 1:
        others = ", ".join(f"rank {c['rank']} on {c['device']['host']}:{c['device']['device']}" for c in cands
                           if c is not mine[0] and isinstance(c.get("device"), dict))
        return text + f" — one of {len(cands)} candidate devices" + (f" (also {others})" if others else "")
    return text


def finding_view(finding: Any, *, limit: int = 50) -> dict[str, Any]:
    """Everything the template shows about one Finding, as text.

    Parameters
    ----------
    finding : Finding
    limit : int
        Most suspects / structural rows listed.

    Returns
    -------
    dict
    """
    d = finding.to_dict()  # strict-JSON values: non-finite floats are "nan"/"inf" strings
    kind = d["kind"]
    found = kind != "none"
    ev = dict(d.get("evidence") or {})
    for key in ("checks", "diagnosis", "later_findings", "later_findings_text"):  # the pre-flight section shows them
        ev.pop(key, None)
    from precnb.analysis.registry import checklist

    if found and checklist(finding) is not None:  # the pre-flight checks: the checklist shows them
        d["values"] = {}
    stack = [parse_frame(f) for f in ev.pop("stack", []) or []]
    trend = ev.pop("trend", None)
    module_path = [str(m) for m in ev.pop("module_path", []) or []]
    where = [(k, fmt(d.get(k))) for k in ("step", "rank", "node", "tensor", "module") if d.get(k) is not None
             and not (k == "tensor" and d.get("tensor") == d.get("node"))]  # monitor rows: node == tensor
    if isinstance(d.get("device"), dict):  # a rank table was given (issue #28): the device beside the rank
        where.insert([k for k, _ in where].index("rank") + 1 if "rank" in [k for k, _ in where] else 0,
                     ("device", Cell(_device_text(d))))
    if "target_step" in (d.get("values") or {}):
        where.insert(1, ("target step", fmt(d["values"]["target_step"])))
    base = d.get("baseline") or {}
    for k in ("node", "tensor", "module"):  # runs whose names differ: the baseline's name of the same place
        if base.get(k) and base.get(k) != d.get(k):
            where.append((f"baseline {k}", fmt(base[k])))
    extra_ev = []
    for k, v in ev.items():
        if isinstance(v, list):
            shown = ", ".join(str(x) for x in v[:12]) + (f" … ({len(v)} in all)" if len(v) > 12 else "")
            extra_ev.append((k.replace("_", " "), Cell(shown)))
        elif isinstance(v, dict):
            extra_ev.append((k.replace("_", " "), Cell(", ".join(f"{a}: {b}" for a, b in v.items()
                                                                  if not isinstance(b, dict)))))
        else:
            extra_ev.append((k.replace("_", " "), fmt(v)))
    stats = [(k.replace("_", " "), fmt(v)) for k, v in (d.get("stats") or {}).items()
             if not isinstance(v, (dict, list))]
    for k, v in (d.get("stats") or {}).items():
        if isinstance(v, dict):
            stats.append((k.replace("_", " "), Cell(", ".join(f"{a}={b}" for a, b in v.items()))))
    structural = [[fmt(s.get("node")), fmt(s.get("only_in")), fmt(s.get("step")), fmt(s.get("rank")),
                   fmt(s.get("count"))] for s in (d.get("structural") or [])[:limit]]
    crc = [[fmt(c.get("step")), fmt(c.get("rank")), fmt(c.get("tensor"))] for c in (d.get("crc_only") or [])[:limit]]
    return {
        "kind": kind,
        "found": found,
        "title": finding.title,  # "Nothing compared" for a pair with no record in common
        "checked": _checked(kind),
        "reason": d.get("reason", ""),
        "where": where,
        "values": _values_tables(d.get("values") or {}, "values at the finding"),
        "hints": [str(h) for h in d.get("hints") or []],
        "suspects": _suspects(d.get("suspects") or [], limit),
        "stack": stack,
        "user_frames": sum(1 for f in stack if not f["lib"]),
        "module_path": list(reversed(module_path)),  # outermost first
        "evidence": extra_ev,
        "structural": structural,
        "structural_total": len(d.get("structural") or []),
        "crc_only": crc,
        "stats": stats,
        "causes": [{"text": str(c.get("text", "")), "certain": bool(c.get("certain"))} for c in d.get("causes") or []],
        "gap": _gap_view(d.get("gap")),
        "plan": _plan_view(d.get("dump_plan")),
        "trend": _trend_view(trend),
    }


def _gap_view(gap: Any) -> dict[str, Any] | None:
    """The coverage gap as text rows (escaped by the template)."""
    if not isinstance(gap, dict):
        return None
    cap = gap.get("capture") or {}
    return {"module": str(gap.get("module") or "the model"), "missing": str(gap.get("missing", "")),
            "first_bad": str((gap.get("first_bad") or {}).get("tensor", "")),
            "gradient_of": str(gap.get("gradient_of") or ""),
            "last_clean": [str(t.get("tensor", "")) for t in gap.get("last_clean") or []],
            "region_inputs": [str(t.get("tensor", "")) for t in gap.get("region_inputs") or []],
            "source": [str(x) for x in gap.get("source") or []],
            "module_backward": gap.get("module_backward") or None,
            "register": str(cap.get("register_custom_api") or ""), "list": [str(x) for x in cap.get("list") or []],
            "why": str(cap.get("why", ""))}


def _plan_view(plan: Any) -> dict[str, Any] | None:
    """The dump plan: summary, the config.json text, notes."""
    if not isinstance(plan, dict):
        return None
    import json

    return {"summary": str(plan.get("summary", "")), "estimate": str(plan.get("estimate", "")),
            "config": json.dumps(plan.get("config", {}), indent=2),
            "nodes": [str(n) for n in (plan.get("selects") or {}).get("nodes", [])[:20]],
            "register": str(plan.get("register_custom_api") or ""),
            "notes": [str(n) for n in plan.get("notes") or []]}


def _trend_view(trend: Any) -> dict[str, Any] | None:
    """Modules ranked by lead time (onset step, statistic, direction)."""
    if not isinstance(trend, dict) or not trend.get("modules"):
        return None
    rows = [[fmt(m.get("module") or m.get("node")), fmt(m.get("stat")), fmt(m.get("direction")),
             fmt(m.get("onset_step")), fmt(m.get("rank")),
             fmt(m.get("lead_steps")) if m.get("lead_steps") is not None else Cell("—")]
            for m in trend["modules"][:20]]
    return {"change": trend.get("first_reference_change"), "rows": rows}


def diagnosis_sections(findings: Sequence[Any], *, rows: int = 50) -> list[dict[str, Any]]:
    """The report tables the findings' diagnoses give themselves (:attr:`ReportHooks.section`), as cells.

    A section is ``{"title", "caption", "columns", "rows"}`` of plain values; names (``node``, ``tensor``,
    ``module`` columns) wrap, numbers are formatted as everywhere else, everything is escaped.
    """
    from precnb.analysis.registry import lookup

    out = []
    for f in findings:
        d = lookup(f.kind)
        if d is None or d.report.section is None or not (sec := d.report.section(f, rows=rows)):
            continue
        cols = [str(c) for c in sec.get("columns") or []]
        cells = [[_section_cell(c, v) for c, v in zip(cols, r, strict=False)] for r in sec.get("rows") or []]
        out.append({"title": str(sec.get("title") or d.title), "caption": str(sec.get("caption") or ""),
                    "cls": str(sec.get("cls") or "section"), "columns": cols, "rows": cells})
    return out


def _section_cell(column: str, v: Any) -> Cell:
    """A section's value as a cell: ``{"value", "bad"}`` marks a problem (red); names wrap."""
    if isinstance(v, dict) and "value" in v:
        return Cell(v["value"], "nf" if v.get("bad") else "")
    if column in ("node", "tensor", "module") and v is not None:
        return Cell(str(v), "name")
    return fmt(v)


def preflight_view(finding: Any) -> dict[str, Any]:
    """The pre-flight checklist of the pipeline's ``preflight`` result (found or not), as text rows.

    Returns
    -------
    dict
        ``status`` (worst), ``rows`` (``name``, ``title``, ``status``, ``message``, ``confidence``,
        ``basis``), ``failed`` / ``warned`` (how many), ``root_cause`` (a warning names a likely root cause),
        ``later`` (findings after a failure, as text).
    """
    checks = [c for c in (finding.evidence.get("checks") or []) if isinstance(c, dict)]
    rows = [{"name": str(c.get("name", "")), "title": str(c.get("title") or c.get("name", "")),
             "status": str(c.get("status", "")), "message": str(c.get("message", "")),
             "confidence": str(c.get("confidence") or ""), "basis": str(c.get("basis") or "")} for c in checks]
    return {"status": str(finding.stats.get("status", "")), "rows": rows,
            "failed": sum(1 for r in rows if r["status"] == "fail"),
            "warned": sum(1 for r in rows if r["status"] == "warn"),
            "root_cause": any((c.get("details") or {}).get("root_cause") for c in checks),
            "later": [str(t) for t in finding.evidence.get("later_findings_text") or []]}

