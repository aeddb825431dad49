"""``precnb.diagnose``: the one path from inputs and options to ordered findings; :func:`run` carries out a plan.

:func:`diagnose` is ``run(make_plan(normalize(...)))`` (:mod:`precnb.pipeline.plan`, :mod:`precnb.pipeline.inputs`):
the command line, the report, the explorer, the notebook templates and ``ds.prec`` are thin front ends over it,
so the same input and options always give the same first finding. Two public verbs run it for one purpose:
:func:`preflight` (``precnb.preflight``: the pre-flight checks as the JSON-able check list; the checks are the
diagnosis of kind ``preflight``, so every front end sees the same ones) and :func:`follow_devices`
(``precnb devices``: each job's replica departures followed to hosts and devices across jobs, issue 28; the
verdicts are :func:`precnb.analysis.replicas.devices.device_verdicts`). :func:`run` carries out a
:class:`~precnb.pipeline.plan.Plan` into a :class:`~precnb.pipeline.result.Triage`:

One loop per read: read (whole, or step batch by step batch for a search that asks for it) → prepare (merge
shards, fuse projections, align names, resolve the step offset) → the diagnoses; then once: enrich the findings,
name them in the layout's terms, scalar arguments, devices, ordering, the triage. The first-steps diagnoses of a
step-wise search run on the steps it read, through :func:`run_read` (never through :func:`precnb.diagnose`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import xarray as xr

from precnb._args import baseline_keyword
from precnb.pipeline import prepare
from precnb.pipeline.inputs import normalize
from precnb.pipeline.options import Options
from precnb.pipeline.plan import Plan, make_plan
from precnb.pipeline.prepare import merge_layouts, nothing_compared_first, resolve_layout
from precnb.pipeline.result import TRIAGE_SCHEMA, Triage, attach_scalar_arguments, build_triage, shared_comparison
from precnb.pipeline.sources import Loaded, ReadRun, Source, open_source

__all__ = ["PREFLIGHT_SCHEMA", "TRIAGE_SCHEMA", "ReadRun", "Triage", "checklist", "diagnose", "follow_devices",
           "merge_layouts", "nothing_compared_first", "preflight", "resolve_layout", "run", "run_read",
           "shared_comparison"]

PREFLIGHT_SCHEMA = "precnb.preflight/1"


@baseline_keyword()
def diagnose(
    target: Any,
    *,
    baseline: Any = None,
    options: Options | None = None,
    **kw: Any,
) -> Triage:
    """Diagnose one run, or a target against its baseline: every applicable diagnosis, in order.

    Parameters
    ----------
    target : path, xarray.Dataset or mapping
        The run diagnosed: a dump root / step / rank folder, monitor output, kernel dump, compare
        CSV or zarr store; an opened dataset; a dataset holding two runs (``run`` dim; the first is
        the baseline); or ``{"gpu": a, "npu": b}`` (first = baseline, last = target).
    baseline : path, xarray.Dataset or str, optional
        The run it is compared with (or, with a combined dataset, the name of one of its runs).
        Keyword-only (``diagnose(target, baseline=...)``; ``precnb diff BASE TARGET`` puts it
        first): a second positional run is a ``TypeError``, never a silent swap.
    options : Options, optional
        All options at once; or give them as keyword arguments (see :class:`Options`):
        ``target_layout`` (alias ``layout``), ``baseline_layout``, ``layouts`` (by run name), ``step_offset``,
        ``tolerance``, ``reference``, ``mapping``, ``steps``, ``ranks``, ``kinds``, ``crc``, ``format``,
        ``workers``, ``client``, ``progress``, ``spike_z``, ``spike_ratio``, ``spike_stats``,
        ``limit``, ``replica_rtol``, ``monitor``, ``loss``.

    Returns
    -------
    Triage
        ``.finding`` is the most important finding; ``.findings`` all of them.

    Raises
    ------
    NotADumpError
        When an input holds nothing readable.
    ValueError
        When the options do not fit the inputs (a layout that does not match the ranks, two runs
        that share no step, an unknown diagnosis kind).

    Examples
    --------
    >>> import precnb
    >>> t = precnb.diagnose(precnb.sample_path("dp_nan"))  # doctest: +SKIP
    >>> t.finding.kind, t.finding.step, t.finding.rank  # doctest: +SKIP
    ('nan_origin', 1, 1)
    """
    opts = options.with_(**kw) if options is not None and kw else (options or Options.from_kwargs(**kw))
    inputs = normalize(target, baseline, layouts=opts.layouts, target_layout=opts.target_layout,
                       baseline_layout=opts.baseline_layout, mapping=opts.mapping)  # the one input model
    return run(make_plan(inputs, opts))


def follow_devices(runs: Mapping[str, Any], tables: Mapping[str, Any], *, layout: Any,
                   baseline: Any = None, **options: Any) -> dict[str, Any]:
    """``precnb devices``: each job's replica departures, followed to hosts and devices across jobs.

    Parameters
    ----------
    runs : mapping name -> run
        The jobs (paths or datasets), by display name.
    tables : mapping name -> rank table
        Each job's rank table (path or mapping; see :func:`resolve_rank_table`).
    layout : str, mapping or Layout
        The parallel layout of every job (``"tp=2,dp=2"``).
    baseline : path or xarray.Dataset, optional
        A clean run of the same training: decides two-replica departures.
    **options
        Further :class:`~precnb.pipeline.Options` (``replica_rtol``, ``rng_regions``, ``workers``, ...).

    Returns
    -------
    dict
        ``{"devices": [...]}`` (:func:`precnb.analysis.replicas.devices.device_verdicts`), and the per-job findings
        under ``"findings"`` (not part of the printed shape).

    Examples
    --------
    >>> import precnb
    >>> root = precnb.sample_path("sdc")
    >>> out = follow_devices({j: root / j for j in ("job1", "job2")},
    ...                      {j: root / "rank_tables" / f"{j}.csv" for j in ("job1", "job2")},
    ...                      layout="tp=2,dp=2", workers=1)
    >>> out["devices"][0]["host"], out["devices"][0]["device"], out["devices"][0]["verdict"]
    ('10.0.0.1', '1', 'suspect')
    """
    from precnb.analysis.replicas.devices import device_verdicts

    events: dict[str, list[dict[str, Any]]] = {}
    placed: dict[str, dict[int, dict[str, str]]] = {}
    findings: dict[str, Any] = {}
    notes: list[str] = []  # a rank table's rows for ranks its run does not have (#49)
    for name, run in runs.items():
        t = diagnose(run, kinds=["replica_mismatch"], target_layout=layout, rank_table=tables[name],
                     replica_baseline=baseline, **options)
        f = t.result("replica_mismatch") or t.finding
        findings[name] = f
        events[name] = list(f.evidence.get("departures", [])) if f is not None and f.found else []
        assert t.rank_table is not None
        placed[name] = t.rank_table
        notes += [n for n in t.notes if n.startswith("rank table ") and n not in notes]
    return {"devices": device_verdicts(events, placed), "findings": findings, "notes": notes}


def preflight(base: Any, target: Any = None, **options: Any) -> dict[str, Any]:
    """Pre-flight checks of one run (*base*) or of *target* against *base*, before any layer-by-layer compare.

    Parameters
    ----------
    base : path or xarray.Dataset
        The baseline run, or the one run checked (a dump, a msprobe ``config_check`` pack, ...).
    target : path or xarray.Dataset, optional
        The run compared with *base*.
    **options
        Pipeline options (:class:`precnb.Options`): ``layout`` / ``target_layout`` (which ranks
        share a batch by design: TP, CP, PP groups; only distinct DP replicas must read distinct
        data), ``baseline_layout``, ``step_offset``, ``steps``, ``ranks``, ``format``, ...

    Returns
    -------
    dict
        ``{"schema": "precnb.preflight/1", "status": worst status, "baseline": name | None,
        "target": name, "checks": [{"name", "title", "status", "message", "confidence", "basis",
        "details"}, ...]}`` (strict JSON values); see :mod:`precnb.analysis.preflight`.

    Raises
    ------
    NotADumpError
        When an input holds nothing readable.

    Examples
    --------
    >>> import precnb
    >>> out = precnb.preflight(precnb.sample_path("preflight/same_batch"))  # doctest: +SKIP
    >>> [c["status"] for c in out["checks"] if c["name"] == "dp_data"]  # doctest: +SKIP
    ['fail']
    """
    kw = {k: v for k, v in options.items() if k != "kinds"}
    triage = diagnose(base, kinds=["preflight"], **kw) if target is None else diagnose(
        target, baseline=base, kinds=["preflight"], **kw)
    return checklist(triage)


def checklist(triage: Any) -> dict[str, Any]:
    """The :func:`preflight` dict of a :class:`~precnb.Triage` that ran the pre-flight checks."""
    from precnb.analysis.findings import jsonable

    f = triage.result("preflight")
    if f is None:
        raise ValueError("the pre-flight checks did not run in this triage (kinds without 'preflight')")
    checks = list(f.evidence.get("checks", []))
    return jsonable({"schema": PREFLIGHT_SCHEMA, "status": f.stats.get("status"),
                     "baseline": triage.names[0] if triage.paired else None, "target": triage.names[1],
                     "checks": checks})


def run(plan: Plan) -> Triage:
    """The triage *plan* decides: step batch by step batch when it says so (and every step has a file), else whole.

    Examples
    --------
    >>> import precnb
    >>> from precnb.pipeline.inputs import normalize
    >>> t = run(make_plan(normalize(precnb.sample_path("dp_nan")), Options(kinds=["nan_origin"], workers=1)))
    >>> t.finding.kind, t.finding.step, t.finding.rank
    ('nan_origin', 1, 1)
    """
    if plan.stepwise is not None and plan.baseline is not None:
        from precnb.pipeline.stepwise_read import try_stepwise

        notes: list[str] = []
        got = try_stepwise(plan.stepwise, plan.target.value, plan.baseline.value, plan.target, plan.baseline,
                           plan.options, plan.tolerance, plan.loaded, plan.common, notes, rerun=_first_steps)
        if got is not None:
            return got
    raw_t, raw_b = _read(plan.target, plan.baseline, plan.options, plan.loaded, plan.common)
    return run_read(plan, raw_t, raw_b)


def _first_steps(target: Any, *, baseline: Any, options: Options) -> Triage:
    """The first-steps diagnoses of a step-wise search on the steps it read (*target*, *baseline*: datasets or paths).

    A plan of its own, read whole (no second step-wise search).
    """
    inputs = normalize(target, baseline, target_layout=options.target_layout,
                       baseline_layout=options.baseline_layout, mapping=options.mapping)
    plan = make_plan(inputs, options, whole=True)
    raw_t, raw_b = _read(plan.target, plan.baseline, plan.options, plan.loaded, plan.common)
    return run_read(plan, raw_t, raw_b)


def run_read(plan: Plan, raw_t: xr.Dataset, raw_b: xr.Dataset | None) -> Triage:
    """The rest of the triage once the runs are read: prepare, the diagnoses, then the findings' evidence."""
    opts, tsrc, bsrc, loaded = plan.options, plan.target, plan.baseline, plan.loaded
    notes: list[str] = []
    assumed: list[dict[str, Any]] = []  # inferred layouts (the rest is read off the context by build_triage)
    from precnb.pipeline.devices import resolve_rank_table

    rank_table = resolve_rank_table(opts.rank_table, raw_t, notes)  # a bad table fails before the diagnoses
    params = _params(plan.diagnoses, opts, tsrc, raw_t, loaded, plan.common)
    ctx, cache = _context(raw_t, raw_b, tsrc, bsrc, opts, plan.tolerance, params, loaded, notes, assumed)
    findings, checks, results = _run(plan.diagnoses, ctx, explicit=opts.kinds is not None)
    nothing_compared_first(findings, loaded.failures)
    prepare.enrich_all(findings, ctx)
    prepare.name_in_layout(findings, raw_t, ctx.target, ctx.target_layout, paired=ctx.baseline is not None,
                           assumed=assumed)
    attach_scalar_arguments(findings, tsrc, bsrc, names=ctx.names, format=opts.format)
    from precnb.pipeline.devices import attach_devices

    attach_devices(findings, rank_table)
    return build_triage(ctx, findings=findings, checks=checks, results=results, options=opts, notes=notes,
                        failures=loaded.failures, rank_table=rank_table, cache=cache,
                        sources=(bsrc.records_path if bsrc is not None else None, tsrc.records_path), assumed=assumed)


def _read(tsrc: Source, bsrc: Source | None, opts: Options, loaded: Loaded, common: dict[str, Any]
          ) -> tuple[xr.Dataset, xr.Dataset | None]:
    """(target, baseline) as read whole (only the ``--steps`` asked for when the offset is known)."""
    if bsrc is None:
        return open_source(tsrc, loaded=loaded, steps=opts.steps, **common), None
    b_steps, t_steps = prepare.pair_steps(tsrc, bsrc, opts)
    raw_t = open_source(tsrc, loaded=loaded, steps=t_steps, **common)
    return raw_t, open_source(bsrc, loaded=loaded, steps=b_steps, **common)


def _params(wanted: Sequence[Any], opts: Options, tsrc: Source, raw_t: xr.Dataset, loaded: Loaded,
            common: dict[str, Any]) -> dict[str, Any]:
    """The diagnoses' parameters: the options they read, what is read beside the run, each one's own inputs."""
    params: dict[str, Any] = {"spike_rule": prepare.spike_rule(opts), "limit": int(opts.limit),
                              "replica_rtol": float(opts.replica_rtol), "rng_regions": tuple(opts.rng_regions)}
    if opts.monitor is not None or opts.loss is not None:  # issue #29: read beside the run
        from precnb.pipeline.tensors import side_inputs

        params.update(side_inputs(opts, loaded, common))
    for d in wanted:  # what a diagnosis reads beside the run (its ``inputs`` hook)
        if d.inputs is not None:
            params.update(_resolve(d.inputs)(tsrc, opts, raw_t, loaded=loaded, common=common))
    return params


def _resolve(ref: Any) -> Any:
    """A hook given as a callable or as ``"module:function"``."""
    if callable(ref):
        return ref
    import importlib

    mod, _, name = str(ref).partition(":")
    return getattr(importlib.import_module(mod), name)


def _context(raw_t: xr.Dataset, raw_b: xr.Dataset | None, tsrc: Source, bsrc: Source | None, opts: Options,
             tolerance: Any, params: dict[str, Any], loaded: Loaded, notes: list[str],
             assumed: list[dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    """The diagnoses' :class:`~precnb.analysis.registry.Context`: layouts, merged shards, alignment, offset."""
    from precnb.analysis.registry import Context
    from precnb.pipeline.tensors import pair_tensor_metrics  # issue #17

    # a pair is compared whole-model against whole-model: a layout the user did not give is read from the dumps
    t_lay = resolve_layout(tsrc.layout, raw_t, "target", notes, infer=raw_b is not None, assumed=assumed)
    b_lay = (resolve_layout(bsrc.layout, raw_b, "baseline", notes, assumed=assumed)
             if bsrc is not None and raw_b is not None else None)
    cache: dict[str, Any] = {}
    names = (bsrc.name if bsrc is not None else "", tsrc.name)
    if raw_b is None:  # one run is diagnosed rank by rank
        return Context(target=raw_t, raw_target=raw_t, target_layout=t_lay, tolerance=tolerance,
                       step_offset=opts.step_offset, crc=opts.crc, names=names, params=params), cache
    from precnb.pipeline.prepare import merged_pair

    base, targ = merged_pair(raw_b, raw_t, b_lay, t_lay, notes)  # shards merged; fused vs separate projections too
    alignment = prepare.pair_alignment(base, targ, opts, notes)
    step_offset = prepare.step_offset_of(base, targ, alignment, opts.step_offset)
    if opts.steps is not None:
        keep = [s for s in base["step"].values.tolist() if s in set(opts.steps)]
        base = base.sel(step=keep)
        targ = targ.sel(step=[s for s in targ["step"].values.tolist() if s - step_offset in set(keep)])
    params["tensor_metrics"] = pair_tensor_metrics(opts, raw_b, raw_t, step_offset=step_offset, alignment=alignment,
                                                   notes=notes, failures=loaded.failures)  # #17; #23: refused files
    # the search's comparison, made once and kept for the views (Triage.comparison)
    params["comparison"] = lambda: shared_comparison(
        cache, base, targ, alignment=alignment, step_offset=step_offset, tolerance=tolerance,
        tensor_metrics=params.get("tensor_metrics"))
    return Context(target=targ, baseline=base, raw_target=raw_t, raw_baseline=raw_b, target_layout=t_lay,
                   baseline_layout=b_lay, alignment=alignment, tolerance=tolerance, step_offset=step_offset,
                   crc=opts.crc, names=names, params=params), cache


def _run(wanted: Sequence[Any], ctx: Any, *, explicit: bool
         ) -> tuple[list[Any], list[dict[str, Any]], dict[str, Any]]:
    from precnb.analysis import registry

    results: list[tuple[str, Any]] = []  # (diagnosis kind, finding): a clean finding's own kind is "none"
    checks: list[dict[str, Any]] = []
    for d in wanted:
        if not d.applicable(ctx):
            if explicit:
                raise ValueError(_not_applicable(d, ctx))
            checks.append({"kind": d.kind, "title": d.title, "description": d.description,
                           "status": "not applicable", "message": _not_applicable(d, ctx)})
            continue
        out = d.run(ctx)
        for f in out if isinstance(out, list) else [out]:
            results.append((d.kind, f))
            checks.append({"kind": d.kind, "title": d.title, "description": d.description,
                           "status": "found" if f.found else "none", "message": f.reason})
    by_kind = {k: f for k, f in results}
    keep = {d.kind: d.keep for d in wanted if d.keep is not None}  # a diagnosis decides whether its result is listed
    results = [(k, f) for k, f in results if k not in keep or keep[k](f, by_kind)]
    # a "nothing found" that warns (a pre-flight warning may be the cause: a weight left at zero) comes
    # before the other "nothing found" results, so that it is what a clean triage shows first
    findings = registry.order_findings(results)
    from precnb.pipeline.stepwise_read import note_later

    note_later(findings)
    return findings, checks, by_kind


def _not_applicable(d: Any, ctx: Any) -> str:
    return str(d.why_not(ctx))
