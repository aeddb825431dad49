"""Plain view models of findings and tables for the report template (strings, no HTML).

Everything returned here is text; the template escapes it (jinja2 autoescape), so module
names, node names, file paths, stack frames and hints from a dump are always shown as text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from precnb.analysis.evidence import parse_frame

__all__ = [
    "Cell",
    "detail_table",
    "diagnosis_sections",
    "finding_view",
    "fmt",
    "hotspot_table",
    "parse_frame",
    "preflight_view",
]

_STATS = ("max", "min", "mean", "norm")


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
    return isinstance(v, dict) and ("present" in v or any(s in v for s in _STATS))


def _values_tables(values: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """Statistics of each side (baseline / target / entry) as one table, plus scalars."""
    sides = [(k, v) for k, v in values.items() if _is_side(v)]
    scalars = [(k, v) for k, v in values.items() if not isinstance(v, dict) and k != "present"]
    nested = [(k, v) for k, v in values.items() if isinstance(v, dict) and not _is_side(v)]
    tables: list[dict[str, Any]] = []
    if sides or scalars:
        stats = [s for s in _STATS if any(s in v for _, v in sides)]
        extra = sorted({k for _, v in sides for k, x in v.items()
                        if k not in (*_STATS, "present", "dtype", "shape", "crc") and not isinstance(x, dict)})
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


def _window(ds: xr.Dataset, step: int, rank: int, tensor: str | None, before: int, after: int) -> list[str]:
    """Tensors recorded at (step, rank) around *tensor* in execution order."""
    e = ds.sel(step=step, rank=rank)
    seq = np.asarray(e["seq"].values, dtype=np.int64)
    present = np.asarray(e["present"].values, bool) & (seq >= 0)
    labels = ds["tensor"].values
    known = tensor is not None and tensor in ds.indexes["tensor"]
    s0 = int(seq[ds.indexes["tensor"].get_loc(tensor)]) if known else -1
    if s0 < 0:
        idx = np.flatnonzero(present)
        idx = idx[np.argsort(seq[idx], kind="stable")][: before + after + 1]
    else:
        idx = np.flatnonzero(present & (seq >= s0 - before) & (seq <= s0 + after))
        idx = idx[np.argsort(seq[idx], kind="stable")]
    return [str(labels[i]) for i in idx]


def detail_table(data: Any, combined: xr.Dataset | None, finding: Any, *, rows: int = 40) -> dict[str, Any] | None:
    """Records around the finding at its (step, rank): values, module, dtype, shape.

    Parameters
    ----------
    data : ReportData
    combined : xarray.Dataset or None
        Baseline and target as runs (comparison reports).
    finding : Finding or None
    rows : int
        Most records.

    Returns
    -------
    dict or None
        ``title``, ``columns`` and ``rows`` (lists of :class:`Cell`), ``focus`` row index.
    """
    from precnb.analysis.findings import shown_record
    from precnb.viz import detail_frame

    ds = data.target
    rec = shown_record(finding, [int(r) for r in ds["rank"].values]) if finding is not None else None
    if rec is not None and rec[2] in ds.indexes["tensor"]:  # the origin record, when the finding has one
        step, rank, tensor = rec
    elif finding is not None and finding.found and finding.step is not None and finding.rank is not None:
        step, rank, tensor = int(finding.step), int(finding.rank), finding.tensor
    else:
        if not (ds.sizes["step"] and ds.sizes["rank"]):
            return None
        step, rank, tensor = int(ds["step"].values[0]), int(ds["rank"].values[0]), None
    before, after = rows // 3, rows - rows // 3 - 1
    if combined is not None:
        names = [str(r) for r in combined["run"].values]
        side = combined.sel(run=names[1])
        if tensor is not None and tensor in side.indexes["tensor"] and step in side.indexes["step"] \
                and rank in side.indexes["rank"] and not bool(side["present"].sel(step=step, rank=rank,
                                                                                   tensor=tensor)):
            side = combined.sel(run=names[0])  # only in the baseline: its execution order
        if step not in side.indexes["step"] or rank not in side.indexes["rank"]:
            return None
        window = _window(side, step, rank, tensor, before, after)
        from precnb.viz.series import shard_kinds

        frame = detail_frame(combined, step=step, rank=rank, tensors=window, run=names[1], baseline=names[0],
                             limit=len(window) + 1, merged=shard_kinds(data.target))
        order = {t: i for i, t in enumerate(window)}
        frame = frame.assign(_o=frame["tensor"].map(order)).sort_values("_o", kind="stable").drop(columns="_o")
        from precnb.report._tensor_cols import metric_columns  # issue #17: whole-tensor metrics

        metrics = metric_columns(data, step=step, rank=rank, tensors=window)
        return _detail_rows(frame, step, rank, tensor, names, metrics=metrics)
    else:
        if step not in ds.indexes["step"] or rank not in ds.indexes["rank"]:
            return None
        window = _window(ds, step, rank, tensor, before, after)
        frame = detail_frame(ds, step=step, rank=rank, tensors=window, limit=len(window) + 1)
        names = []
    return _detail_rows(frame, step, rank, tensor, names)


def _detail_rows(frame: pd.DataFrame, step: int, rank: int, tensor: str | None, names: list[str],
                 metrics: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    base = names[0] if names else None
    stat_cols = [s for s in _STATS if s in frame.columns]
    extra = [c for c in frame.columns if c in ("nans", "zeros")]
    cols = ["seq", "tensor", "module", "role", "dtype", "shape"]
    header = [*cols, *stat_cols, *extra]
    if base is not None:  # one cell per statistic, the target's value over the baseline's: fits a 1400 px page
        header = [*cols, *[f"{s} ({names[1]} / {base})" for s in stat_cols], "rel. diff"]
    if metrics:
        from precnb.report._tensor_cols import METRIC_HEADERS

        header += list(METRIC_HEADERS.values())
    out, focus = [], None
    for i, r in enumerate(frame.to_dict("records")):
        null = int(r.get("null_stats", 0) or 0)
        bnull = int(r.get(f"null_stats_{base}", 0) or 0) if base is not None else 0
        partial = str(r.get("merged", "") or "") == "partial_sum"  # only its mean merges from shard statistics
        cells = [fmt(int(r["seq"])) if int(r["seq"]) >= 0 else Cell("—", "absent"),
                 Cell(r["tensor"], "name"), Cell(r["module"] or "—", "name short"), Cell(r["role"]),
                 Cell(str(r["dtype"]).removeprefix("torch."), "meta"), Cell(r["shape"], "meta")]
        bits = {"max": 1, "min": 2, "mean": 4, "norm": 8}
        own = [(Cell("Σ (partial sum)", "num null") if partial else Cell("null", "num null")) if null & bits[s]
               else fmt(r[s]) for s in stat_cols]
        if base is None:
            cells += own
            cells += [fmt(r[c]) for c in extra]
        else:
            cells += [pair_cell(v, Cell("null", "num null") if bnull & bits[s] else fmt(r.get(f"{s}_{base}")))
                      for s, v in zip(stat_cols, own, strict=True)]
            rel = r.get("rel_diff")
            cells.append(Cell("—", "absent") if rel is None or (isinstance(rel, float) and math.isnan(rel))
                         else fmt(rel))
        if metrics:
            got = metrics.get(r["tensor"])
            cells += [Cell("—", "absent") if got is None or math.isnan(got[k]) else fmt(got[k])
                      for k in METRIC_HEADERS]
        if r["tensor"] == tensor:
            focus = i
        out.append(cells)
    where = f"step {step}, rank {rank}"
    title = (f"Records around the finding at {where}, in execution order" if tensor else
             f"First records of {where}, in execution order")
    return {"title": title, "columns": header, "rows": out, "focus": focus}


def hotspot_table(frame: pd.DataFrame | None, *, rows: int = 15) -> dict[str, Any] | None:
    """The heat map's worst cells, one per module: where to look first, as text."""
    if frame is None or not len(frame):
        return None
    mode = frame.attrs.get("color", "stat")
    f = frame[frame["tensor"].astype(str) != ""]
    if not len(f):
        return None
    key = "nonfinite" if mode in ("nonfinite", "events") else "color"
    f = f.assign(_k=f[key].astype(float).fillna(-np.inf))
    if mode == "stat":  # cells holding only non-finite values first
        f = f.assign(_k=np.where(f["value"].isna() & (f["nonfinite"] > 0), np.inf, f["_k"]))
    best = f.sort_values(["_k", "row_order"], ascending=[False, True], kind="stable").drop_duplicates("row")
    nf = frame.groupby("row")["nonfinite"].sum()
    out = []
    for r in best.head(rows).to_dict("records"):
        out.append([Cell(r["row"], "name"), Cell(r["value_text"], "num nf" if r["nonfinite"] and mode != "reldiff"
                                                 and r["value_text"] in ("nan", "non-finite", "inf") else "num"),
                    Cell(r["tensor"], "name"), fmt(int(r["worst_step"])), fmt(int(r["worst_rank"])),
                    fmt(int(nf.get(r["row"], 0)))])
    what = {"reldiff": "largest rel. diff", "events": "NaN / new inf records", "nonfinite": "non-finite records"
            }.get(mode, "largest value")
    return {"columns": ["module", what, "worst tensor", "step", "rank", "non-finite records"], "rows": out}


def diagnosis_sections(findings: Sequence[Any], *, rows: int = 50) -> list[dict[str, Any]]:
    """The report tables the findings' diagnoses give themselves (:attr:`Diagnosis.section`), as cells.

    A section is ``{"title", "caption", "columns", "rows"}`` of plain values; names (``node``, ``tensor``,
    ``module`` columns) wrap, numbers are formatted as everywhere else, everything is escaped.
    """
    from precnb.analysis.registry import lookup

    out = []
    for f in findings:
        d = lookup(f.kind)
        if d is None or d.section is None or not (sec := d.section(f, rows=rows)):
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
