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
shards, fuse projections, align names, resolve the step offset) → the diagnoses, each read a
:class:`~precnb.pipeline.result.Part`; then once for the triage: ordering, enrich, names in the layout's terms,
scalar arguments, devices, :func:`~precnb.pipeline.result.build_triage`. The first-steps diagnoses of a step-wise
search run on the steps it read through the same read path (:func:`diagnose_read`; never a second plan, never
:func:`precnb.diagnose`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import xarray as xr

from precnb._args import baseline_keyword
from precnb.analysis.diagnoses import PREFLIGHT, REPLICAS
from precnb.pipeline import prepare
from precnb.pipeline.inputs import normalize
from precnb.pipeline.options import Options
from precnb.pipeline.plan import Plan, make_plan
from precnb.pipeline.prepare import merge_layouts, nothing_compared_first, resolve_layout
from precnb.pipeline.result import (
    TRIAGE_SCHEMA,
    Part,
    Triage,
    attach_scalar_arguments,
    build_triage,
    shared_comparison,
)
from precnb.pipeline.sources import Loaded, ReadRun, Source, open_source

__all__ = [
    "PREFLIGHT_SCHEMA",
    "TRIAGE_SCHEMA",
    "ReadRun",
    "Triage",
    "checklist",
    "diagnose",
    "diagnose_read",
    "follow_devices",
    "merge_layouts",
    "nothing_compared_first",
    "preflight",
    "resolve_layout",
    "run",
    "shared_comparison",
]

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
    from precnb.analysis._memo import scope

    with scope():  # each dataset checksummed once for the memos (no user code runs inside)
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
        t = diagnose(run, kinds=[REPLICAS], target_layout=layout, rank_table=tables[name],
                     replica_baseline=baseline, **options)
        f = t.result(REPLICAS) or t.finding
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
    triage = diagnose(base, kinds=[PREFLIGHT], **kw) if target is None else diagnose(
        target, baseline=base, kinds=[PREFLIGHT], **kw)
    return checklist(triage)


def checklist(triage: Any) -> dict[str, Any]:
    """The :func:`preflight` dict of a :class:`~precnb.Triage` that ran the pre-flight checks."""
    from precnb.analysis.findings import jsonable

    f = triage.result(PREFLIGHT)
    if f is None:
        raise ValueError(f"the pre-flight checks did not run in this triage (kinds without {PREFLIGHT!r})")
    checks = list(f.evidence.get("checks", []))
    return jsonable({"schema": PREFLIGHT_SCHEMA, "status": f.stats.get("status"),
                     "baseline": triage.names[0] if triage.paired else None, "target": triage.names[1],
                     "checks": checks})


def run(plan: Plan) -> Triage:
    """The triage *plan* decides: step batch by step batch when it says so (and every step has a file), else whole.

    One read (the runs whole) or, on the step-wise path, the search's step batches and the first steps beside it;
    then, once for the triage: ordering, evidence, names in the layout, scalar arguments, devices, the triage.

    Examples
    --------
    >>> import precnb
    >>> from precnb.pipeline.inputs import normalize
    >>> t = run(make_plan(normalize(precnb.sample_path("dp_nan")), Options(kinds=["nan_origin"], workers=1)))
    >>> t.finding.kind, t.finding.step, t.finding.rank
    ('nan_origin', 1, 1)
    """
    from precnb.pipeline.devices import resolve_rank_table

    notes: list[str] = []
    parts = None
    if plan.stepwise is not None and plan.baseline is not None:
        from precnb.pipeline.stepwise_read import try_stepwise

        parts = try_stepwise(plan, notes, lambda wanted, opts, runs: _first_steps(plan, wanted, opts, runs))
    if parts is not None:  # the rank table of the steps the search read last; its notes last
        said: list[str] = []
        rank_table = resolve_rank_table(plan.options.rank_table, parts[0].ctx.raw_target, said)
        notes.extend(n for n in said if n not in notes)
    else:
        notes = []
        raw_t, raw_b = _read(plan.target, plan.baseline, plan.options, plan.loaded, plan.common)
        rank_table = resolve_rank_table(plan.options.rank_table, raw_t, notes)  # a bad table fails before the diagnoses
        parts = [diagnose_read(plan, raw_t, raw_b, notes)]
    return _finish(plan, parts, notes, rank_table)


def _first_steps(plan: Plan, wanted: list[Any], options: Options, runs: tuple[Any, Any] | None) -> Part:
    """The first-steps diagnoses of a step-wise search, through the same read path as a whole read.

    On the (target, baseline) steps the search read (*runs*), else on the plan's runs read at the steps *options*
    name; no plan of its own.
    """
    if runs is None:
        tsrc, bsrc = plan.target, plan.baseline
    else:  # the runs as read, named as the input model names them
        tsrc, bsrc = normalize(runs[0], runs[1], target_layout=options.target_layout,
                               baseline_layout=options.baseline_layout, mapping=options.mapping).sources()
    raw_t, raw_b = _read(tsrc, bsrc, options, plan.loaded, plan.common)
    return diagnose_read(plan, raw_t, raw_b, [], wanted=wanted, options=options, sources=(tsrc, bsrc))


def diagnose_read(plan: Plan, raw_t: xr.Dataset, raw_b: xr.Dataset | None, notes: list[str], *,
                  wanted: Sequence[Any] | None = None, options: Options | None = None,
                  sources: tuple[Source, Source | None] | None = None) -> Part:
    """The diagnoses of one read (the plan's, or *wanted* with *options* on *sources*): prepare, then run them."""
    from precnb.pipeline.tensors import params_of

    opts = plan.options if options is None else options
    tsrc, bsrc = (plan.target, plan.baseline) if sources is None else sources
    wanted = plan.diagnoses if wanted is None else wanted
    assumed: list[dict[str, Any]] = []  # inferred layouts (the rest is read off the context by build_triage)
    params = params_of(wanted, opts, tsrc, raw_t, plan.loaded, plan.common, plan.cache, baseline=bsrc)
    ctx, cache = _context(raw_t, raw_b, tsrc, bsrc, opts, plan.tolerance, params, plan.loaded, notes, assumed)
    if raw_b is None and ctx.target_layout is None and opts.kinds is not None:
        ctx = prepare.with_run_layout(ctx, wanted, raw_t, notes, assumed)
    results, by_kind, checks = _run(wanted, ctx, explicit=opts.kinds is not None)
    return Part(ctx=ctx, results=results, by_kind=by_kind, checks=checks, options=opts, assumed=assumed, cache=cache)


def _finish(plan: Plan, parts: list[Part], notes: list[str], rank_table: Any) -> Triage:
    """The triage of *parts*, made once: ordering, evidence, names in the layout, scalar arguments, devices.

    On the step-wise path the first-steps results are listed before the search's (the search says what it
    compared: no warning first), and a failing pre-flight finding names the findings after it once they are named
    in the layout and told their scalar arguments (:func:`~precnb.pipeline.stepwise_read.note_later`).
    """
    from precnb.analysis import registry
    from precnb.pipeline.assumptions import collect
    from precnb.pipeline.devices import attach_devices
    from precnb.pipeline.stepwise_read import note_later

    main, beside = parts[0], parts[1:]
    findings = registry.order_findings([r for p in beside for r in p.results] + main.results, warn_first=not beside)
    if not beside:
        note_later(findings)
        nothing_compared_first(findings, plan.loaded.failures)
    prepare.enrich_all(findings, parts)
    prepare.name_all(findings, parts)
    tsrc, bsrc = plan.target, plan.baseline
    attach_scalar_arguments(findings, tsrc, bsrc, names=main.ctx.names, format=plan.options.format)
    if beside:
        note_later(findings)
        nothing_compared_first(findings, plan.loaded.failures)
    attach_devices(findings, rank_table)
    return build_triage(main.ctx, findings=findings, checks=[c for p in [*beside, main] for c in p.checks],
                        results={k: f for p in [*beside, main] for k, f in p.by_kind.items()}, options=plan.options,
                        notes=notes, failures=plan.loaded.failures, rank_table=rank_table, cache=main.cache,
                        sources=(bsrc.records_path if bsrc is not None else None, tsrc.records_path),
                        assumed=main.assumed, beside=[a for p in beside for a in collect(p.ctx, p.options, p.assumed)])


def _read(tsrc: Source, bsrc: Source | None, opts: Options, loaded: Loaded, common: dict[str, Any]
          ) -> tuple[xr.Dataset, xr.Dataset | None]:
    """(target, baseline) as read whole (only the ``--steps`` asked for when the offset is known)."""
    if bsrc is None:
        return open_source(tsrc, loaded=loaded, steps=opts.steps, **common), None
    b_steps, t_steps = prepare.pair_steps(tsrc, bsrc, opts)
    raw_t = open_source(tsrc, loaded=loaded, steps=t_steps, **common)
    return raw_t, open_source(bsrc, loaded=loaded, steps=b_steps, **common)


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
                       step_offset=opts.step_offset, crc=opts.crc, names=names, params=params,
                       options=opts.by_kind()), cache
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
                   crc=opts.crc, names=names, params=params, options=opts.by_kind()), cache


def _run(wanted: Sequence[Any], ctx: Any, *, explicit: bool
         ) -> tuple[list[tuple[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """(the results as listed, what each diagnosis returned by kind, the checks): every diagnosis that applies."""
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
    # a diagnosis decides whether its result is listed
    keep = {d.kind: d.order.keep for d in wanted if d.order.keep is not None}
    return [(k, f) for k, f in results if k not in keep or keep[k](f, by_kind)], by_kind, checks


def _not_applicable(d: Any, ctx: Any) -> str:
    return str(d.why_not(ctx))
