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

from dataclasses import dataclass, field
from typing import Any

import xarray as xr

from precnb.analysis._memo import DatasetMemo
from precnb.analysis.tolerance import relative_difference

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
    _rel: dict[Any, xr.DataArray] = field(default_factory=dict)

    def rel(self, stats: tuple[str, ...], atol: float) -> xr.DataArray:
        """Each record's relative difference (the largest over *stats*), computed once per *atol*."""
        key = (tuple(stats), float(atol))
        if key not in self._rel:
            bb, tt = self.both_ds.isel(run=0), self.both_ds.isel(run=1)
            self._rel[key] = relative_difference(bb, tt, stats, atol=atol).max("stat")
        return self._rel[key]


def alignment_key(alignment: Any) -> Any:
    """What of *alignment* the renaming reads (its pairs, glue, target coordinates): equal keys, same renaming.

    None: no renaming (no alignment, or an identical one).
    """
    if alignment is None or getattr(alignment, "identical", True):
        return None
    return (tuple((p.baseline, p.target) for p in alignment.tensors),
            tuple((p.baseline, p.target) for p in alignment.nodes),
            repr(alignment.unpaired), tuple(alignment.frameworks), bool(getattr(alignment, "applied", False)),
            repr(sorted(alignment.target_coords.items())))


def prepared_pair(baseline: xr.Dataset, target: xr.Dataset | None, *, runs: Any, steps: Any, ranks: Any,
                  step_offset: Any, alignment: Any, disjoint: str) -> Prepared:
    """:func:`_prepare` of the pair, reused while the same datasets come with an equal alignment and selection."""
    datasets = [baseline] if target is None else [baseline, target]
    key = ("prepared", repr(runs), repr(None if steps is None else list(steps)),
           repr(None if ranks is None else list(ranks)), repr(step_offset), disjoint, alignment_key(alignment))
    return _PREPARED.get(datasets, key, lambda: _prepare(baseline, target, runs=runs, steps=steps, ranks=ranks,
                                                         step_offset=step_offset, alignment=alignment,
                                                         disjoint=disjoint), copy=False)


def _prepare(baseline: xr.Dataset, target: xr.Dataset | None, *, runs: Any, steps: Any, ranks: Any,
             step_offset: Any, alignment: Any, disjoint: str) -> Prepared:
    """The runs renamed, on their common steps and ranks, combined; shapes and dtypes compared."""
    from precnb.analysis.compare import NothingToCompareError, _numel, align_steps, entry_dtype_differences, split_runs
    from precnb.analysis.rank_args import glue_labels
    from precnb.analysis.undefined import mark_undefined, returned_parameter_grads
    from precnb.combine import combine_runs
    from precnb.schema import shift_entry_changes

    b, t, names = split_runs(baseline, target, runs=runs)
    b, t = mark_undefined(b), mark_undefined(t)  # before any renaming: the reader's table names the run as read
    aligned = alignment is not None and not getattr(alignment, "identical", True)
    if aligned:
        b = alignment.apply(b)
        t = alignment.target_view(t)
    try:
        off = align_steps(b, t, step_offset)
    except NothingToCompareError:
        if disjoint != "union":
            raise
        off = int(step_offset) if isinstance(step_offset, int) and not isinstance(step_offset, bool) else 0
    if off:
        t = t.assign_coords(step=t["step"] - off)
        t.attrs = shift_entry_changes(t.attrs, off)  # per-entry dtypes and metadata follow their steps
    common_steps = sorted(set(b["step"].values.tolist()) & set(t["step"].values.tolist()))
    common_ranks = sorted(set(b["rank"].values.tolist()) & set(t["rank"].values.tolist()))
    if steps is not None:
        common_steps = [s for s in common_steps if s in set(steps)]
    if ranks is not None:
        common_ranks = [r for r in common_ranks if r in set(ranks)]
    if (not common_steps or not common_ranks) and disjoint == "union":
        return Prepared(b=b, t=t, names=names, off=off, aligned=aligned, disjoint=True)
    if not common_steps or not common_ranks:
        raise NothingToCompareError(
            f"the runs share no step/rank to compare (baseline steps {b['step'].values.tolist()}, "
            f"target steps {t['step'].values.tolist()} after offset {off}; baseline ranks "
            f"{b['rank'].values.tolist()}, target ranks {t['rank'].values.tolist()})")
    b = b.sel(step=common_steps, rank=common_ranks)
    t = t.sel(step=common_steps, rank=common_ranks)
    shape_changed: dict[str, tuple[str, str]] = {}
    shared = b.indexes["tensor"].intersection(t.indexes["tensor"])
    glue = {**glue_labels(b), **glue_labels(t),  # tensor-parallel glue of a merged side: no counterpart
            **returned_parameter_grads(b), **returned_parameter_grads(t)}
    if glue:
        shared = shared.difference(list(glue))  # a rank's own part has no whole-model shape to compare
    if len(shared):
        sb = b["shape"].sel(tensor=shared).values
        st = t["shape"].sel(tensor=shared).values
        for lbl, x, y in zip(shared, sb, st, strict=True):
            if x != y and x and y and not (aligned and _numel(str(x)) == _numel(str(y))):
                shape_changed[str(lbl)] = (str(x), str(y))  # (an aligned pair may differ by a reshape only)
    both_ds = combine_runs({names[0]: b, names[1]: t})
    cross = aligned and len(set(getattr(alignment, "frameworks", ()))) > 1
    dtype_notes: dict[str, tuple[str, str, str]] = {}
    dtype_differs, dtype_changed = entry_dtype_differences(b, t, both_ds, cross=cross, notes=dtype_notes)
    return Prepared(b=b, t=t, names=names, off=off, aligned=aligned, both_ds=both_ds, shape_changed=shape_changed,
                    glue=glue, cross=cross, dtype_differs=dtype_differs, dtype_changed=dtype_changed,
                    dtype_notes=dtype_notes)
