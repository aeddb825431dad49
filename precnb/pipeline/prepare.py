"""The pipeline's preparation steps: layouts, tolerance, step offset, alignment; and what every finding gets after.

Used by both paths of :func:`precnb.pipeline.run.diagnose` (the whole read and the step-wise search,
:mod:`precnb.pipeline.stepwise_read`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from precnb.pipeline.layout_merge import is_sharded as _sharded
from precnb.pipeline.options import Options
from precnb.pipeline.sources import Source

__all__ = ["enrich_all", "name_in_layout", "nothing_compared_first", "pair_alignment", "pair_steps",
           "resolve_layout", "spike_rule", "step_offset_of", "tolerance_of", "with_devices"]


def _layout(spec: Any, ds: xr.Dataset) -> Any:
    from precnb.analysis.layout import Layout

    return Layout.coerce(spec, int(ds.sizes["rank"]))


def resolve_layout(spec: Any, ds: xr.Dataset | None, side: str, notes: list[str] | None = None, *,
                   infer: bool = True, assumed: list[dict[str, Any]] | None = None) -> Any:
    """The layout of one run: the one given (checked against the dumps), else the one they show (*infer*).

    A given layout that contradicts the dumps (pipelines, model chunks, TP groups:
    :func:`precnb.analysis.layout.infer.check_layout`) is a ValueError naming what disagrees; an inferred
    one is used only when it shards something (tp, pp, vpp > 1) or has data-parallel replicas, and is said
    in *notes* and, as an ``inferred_layout`` assumption (:mod:`precnb.pipeline.assumptions`), in *assumed*.
    """
    if ds is None:
        return None
    from precnb.analysis.layout.infer import check_layout, infer_layout

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
    if assumed is not None:
        from precnb.pipeline.assumptions import inferred_layout

        assumed.append(inferred_layout(side, got.layout, got.evidence))
    return got.layout


def tolerance_of(opts: Options, open_ref: Any) -> Any:
    """The pair's tolerance from the options: a number (rtol), a Tolerance, or one calibrated on a reference pair.

    *open_ref* opens one run of the ``reference`` option (a healthy pair whose noise sets the tolerance).
    """
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


def spike_rule(opts: Options) -> Any:
    """The loss-spike / anomaly rule of the options (``spike_z``, ``spike_ratio``, ``spike_stats``)."""
    from precnb.analysis import SpikeRule

    return SpikeRule(z=float(opts.spike_z), ratio=float(opts.spike_ratio), stats=tuple(opts.spike_stats))


def pair_steps(tsrc: Source, bsrc: Source, opts: Options) -> tuple[list[int] | None, list[int] | None]:
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


def nothing_compared_first(findings: list[Any], failures: Sequence[tuple[str, str]]) -> None:
    """A pair that had no record in common answers that first, and says which files were skipped.

    (:mod:`precnb.analysis.compare.compared`; the CLI exits 1 on it, the report and the explorer head with it.)
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


def with_devices(triage: Any, opts: Options) -> Any:
    """*triage* with hosts and devices beside its ranks (the ``rank_table`` option; issue #28)."""
    from precnb.pipeline.devices import attach_devices, resolve_rank_table

    notes: list[str] = []
    table = resolve_rank_table(opts.rank_table, triage.raw_target, notes)
    triage.notes.extend(n for n in notes if n not in triage.notes)
    attach_devices(triage.findings, table)
    triage.rank_table = table
    return triage


def name_in_layout(findings: list[Any], raw_t: xr.Dataset, targ: xr.Dataset, t_lay: Any, *, paired: bool,
                   assumed: list[dict[str, Any]] | None = None, earlier: xr.Dataset | None = None) -> None:
    """The dump's names of a merged target's finding; the whole model's names of a pipeline run's finding.

    A one-run layout read from the dumps to name the finding is an assumption (added to *assumed*).
    """
    from precnb.pipeline.layout_names import attach_layout_names

    if not any(f.found and f.node for f in findings):
        return
    merged = paired and bool(targ.attrs.get("merged_layout"))
    lay = t_lay if t_lay is not None or paired else resolve_layout(None, raw_t, "target", None, assumed=assumed)
    with contextlib.suppress(Exception):  # names are evidence: the finding stands without them
        attach_layout_names(findings, raw=raw_t, merged=targ if merged else None, layout=lay, was_merged=merged,
                            earlier=earlier)


def enrich_all(findings: list[Any], ctx: Any) -> None:
    """What every finding gets after its diagnosis: ratio / gap evidence, then its dump plan."""
    from precnb.analysis.findings.enrich import enrich

    enrich(findings, ctx.target, ctx.baseline)


def step_offset_of(base: xr.Dataset, targ: xr.Dataset, alignment: Any, given: Any) -> int:
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


def pair_alignment(base: xr.Dataset, targ: xr.Dataset, opts: Options, notes: list[str]) -> Any:
    """The name alignment of the pair, computed once (identity, at no cost, when the names are the same)."""
    from precnb.pipeline.reuse import alignment

    a = alignment(base, targ, opts.mapping)  # a rerun on the same runs and mapping: the same alignment
    if not a.identical:
        notes.append("aligned: " + a.describe())
    notes.extend(f"mapping: {p}" for p in a.mapping_problems)  # pairs not kept (unknown names, swapped, ...)
    return a
