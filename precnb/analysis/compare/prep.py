"""What :func:`precnb.analysis.compare.compare_runs` computes before any tolerance is applied, reused.

Renaming the baseline into the target's names (:meth:`~precnb.analysis.align.Alignment.apply`), the
common steps and ranks, the shape and dtype differences, the combined grid and each record's relative
difference depend on the two runs, the alignment's pairs and the step / rank selection: not on the
tolerance. An explorer's rerun with another tolerance (or a Match that leaves every tensor pair as it
was) passes the same dataset objects again: this part is taken from the previous comparison
(:class:`precnb.analysis._memo.DatasetMemo`) and only thresholded again. The answer is the one computed
afresh (``tests/test_rerun_reuse.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis._arrays import on_grid
from precnb.analysis._memo import DatasetMemo
from precnb.analysis.compare.tolerance import relative_arrays, relative_difference

__all__ = ["Prepared", "alignment_key", "prepared_pair"]

_PREPARED = DatasetMemo(size=2)


@dataclass
class Prepared:
    """The tolerance-free part of a comparison (read, never changed, by its callers)."""

    b: xr.Dataset
    t: xr.Dataset
    names: tuple[str, str]
    off: int
    aligned: bool
    disjoint: bool = False
    both_ds: Any = None
    shape_changed: dict[str, tuple[str, str]] = field(default_factory=dict)
    glue: dict[str, str] = field(default_factory=dict)
    cross: bool = False
    dtype_differs: Any = None
    dtype_changed: dict[str, tuple[str, str]] = field(default_factory=dict)
    dtype_notes: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    shifted: list[dict[str, Any]] = field(default_factory=list)  # calls whose API's labels shifted at one entry
    _rel: dict[Any, xr.DataArray] = field(default_factory=dict)

    def rel(self, stats: tuple[str, ...], atol: float) -> xr.DataArray:
        """Each record's relative difference (the largest over *stats*), computed once per *atol*."""
        key = (tuple(stats), float(atol))
        if key not in self._rel:
            bb, tt = self.both_ds.isel(run=0), self.both_ds.isel(run=1)
            self._rel[key] = largest_difference(bb, tt, stats, atol)
        return self._rel[key]


def largest_difference(bb: xr.Dataset, tt: xr.Dataset, stats: tuple[str, ...], atol: float) -> xr.DataArray:
    """``relative_difference(bb, tt, stats).max("stat")``, computed one step at a time.

    The values are the same (each entry is judged on its own); the temporaries (every statistic's
    difference, scale and masks) span one step instead of the whole pair. Each variable is read once and sliced
    per step in numpy (as ``isel(step=...)`` slices it); no record's difference is NaN, so the largest over the
    statistics is numpy's ``max``.
    """
    like = bb["max"]
    if "step" not in like.dims or like.sizes["step"] <= 1:
        return relative_difference(bb, tt, stats, atol=atol).max("stat")
    if bb["max"].dims != tt["max"].dims or bb["max"].shape != tt["max"].shape:
        relative_difference(bb, tt, stats, atol=atol)  # raises its error (runs not aligned)
    axis = like.get_axis_num("step")
    out = np.empty(like.shape, np.float64)
    read: dict[tuple[int, str], tuple[np.ndarray, int | None]] = {}

    def column(ds: xr.Dataset, side: int, name: str, i: int) -> np.ndarray:
        got = read.get((side, name))
        if got is None:
            var = ds[name]
            got = read[(side, name)] = (var.values, var.get_axis_num("step") if "step" in var.dims else None)
        values, at = got
        return values if at is None else values[(slice(None),) * at + (slice(i, i + 1),)]

    for i in range(like.sizes["step"]):
        part = relative_arrays(functools.partial(column, bb, 0, i=i), functools.partial(column, tt, 1, i=i),
                               stats, atol=atol).max(axis=0)
        np.moveaxis(out, axis, 0)[i] = np.moveaxis(part, axis, 0)[0]
    return on_grid(like, out)


def alignment_key(alignment: Any) -> Any:
    """What of *alignment* the renaming reads (its pairs, glue, target coordinates): equal keys, same renaming.

    None: no renaming (no alignment, or an identical one).
    """
    if alignment is None or getattr(alignment, "identical", True):
        return None
    # computed once per alignment (a run renames with it up to three times), again if one of its parts is replaced
    guard = (tuple((id(v), len(v)) for v in (alignment.tensors, alignment.nodes, alignment.unpaired,
                                             alignment.target_coords)),
             tuple(alignment.frameworks), bool(getattr(alignment, "applied", False)))
    kept = vars(alignment).get("_rename_key")
    if kept is not None and kept[0] == guard:
        return kept[1]
    key = (tuple((p.baseline, p.target) for p in alignment.tensors),
           tuple((p.baseline, p.target) for p in alignment.nodes),
           repr(alignment.unpaired), tuple(alignment.frameworks), bool(getattr(alignment, "applied", False)),
           repr(sorted(alignment.target_coords.items())))
    vars(alignment)["_rename_key"] = (guard, key)
    return key


def prepared_pair(baseline: xr.Dataset, target: xr.Dataset | None, *, runs: Any, steps: Any, ranks: Any,
                  step_offset: Any, alignment: Any, disjoint: str, compute: Callable[[], Prepared]) -> Prepared:
    """*compute()*, reused while the same datasets come with an equal alignment and selection.

    *compute* is :func:`precnb.analysis.compare.prepare_pair` of these arguments.
    """
    datasets = [baseline] if target is None else [baseline, target]
    key = ("prepared", repr(runs), repr(None if steps is None else list(steps)),
           repr(None if ranks is None else list(ranks)), repr(step_offset), disjoint, alignment_key(alignment))
    return _PREPARED.get(datasets, key, compute, copy=False)
