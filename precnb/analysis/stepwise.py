"""Search for a first divergence step by step, loading only the steps the answer needs.

A first divergence is ordered by step first: once some loaded prefix of the steps holds a
value difference, later steps cannot change *where* it is. :func:`first_divergence_stepwise`
therefore loads steps in growing batches (1, 1, 2, 4, ... steps), runs
:func:`precnb.analysis.first_divergence` on everything loaded so far, and stops at the first
batch that yields a divergence. The answer (step, rank, node, tensor, reason, suspects,
structural cause) is the one a search over every step gives; the ``stats`` cover the steps
searched and list the ``steps_not_searched``.

This is what makes ``precnb diff`` on a long run cost the steps up to the fault rather than
the whole run, and what keeps :func:`~precnb.analysis.first_divergence` out of core on a
lazily opened (dask-backed) store: at most twice the steps up to the fault are in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import xarray as xr

from precnb.analysis.findings import Finding
from precnb.analysis.tolerance import Tolerance
from precnb.combine import concat_steps

__all__ = ["StepLoader", "first_divergence_stepwise", "is_lazy", "step_batches"]

StepLoader = Callable[[list[int]], tuple[xr.Dataset, xr.Dataset]]
"""``load(baseline_steps) -> (baseline, target)`` holding those steps (target: step + offset)."""


def is_lazy(ds: xr.Dataset | None) -> bool:
    """True when *ds* has dask-backed (not yet loaded) variables.

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> is_lazy(empty_dataset())
    False
    """
    return ds is not None and bool(ds.chunks)


def step_batches(steps: Sequence[int], first: int = 1) -> list[list[int]]:
    """Split *steps* (in order) into batches of 1, 1, 2, 4, ... steps (*first* sets the first size).

    The doubling bounds the repeated analysis of the loaded prefix to about twice the work
    of one analysis of the steps up to the fault.

    Examples
    --------
    >>> step_batches([0, 1, 2, 3, 4, 5, 6, 7, 8])
    [[0], [1], [2, 3], [4, 5, 6, 7], [8]]
    """
    out: list[list[int]] = []
    steps = list(steps)
    first = max(1, int(first))
    i = 0
    while i < len(steps):
        take = first if len(out) < 2 else i  # then double what is loaded
        out.append(steps[i:i + take])
        i += take
    return out


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
        As for :func:`precnb.analysis.first_divergence`.
    step_offset : int
        Target step = baseline step + offset (already resolved: not ``"auto"``).
    on_batch : callable, optional
        Called with each batch of steps before it is loaded (progress reporting).
    alignment : Alignment, "auto" or None
        As for :func:`precnb.analysis.first_divergence`; ``"auto"`` aligns the names once, on
        the first batch, and reuses that alignment for every later batch.
    **hooks
        Passed on to :func:`precnb.analysis.first_divergence` (``tensor_metrics``,
        ``tensor_thresholds``, ``precision_aware``).

    Returns
    -------
    Finding
        As :func:`precnb.analysis.first_divergence` over all *steps* would return, with
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
    from precnb.analysis.divergence import first_divergence

    order = sorted({int(s) for s in steps})
    if not order:
        raise ValueError("no step to search")
    base_parts: list[xr.Dataset] = []
    targ_parts: list[xr.Dataset] = []
    finding: Finding | None = None
    searched = 0
    for batch in step_batches(order):
        if on_batch is not None:
            on_batch(batch)
        b, t = load(batch)
        base_parts.append(b)
        targ_parts.append(t)
        searched += len(batch)
        base = concat_steps(base_parts)
        targ = concat_steps(targ_parts)
        base_parts, targ_parts = [base], [targ]
        if isinstance(alignment, str) and alignment == "auto":  # once per pair of runs, not per batch
            from precnb.analysis.align import align

            alignment = align(base, targ)
        finding = first_divergence(base, targ, runs=names, tolerance=tolerance, ranks=ranks,
                                   step_offset=step_offset, crc=crc, alignment=alignment, **hooks)
        if finding.kind != "none":
            break
    assert finding is not None
    finding.stats["steps_not_searched"] = order[searched:]
    return finding


def first_divergence_lazy(
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
        raise ValueError(
            f"the runs share no step to compare (baseline steps {baseline['step'].values.tolist()}, "
            f"target steps {sorted(tsteps)} after offset {off})")

    def load(batch: list[int]) -> tuple[xr.Dataset, xr.Dataset]:
        return (baseline.sel(step=batch).load(),
                target.sel(step=[s + off for s in batch]).load())

    return first_divergence_stepwise(load, search, names=names, tolerance=tolerance, ranks=ranks,
                                     step_offset=off, crc=crc, alignment=alignment, **hooks)
