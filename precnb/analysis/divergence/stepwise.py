"""Search for a first divergence step by step, loading only the steps the answer needs.

A first divergence is ordered by step first: once some loaded prefix of the steps holds a
value difference, later steps cannot change *where* it is.
:func:`precnb.analysis.divergence.first_divergence_stepwise` (the loop is :func:`search_stepwise`,
which knows nothing of what it searches) therefore loads steps in growing batches (1, 1, 2, 4, ... steps), runs
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
from typing import Any

import xarray as xr

from precnb.analysis.findings import Finding
from precnb.combine import concat_steps

__all__ = ["StepLoader", "is_lazy", "search_stepwise", "step_batches"]

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


def search_stepwise(
    load: StepLoader,
    steps: Sequence[int],
    search: Callable[[xr.Dataset, xr.Dataset, Any], Finding],
    *,
    on_batch: Callable[[list[int]], Any] | None = None,
    alignment: Any = "auto",
) -> Finding:
    """Run *search* on growing step batches until it finds something (the loop of a step-by-step search).

    Parameters
    ----------
    load : callable
        ``load(baseline_steps) -> (baseline, target)``.
    steps : sequence of int
        Baseline steps to search, in any order (searched ascending).
    search : callable
        ``search(baseline, target, alignment) -> Finding`` on everything loaded so far
        (:func:`precnb.analysis.divergence.first_divergence_stepwise` passes the divergence search).
    on_batch : callable, optional
        Called with each batch of steps before it is loaded (progress reporting).
    alignment : Alignment, "auto" or None
        ``"auto"`` aligns the names once, on the first batch, and reuses that alignment.

    Returns
    -------
    Finding
        The first batch's finding whose kind is not ``none``, or that reached a horizon
        (``stats["horizon"]``: :mod:`~precnb.analysis.divergence.random_draws`), else the last one, with
        ``stats["steps_not_searched"]`` listing the steps never loaded.

    Examples
    --------
    >>> import precnb
    >>> from precnb.analysis.findings import Finding
    >>> seen = []
    >>> def load(batch):
    ...     seen.append(batch)
    ...     run = precnb.open_run(precnb.sample_path("dp_nan"), steps=batch, progress=False)
    ...     return run, run
    >>> def search(b, t, alignment):  # "finds" something once step 1 is loaded
    ...     return Finding(kind="anomaly" if 1 in b["step"].values else "none", reason="")
    >>> f = search_stepwise(load, [0, 1, 2], search, alignment=None)
    >>> seen, f.kind, f.stats["steps_not_searched"]
    ([[0], [1]], 'anomaly', [2])
    """
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
        finding = search(base, targ, alignment)
        if finding.kind != "none" or finding.stats.get("horizon"):
            break  # a divergence, or a horizon: past it the runs are not comparable (a random draw by design)
    assert finding is not None
    finding.stats["steps_not_searched"] = order[searched:]
    return finding
