"""The outcome of :func:`precnb.diagnose` (:class:`Triage`) and its one constructor (:func:`build_triage`).

Kept apart from :mod:`precnb.pipeline.run` (the pipeline) so that both of the pipeline's paths (the whole
read and the step-wise search, :mod:`precnb.pipeline.stepwise_read`) build a triage the same way.

**The scalar arguments of a divergence's node** (:func:`attach_scalar_arguments`), read from both dumps when the
triage is made. The statistics cannot show that an op ran with another ``eps`` or scale; its record in
``dump.json`` can. For a first divergence whose node is in both runs, the pipeline reads that node's record at the
finding's (step, rank) from each dump (:func:`precnb.io.node_records`, only those records are decoded) and, when
scalar arguments differ (:func:`precnb.analysis.divergence.scalars.differing_arguments`), adds a certain cause and
says so in the reason. Inputs given as datasets read from nowhere known (no files) are left as they are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xarray as xr

from precnb.pipeline.options import Options
from precnb.pipeline.sources import Source

__all__ = ["TRIAGE_SCHEMA", "Part", "Triage", "attach_scalar_arguments", "build_triage", "shared_comparison"]

TRIAGE_SCHEMA = "precnb.triage/1"
_COMPUTED = "computed differently here"


@dataclass
class Part:
    """What the diagnoses of one read gave, before the triage is made.

    A triage has one part (the runs read whole) or, on the step-wise path, two: the search's and the
    first-steps diagnoses' (:mod:`precnb.pipeline.stepwise_read`). :func:`precnb.pipeline.run.run` finishes the
    parts of a triage once, together: ordering, evidence, names in the layout, scalar arguments, devices and
    :func:`build_triage`.

    Attributes
    ----------
    ctx : Context
        What the diagnoses ran on (:class:`~precnb.analysis.registry.Context`).
    results : list of (str, Finding)
        (diagnosis kind, finding) as listed (a diagnosis's ``keep`` applied).
    by_kind : dict
        What each diagnosis returned, by kind (:attr:`Triage.results`).
    checks : list of dict
        One entry per diagnosis considered (:attr:`Triage.checks`).
    options : Options
        The options the diagnoses ran with.
    assumed : list of dict
        The layouts read from the dumps (:func:`precnb.pipeline.assumptions.inferred_layout`).
    cache : dict
        Derived results kept for the triage's views (the pair's comparison).
    earlier : xarray.Dataset or None
        The target's first step batch as dumped, when the finding's batch is a later one (names in the layout).
    """

    ctx: Any
    results: list[tuple[str, Any]]
    by_kind: dict[str, Any]
    checks: list[dict[str, Any]]
    options: Options
    assumed: list[dict[str, Any]] = field(default_factory=list)
    cache: dict[str, Any] = field(default_factory=dict)
    earlier: xr.Dataset | None = None


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
    assumptions : list of dict
        What the pipeline assumed and the user did not give (an inferred layout, a detected step
        offset, nodes paired by structure / shape / value), each ``kind``, ``text`` and its values
        (:mod:`precnb.pipeline.assumptions`); every finding carries the same list.
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
    assumptions: list[dict[str, Any]] = field(default_factory=list)

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
        """Every record a diagnosis flags, in causal order (:func:`precnb.pipeline.tensors.flagged`)."""
        from precnb.pipeline.tensors import flagged

        return flagged(self)

    def flagged_ranks(self) -> Any:
        """The same for a rank × step view (the dump's ranks where shards were merged and disagree)."""
        from precnb.pipeline.tensors import flagged_ranks

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
            "assumptions": self.assumptions,
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


def build_triage(ctx: Any, *, findings: list[Any], checks: list[dict[str, Any]], results: dict[str, Any],
                 options: Options, notes: list[str], failures: list[tuple[str, str]],
                 sources: tuple[str | None, str | None], rank_table: dict[int, dict[str, str]] | None = None,
                 cache: dict[str, Any] | None = None, assumed: Sequence[dict[str, Any]] = (),
                 beside: Sequence[dict[str, Any]] = ()) -> Triage:
    """The :class:`Triage` of a pipeline run, from the diagnoses' :class:`~precnb.analysis.registry.Context`.

    The one place a triage is made: the runs, layouts, alignment, tolerance, names and tensor metrics
    are the context's; *findings*, *checks* and *results* what the diagnoses gave; the step offset is
    the context's resolved one for a pair (None for one run). The assumptions are collected here, once
    (*assumed*: the layouts read from the dumps; :func:`precnb.pipeline.assumptions.collect`), and given to
    every finding; *beside*: the assumptions of the first-steps diagnoses of a step-wise search, added after.
    """
    from precnb.pipeline.assumptions import attach, collect, horizons

    paired = ctx.baseline is not None
    assumptions = collect(ctx, options, assumed)
    assumptions += [a for a in beside if a not in assumptions]
    assumptions += [a for a in horizons(findings) if a not in assumptions]
    attach(findings, assumptions)
    return Triage(findings=findings, options=options, alignment=ctx.alignment, checks=checks, target=ctx.target,
                  baseline=ctx.baseline, raw_target=ctx.raw_target, raw_baseline=ctx.raw_baseline, names=ctx.names,
                  step_offset=ctx.step_offset if paired else None, notes=notes, load_failures=failures,
                  target_layout=ctx.target_layout, baseline_layout=ctx.baseline_layout, results=results,
                  tolerance=ctx.tolerance, tensor_metrics=ctx.params.get("tensor_metrics"),
                  cache={} if cache is None else cache, rank_table=rank_table, source_paths=sources,
                  assumptions=assumptions)


def _records(src: Source, step: int, rank: int, node: str, fmt: str | None) -> dict[str, Any] | None:
    if src.records_path is None:
        return None
    from precnb.io.api import node_records

    try:
        where, reader = src.resolved(fmt)  # the reader asked once per path
        return node_records(where, step, rank, [node], format=reader).get(node)
    except Exception:  # evidence is optional: the finding stands without it
        return None


def attach_scalar_arguments(findings: list[Any], tsrc: Source, bsrc: Source | None, *,
                            names: tuple[str, str], format: str | None = None) -> None:
    """Add a ``scalar_argument`` cause to each first divergence whose node ran with other constants.

    Parameters
    ----------
    findings : list of Finding
        Changed in place.
    tsrc, bsrc : Source
        The target and baseline as given (paths are read, and so are the paths datasets were read
        from, :class:`~precnb.pipeline.inputs.ReadRun`; other datasets are skipped).
    names : (str, str)
        The (baseline, target) display names.
    format : str, optional
        The forced input format.
    """
    if bsrc is None or tsrc.records_path is None or bsrc.records_path is None:
        return
    from precnb.analysis.divergence.scalars import argument_cause, differing_arguments, format_argument
    from precnb.analysis.registry import lookup

    for f in findings:
        if getattr(lookup(f.kind), "mode", None) != "pair" or not f.node or f.step is None or f.rank is None:
            continue  # a finding of a pair diagnosis (the first divergence) naming one record
        if f.evidence.get("only_in") or (isinstance(f.baseline, dict) and "node" in f.baseline
                                         and not f.baseline["node"]):
            continue  # a node one run does not have (or left unpaired: an Unmatch) has nothing to compare
        b_node = (f.baseline or {}).get("node") or f.node
        t_step = int(f.values.get("target_step", f.step)) if isinstance(f.values, dict) else int(f.step)
        rb = _records(bsrc, int(f.step), int(f.rank), b_node, format)
        dump = f.evidence.get("dump") if isinstance(f.evidence.get("dump"), dict) else None
        # a merged target's record is in the dump under its own rank(s) and local name
        where = [(int(r), str(dump["node"])) for r in dump["ranks"]] if dump else [(int(f.rank), f.node)]
        for rank, node in where:
            rt = _records(tsrc, t_step, rank, node, format)
            if rt is None or rb is None:
                continue
            diffs = differing_arguments(rt, rb)
            if not diffs:
                continue
            cause = argument_cause(node, diffs, baseline_node=b_node, names=names)
            if dump:
                cause["rank"] = rank
                dump["rank"] = rank
            f.causes.insert(0, cause)
            d = diffs[0]
            if _COMPUTED in f.reason:
                on = f" on rank {rank} ({node})" if dump else ""
                said = (f"computed with a different scalar argument{on} ({d['argument']} = "
                        f"{format_argument(d['target'])} here, {format_argument(d['baseline'])} in {names[0]})")
                f.reason = f.reason.replace(_COMPUTED, said)
            break
