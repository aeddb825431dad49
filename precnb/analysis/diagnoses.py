"""The built-in diagnoses, registered in :mod:`precnb.analysis.registry`.

Each wraps one pure analysis function; the pipeline (:func:`precnb.diagnose`) decides which
apply. Order (priority): pre-flight checks (one or two runs; a failing one comes first, a clean
one last), first divergence (two runs), replica mismatch (a layout was given), NaN/Inf origin
and anomalies (one run).

Examples
--------
>>> from precnb.analysis.registry import get
>>> get(FIRST_DIVERGENCE).cli.command
'diff'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from precnb.analysis._memo import DatasetMemo
from precnb.analysis.hooks import (
    CliHooks,
    ExplorerHooks,
    FindingHooks,
    InputHooks,
    OrderHooks,
    ReportHooks,
    StepwiseHooks,
)
from precnb.analysis.options import option, suspects_limit
from precnb.analysis.registry import Context, Diagnosis, register
from precnb.analysis.spike.diagnosis import LOSS_SPIKE

__all__ = ["ANOMALY", "FIRST_DIVERGENCE", "NAN_ORIGIN", "PREFLIGHT", "REPLICAS", "SPIKE_STATS", "AnomalyOptions",
           "ReplicaOptions"]

#: the built-in kinds, spelled here once: front ends that need one by name import it (no kind literal elsewhere)
PREFLIGHT = "preflight"
FIRST_DIVERGENCE = "first_divergence"
REPLICAS = "replica_mismatch"
NAN_ORIGIN = "nan_origin"
ANOMALY = "anomaly"
_REPLICAS, _ANOMALY = REPLICAS, ANOMALY
_REPLICA_RESULTS = DatasetMemo(size=2)
#: statistics a spike test can use: the schema's four and msprobe monitor's zeros / nans counts
SPIKE_STATS = ("norm", "max", "min", "mean", "zeros", "nans")


@dataclass(frozen=True)
class AnomalyOptions:
    """The anomaly search's options (``precnb anomalies``): its spike test against each tensor's own history."""

    limit: int = suspects_limit()
    spike_z: float = option(10.0, help="robust z-score threshold", flag="--z", type="positive")
    spike_ratio: float = option(5.0, help="minimum jump ratio", flag="--ratio", type="positive")
    spike_stats: tuple[str, ...] = option(("norm",), help="statistic(s) to test for spikes", flag="--stat",
                                          action="append", choices=SPIKE_STATS)

    def rule(self) -> Any:
        """The :class:`precnb.analysis.SpikeRule` of these options."""
        from precnb.analysis.anomalies import SpikeRule

        return SpikeRule(z=float(self.spike_z), ratio=float(self.spike_ratio), stats=tuple(self.spike_stats))


@dataclass(frozen=True)
class ReplicaOptions:
    """The replica check's options (``precnb replicas``)."""

    limit: int = suspects_limit()
    replica_rtol: float = option(1e-6, help="relative tolerance", flag="--rtol", type="positive")
    rng_regions: tuple[str, ...] = option(
        (), help="module path (prefix) inside a model-parallel RNG region, e.g. blocks.0.attn: a random op there "
        "differs across TP ranks by design (repeatable)", flag="--rng-region", action="append", metavar="MODULE")
    replica_baseline: Any = option(
        None, compare=False, help="a clean run of the same training: decides which side of a two-replica departure "
        "is wrong", flag="--baseline", metavar="RUN")  # issue #28; the subcommand takes no baseline run


def _divergence_stepwise(load: Any, steps: Any, **kw: Any) -> Any:
    from precnb.analysis.divergence import first_divergence_stepwise

    return first_divergence_stepwise(load, steps, **kw)


def _first_divergence(ctx: Context) -> Any:
    from precnb.analysis.divergence import first_divergence

    assert ctx.baseline is not None
    kw: dict[str, Any] = {}
    if ctx.alignment is not None:  # computed once by the pipeline
        kw["alignment"] = ctx.alignment
    if ctx.params.get("tensor_metrics") is not None:  # issue #17: judged on whole tensors first
        kw["tensor_metrics"] = ctx.params["tensor_metrics"]
    if callable(ctx.params.get("comparison")):  # the pipeline's comparison of the pair, shared with its views
        kw["comparison"] = ctx.params["comparison"]()
    return first_divergence(ctx.baseline, ctx.target, tolerance=ctx.tolerance, step_offset=ctx.step_offset,
                            crc=ctx.crc, **kw)


def _nan_origin(ctx: Context) -> Any:
    from precnb.analysis.nan import nan_origin

    return nan_origin(ctx.target)


def _anomalies(ctx: Context) -> Any:
    from precnb.analysis.anomalies import anomalies

    o = ctx.options.get(_ANOMALY) or AnomalyOptions()
    return anomalies(ctx.target, rule=o.rule(), limit=int(o.limit))


def _anomaly_flags(ds: Any, finding: Any, *, triage: Any) -> Any:
    """Every anomaly of the run (the explorer's rule: the triage's spike options)."""
    from precnb.analysis.anomalies import anomaly_table

    return anomaly_table(ds, rule=triage.options.of(_ANOMALY).rule())


def _replica_flags(ds: Any, finding: Any, *, triage: Any) -> list[dict[str, Any]]:
    """The records whose replicas disagree (none when the triage has no layout or it does not fit *ds*)."""
    from precnb.analysis.replicas import replica_mismatches

    if triage.target_layout is None:
        return []
    key = f"replica_rows:{id(ds)}"
    if key not in triage.cache:
        try:
            rtol = float(triage.options.of(_REPLICAS).replica_rtol)
            rows, _ = replica_mismatches(ds, triage.target_layout, rtol=rtol)
        except ValueError:  # the layout does not describe these ranks
            rows = []
        triage.cache[key] = rows
    return list(triage.cache[key])


def _keep_anomalies(f: Any, results: dict[str, Any]) -> bool:
    """Next to the NaN origin, an anomaly list adds something only when it holds a spike or a drift."""
    nan = results.get(NAN_ORIGIN)
    if nan is None:
        return True
    return f.found and not (nan.found and "first_spike" not in f.values and "first_drift" not in f.values)


def _anomaly_section(finding: Any, *, rows: int = 50) -> dict[str, Any]:
    """The report's table of the anomalies in training order (its first one first).

    The first non-finite anomaly is always listed, also when it comes after *rows* spikes.
    """
    d = finding.to_dict()  # strict-JSON values: non-finite floats are "nan"/"inf" strings
    vals = d.get("values") or {}
    firsts = [x for x in (vals.get(f"first_{t}") for t in ("spike", "nonfinite")) if isinstance(x, dict)]
    head = [x for x in firsts if x.get("tensor") == d.get("tensor") and x.get("step") == d.get("step")]

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r.get("type"), r.get("step"), r.get("rank"), r.get("tensor"), r.get("stat"))

    seen: set[tuple[Any, ...]] = set()
    ordered = []
    for r in head[:1] + list(d.get("suspects") or []):
        if key(r) not in seen:
            seen.add(key(r))
            ordered.append(r)
    shown = ordered[:rows]
    keys = {key(r) for r in shown}
    shown += [x for x in firsts if x.get("type") == "nonfinite" and key(x) not in keys]
    total = (d.get("stats") or {}).get("anomalies", len(ordered))
    listed = f", {len(shown)} listed" if len(shown) < total else ""
    return {"title": f"Anomalies in training order ({total} in all{listed})", "cls": "anomalies",
            "caption": "Spikes are judged against each tensor's own history (robust z-score and jump ratio); the "
            "first non-finite value is always listed.",
            "columns": ["type", "step", "rank", "tensor", "stat", "value", "typical", "score"],
            "rows": [[{"value": r.get("type", ""), "bad": r.get("type") == "nonfinite"}, r.get("step"), r.get("rank"),
                      r.get("tensor", ""), {"value": r.get("stat", "")}, r.get("value"), r.get("reference"),
                      r.get("score")] for r in shown]}


def _has_layout(ctx: Context) -> bool:
    return ctx.target_layout is not None


def _replicas(ctx: Context) -> Any:
    """The replica check of the target as dumped: it reads neither the baseline nor the alignment.

    Its finding is reused while the same target (and clean run) come with the same options and dump
    (:class:`~precnb.analysis._memo.DatasetMemo`, a deep copy each time): an explorer's Match / Unmatch
    reruns only what the alignment change can affect.
    """
    from precnb.analysis.replicas.departures import check_departures  # issue #28: the first departure, classified

    raw = ctx.raw_target if ctx.raw_target is not None else ctx.target
    o = ctx.options.get(_REPLICAS) or ReplicaOptions()
    records, clean = ctx.params.get("node_records"), ctx.params.get("replica_baseline")
    limit, rng = int(o.limit), tuple(o.rng_regions or ())

    def run() -> Any:
        return check_departures(raw, ctx.target_layout, rtol=float(o.replica_rtol), limit=limit, records=records,
                                baseline=clean, rng_regions=rng)

    where = getattr(records, "key", None) if records is not None else ()  # what the records are read from
    if where is None:  # records read from somewhere it cannot name: computed again
        return run()
    key = ("replica_check", repr(ctx.target_layout), float(o.replica_rtol), limit, rng, where)
    return _REPLICA_RESULTS.get([raw] + ([clean] if clean is not None else []), key, run)


def _replica_plan(finding: Any, ds: Any, *, dump_path: str, task: str | None = None) -> Any:
    """A classified departure's own plan (md5 on its group, issue #28), unless a task is asked for."""
    from precnb.analysis.findings.plan import generic_plan
    from precnb.analysis.replicas.departure_plan import departure_plan

    if task is None and (finding.evidence or {}).get("departure"):
        return departure_plan(finding, ds, dump_path=dump_path)
    ranks = {int(s["rank"]) for s in finding.suspects if s.get("rank") is not None}  # every replica that departs
    ranks |= {int(finding.rank)} if finding.rank is not None else set()
    return generic_plan(finding, ds, dump_path=dump_path, task=task or "tensor", ranks=sorted(ranks))


def _divergence_evidence(finding: Any, target: Any, baseline: Any) -> None:
    from precnb.analysis.findings.enrich import divergence_evidence

    divergence_evidence(finding, target, baseline)


def _divergence_plan(finding: Any, ds: Any, *, dump_path: str, task: str | None = None) -> Any:
    """The generic plan, to run on both jobs."""
    from precnb.analysis.findings.plan import generic_plan

    return generic_plan(finding, ds, dump_path=dump_path, task=task or "tensor",
                        node_notes=["run the same config on the baseline job too, then compare the two tensor dumps"])


def _anomaly_plan(finding: Any, ds: Any, *, dump_path: str, task: str | None = None) -> Any:
    """The step before a spike or drift too (what it departs from); a drift's module rather than its node."""
    from precnb.analysis.findings.plan import generic_plan

    first = finding.values.get("first_drift") or finding.values.get("first_spike")
    steps = None
    if first and first.get("step") is not None and int(first["step"]) > 0:
        steps = sorted({int(finding.step) - 1, int(finding.step)} - {-1})
    module = (finding.values.get("first_drift") or {}).get("module")
    return generic_plan(finding, ds, dump_path=dump_path, task=task or "tensor", steps=steps,
                        module=str(module) if module else None)


def _preflight(ctx: Context) -> Any:
    from precnb.analysis.preflight import preflight, preflight_finding

    off = ctx.step_offset if isinstance(ctx.step_offset, int) and not isinstance(ctx.step_offset, bool) else 0
    names = (ctx.names[0] or "baseline", ctx.names[1] or "target")
    base = ctx.baseline
    if base is not None and ctx.alignment is not None:  # runs named differently: the baseline in the target's names
        base = ctx.alignment.apply(base)
    target = ctx.target
    lay = ctx.target_layout
    if base is None and lay is not None and lay.sharded:
        from precnb.analysis.layout.merge import merge_shards  # one run: its inventory is the whole model's

        target = merge_shards(ctx.raw_target if ctx.raw_target is not None else ctx.target, lay)
    checks = preflight(target, baseline=base, target_layout=ctx.target_layout,
                       baseline_layout=ctx.baseline_layout, step_offset=off, names=names,
                       raw_target=ctx.raw_target, raw_baseline=ctx.raw_baseline)
    return preflight_finding(checks)


register(Diagnosis(
    kind=PREFLIGHT, title="Pre-flight checks", priority=0, mode="any", run=_preflight,
    description="pre-flight checks (parameters, frozen set, optimizer hyper-parameters, initial weights, same data, "
    "distinct data per DP replica)", report=ReportHooks(checklist=True),
    cli=CliHooks("preflight", help="pre-flight checks before any layer-by-layer compare: parameters, frozen set, "
                 "optimizer hyper-parameters, initial weights, same data, distinct data per DP replica",
                 base_first=True, shared=("layout_text", "baseline_layout", "step_offset", "mapping"),
                 emit="precnb.cli.analysis_cmds:preflight_emit"),
    order=OrderHooks(clean_last=True), steps=StepwiseHooks(first_steps=2)))
register(Diagnosis(
    kind=FIRST_DIVERGENCE, title="First divergence", priority=10, mode="pair", run=_first_divergence,
    description="first divergence (values with dtype tolerances, structural differences)", cli=CliHooks("diff"),
    finding=FindingHooks(enrich=_divergence_evidence, plan=_divergence_plan),
    steps=StepwiseHooks(stepwise=_divergence_stepwise)))
register(Diagnosis(
    kind=_REPLICAS, title="Replica mismatch", priority=20, mode="any", run=_replicas, applies=_has_layout,
    description="replica check (tensors that must be identical across the layout's replicas)", options=ReplicaOptions,
    cli=CliHooks("replicas", help="ranks whose replicated tensors differ from their replicas",
                 shared=("step", "layout", "rank_table")), finding=FindingHooks(plan=_replica_plan),
    report=ReportHooks(not_applicable="the replica check needs the run's layout (e.g. tp=2 or dp=4)"),
    explorer=ExplorerHooks(flags=_replica_flags, flag_text="replica mismatches", unmerged=True),
    reads=InputHooks("precnb.pipeline.devices:replica_inputs")))
register(Diagnosis(
    kind=NAN_ORIGIN, title="NaN/Inf origin", priority=30, mode="single", run=_nan_origin,
    description="NaN/Inf origin (mask infinities ignored)", report=ReportHooks(color="events"),
    cli=CliHooks("nan", help="where NaN (or a new ±inf) first appeared, across ranks", shared=("step", "rank_table"))))
register(Diagnosis(
    kind=_ANOMALY, title="First anomaly", priority=40, mode="single", run=_anomalies,
    description="anomalies (NaN/Inf transitions, spikes and drifts against history)",
    cli=CliHooks("anomalies", help="NaN/Inf transitions and spikes over steps, ranked", shared=("step",),
                 beside=(LOSS_SPIKE,), emit="precnb.cli._side:with_loss_spike"),
    order=OrderHooks(keep=_keep_anomalies), explorer=ExplorerHooks(flags=_anomaly_flags, flag_text="anomalies"),
    finding=FindingHooks(plan=_anomaly_plan), report=ReportHooks(section=_anomaly_section), options=AnomalyOptions))
