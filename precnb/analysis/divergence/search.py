"""First divergence between a baseline and a target run: the search, in memory or step by step.

:func:`first_divergence` compares the pair (:func:`pair_comparison`), judges it
(:mod:`~precnb.analysis.divergence.judged`) and, when a difference is left, reports its origin
(:mod:`~precnb.analysis.divergence.origin`). Lazily opened runs are searched step by step
(:func:`first_divergence_stepwise`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

import xarray as xr

from precnb.analysis.compare import Comparison, NothingToCompareError, compare_runs, split_runs
from precnb.analysis.compare.compared import compared_part, nothing_compared
from precnb.analysis.compare.tolerance import Tolerance
from precnb.analysis.divergence.crossfw import noise_floor, two_frameworks
from precnb.analysis.divergence.judged import judge, no_divergence
from precnb.analysis.divergence.origin import origin_finding
from precnb.analysis.divergence.shifted import shifted_call_finding
from precnb.analysis.divergence.stepwise import StepLoader, is_lazy, search_stepwise
from precnb.analysis.findings import Finding

__all__ = ["first_divergence", "first_divergence_stepwise", "pair_comparison"]


def _nothing(b: xr.Dataset, t: xr.Dataset, names: tuple[str, str], alignment: Any, step_offset: Any,
             steps: Sequence[int] | None, ranks: Sequence[int] | None) -> Finding:
    """The "nothing compared" finding of a pair (the baseline in the target's names when aligned)."""
    if alignment is not None:
        b = alignment.apply(b)
    off = step_offset if isinstance(step_offset, int) and not isinstance(step_offset, bool) else 0
    return nothing_compared(b, t, names, step_offset=off, steps=steps, ranks=ranks)


def pair_comparison(baseline: xr.Dataset, target: xr.Dataset, *, alignment: Any = None,
                    tolerance: Tolerance | None = None, **kw: Any) -> Comparison:
    """The :class:`Comparison` the first-divergence search judges.

    :func:`compare_runs`, and for two frameworks without a tolerance, again with the tolerance
    calibrated on their noise floor (:func:`noise_floor`; ``calibration`` holds it). *kw* goes to
    :func:`compare_runs` (``runs``, ``steps``, ``ranks``, ``step_offset``, ``tensor_metrics``, ...).
    """
    aligned = alignment is not None and not getattr(alignment, "identical", True)
    cmp = compare_runs(baseline, target, tolerance=tolerance, alignment=alignment if aligned else None, **kw)
    if two_frameworks(alignment) and tolerance is None and bool(cmp.both.any()):
        # two frameworks: calibrate from how well the aligned pair agrees before any real difference
        noise, calibrated = noise_floor(cmp)
        if calibrated is not None:
            cmp = compare_runs(baseline, target, tolerance=calibrated, alignment=alignment, **kw)
        cmp.calibration = noise
    return cmp


def first_divergence(
    baseline: xr.Dataset,
    target: xr.Dataset | None = None,
    *,
    runs: tuple[str, str] | None = None,
    tolerance: Tolerance | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    step_offset: int | Literal["auto"] | None = None,
    crc: Literal["report", "strict"] = "report",
    alignment: Any = "auto",
    tensor_metrics: xr.Dataset | None = None,
    tensor_thresholds: Any = None,
    precision_aware: bool = True,
    comparison: Comparison | None = None,
) -> Finding:
    """Find where *target* first departs from *baseline*.

    Order: step, then execution order (``seq``); across ranks, communication-aware (see
    :mod:`precnb.analysis.causal.order`). Value differences are judged on statistics with
    *tolerance*; nodes recorded in one run only are reported as ``structural``; CRC
    differences with identical statistics are reported as ``crc_only`` (``crc="strict"``
    counts them as divergence).

    Parameters
    ----------
    baseline, target : xarray.Dataset
        Two runs, or one dataset with a ``run`` dim (then pass ``runs=(b, t)`` if it has more
        than two).
    runs : (str, str), optional
    tolerance : Tolerance, optional
        Defaults by dtype.
    steps, ranks : sequence of int, optional
        Restrict the search (baseline step numbers).
    step_offset : int, "auto" or None
        Target step = baseline step + offset (a resumed run). None (default): 0 when both runs
        hold the same steps, else "auto" (see :func:`precnb.analysis.compare.default_step_offset`).
    crc : {"report", "strict"}
    alignment : Alignment, "auto" or None
        How the baseline's names map onto the target's. ``"auto"`` (default): :func:`precnb.align`
        pairs them (identity, at no cost, when both runs have the same names); None compares
        names as they are. The finding's ``node``, ``tensor`` and ``module`` are the target's;
        its ``baseline`` field holds the baseline's names.
    tensor_metrics : xarray.Dataset, optional
        :func:`precnb.tensor_metrics` of the pair: entries whose tensors were compared are
        judged on them first (msprobe's thresholds, see :mod:`precnb.analysis.tensor.verdicts`),
        the others on statistics.
    tensor_thresholds : TensorThresholds, optional
        Bounds of the tensor verdict (e.g. :meth:`TensorThresholds.calibrate` on a healthy pair).
    precision_aware : bool
        A run in systematic lower precision (autocast) is compared with that precision's
        tolerance and says so (:mod:`precnb.analysis.compare.precision`); an isolated dtype change stays
        a finding.
    comparison : Comparison, optional
        The pair as already compared with these options (the pipeline builds it once for the
        search and the views); the search then does not compare the runs again.

    Returns
    -------
    Finding
        Kind ``first_divergence``, or ``none``.

    Notes
    -----
    Dask-backed (lazily opened) inputs are searched step by step (see
    :func:`first_divergence_stepwise`): only the steps up to the
    fault are loaded, and ``stats["steps_not_searched"]`` lists the others.

    See Also
    --------
    xarray.Dataset.diff : finite differences along a dimension (unrelated).

    Examples
    --------
    >>> import precnb
    >>> f = precnb.first_divergence(base, target)  # doctest: +SKIP
    >>> f.step, f.rank, f.node  # doctest: +SKIP
    (1, 0, 'Functional.gelu.0.forward')
    """
    if is_lazy(baseline) or is_lazy(target):  # out of core: load the steps up to the fault only
        b, t, pair = split_runs(baseline, target, runs=runs)
        try:
            return _first_divergence_lazy(b, t, names=pair, tolerance=tolerance, steps=steps, ranks=ranks,
                                          step_offset=step_offset, crc=crc, alignment=alignment,
                                          tensor_metrics=tensor_metrics, tensor_thresholds=tensor_thresholds,
                                          precision_aware=precision_aware)
        except NothingToCompareError:
            return _nothing(b, t, pair, None, step_offset, steps, ranks)
    b_in, t_in, pair = split_runs(baseline, target, runs=runs)
    hooks = {"tensor_metrics": tensor_metrics, "tensor_thresholds": tensor_thresholds,
             "precision_aware": precision_aware}  # issue #17
    if isinstance(alignment, str) and alignment == "auto":
        from precnb.analysis.align import Alignment, align

        # one dataset holding both runs (precnb.open_runs) already has the baseline in the target's names
        alignment = (Alignment.of(baseline) if target is None else None) or align(b_in, t_in)
    aligned = alignment is not None and not alignment.identical
    try:
        cmp = comparison if comparison is not None else pair_comparison(
            b_in, t_in, runs=pair, tolerance=tolerance, steps=steps, ranks=ranks, step_offset=step_offset,
            alignment=alignment, **hooks)
    except NothingToCompareError:  # no step or rank in common: nothing compared is the answer, not an error
        return _nothing(b_in, t_in, pair, alignment if aligned else None, step_offset, steps, ranks)
    if not bool(cmp.both.any()):
        return _nothing(b_in, t_in, pair, alignment if aligned else None, cmp.step_offset, steps, ranks)
    judged = judge(cmp, (b_in, t_in), alignment, crc)
    any_step = judged.diff.any(["rank", "tensor"])
    if not bool(any_step.any()):  # a call made in one run only that shifted its API's labels, else nothing
        return shifted_call_finding(judged) or no_divergence(judged)
    return origin_finding(judged, any_step)


def first_divergence_stepwise(
    load: StepLoader,
    steps: Sequence[int],
    *,
    names: tuple[str, str] = ("baseline", "target"),
    tolerance: Tolerance | None = None,
    ranks: Sequence[int] | None = None,
    step_offset: int = 0,
    crc: Literal["report", "strict"] = "report",
    on_batch: Callable[[list[int]], Any] | None = None,
    alignment: Any = "auto",
    **hooks: Any,
) -> Finding:
    """First divergence, loading steps in growing batches until one is found.

    Parameters
    ----------
    load : callable
        ``load(baseline_steps)`` returns ``(baseline, target)`` datasets holding those
        baseline steps and the target steps ``step + step_offset``.
    steps : sequence of int
        Baseline steps to search, in any order (searched ascending).
    names : (str, str)
        Run names for the finding.
    tolerance, ranks, crc
        As for :func:`first_divergence`.
    step_offset : int
        Target step = baseline step + offset (already resolved: not ``"auto"``).
    on_batch : callable, optional
        Called with each batch of steps before it is loaded (progress reporting).
    alignment : Alignment, "auto" or None
        As for :func:`first_divergence`; ``"auto"`` aligns the names once, on the first batch,
        and reuses that alignment for every later batch.
    **hooks
        Passed on to :func:`first_divergence` (``tensor_metrics``, ``tensor_thresholds``,
        ``precision_aware``).

    Returns
    -------
    Finding
        As :func:`first_divergence` over all *steps* would return, with
        ``stats["steps_not_searched"]`` listing the steps never loaded.

    Raises
    ------
    ValueError
        When *steps* is empty.

    Examples
    --------
    >>> import precnb
    >>> def load(batch):  # doctest: +SKIP
    ...     return precnb.open_run("gpu", steps=batch), precnb.open_run("npu", steps=batch)
    >>> first_divergence_stepwise(load, [0, 1, 2, 3]).step  # doctest: +SKIP
    1
    """
    def search(base: xr.Dataset, targ: xr.Dataset, aligned: Any) -> Finding:
        return first_divergence(base, targ, runs=names, tolerance=tolerance, ranks=ranks,
                                step_offset=step_offset, crc=crc, alignment=aligned, **hooks)

    return search_stepwise(load, steps, search, on_batch=on_batch, alignment=alignment)


def _first_divergence_lazy(
    baseline: xr.Dataset,
    target: xr.Dataset,
    *,
    names: tuple[str, str],
    tolerance: Tolerance | None,
    steps: Sequence[int] | None,
    ranks: Sequence[int] | None,
    step_offset: int | Literal["auto"] | None,
    crc: Literal["report", "strict"],
    alignment: Any = "auto",
    **hooks: Any,
) -> Finding:
    """:func:`first_divergence_stepwise` over two dask-backed datasets (loaded batch by batch)."""
    from precnb.analysis.compare import align_steps

    off = align_steps(baseline, target, step_offset)
    tsteps = {int(s) for s in target["step"].values}
    search = [int(s) for s in baseline["step"].values if int(s) + off in tsteps]
    if steps is not None:
        search = [s for s in search if s in set(steps)]
    if not search:
        raise NothingToCompareError(
            f"the runs share no step to compare (baseline steps {baseline['step'].values.tolist()}, "
            f"target steps {sorted(tsteps)} after offset {off})")

    def load(batch: list[int]) -> tuple[xr.Dataset, xr.Dataset]:
        return (baseline.sel(step=batch).load(),
                target.sel(step=[s + off for s in batch]).load())

    f = first_divergence_stepwise(load, search, names=names, tolerance=tolerance, ranks=ranks,
                                  step_offset=off, crc=crc, alignment=alignment, **hooks)
    if f.kind == "none" and "compared_records" in f.stats and not f.stats.get("nothing_compared"):
        # "compared N of M" against the whole runs, as the in-memory search says it (the batches hold
        # only the steps both runs have)
        clean = "no value divergence beyond tolerance"
        f.reason = re.sub(r"^no value divergence beyond tolerance \(compared [^)]*\)", clean, f.reason)
        part = compared_part(int(f.stats["compared_records"]), baseline, target, names, f.stats)
        if part and f.reason.startswith(clean):
            f.reason = f"{clean} ({part})" + f.reason[len(clean):]
    return f
