"""The pipeline's step-wise path: a pair searched step batch by step batch, so an early fault reads no later step.

A diagnosis with a ``stepwise`` search (:class:`precnb.analysis.registry.Diagnosis`; the first divergence)
runs this way on a pair of dump folders when every other diagnosis asked for needs the first steps only
(``first_steps``; the pre-flight checks): those run on the steps the search read (plus the one they lack),
through the same read path as a whole read (:func:`precnb.pipeline.run.diagnose_read`). :func:`try_stepwise` gives
both parts to :func:`precnb.pipeline.run.run`, which orders their results together and makes one triage
(:func:`note_later`: a failing pre-flight finding names the findings after it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import xarray as xr

from precnb.pipeline import prepare
from precnb.pipeline.options import Options
from precnb.pipeline.prepare import merge_layouts
from precnb.pipeline.result import Part
from precnb.pipeline.sources import Loaded, Source, open_source

__all__ = ["note_later", "stepwise_plan", "try_stepwise"]

Pair = tuple[xr.Dataset, xr.Dataset]


def stepwise_plan(wanted: Sequence[Any], tsrc: Source, bsrc: Source | None, opts: Options, *,
                  whole: bool = False) -> tuple[Any, list[Any], tuple[list[int], int]] | None:
    """(the searching diagnosis, the first-steps ones, (baseline steps, offset)) when the pair reads step-wise.

    None when it must be read whole: one run, *whole* (e.g. tensor metrics over the pair), not exactly one
    diagnosis with a ``stepwise`` search, another that needs every step, or inputs that are not dump folders
    with at least two common steps.
    """
    searchers = [d for d in wanted if d.steps.stepwise is not None]
    rest = [d for d in wanted if d.steps.stepwise is None]
    if bsrc is None or whole or len(searchers) != 1 or any(d.steps.first_steps <= 0 for d in rest):
        return None
    plan = _steps(tsrc, bsrc, opts)
    return None if plan is None else (searchers[0], rest, plan)


def _steps(tsrc: Source, bsrc: Source, opts: Options) -> tuple[list[int], int] | None:
    """(baseline steps to search, offset) when the search can read step by step."""
    from precnb.analysis.compare import default_step_offset

    if not (tsrc.is_path and bsrc.is_path):
        return None
    try:
        bsteps = prepare.steps_of(bsrc, opts)
        tsteps = prepare.steps_of(tsrc, opts)
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


def try_stepwise(plan: Any, notes: list[str], first_steps: Callable[[list[Any], Options, Pair | None], Part]
                 ) -> list[Part] | None:
    """The parts of a step-wise triage (the search's, then the first-steps diagnoses'), or None to read whole.

    None when a step has no readable file (the caller reads the runs whole). *plan* is the triage's
    :class:`~precnb.pipeline.plan.Plan`; *notes* receives what was done. *first_steps* runs the first-steps
    diagnoses (``first_steps(diagnoses, options, (target, baseline) or None)``:
    :func:`precnb.pipeline.run.diagnose_read` on the steps the search read, or on the plan's runs read at the first
    steps when it kept too few; never :func:`precnb.diagnose`). The parts are finished once, together
    (:func:`precnb.pipeline.run.run`: ordering, evidence, names, devices, one :func:`build_triage`).
    """
    from precnb.analysis import registry
    from precnb.errors import NotADumpError

    searcher, rest, steps = plan.stepwise
    opts, loaded, common = plan.options, plan.loaded, plan.common
    tsrc, bsrc = plan.target, plan.baseline
    kept: list[Pair] = []
    try:
        div = _search(searcher, tsrc, bsrc, opts, steps, plan.tolerance, loaded, common, notes, keep=kept)
    except NotADumpError:  # a step with no readable file: read the runs whole instead
        loaded.failures.clear()
        return None
    if not rest:
        return [div]
    n = max(d.steps.first_steps for d in rest)
    if n > 1 and _forward_fault_first(div.by_kind.get(searcher.kind), kept):
        n = 1  # nothing after the first step's forward pass can explain it: the next step is not read
        notes.append(f"{', '.join(d.title.lower() for d in rest)} on the first step only: the runs already "
                     "differ in its forward pass (dumped before any backward record), so the next step was not read; "
                     "`precnb preflight BASELINE TARGET` checks the first two steps (frozen parameters also by "
                     "their updates)")
    pre_opts = opts.with_(kinds=[d.kind for d in rest], steps=steps[0][:n], step_offset=steps[1])
    _read_first_steps(kept, steps, n, bsrc, tsrc, loaded, common)
    if sum(int(b.sizes["step"]) for b, _ in kept) >= min(n, len(steps[0])):
        from precnb.combine import concat_steps

        pre = first_steps(rest, pre_opts.with_(steps=None),
                          (concat_steps([t for _, t in kept]), concat_steps([b for b, _ in kept])))
    else:
        pre = first_steps(rest, pre_opts, None)
    read = sorted({int(s) for s in pre.ctx.baseline["step"].values}) if pre.ctx.baseline is not None else []
    titles = ", ".join(registry.title(k).lower() for k in pre.by_kind)
    notes.append(f"{titles} on baseline steps {', '.join(map(str, read))}")
    return [div, pre]


def _forward_fault_first(f: Any, kept: list[Pair]) -> bool:
    """Whether the search answered in the forward pass of the one step it read, before any backward record.

    Judged on the finding's rank in the target as read: every tensor of the finding's node was dumped
    (``seq``, the execution order) before the rank's first backward tensor. msprobe calls every op
    outside autograd "forward" (the optimizer's ``Tensor.mul_``, the gradient all-reduce), so the name
    alone does not tell; a rank with no backward record at all does not tell either (False: the next step
    is read, as before).
    """
    import numpy as np

    if f is None or not getattr(f, "found", False) or len(kept) != 1 or not f.node or f.rank is None:
        return False
    target = kept[0][1]
    if int(target.sizes.get("step", 0)) != 1 or not {"direction", "node", "seq", "present"} <= set(target.variables):
        return False
    if int(f.rank) not in {int(r) for r in target["rank"].values}:
        return False
    one = target.isel(step=0).sel(rank=int(f.rank))
    present = np.asarray(one["present"].values, bool)
    seq = np.asarray(one["seq"].values)
    dirs = np.asarray(target["direction"].values)
    mine = present & (np.asarray(target["node"].values) == str(f.node))
    back = present & (dirs == "backward")
    if not mine.any() or not back.any() or not (dirs[mine] == "forward").all():
        return False  # a node named in the merged layout's names (not found), or no backward to order against
    return bool(seq[mine].max() < seq[back].min())


def _read_first_steps(kept: list[Pair], plan: tuple[list[int], int], n: int, bsrc: Source, tsrc: Source,
                      loaded: Loaded, common: dict[str, Any]) -> None:
    """Add to *kept* the first *n* steps the search did not read (it stopped early: a fault at the first step).

    The steps the search read are not read again: the first-steps diagnoses join them with the ones they lack.
    """
    first, off = plan[0][:n], plan[1]
    have = {int(s) for b, _ in kept for s in b["step"].values}
    more = [s for s in first if s not in have]
    if kept and more and len(first) == n:
        from precnb.errors import NotADumpError

        with contextlib.suppress(NotADumpError):  # unreadable: the diagnoses read their steps themselves, as before
            kept.append((open_source(bsrc, loaded=loaded, steps=more, **common),
                         open_source(tsrc, loaded=loaded, steps=[s + off for s in more], **common)))


class _Reader:
    """Reads one step batch of both runs and merges their shards (the layouts decided on the first batch)."""

    def __init__(self, tsrc: Source, bsrc: Source, opts: Options, off: int, loaded: Loaded,
                 common: dict[str, Any], keep: list[Pair] | None) -> None:
        self.tsrc, self.bsrc, self.opts, self.off = tsrc, bsrc, opts, off
        self.loaded, self.common, self.keep = loaded, common, keep
        self.layouts: tuple[Any, Any] | None = None
        self.layout_notes: list[str] = []
        self.assumed: list[dict[str, Any]] = []  # the layouts read from the dumps
        self.merge_notes: list[str] | None = None
        self.first_merged: Pair | None = None
        self.last: tuple[xr.Dataset, xr.Dataset, xr.Dataset, xr.Dataset] | None = None
        self.first_stats: xr.Dataset | None = None  # the first batch's target statistics (copied shards)

    def __call__(self, batch: list[int]) -> Pair:
        b = open_source(self.bsrc, loaded=self.loaded, steps=batch, **self.common)
        t = open_source(self.tsrc, loaded=self.loaded, steps=[s + self.off for s in batch], **self.common)
        if self.layouts is None:
            self.layouts = (prepare.resolve_layout(self.bsrc.layout, b, "baseline", self.layout_notes,
                                                   assumed=self.assumed),
                            prepare.resolve_layout(self.tsrc.layout, t, "target", self.layout_notes,
                                                   assumed=self.assumed))
        mnotes: list[str] = []
        mb, mt = merge_layouts(b, t, *self.layouts, mnotes, like=self.first_merged)
        assert mb is not None
        if self.merge_notes is None:
            self.merge_notes = mnotes
        if self.first_merged is None:
            self.first_merged = (mb, mt)  # later batches keep the first batch's shard classes
            if mt is not t:  # merged: a shard copied from another rank's earlier one is found across batches
                self.first_stats = t[[v for v in ("max", "min", "mean", "norm", "present") if v in t.data_vars]]
        self.last = (b, t, mb, mt)
        if self.keep is not None and len(self.keep) < 2:
            self.keep.append((b, t))
        return mb, mt


def _search(d: Any, tsrc: Source, bsrc: Source, opts: Options, plan: tuple[list[int], int], tolerance: Any,
            loaded: Loaded, common: dict[str, Any], notes: list[str], keep: list[Pair] | None = None) -> Part:
    """The search of diagnosis *d* reading step batches until one answers (the whole-run answer), as a :class:`Part`.

    *keep* receives the (baseline, target) runs of the first two step batches as read (before merging).
    """
    from precnb.analysis.divergence.stepwise import step_batches
    from precnb.analysis.registry import Context

    search, off = plan
    read = _Reader(tsrc, bsrc, opts, off, loaded, common, keep)
    # the first batch is read here: the alignment is computed once, on it, and reused for every batch
    first = step_batches(sorted(search))[0]
    ready = {tuple(first): read(first)}
    assert read.merge_notes is not None
    alignment = prepare.pair_alignment(*ready[tuple(first)], opts, read.merge_notes)

    def load(batch: list[int]) -> Pair:
        got = ready.pop(tuple(batch), None)
        return got if got is not None else read(batch)

    finding = d.steps.stepwise(load, search, tolerance=tolerance, step_offset=off, crc=opts.crc, alignment=alignment)
    notes.extend(read.layout_notes)
    prepare.nothing_compared_first([finding], loaded.failures)
    notes.extend(read.merge_notes or [])
    skipped = finding.stats.get("steps_not_searched") or []
    if skipped:
        notes.append(f"read step by step: {len(search) - len(skipped)} of {len(search)} step(s) read")
    assert read.last is not None and read.layouts is not None
    raw_b, raw_t, mb, mt = read.last
    checks = [{"kind": d.kind, "title": d.title, "description": d.description,
               "status": "found" if finding.found else "none", "message": finding.reason}]
    b_lay, t_lay = read.layouts
    ctx = Context(target=mt, baseline=mb, raw_target=raw_t, raw_baseline=raw_b, target_layout=t_lay,
                  baseline_layout=b_lay, alignment=alignment, tolerance=tolerance, step_offset=off, crc=opts.crc,
                  names=(bsrc.name, tsrc.name), options=opts.by_kind())
    earlier = read.first_stats  # the first batch's steps, when the finding's batch is a later one
    if earlier is not None and earlier["step"].equals(raw_t["step"]):
        earlier = None
    return Part(ctx=ctx, results=[(d.kind, finding)], by_kind={d.kind: finding}, checks=checks, options=opts,
                assumed=read.assumed, earlier=earlier)


def note_later(findings: list[Any]) -> None:
    """A failing pre-flight finding first: it names the findings after it (they may be consequences).

    ``evidence["later_findings"]`` holds their kind, step, rank, node, tensor and reason, so the one
    JSON object ``precnb diff --json`` prints (the pre-flight finding) still says where the runs
    first diverge.
    """
    from precnb.analysis import registry

    head_d = registry.lookup(findings[0].kind) if findings else None
    if head_d is None or not head_d.order.clean_last:  # a precondition check (the pre-flight checks) heads the list
        return
    later = [f for f in findings[1:] if f.found]
    if not later:
        return
    head = findings[0]
    head.evidence["later_findings"] = [{k: getattr(f, k) for k in ("kind", "step", "rank", "node", "tensor",
                                                                    "reason")} for f in later]
    texts = [f"{f.kind} at step {f.step}, rank {f.rank}" + (f", {f.node}" if f.node else "") for f in later]
    head.evidence["later_findings_text"] = texts
    head.hints.append("found after the pre-flight failure (possibly its consequence): " + "; ".join(texts))

