"""``precnb.diagnose``: the one path from inputs and options to ordered findings.

Load → merge shards (layouts) → align names → resolve the step offset → run every registered
diagnosis that applies (:mod:`precnb.analysis.registry`) → order the findings. The command
line, the report, the explorer, the notebook templates and ``ds.prec`` are thin front ends
over it, so the same input and options always give the same first finding.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from precnb._args import baseline_keyword
from precnb.pipeline.inputs import Loaded, ReadRun, Source, open_source, split_inputs
from precnb.pipeline.layout_merge import is_sharded as _sharded
from precnb.pipeline.layout_merge import merge_layouts
from precnb.pipeline.options import Options
from precnb.pipeline.scalars import attach_scalar_arguments

__all__ = ["ReadRun", "Triage", "diagnose"]

TRIAGE_SCHEMA = "precnb.triage/1"


@dataclass
class Triage:
    """The outcome of :func:`diagnose`.

    Attributes
    ----------
    findings : list of Finding
        Most important first: found ones by diagnosis priority, then the "nothing found" ones
        (so a healthy run still says what was checked).
    options : Options
        The options used.
    alignment : Alignment or None
        How the baseline's names were mapped onto the target's (None: one run, or identical names).
    checks : list of dict
        One entry per diagnosis considered: ``kind``, ``title``, ``description``, ``status``
        (``found`` / ``none`` / ``not applicable``) and a ``message``.
    target, baseline : xarray.Dataset
        The runs diagnosed (shards merged), baseline None for one run.
    raw_target, raw_baseline : xarray.Dataset
        The runs as read (before merging).
    names : (str, str)
        Display names (baseline, target); ``("", name)`` for one run.
    step_offset : int or None
        The resolved step offset (two runs).
    notes : list of str
        What was done to the inputs (merges, alignment, stepwise reading), in words.
    load_failures : list of (str, str)
        Files that could not be read (path, reason).
    target_layout, baseline_layout : Layout or None
        The layouts, parsed against the runs' ranks.
    results : dict
        What each diagnosis returned, by kind (see :meth:`result`).
    tolerance : Tolerance or None
        The tolerance the pair was compared with (resolved from the options; None: dtype defaults).
    tensor_metrics : xarray.Dataset or None
        :func:`precnb.tensor_metrics` of a tensor-mode pair, when the search judged on it.
    cache : dict
        Derived results computed on demand (:meth:`comparison`).
    source_paths : (str or None, str or None)
        Where the (baseline, target) were read from (None: given as a dataset of unknown origin):
        a rerun on the datasets as read reads node records from there (:class:`ReadRun`).
    """

    findings: list[Any]
    options: Options
    alignment: Any = None
    checks: list[dict[str, Any]] = field(default_factory=list)
    target: xr.Dataset | None = field(default=None, repr=False)
    baseline: xr.Dataset | None = field(default=None, repr=False)
    raw_target: xr.Dataset | None = field(default=None, repr=False)
    raw_baseline: xr.Dataset | None = field(default=None, repr=False)
    names: tuple[str, str] = ("", "run")
    step_offset: int | None = None
    notes: list[str] = field(default_factory=list)
    load_failures: list[tuple[str, str]] = field(default_factory=list)
    target_layout: Any = None
    baseline_layout: Any = None
    results: dict[str, Any] = field(default_factory=dict, repr=False)
    tolerance: Any = field(default=None, repr=False)
    tensor_metrics: xr.Dataset | None = field(default=None, repr=False)
    cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: ``{rank: {"host", "device"}}`` from the ``rank_table`` option (issue #28), else None
    rank_table: dict[int, dict[str, str]] | None = field(default=None, repr=False)
    source_paths: tuple[str | None, str | None] = (None, None)

    @property
    def finding(self) -> Any:
        """The first finding (the most important one; a "nothing found" one when all are clean)."""
        return self.findings[0] if self.findings else None

    @property
    def found(self) -> list[Any]:
        """The findings that found something."""
        return [f for f in self.findings if f.found]

    @property
    def nothing_compared(self) -> bool:
        """True when the pair had no record in common: the first finding says so ("Nothing compared")."""
        return self.finding is not None and bool(self.finding.nothing_compared)

    @property
    def paired(self) -> bool:
        """True when a baseline was compared."""
        return self.baseline is not None

    def result(self, kind: str) -> Any:
        """What the diagnosis *kind* returned (its finding, or its "nothing found"); None when it did not run."""
        return self.results.get(kind)

    def comparison(self) -> Any:
        """The :class:`~precnb.analysis.Comparison` of the pair as the search made it (None for one run).

        Same alignment, step offset and tolerance as the first-divergence search (for two
        frameworks without a tolerance, the one calibrated on their noise floor,
        :func:`precnb.analysis.divergence.noise_floor`); computed once.
        """
        if self.baseline is None or self.target is None:
            return None
        return shared_comparison(self.cache, self.baseline, self.target, alignment=self.alignment,
                                 step_offset=self.step_offset, tolerance=self.tolerance,
                                 tensor_metrics=self.tensor_metrics)

    def flagged(self) -> Any:
        """Every record a diagnosis flags, in causal order (:func:`precnb.pipeline.flagged.flagged`)."""
        from precnb.pipeline.flagged import flagged

        return flagged(self)

    def flagged_ranks(self) -> Any:
        """The same for a rank × step view (the dump's ranks where shards were merged and disagree)."""
        from precnb.pipeline.flagged import flagged_ranks

        return flagged_ranks(self)

    def combined(self) -> xr.Dataset:
        """Baseline and target in one dataset (``run`` dim named by :attr:`names`), for charts and tables.

        The baseline is in the target's names (aligned), the steps are the baseline's (target steps
        shifted by the step offset) and only the steps and ranks both runs hold are kept — the
        grid the first-divergence search compared. One run: the target.
        """
        if self.target is None:
            raise ValueError("no run")
        if self.baseline is None:
            return self.target
        cmp = self.comparison()
        names = [str(self.names[0]), str(self.names[1])]
        out = cmp.ds.assign_coords(run=("run", names))
        raw = out.attrs.get("run_attrs")  # each run's own attributes (per-entry metadata, stacks), by its new name
        if raw:
            own = json.loads(raw) if isinstance(raw, str) else dict(raw)
            old = [str(r) for r in cmp.ds["run"].values]
            out.attrs = {**out.attrs, "run_attrs": json.dumps({n: own.get(o, {}) for o, n in zip(old, names,
                                                                                          strict=True)})}
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``findings`` (most important first), ``checks``, ``options``, ``notes``."""
        from precnb.analysis.findings import jsonable

        return jsonable({
            "schema": TRIAGE_SCHEMA,
            "findings": [f.to_dict() for f in self.findings],
            "checks": self.checks,
            "options": self.options.describe(),
            "names": {"baseline": self.names[0], "target": self.names[1]},
            "step_offset": self.step_offset,
            "notes": self.notes,
            "alignment": self.alignment.summary() if self.alignment is not None else None,
            "load_failures": [{"path": p, "reason": r} for p, r in self.load_failures],
        })

    def to_json(self, *, indent: int | None = 2) -> str:
        """Strict JSON text of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def summary(self) -> str:
        """Readable text: every finding's summary, most important first."""
        return "\n\n".join(f.summary() for f in self.findings)


def shared_comparison(cache: dict[str, Any], baseline: xr.Dataset, target: xr.Dataset, *, alignment: Any,
                      step_offset: Any, tolerance: Any, tensor_metrics: Any) -> Any:
    """The pair's :func:`~precnb.analysis.divergence.pair_comparison`, made once per triage (kept in *cache*).

    The first-divergence search and every view of the triage (:meth:`Triage.comparison`) share it.
    """
    from precnb.analysis.divergence import pair_comparison

    cached = cache.get("comparison")
    if cached is None:
        # a pair with nothing in common ("nothing compared"): both runs, no mask set, instead of an error
        kw: dict[str, Any] = {"disjoint": "union"}
        if tensor_metrics is not None:  # entries judged on whole tensors, as the search does
            kw["tensor_metrics"] = tensor_metrics
        cached = pair_comparison(baseline, target, alignment=alignment, tolerance=tolerance,
                                 step_offset=step_offset, **kw)
        cache["comparison"] = cached
    return cached


def _layout(spec: Any, ds: xr.Dataset) -> Any:
    if spec is None or spec == "":
        return None
    from collections.abc import Mapping

    from precnb.analysis import Layout

    if isinstance(spec, Layout):
        return spec
    if isinstance(spec, Mapping):
        return Layout(int(ds.sizes["rank"]), **dict(spec))
    return Layout.parse(str(spec), world_size=int(ds.sizes["rank"]))


def resolve_layout(spec: Any, ds: xr.Dataset | None, side: str, notes: list[str] | None = None, *,
                   infer: bool = True) -> Any:
    """The layout of one run: the one given (checked against the dumps), else the one they show (*infer*).

    A given layout that contradicts the dumps (pipelines, model chunks, TP groups:
    :func:`precnb.analysis.layout_infer.check_layout`) is a ValueError naming what disagrees; an inferred
    one is used only when it shards something (tp, pp, vpp > 1) or has data-parallel replicas, and is said
    in *notes*.
    """
    if ds is None:
        return None
    from precnb.analysis.layout_infer import check_layout, infer_layout

    lay = _layout(spec, ds)
    if lay is not None:
        problems = check_layout(ds, lay)
        if problems:
            raise ValueError(f"{side} layout {lay.describe()} contradicts the dumps: " + "; ".join(problems))
        return lay
    if not infer or int(ds.sizes.get("rank", 0)) < 2:
        return None
    got = infer_layout(ds)
    if got.layout is None or not (_sharded(got.layout) or got.layout.dp > 1):
        return None
    if notes is not None:
        notes.append(f"{side} layout read from the dumps: {got.layout.describe()} (" + "; ".join(got.evidence) + ")")
    return got.layout


def _tolerance(opts: Options, open_ref: Any) -> Any:
    from precnb.analysis import Tolerance

    tol = opts.tolerance
    kw: dict[str, Any] = {}
    if isinstance(tol, (int, float)) and not isinstance(tol, bool):
        kw["rtol"] = float(tol)
        tol = None
    if opts.reference is not None:
        a, b = opts.reference
        base = tol if isinstance(tol, Tolerance) else None
        if base is not None:
            kw = {"rtol": base.rtol, "by_dtype": dict(base.by_dtype), "atol": base.atol, **kw}
        return Tolerance.calibrate(open_ref(a), open_ref(b), **kw)
    if tol is not None:
        return tol
    return Tolerance(**kw) if kw else None


def _spike_rule(opts: Options) -> Any:
    from precnb.analysis import SpikeRule

    return SpikeRule(z=float(opts.spike_z), ratio=float(opts.spike_ratio), stats=tuple(opts.spike_stats))


def _pair_steps(tsrc: Source, bsrc: Source, opts: Options) -> tuple[list[int] | None, list[int] | None]:
    """Steps to read of (baseline, target) for ``--steps`` when the offset is known without reading."""
    if opts.steps is None:
        return None, None
    if isinstance(opts.step_offset, int) and not isinstance(opts.step_offset, bool):
        return list(opts.steps), [s + opts.step_offset for s in opts.steps]
    if opts.step_offset is None and tsrc.is_path and bsrc.is_path:
        from precnb.analysis.compare import default_step_offset
        from precnb.io.api import available_steps

        try:
            bs = available_steps(bsrc.value, format=opts.format, ranks=opts.ranks)
            ts = available_steps(tsrc.value, format=opts.format, ranks=opts.ranks)
        except Exception:  # reported by the whole read
            return None, None
        if bs is not None and ts is not None and default_step_offset(bs, ts, None) == 0:
            return list(opts.steps), list(opts.steps)
    return None, None


def _read_second_step(kept: list[tuple[xr.Dataset, xr.Dataset]], plan: tuple[list[int], int], bsrc: Source,
                      tsrc: Source, loaded: Loaded, common: dict[str, Any]) -> None:
    """Add the pre-flight's second step to *kept* when the search stopped after one (a fault at the first step).

    The step the search read is not read again: the pre-flight then joins it with the one step it lacks.
    """
    first_two, off = plan[0][:2], plan[1]
    have = {int(s) for b, _ in kept for s in b["step"].values}
    more = [s for s in first_two if s not in have]
    if kept and more and len(first_two) == 2:
        from precnb.errors import NotADumpError

        with contextlib.suppress(NotADumpError):  # unreadable: the pre-flight reads both steps itself, as before
            kept.append((open_source(bsrc, loaded=loaded, steps=more, **common),
                         open_source(tsrc, loaded=loaded, steps=[s + off for s in more], **common)))


def _stepwise_steps(tsrc: Source, bsrc: Source, opts: Options) -> tuple[list[int], int] | None:
    """(baseline steps to search, offset) when the divergence search can read step by step."""
    from precnb.analysis.compare import default_step_offset
    from precnb.io.api import available_steps

    if not (tsrc.is_path and bsrc.is_path):
        return None
    try:
        bsteps = available_steps(bsrc.value, format=opts.format, ranks=opts.ranks)
        tsteps = available_steps(tsrc.value, format=opts.format, ranks=opts.ranks)
    except Exception:  # undetectable input: the whole read reports it properly
        return None
    if bsteps is None or tsteps is None:
        return None
    off = default_step_offset(bsteps, tsteps, opts.step_offset)
    if off == "auto":
        return None
    search = [s for s in bsteps if s + int(off) in set(tsteps)]
    if opts.steps is not None:
        search = [s for s in search if s in set(opts.steps)]
    return (search, int(off)) if len(search) >= 2 else None


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
        ``target_layout`` (alias ``layout``), ``baseline_layout``, ``step_offset``, ``tolerance``,
        ``reference``, ``mapping``, ``steps``, ``ranks``, ``kinds``, ``crc``, ``format``,
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
    from precnb.analysis import registry
    from precnb.analysis.registry import Context

    opts = options.with_(**kw) if options is not None and kw else (options or Options.from_kwargs(**kw))
    loaded = Loaded()
    common = {"format": opts.format, "workers": opts.workers, "client": opts.client, "progress": opts.progress,
              "ranks": opts.ranks}
    tsrc, bsrc = split_inputs(target, baseline)
    wanted = registry.diagnoses(opts.kinds)
    notes: list[str] = []

    def open_ref(x: Any) -> xr.Dataset:
        return open_source(Source(x, "reference"), loaded=loaded, **common)

    tolerance = _tolerance(opts, open_ref)
    params = {"spike_rule": _spike_rule(opts), "limit": int(opts.limit), "replica_rtol": float(opts.replica_rtol),
              "rng_regions": tuple(opts.rng_regions)}
    if opts.monitor is not None or opts.loss is not None:  # issue #29: read beside the run
        from precnb.pipeline.side_inputs import side_inputs

        params.update(side_inputs(opts, loaded, common))

    kinds_wanted = {d.kind for d in wanted}
    stepwise = bsrc is not None and "first_divergence" in kinds_wanted and kinds_wanted <= {"first_divergence",
                                                                                           "preflight"}
    from precnb.pipeline.tensors import pair_tensor_metrics, wants_tensor_metrics  # issue #17

    if bsrc is not None and wants_tensor_metrics(opts, tsrc.value, bsrc.value):
        stepwise = False  # tensor metrics cover the whole pair: read it whole
    plan = _stepwise_steps(tsrc, bsrc, opts) if stepwise and bsrc is not None else None
    if plan is not None and bsrc is not None:
        from precnb.errors import NotADumpError
        from precnb.pipeline._preflight_join import with_preflight

        kept: list[tuple[xr.Dataset, xr.Dataset]] = []
        try:
            div = _diagnose_stepwise(tsrc, bsrc, opts, plan, tolerance, loaded, common, notes, keep=kept)
        except NotADumpError:  # a step with no readable file: read the runs whole instead
            loaded.failures.clear()
        else:
            if "preflight" not in kinds_wanted:
                return _with_devices(div, opts)
            # the pre-flight checks need the first two steps only (inventory, first update, data): the
            # ones the search read when it read two, else read again
            pre_opts = opts.with_(kinds=["preflight"], steps=plan[0][:2], step_offset=plan[1])
            _read_second_step(kept, plan, bsrc, tsrc, loaded, common)
            if sum(int(b.sizes["step"]) for b, _ in kept) >= 2:
                from precnb.combine import concat_steps

                pre = diagnose(concat_steps([t for _, t in kept]), baseline=concat_steps([b for b, _ in kept]),
                               options=pre_opts.with_(steps=None))
                pre.names = (bsrc.name, tsrc.name)
            else:
                pre = diagnose(target, baseline=baseline, options=pre_opts)
            joined = with_preflight(pre, div)
            nothing_compared_first(joined.findings, joined.load_failures)
            return _with_devices(joined, opts)

    if bsrc is None:
        raw_t = open_source(tsrc, loaded=loaded, steps=opts.steps, **common)
        raw_b = None
    else:
        b_steps, t_steps = _pair_steps(tsrc, bsrc, opts)
        raw_t = open_source(tsrc, loaded=loaded, steps=t_steps, **common)
        raw_b = open_source(bsrc, loaded=loaded, steps=b_steps, **common)
    from precnb.pipeline.devices import replica_inputs, resolve_rank_table

    rank_table = resolve_rank_table(opts.rank_table, raw_t)  # a bad table fails before the diagnoses run
    if "replica_mismatch" in kinds_wanted:
        params.update(replica_inputs(tsrc, opts, raw_t, loaded=loaded, common=common))
    # a pair is compared whole-model against whole-model: a layout the user did not give is read from the dumps
    t_lay = resolve_layout(opts.target_layout, raw_t, "target", notes, infer=raw_b is not None)
    b_lay = resolve_layout(opts.baseline_layout, raw_b, "baseline", notes) if raw_b is not None else None
    if opts.baseline_layout is not None and raw_b is None:
        raise ValueError("baseline_layout needs a baseline")
    if raw_b is not None:  # shards are merged to compare; one run is diagnosed rank by rank
        from precnb.pipeline.reuse import merged_pair

        base, targ = merged_pair(raw_b, raw_t, b_lay, t_lay, notes)  # fused vs separate projections combined too
    else:
        base, targ = None, raw_t
    alignment = None
    step_offset: int | None = None
    if base is not None:
        alignment = _alignment(base, targ, opts, notes)
        step_offset = _step_offset(base, targ, alignment, opts.step_offset)
        if opts.steps is not None:
            keep = [s for s in base["step"].values.tolist() if s in set(opts.steps)]
            base = base.sel(step=keep)
            targ = targ.sel(step=[s for s in targ["step"].values.tolist() if s - step_offset in set(keep)])
        params["tensor_metrics"] = pair_tensor_metrics(opts, raw_b, raw_t, step_offset=step_offset,
                                                       alignment=alignment, notes=notes,
                                                       failures=loaded.failures)  # issue #17; #23: refused files
    cache: dict[str, Any] = {}
    if base is not None:  # the search's comparison, made once and kept for the views (Triage.comparison)
        params["comparison"] = lambda: shared_comparison(
            cache, base, targ, alignment=alignment, step_offset=step_offset, tolerance=tolerance,
            tensor_metrics=params.get("tensor_metrics"))
    ctx = Context(target=targ, baseline=base, raw_target=raw_t, raw_baseline=raw_b, target_layout=t_lay,
                  baseline_layout=b_lay, alignment=alignment, tolerance=tolerance,
                  step_offset=step_offset if base is not None else opts.step_offset, crc=opts.crc,
                  names=(bsrc.name if bsrc is not None else "", tsrc.name), params=params)
    findings, checks, results = _run(wanted, ctx, explicit=opts.kinds is not None)
    nothing_compared_first(findings, loaded.failures)
    _enrich(findings, ctx)
    _name_in_layout(findings, raw_t, targ, t_lay, paired=base is not None)
    attach_scalar_arguments(findings, tsrc, bsrc, names=ctx.names, format=opts.format)
    from precnb.pipeline.devices import attach_devices

    attach_devices(findings, rank_table)
    return Triage(rank_table=rank_table,
                  findings=findings, options=opts, alignment=alignment, checks=checks, target=targ, baseline=base,
                  raw_target=raw_t, raw_baseline=raw_b, names=ctx.names, step_offset=step_offset, notes=notes,
                  load_failures=loaded.failures, target_layout=t_lay, baseline_layout=b_lay, results=results,
                  tolerance=tolerance, tensor_metrics=params.get("tensor_metrics"), cache=cache,
                  source_paths=(bsrc.records_path if bsrc is not None else None, tsrc.records_path))


def nothing_compared_first(findings: list[Any], failures: Sequence[tuple[str, str]]) -> None:
    """A pair that had no record in common answers that first, and says which files were skipped.

    (:mod:`precnb.analysis.compared`; the CLI exits 1 on it, the report and the explorer head with it.)
    """
    at = next((i for i, f in enumerate(findings) if f.nothing_compared), None)
    if at is None:
        return
    f = findings.pop(at)
    if failures and "skipped_files" not in f.stats:
        path, why = failures[0]
        first = why if why.startswith(path) else f"{path}: {why}"
        f.reason += f"; {len(failures)} unreadable file(s) skipped (first: {first})"
        f.stats["skipped_files"] = [{"path": p, "reason": r} for p, r in failures[:50]]
    findings.insert(0, f)


def _with_devices(triage: Triage, opts: Options) -> Triage:
    """*triage* with hosts and devices beside its ranks (the ``rank_table`` option; issue #28)."""
    from precnb.pipeline.devices import attach_devices, resolve_rank_table

    table = resolve_rank_table(opts.rank_table, triage.raw_target)
    attach_devices(triage.findings, table)
    triage.rank_table = table
    return triage


def _name_in_layout(findings: list[Any], raw_t: xr.Dataset, targ: xr.Dataset, t_lay: Any, *, paired: bool) -> None:
    """The dump's names of a merged target's finding; the whole model's names of a pipeline run's finding."""
    from precnb.pipeline.layout_names import attach_layout_names

    if not any(f.found and f.node for f in findings):
        return
    merged = paired and bool(targ.attrs.get("merged_layout"))
    lay = t_lay if t_lay is not None or paired else resolve_layout(None, raw_t, "target", None)
    with contextlib.suppress(Exception):  # names are evidence: the finding stands without them
        attach_layout_names(findings, raw=raw_t, merged=targ if merged else None, layout=lay, was_merged=merged)


def _enrich(findings: list[Any], ctx: Any) -> None:
    """What every finding gets after its diagnosis: ratio / gap evidence, then its dump plan."""
    from precnb.analysis.enrich import enrich

    enrich(findings, ctx.target, ctx.baseline)


def _step_offset(base: xr.Dataset, targ: xr.Dataset, alignment: Any, given: Any) -> int:
    """The pair's step offset; the baseline is put in the target's names only when it is detected ("auto")."""
    from precnb.analysis.compare import NothingToCompareError, align_steps, default_step_offset

    off = default_step_offset(base["step"].values, targ["step"].values, given)
    if off != "auto":
        return int(off)
    try:
        if alignment is None:
            return align_steps(base, targ, given)
        # the offset is read from the parameters: only they are put in the target's names, when the target
        # holds them (else every tensor in common decides, as align_steps does)
        params = np.flatnonzero(base["role"].values == "parameter")
        named = alignment.apply(base.isel(tensor=params)) if len(params) else None
        if named is None or not named.indexes["tensor"].isin(targ.indexes["tensor"]).any():
            named = alignment.apply(base)
        return align_steps(named, targ, given)
    except NothingToCompareError:  # no step in common: the divergence search answers "nothing compared"
        return given if isinstance(given, int) else 0


def _alignment(base: xr.Dataset, targ: xr.Dataset, opts: Options, notes: list[str]) -> Any:
    """The name alignment of the pair, computed once (identity, at no cost, when the names are the same)."""
    from precnb.pipeline.reuse import alignment

    a = alignment(base, targ, opts.mapping)  # a rerun on the same runs and mapping: the same alignment
    if not a.identical:
        notes.append("aligned: " + a.describe())
    notes.extend(f"mapping: {p}" for p in a.mapping_problems)  # pairs not kept (unknown names, swapped, ...)
    return a


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
    from precnb.pipeline._preflight_join import note_later

    note_later(findings)
    return findings, checks, by_kind


def _not_applicable(d: Any, ctx: Any) -> str:
    return str(d.why_not(ctx))


def _diagnose_stepwise(tsrc: Source, bsrc: Source, opts: Options, plan: tuple[list[int], int], tolerance: Any,
                       loaded: Loaded, common: dict[str, Any], notes: list[str],
                       keep: list[tuple[xr.Dataset, xr.Dataset]] | None = None) -> Triage:
    """The divergence search reading step batches until one diverges (the whole-run answer).

    *keep* receives the (baseline, target) runs of the first two step batches as read (before
    merging), for the pre-flight checks.
    """
    from precnb.analysis import registry
    from precnb.analysis.divergence import first_divergence_stepwise
    from precnb.analysis.stepwise import step_batches

    search, off = plan
    state: dict[str, Any] = {}

    def read(batch: list[int]) -> tuple[xr.Dataset, xr.Dataset]:
        b = open_source(bsrc, loaded=loaded, steps=batch, **common)
        t = open_source(tsrc, loaded=loaded, steps=[s + off for s in batch], **common)
        if "layouts" not in state:
            lnotes: list[str] = []
            state["layouts"] = (resolve_layout(opts.baseline_layout, b, "baseline", lnotes),
                                resolve_layout(opts.target_layout, t, "target", lnotes))
            state["layout_notes"] = lnotes
        b_lay, t_lay = state["layouts"]
        mnotes: list[str] = []
        mb, mt = merge_layouts(b, t, b_lay, t_lay, mnotes, like=state.get("first_merged"))
        assert mb is not None
        state.setdefault("notes", mnotes)
        state.setdefault("first_merged", (mb, mt))  # later batches keep the first batch's shard classes
        state["last"] = (b, t, mb, mt)
        if keep is not None and len(keep) < 2:
            keep.append((b, t))
        return mb, mt

    # the first batch is read here: the alignment is computed once, on it, and reused for every batch
    first = step_batches(sorted(search))[0]
    ready = {tuple(first): read(first)}
    state["alignment"] = _alignment(ready[tuple(first)][0], ready[tuple(first)][1], opts, state["notes"])

    def load(batch: list[int]) -> tuple[xr.Dataset, xr.Dataset]:
        got = ready.pop(tuple(batch), None)
        return got if got is not None else read(batch)

    finding = first_divergence_stepwise(load, search, tolerance=tolerance, step_offset=off, crc=opts.crc,
                                        alignment=state["alignment"])
    notes.extend(state.get("layout_notes", []))
    nothing_compared_first([finding], loaded.failures)
    notes.extend(state.get("notes", []))
    skipped = finding.stats.get("steps_not_searched") or []
    if skipped:
        notes.append(f"read step by step: {len(search) - len(skipped)} of {len(search)} step(s) read")
    raw_b, raw_t, mb, mt = state["last"]
    d = registry.get("first_divergence")
    checks = [{"kind": d.kind, "title": d.title, "description": d.description,
               "status": "found" if finding.found else "none", "message": finding.reason}]
    b_lay, t_lay = state["layouts"]
    from precnb.analysis.enrich import enrich

    enrich([finding], mt, mb)
    _name_in_layout([finding], raw_t, mt, t_lay, paired=True)
    attach_scalar_arguments([finding], tsrc, bsrc, names=(bsrc.name, tsrc.name), format=opts.format)
    return Triage(findings=[finding], options=opts, alignment=state.get("alignment"), checks=checks, target=mt,
                  baseline=mb, raw_target=raw_t, raw_baseline=raw_b, names=(bsrc.name, tsrc.name), step_offset=off,
                  notes=notes, load_failures=loaded.failures, target_layout=t_lay, baseline_layout=b_lay,
                  results={"first_divergence": finding}, tolerance=tolerance,
                  source_paths=(bsrc.records_path, tsrc.records_path))
