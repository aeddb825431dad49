"""Which steps of two runs correspond: the step offset, given or detected from the runs' parameters.

Used by :mod:`precnb.analysis.compare` and the pipeline (:mod:`precnb.pipeline.prepare`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

__all__ = ["NothingToCompareError", "align_steps", "default_step_offset"]


class NothingToCompareError(ValueError):
    """Two runs share no step or rank to compare (a ValueError: callers that caught that still do).

    :func:`precnb.analysis.divergence.first_divergence` answers it with a "nothing compared"
    finding (:func:`precnb.analysis.compare.compared.nothing_compared`).
    """


def default_step_offset(baseline_steps: Any, target_steps: Any, step_offset: int | str | None) -> int | str:
    """The one rule for the step-offset default, shared by every front end.

    ``None`` (the default everywhere) means: 0 when both runs hold the same step numbers,
    else ``"auto"`` (detected from parameter statistics: a resumed run whose step counter
    restarted, or started later). An int or ``"auto"`` is returned unchanged.

    Examples
    --------
    >>> default_step_offset([0, 1, 2], [0, 1, 2], None)
    0
    >>> default_step_offset([0, 1, 2, 3], [0, 1], None)
    'auto'
    >>> default_step_offset([0, 1], [5, 6], 5)
    5
    """
    if step_offset is None:
        same = sorted(int(s) for s in baseline_steps) == sorted(int(s) for s in target_steps)
        return 0 if same else "auto"
    if step_offset == "auto":
        return "auto"
    return int(step_offset)


def align_steps(baseline: xr.Dataset, target: xr.Dataset, step_offset: int | str | None = None) -> int:
    """Return the step offset (target step = baseline step + offset).

    ``"auto"`` picks the offset under which the most parameter statistics agree exactly
    (a resumed run whose step counter restarted, or started later); ``None`` applies
    :func:`default_step_offset`. When no offset makes any parameter statistic agree, the
    answer is 0 if the runs share step numbers (nothing better is known), else a ValueError:
    comparing arbitrary steps would be a confident wrong answer.
    """
    step_offset = default_step_offset(baseline["step"].values, target["step"].values, step_offset)
    if step_offset != "auto":
        return int(step_offset)
    bsteps = [int(s) for s in baseline["step"].values]
    tsteps = [int(s) for s in target["step"].values]
    params_b = baseline["role"].values == "parameter"
    labels = [t for t, p in zip(baseline["tensor"].values, params_b, strict=True) if p]
    labels = [t for t in labels if t in target.indexes["tensor"]] or list(
        set(baseline["tensor"].values) & set(target["tensor"].values))
    shared = bool(set(bsteps) & set(tsteps))
    if not labels:
        if shared:
            return 0
        raise NothingToCompareError(f"the runs share no step/rank to compare (baseline steps {bsteps}, target steps "
                         f"{tsteps}) and share no tensor to detect a step offset from")
    bmax = baseline["norm"].sel(tensor=labels)
    tmax = target["norm"].sel(tensor=labels)
    best, best_score = 0, -1
    for off in sorted({t - b for b in bsteps for t in tsteps}, key=abs):
        score = 0
        for b in bsteps:
            if b + off in tsteps:
                x = bmax.sel(step=b).values
                y = tmax.sel(step=b + off).values
                score += int(np.sum(x == y))
        if score > best_score:
            best, best_score = off, score
    if best_score <= 0:
        if shared:
            return 0
        raise NothingToCompareError(f"the runs share no step/rank to compare (baseline steps {bsteps}, target steps "
                         f"{tsteps}) and no step offset makes any parameter statistic agree")
    return best
