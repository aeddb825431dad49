"""The built-in diagnoses, registered in :mod:`precnb.analysis.registry`.

Each wraps one pure analysis function; the pipeline (:func:`precnb.diagnose`) decides which
apply. Order (priority): pre-flight checks (one or two runs; a failing one comes first, a clean
one last), first divergence (two runs), replica mismatch (a layout was given), NaN/Inf origin
and anomalies (one run).

Examples
--------
>>> from precnb.analysis.registry import get
>>> get("first_divergence").command
'diff'
"""

from __future__ import annotations

from typing import Any

from precnb.analysis.registry import Context, Diagnosis, register

__all__: list[str] = []


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
    from precnb.analysis.nan_origin import nan_origin

    return nan_origin(ctx.target)


def _anomalies(ctx: Context) -> Any:
    from precnb.analysis.anomalies import anomalies

    found = anomalies(ctx.target, rule=ctx.params.get("spike_rule"), limit=int(ctx.params.get("limit", 50)))
    return found


def _has_layout(ctx: Context) -> bool:
    return ctx.target_layout is not None


def _replicas(ctx: Context) -> Any:
    from precnb.analysis.departures import check_departures  # issue #28: the first departure, classified

    raw = ctx.raw_target if ctx.raw_target is not None else ctx.target
    return check_departures(raw, ctx.target_layout, rtol=float(ctx.params.get("replica_rtol", 1e-6)),
                            limit=int(ctx.params.get("limit", 50)), records=ctx.params.get("node_records"),
                            baseline=ctx.params.get("replica_baseline"),
                            rng_regions=tuple(ctx.params.get("rng_regions") or ()))


def _replica_plan(finding: Any, ds: Any, *, dump_path: str, task: str | None = None) -> Any:
    """A classified departure's own plan (md5 on its group, issue #28), unless a task is asked for."""
    from precnb.analysis.departure_plan import departure_plan
    from precnb.analysis.plan import generic_plan

    if task is None and (finding.evidence or {}).get("departure"):
        return departure_plan(finding, ds, dump_path=dump_path)
    return generic_plan(finding, ds, dump_path=dump_path, task=task or "tensor")


def _preflight(ctx: Context) -> Any:
    from precnb.analysis.preflight import preflight, preflight_finding

    off = ctx.step_offset if isinstance(ctx.step_offset, int) and not isinstance(ctx.step_offset, bool) else 0
    names = (ctx.names[0] or "baseline", ctx.names[1] or "target")
    base = ctx.baseline
    if base is not None and ctx.alignment is not None:  # runs named differently: the baseline in the target's names
        base = ctx.alignment.apply(base)
    target = ctx.target
    lay = ctx.target_layout
    if base is None and lay is not None and any(getattr(lay, d) > 1 for d in ("tp", "pp", "vpp", "cp", "ep")):
        from precnb.analysis.merge import merge_shards  # one run: its inventory is the whole model's

        target = merge_shards(ctx.raw_target if ctx.raw_target is not None else ctx.target, lay)
    checks = preflight(target, baseline=base, target_layout=ctx.target_layout,
                       baseline_layout=ctx.baseline_layout, step_offset=off, names=names,
                       raw_target=ctx.raw_target, raw_baseline=ctx.raw_baseline)
    return preflight_finding(checks)


register(Diagnosis(
    kind="preflight", title="Pre-flight checks", priority=0, mode="any", run=_preflight,
    description="pre-flight checks (parameters, frozen set, optimizer hyper-parameters, initial weights, same data, "
    "distinct data per DP replica)", command="preflight", color="first_bad", clean_last=True))
register(Diagnosis(
    kind="first_divergence", title="First divergence", priority=10, mode="pair", run=_first_divergence,
    description="first divergence (values with dtype tolerances, structural differences)",
    command="diff", color="first_bad"))
register(Diagnosis(
    kind="replica_mismatch", title="Replica mismatch", priority=20, mode="any", run=_replicas,
    applies=_has_layout, description="replica check (tensors that must be identical across the "
    "layout's replicas)", command="replicas", color="first_bad", plan=_replica_plan))
register(Diagnosis(
    kind="nan_origin", title="NaN/Inf origin", priority=30, mode="single", run=_nan_origin,
    description="NaN/Inf origin (mask infinities ignored)", command="nan", color="first_bad"))
register(Diagnosis(
    kind="anomaly", title="First anomaly", priority=40, mode="single", run=_anomalies,
    description="anomalies (NaN/Inf transitions, spikes and drifts against history)", command="anomalies",
    color="first_bad"))
