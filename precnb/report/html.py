"""One self-contained, offline HTML file per incident: findings, linked charts, tables.

The page inlines one vega/vega-lite/vega-embed bundle (from vl-convert) and a few lines of
page script that embed every chart spec; no URL is loaded. All text from the dump (module
and node names, paths, stack frames, hints) goes through jinja2's autoescape; chart specs
sit in ``<script type="application/json">`` blocks with ``<``, ``>`` and ``&`` escaped.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from precnb._args import baseline_keyword
from precnb.report._charts import ChartSpec, Limits, build_charts, comparison_dataset
from precnb.report._diagnose import normalize_findings, primary, sort_findings
from precnb.report._inputs import ReportData, from_triage

__all__ = ["render", "to_html", "write_html"]


@functools.lru_cache(maxsize=1)
def _env() -> Any:
    """The report's jinja2 environment, made once (it reloads a template whose file changed)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("precnb", "templates/report"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "htm", "xml", "j2"),
                                            default_for_string=True, default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["script_json"] = script_json
    env.filters["wrapdots"] = wrapdots
    env.filters["wrapname"] = wrapname
    return env


def wrapdots(text: Any) -> Any:
    """Escape *text*, then allow line breaks after ``.`` and ``/`` (long tensor names, paths).

    Examples
    --------
    >>> str(wrapdots("a.b<c>"))
    'a.<wbr>b&lt;c&gt;'
    """
    from markupsafe import Markup, escape

    safe = str(escape(str(text)))  # no markup from the data survives escaping
    return Markup(safe.replace(".", ".<wbr>").replace("/", "/<wbr>"))  # noqa: S704 - escaped above


_NAME_BREAKS = (".forward", ".backward", ".input", ".output", ".parameters", ".kwargs", ".args")


def wrapname(text: Any) -> Any:
    """Escape a tensor / node / module name; allow line breaks only between its parts, not at every dot.

    Breaks go before the direction and role (``.forward``, ``.output``, ...) and after ``/`` (kernel
    scopes), so ``Module.blocks.0.mlp.MLP.forward.0.output.0`` takes at most three lines.

    Examples
    --------
    >>> str(wrapname("Module.a.b.Linear.forward.0.output.0"))
    'Module.a.b.Linear<wbr>.forward.0<wbr>.output.0'
    >>> str(wrapname("Default/net-<X>/Mul-op1"))
    'Default/<wbr>net-&lt;X&gt;/<wbr>Mul-op1'
    """
    from markupsafe import Markup, escape

    safe = str(escape(str(text)))  # no markup from the data survives escaping
    for part in _NAME_BREAKS:
        safe = safe.replace(part, "<wbr>" + part)
    return Markup(safe.replace("/", "/<wbr>"))  # noqa: S704 - escaped above


def script_json(obj: Any) -> Any:
    r"""Strict JSON for a ``<script type="application/json">`` block (``<``, ``>``, ``&`` escaped).

    Examples
    --------
    >>> str(script_json({"m": "</script><b>"}))
    '{"m": "\\u003c/script\\u003e\\u003cb\\u003e"}'
    """
    from markupsafe import Markup

    from precnb.analysis.findings import jsonable
    from precnb.report._assets import escape_script_json

    text = escape_script_json(json.dumps(jsonable(obj), allow_nan=False, ensure_ascii=False))
    return Markup(text)  # noqa: S704 - every markup-significant character is escaped above


def _ranges(vals: Sequence[int]) -> str:
    from precnb.analysis.summary import format_ranges

    text = format_ranges(vals, sep=", ", dash="–", empty="—")
    return text if len(text) <= 60 else text[:57] + "…"


def _run_info(ds: Any, name: str, role: str) -> dict[str, Any]:
    from precnb.analysis.summary import summarize

    s = summarize(ds)
    nf = s["nonfinite"]
    return {
        "role": role,
        "name": name,
        "source": s["source"] or "(in memory)",
        "format": s["format"] or "—",
        "task": s["task"] or "—",
        "level": s["level"] or "—",
        "framework": s["framework"] or "—",
        "steps": _ranges(s["steps"]),
        "n_steps": len(s["steps"]),
        "ranks": _ranges(s["ranks"]),
        "n_ranks": len(s["ranks"]),
        "tensors": s["tensors"],
        "nodes": s["nodes"],
        "records": s["records"],
        "nan_values": nf["nan_values"],
        "inf_values": nf["inf_values"],
        "dtypes": ", ".join(f"{k or '?'} {v}" for k, v in list(s["dtypes"].items())[:6]),
        "skipped": len(s.get("skipped_files") or []),
    }


def render(
    data: ReportData,
    findings: list[Any],
    *,
    title: str | None = None,
    stat: str = "norm",
    limits: Limits | None = None,
    checks: list[str] | None = None,
) -> str:
    """Render the page for prepared inputs and findings (see :func:`to_html`)."""
    from markupsafe import Markup

    from precnb._marks import html_marker
    from precnb._version import __version__
    from precnb.report import _detail
    from precnb.report import _tables as tables
    from precnb.report._assets import package_text, script_safe, vega_bundle

    lim = limits or Limits()
    focus = primary(findings)
    combined = comparison_dataset(data) if data.compared else None
    from altair.utils.schemapi import debug_mode

    with debug_mode(False):  # no schema check of each altair object as it is made: the builders are tested
        charts: list[ChartSpec] = build_charts(data, focus, stat=stat, limits=lim, combined=combined)
    linked = next((c for c in charts if c.kind == "linked"), None)
    name = data.names[1]
    shown_target = data.raw_target if data.raw_target is not None else data.target
    runs = [_run_info(shown_target, name, "target" if data.compared else "run")]
    if data.baseline is not None:
        shown_base = data.raw_baseline if data.raw_baseline is not None else data.baseline
        runs.insert(0, _run_info(shown_base, data.names[0], "baseline"))
    layout_lines = [f"{role}: {lay.describe()}" for role, lay in (("target", data.layout),
                                                                   ("baseline", data.baseline_layout))
                    if lay is not None]
    if data.compared and data.step_offset not in (0, "0"):
        layout_lines.append(f"target step = baseline step + {data.step_offset}"
                            + ("" if isinstance(data.step_offset_asked, int) else " (found automatically)"))
    from precnb.analysis.registry import checklist

    pre = next((f for f in findings if checklist(f) is not None), None)  # the pre-flight checks
    # the checklist has its own section; a clean pre-flight result needs no finding card
    views = [tables.finding_view(f, limit=lim.table_rows) for f in findings if f.found or f is not pre]
    verdict = ("problem" if any(v["found"] for v in views) else "clean") if views else "none"
    if findings and findings[0].nothing_compared:  # the pipeline puts it first: not a clean result
        verdict = "nothing"
    elif verdict == "clean" and pre is not None and pre.stats.get("status") == "warn":
        verdict = "warn"  # nothing found, but a pre-flight warning may be the cause (a weight left at zero)
    ctx = {
        "title": title or (f"{data.names[1]} vs {data.names[0]}" if data.compared else name),
        "compared": data.compared,
        "names": data.names,
        "runs": runs,
        "layout": layout_lines,
        "notes": data.notes,
        "assumptions": [{"kind": str(a.get("kind")), "text": str(a.get("text") or a.get("kind"))}
                        for a in data.assumptions],
        "generated": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "version": __version__,
        "marker": Markup(html_marker("report")),  # noqa: S704 - precnb's own tag (precnb._marks)
        "verdict": verdict,
        "findings": views,
        "preflight": tables.preflight_view(pre) if pre is not None else None,
        "checks": checks or [],
        "charts": [{"id": c.id, "title": c.title, "caption": c.caption, "spec": c.spec, "kind": c.kind}
                   for c in charts],
        "detail": _detail.detail_table(data, combined, focus, rows=lim.detail_rows),
        "hotspots": _detail.hotspot_table(linked.frame if linked is not None else None),
        "sections": tables.diagnosis_sections(findings, rows=lim.table_rows),
        "findings_json": [f.to_dict() for f in findings],
        "findings_pretty": json.dumps([f.to_dict() for f in findings], indent=2, ensure_ascii=False),
        "css": package_text("report.css"),
        "page_js": script_safe(package_text("report.js")),
        "vega_js": vega_bundle(),
    }
    for key in ("css", "page_js", "vega_js"):
        ctx[key] = Markup(ctx[key])  # noqa: S704 - package files, checked by script_safe
    return _env().get_template("report.html.j2").render(**ctx)


def to_html(
    ds_or_runs: Any,
    *,
    baseline: Any = None,
    findings: Any = None,
    title: str | None = None,
    names: Sequence[str] | None = None,
    stat: str = "norm",
    limits: Limits | None = None,
    **options: Any,
) -> str:
    """Build the self-contained HTML report of one run, or of a target against a baseline.

    The report shows what :func:`precnb.diagnose` finds for these inputs and options, so it
    agrees with ``precnb diff`` / ``nan`` / ``anomalies`` / ``replicas`` and the explorer.

    Parameters
    ----------
    ds_or_runs : Triage, xarray.Dataset, path, mapping or dataset with a ``run`` dim
        A :class:`precnb.Triage` (its runs and findings are shown as they are); or one run;
        ``{"gpu": a, "npu": b}`` (first = baseline); or a dataset holding runs.
    baseline : xarray.Dataset, path or str, optional
        The run to compare against (a dataset / path, or the name of one of the runs).
    findings : Finding or sequence of Finding, optional
        Show these instead of the pipeline's findings (``[]``: no findings section).
    title : str, optional
        Page title (default: the run name).
    names : (str, str), optional
        Display names of (baseline, target).
    stat : str
        Statistic the charts draw (``"norm"``, ``"max"``, ...).
    limits : Limits, optional
        Size bounds (rows, buckets) of charts and tables.
    **options
        Pipeline options (see :class:`precnb.Options`): ``target_layout`` (alias ``layout``),
        ``baseline_layout``, ``step_offset``, ``tolerance``, ``mapping``, ``steps``, ``ranks``, ...

    Returns
    -------
    str
        The page: no external URL, one inlined vega bundle, bounded in size however many
        ranks the run has (charts aggregate to top modules × step / rank buckets).

    Examples
    --------
    >>> import precnb
    >>> page = precnb.report.to_html(precnb.sample_path("dp_nan"))  # doctest: +SKIP
    >>> "NaN/Inf origin" in page  # doctest: +SKIP
    True
    """
    from precnb.pipeline import diagnose
    from precnb.pipeline.inputs import normalize

    inp = normalize(ds_or_runs, baseline)  # the one input model (issue #27), as the pipeline and the explorer
    if inp.triage is not None:
        if options:
            raise ValueError("a Triage already holds its runs and options; pass neither baseline nor options")
        triage = inp.triage
    else:
        triage = diagnose(inp, **options)
    data = from_triage(triage)
    if names is not None:
        data.names = (str(names[0]), str(names[1]))
    if findings is None:
        found = list(triage.findings)
        checks = [c["description"] for c in triage.checks if c["status"] != "not applicable"]
    else:
        found, checks = sort_findings(normalize_findings(findings)), None
    return render(data, found, title=title, stat=stat, limits=limits, checks=checks)


@baseline_keyword(2, call="target, path")
def write_html(ds_or_runs: Any, path: str | os.PathLike[str], *, baseline: Any = None, overwrite: bool = False,
               inputs: Sequence[str | os.PathLike[str]] = (), **kw: Any) -> Path:
    """Write :func:`to_html` to *path* (UTF-8, atomically) and return the path.

    The write follows :mod:`precnb._write`: the parent folder must exist, the file must not be
    inside an input (the paths given, the datasets' recorded sources, *inputs*), and an existing
    file is replaced only with *overwrite* and only when it is a precnb output.

    Parameters
    ----------
    ds_or_runs : xarray.Dataset, path, mapping or dataset with a ``run`` dim
    path : path-like
        The ``.html`` file to write.
    baseline : xarray.Dataset, path or str, optional
        The run compared with (as for :func:`precnb.diagnose`): keyword-only; a third
        positional argument is a ``TypeError`` naming ``baseline=``.
    overwrite : bool
        Replace an existing precnb report (never any other file).
    inputs : sequence of path-like
        Further paths the report must stay out of.
    **kw
        Passed to :func:`to_html` (``findings``, ``title``, ``target_layout``, ...).

    Returns
    -------
    pathlib.Path

    Raises
    ------
    precnb.errors.OutputRefusedError
        See :func:`precnb._write.check_output`.
    """
    from precnb._write import check_output, dataset_inputs, write_text

    protect = [*_input_paths(ds_or_runs), *_input_paths(baseline), *inputs]
    check_output(path, inputs=protect, overwrite=overwrite, content="html")  # before the (long) diagnosis
    page = to_html(ds_or_runs, baseline=baseline, **kw)
    protect += dataset_inputs(ds_or_runs) + dataset_inputs(baseline)
    return write_text(Path(path).expanduser(), page, inputs=protect, overwrite=overwrite)


def _input_paths(obj: Any) -> list[str]:
    """Paths among the inputs of :func:`to_html` (a path, a mapping or sequence of paths, or datasets' sources)."""
    from precnb._write import dataset_inputs

    if obj is None:
        return []
    if isinstance(obj, (str, os.PathLike)):
        return [os.fspath(obj)]
    if isinstance(obj, dict):
        return [p for v in obj.values() for p in _input_paths(v)]
    if isinstance(obj, (list, tuple)):  # a sequence of runs (precnb.pipeline.inputs.normalize)
        return [p for v in obj for p in _input_paths(v)]
    return dataset_inputs(obj)
