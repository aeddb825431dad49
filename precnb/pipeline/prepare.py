"""The pipeline's preparation steps: layouts, shards merged, tolerance, step offset, alignment; what findings get after.

Used by both paths of :func:`precnb.pipeline.run.diagnose` (the whole read and the step-wise search,
:mod:`precnb.pipeline.stepwise_read`).

**Merging shards.** :func:`merge_layouts` merges each run's shards into whole-layer statistics before two runs are
compared (TP/PP/VPP/CP/EP, DP); the triage and the explorer's reruns call it through :func:`merged_pair`.

**What a rerun reuses** (the explorer's Rerun, Match, Unmatch). The explorer reruns the triage on the datasets
the first run read (:class:`precnb.pipeline.ReadRun`); what depends on them and on options the rerun did not
change is taken from the previous run (:class:`precnb.analysis._memo.DatasetMemo`, by dataset identity):

* each run's layout as the dumps show it (:func:`resolve_layout`), and the check of a given one;
* the shards merged and the fused projections combined (:func:`merged_pair`: the runs and their layouts);
* the alignment (:func:`alignment`: the runs and the same mapping document — another tolerance);
  after a Match / Unmatch the mapping changed and it is computed again, on each run's tree read
  once (:func:`precnb.analysis.align._tree`);
* the replica comparison of the target (:func:`precnb.analysis.replicas.replica_mismatches`), and the replica
  check's finding (it reads neither the baseline nor the alignment: ``precnb.analysis.diagnoses._replicas``);
* the pair's renaming, common grid and per-record relative differences
  (:mod:`precnb.analysis.compare.prep`, for :func:`precnb.analysis.compare.compare_runs`):
  another tolerance only thresholds them again.

Every diagnosis then runs as in a full triage, and the findings are ordered by
:func:`precnb.analysis.registry.order_findings`: the answer is the full rerun's
(``tests/test_rerun_reuse.py`` compares them on the bundled pairs).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis._memo import DatasetMemo
from precnb.pipeline.options import Options
from precnb.pipeline.sources import Source

__all__ = ["alignment", "enrich_all", "is_sharded", "mapping_key", "merge_layouts", "merged_pair", "name_all",
           "name_in_layout", "nothing_compared_first", "pair_alignment", "pair_steps", "resolve_layout", "run_layout",
           "step_offset_of", "steps_of", "tolerance_of", "with_run_layout"]

_MERGED = DatasetMemo(size=2)
_ALIGNED = DatasetMemo(size=2)
_LAYOUTS = DatasetMemo(size=8)  # each run's layout as its dumps show it (and checks of a given one)


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
        problems = _LAYOUTS.get([ds], ("check_layout", repr(lay)), lambda: check_layout(ds, lay))
        if problems:
            raise ValueError(f"{side} layout {lay.describe()} contradicts the dumps: " + "; ".join(problems))
        return lay
    if not infer or int(ds.sizes.get("rank", 0)) < 2:
        return None
    got = _LAYOUTS.get([ds], "infer_layout", lambda: infer_layout(ds))  # a rerun on the same runs: read once
    if got.layout is None or not (is_sharded(got.layout) or got.layout.dp > 1):
        return None
    if notes is not None:
        notes.append(f"{side} layout read from the dumps: {got.layout.describe()} (" + "; ".join(got.evidence) + ")")
    if assumed is not None:
        from precnb.pipeline.assumptions import inferred_layout

        assumed.append(inferred_layout(side, got.layout, got.evidence))
    return got.layout


def run_layout(spec: Any, ds: xr.Dataset, side: str, notes: list[str] | None = None, *,
               assumed: list[dict[str, Any]] | None = None, order: str | None = None,
               num_layers: int | None = None) -> Any:
    """The layout of one run for a check that needs one (``precnb replicas RUN``; ``diagnose(run, kinds=[...])``).

    The one given (checked against the dumps), else the one the dumps show (:func:`resolve_layout`), else every
    rank a data-parallel replica (*order*, *num_layers* kept). One rule for the command line and the API; the
    layout not given is said in *notes* and, as an ``inferred_layout`` assumption, in *assumed*.
    """
    lay = resolve_layout(spec, ds, side, notes, assumed=assumed)
    if lay is not None:
        return lay
    from precnb.analysis.layout import Layout

    lay = Layout(int(ds.sizes["rank"]), order=order or Layout.order, num_layers=num_layers)
    if assumed is not None:
        from precnb.pipeline.assumptions import inferred_layout

        assumed.append(inferred_layout(side, lay, ["the dumps show no tensor, pipeline or context parallelism: "
                                                   "every rank a data-parallel replica"]))
    return lay


def with_run_layout(ctx: Any, wanted: Sequence[Any], raw_t: xr.Dataset, notes: list[str],
                     assumed: list[dict[str, Any]]) -> Any:
    """*ctx* with the run's layout when a check asked for by name needs one and none was given.

    The layout ``precnb replicas RUN`` uses (:func:`run_layout`: the dumps', else every
    rank a data-parallel replica), said in the notes and the assumptions; *ctx* as it is when no check needs it.
    """
    from dataclasses import replace

    if all(d.applicable(ctx) for d in wanted):
        return ctx
    said: list[str] = []
    also: list[dict[str, Any]] = []
    laid = replace(ctx, target_layout=run_layout(None, raw_t, "target", said, assumed=also))
    if not any(d.applicable(laid) and not d.applicable(ctx) for d in wanted):
        return ctx
    notes.extend(said)
    assumed.extend(also)
    return laid


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


def pair_steps(tsrc: Source, bsrc: Source, opts: Options) -> tuple[list[int] | None, list[int] | None]:
    """Steps to read of (baseline, target) for ``--steps`` when the offset is known without reading."""
    if opts.steps is None:
        return None, None
    if isinstance(opts.step_offset, int) and not isinstance(opts.step_offset, bool):
        return list(opts.steps), [s + opts.step_offset for s in opts.steps]
    if opts.step_offset is None and tsrc.is_path and bsrc.is_path:
        from precnb.analysis.compare import default_step_offset
        try:
            bs = steps_of(bsrc, opts)
            ts = steps_of(tsrc, opts)
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


def name_in_layout(findings: list[Any], raw_t: xr.Dataset, targ: xr.Dataset, t_lay: Any, *, paired: bool,
                   assumed: list[dict[str, Any]] | None = None, earlier: xr.Dataset | None = None) -> None:
    """The dump's names of a merged target's finding; the whole model's names of a pipeline run's finding.

    A one-run layout read from the dumps to name the finding is an assumption (added to *assumed*).
    """
    from precnb.pipeline.assumptions import attach_layout_names

    if not any(f.found and f.node for f in findings):
        return
    merged = paired and bool(targ.attrs.get("merged_layout"))
    lay = t_lay if t_lay is not None or paired else resolve_layout(None, raw_t, "target", None, assumed=assumed)
    with contextlib.suppress(Exception):  # names are evidence: the finding stands without them
        attach_layout_names(findings, raw=raw_t, merged=targ if merged else None, layout=lay, was_merged=merged,
                            earlier=earlier)


def _of(findings: list[Any], part: Any) -> list[Any]:
    """The findings of *part* (a :class:`~precnb.pipeline.result.Part`), in the order of *findings*."""
    own = {id(f) for _, f in part.results}
    return [f for f in findings if id(f) in own]


def enrich_all(findings: list[Any], parts: Sequence[Any]) -> None:
    """What every finding gets after its diagnosis (ratio / gap evidence, its dump plan), once per triage.

    Each finding is told its evidence from the runs its diagnosis read: its part's (the runs whole, or on the
    step-wise path the search's last step batch and the first steps the first-steps diagnoses read).
    """
    from precnb.analysis.findings.enrich import enrich

    for part in parts:
        own = _of(findings, part)
        if own:
            enrich(own, part.ctx.target, part.ctx.baseline)


def name_all(findings: list[Any], parts: Sequence[Any]) -> None:
    """:func:`name_in_layout` of every finding, once per triage, in the terms of the runs its diagnosis read."""
    for part in parts:
        ctx = part.ctx
        name_in_layout(_of(findings, part), ctx.raw_target, ctx.target, ctx.target_layout,
                       paired=ctx.baseline is not None, assumed=part.assumed, earlier=part.earlier)


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
    a = alignment(base, targ, opts.mapping)  # a rerun on the same runs and mapping: the same alignment
    if not a.identical:
        notes.append("aligned: " + a.describe())
    notes.extend(f"mapping: {p}" for p in a.mapping_problems)  # pairs not kept (unknown names, swapped, ...)
    return a


def _same_layout(a: Any, b: Any, base: xr.Dataset, target: xr.Dataset) -> bool:
    """Two runs laid out alike (same sizes, order and ranks): rank r holds the same part of the model in both."""
    keys = ("world_size", "tp", "pp", "vpp", "cp", "ep", "etp", "order")
    if not all(getattr(a, k) == getattr(b, k) for k in keys) or (
            base["rank"].values.tolist() != target["rank"].values.tolist()):
        return False
    from precnb.naming import is_communication

    def collectives(ds: xr.Dataset) -> set[str]:  # sequence parallelism trades all-reduces for gathers/scatters
        return {str(a) for a, n in zip(ds["api"].values, ds["node"].values, strict=True) if is_communication(str(n))}

    return collectives(base) == collectives(target)


def is_sharded(layout: Any) -> bool:
    """Whether *layout* splits the model (tp, pp, vpp, cp or ep above 1)."""
    return layout is not None and bool(layout.sharded)


def merge_layouts(base: xr.Dataset | None, target: xr.Dataset, b_lay: Any, t_lay: Any,
                  notes: list[str] | None = None, *, like: tuple[Any, Any] | None = None
                  ) -> tuple[xr.Dataset | None, xr.Dataset]:
    """Merge each run's shards into whole-layer statistics (the other run names split dims).

    Parameters
    ----------
    base, target : xarray.Dataset
    b_lay, t_lay : Layout or None
        Only layouts with tp/pp/vpp/cp/ep > 1 merge anything.
    notes : list of str, optional
        What was merged is appended here.
    like : (Dataset, Dataset), optional
        (baseline, target) merged from earlier steps: their shard classification is reused.
    """
    from precnb.analysis import merge_shards

    b_dp = b_lay.dp if b_lay is not None else (int(base.sizes["rank"]) if base is not None else 1)
    t_dp = t_lay.dp if t_lay is not None else int(target.sizes["rank"])
    # replicas on parts of the batch against a run on the whole batch: merged too, the other run naming the batch dim
    t_dp_merge = base is not None and t_lay is not None and t_dp > 1 and b_dp == 1
    b_dp_merge = base is not None and b_lay is not None and b_dp > 1 and t_dp == 1
    b_m = b_lay if is_sharded(b_lay) or b_dp_merge else None
    t_m = t_lay if is_sharded(t_lay) or t_dp_merge else None
    if base is not None and b_m is not None and t_m is not None and _same_layout(b_m, t_m, base, target):
        if notes is not None:  # rank r is the same shard of the same stage in both: the dump's own ranks answer
            notes.append(f"the same layout on both sides ({t_m.describe()}): compared rank by rank, unmerged")
        return base, target
    merged_base = base
    if base is not None and b_m is not None:
        merged_base = merge_shards(base, b_m, reference=None if t_m else target, like=like[0] if like else None,
                                   merge_dp=b_dp_merge)
        if notes is not None:
            notes.append(f"baseline shards merged ({b_m.describe()})")
    raw_target = target
    if t_m is not None:
        target = merge_shards(target, t_m, reference=None if (b_m or base is None) else base,
                              like=like[1] if like else None, merge_dp=t_dp_merge)
        if notes is not None:
            notes.append(f"target shards merged ({t_m.describe()})")
    if merged_base is not None:  # a pipeline run's stage-local optimizer lists in the other run's order
        from precnb.analysis.layout.optimizer_lists import align_optimizer_lists

        staged = [lay is not None and (lay.pp > 1 or lay.vpp > 1) for lay in (b_m, t_m)]
        if staged[1] and not staged[0]:
            target, n = align_optimizer_lists(target, merged_base, raw=raw_target)
        elif staged[0] and not staged[1]:
            merged_base, n = align_optimizer_lists(merged_base, target, raw=base)
        else:
            n = 0
        if n and notes is not None:
            notes.append(f"the pipeline stages' optimizer lists renamed to the other run's order by the parameter "
                         f"each entry holds ({n} entries)")
    return merged_base, target


def mapping_key(mapping: Any) -> str | None:
    """A text that identifies a mapping given in memory (``""``: none; None: not reusable, e.g. a file path)."""
    if mapping is None:
        return ""
    if isinstance(mapping, dict):
        try:
            return json.dumps(mapping, sort_keys=True, allow_nan=True, default=repr)
        except (TypeError, ValueError):
            return None
    return None


def merged_pair(raw_b: xr.Dataset, raw_t: xr.Dataset, b_lay: Any, t_lay: Any, notes: list[str]
                ) -> tuple[xr.Dataset, xr.Dataset]:
    """(baseline, target) compared: shards merged by layout, fused projections combined; what was done in *notes*."""
    from precnb.analysis.align.fused import fuse_pair

    def compute() -> tuple[xr.Dataset, xr.Dataset, list[str]]:
        said: list[str] = []
        merged_b, targ = merge_layouts(raw_b, raw_t, b_lay, t_lay, said)
        base, targ = fuse_pair(merged_b if merged_b is not None else raw_b, targ)
        return base, targ, said

    base, targ, said = _MERGED.get([raw_b, raw_t], ("merged", repr(b_lay), repr(t_lay)), compute, copy=False)
    notes.extend(said)
    return base, targ


def alignment(base: xr.Dataset, targ: xr.Dataset, mapping: Any) -> Any:
    """:func:`precnb.analysis.align.align` of the pair, reused for the same runs and mapping document.

    An :class:`~precnb.analysis.align.Alignment` is never changed once made: the same one is shared; it holds
    no dataset (names, pairs and coordinates only), so the memo does not search it for one.
    """
    from precnb.analysis.align import align

    key = mapping_key(mapping)
    if key is None:  # a file (it may have changed on disk) or an object: computed again
        return align(base, targ, mapping=mapping)
    return _ALIGNED.get([base, targ], ("align", key), lambda: align(base, targ, mapping=mapping), copy=False,
                        holds=False)


def steps_of(src: Source, opts: Options) -> list[int] | None:
    """:func:`precnb.io.available_steps` of a path source (its reader asked once: :meth:`Source.resolved`)."""
    from precnb.io.api import available_steps

    where, fmt = src.resolved(opts.format)
    return available_steps(where, format=fmt, ranks=opts.ranks)
