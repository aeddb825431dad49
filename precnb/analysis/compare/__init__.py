"""Pairing two runs tensor by tensor: what is shared, what differs, what exists in one only.

The comparison family: this module (:func:`compare_runs`, :class:`Comparison`) and what it is made of —
:mod:`~precnb.analysis.compare.tolerance` (the relative difference and its thresholds),
:mod:`~precnb.analysis.compare.steps` (which steps correspond), :mod:`~precnb.analysis.compare.prep`
(the tolerance-free part, reused on reruns), :mod:`~precnb.analysis.compare.entry_dtypes` (entries recorded
in other dtypes), :mod:`~precnb.analysis.compare.precision` (autocast judged with the lower precision's
tolerance) and :mod:`~precnb.analysis.compare.compared` (how much of the runs a comparison covered).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import xarray as xr

from precnb.analysis._arrays import on_grid
from precnb.analysis.compare.entry_dtypes import _numel, entry_dtype_differences
from precnb.analysis.compare.steps import NothingToCompareError, align_steps, default_step_offset
from precnb.analysis.compare.tolerance import Tolerance
from precnb.combine import combine_runs, select_run
from precnb.schema import shift_entry_changes

__all__ = ["Comparison", "NothingToCompareError", "align_steps", "compare_runs", "default_step_offset",
           "entry_dtype_differences", "split_runs"]


def split_runs(baseline: xr.Dataset, target: xr.Dataset | None, *, runs: tuple[str, str] | None = None
               ) -> tuple[xr.Dataset, xr.Dataset, tuple[str, str]]:
    """Accept either two single-run datasets or one dataset with a ``run`` dim."""
    if target is None:
        if "run" not in baseline.dims:
            raise ValueError("pass a baseline and a target, or one dataset with a 'run' dimension")
        names = [str(r) for r in baseline["run"].values]
        if runs is None:
            if len(names) != 2:
                raise ValueError(f"dataset has runs {names}; say which two with runs=(baseline, target)")
            runs = (names[0], names[1])
        b = select_run(baseline, runs[0])
        t = select_run(baseline, runs[1])
        return b, t, runs
    return baseline, target, runs or ("baseline", "target")


@dataclass
class Comparison:
    """Two runs aligned on (step, rank, tensor), with difference masks.

    Attributes
    ----------
    ds : xarray.Dataset
        Combined dataset, ``run`` = (baseline, target), restricted to shared steps and ranks.
    rel : xarray.DataArray
        Largest relative difference over the statistics, (step, rank, tensor).
    rtol : xarray.DataArray
        Tolerance per tensor.
    both, only_baseline, only_target, differs, crc_differs, crc_only : xarray.DataArray
        Boolean masks over (step, rank, tensor).
    dtype_changed : dict
        tensor → (baseline dtype, target dtype) at its first entry whose dtypes differ.
    dtype_differs : xarray.DataArray
        Entries recorded in both runs with different dtypes (counted in ``differs``).
    names : tuple of str
    step_offset : int
    """

    ds: xr.Dataset
    rel: xr.DataArray
    rtol: xr.DataArray
    both: xr.DataArray
    only_baseline: xr.DataArray
    only_target: xr.DataArray
    differs: xr.DataArray
    crc_differs: xr.DataArray
    crc_only: xr.DataArray
    dtype_changed: dict[str, tuple[str, str]]
    shape_changed: dict[str, tuple[str, str]]
    names: tuple[str, str]
    step_offset: int
    base: xr.Dataset
    targ: xr.Dataset
    dtype_differs: xr.DataArray | None = None
    #: tensors whose dtypes differ but hold the same values (precnb.dtypes.EQUIVALENT): tensor -> (baseline
    #: dtype, target dtype, why); a note on the pair, never a difference
    dtype_notes: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    # issue #17 hooks: the precision verdict (precnb.analysis.compare.precision) and the entries judged on
    # whole tensors (precnb.analysis.tensor.verdicts); None when not applicable
    precision: Any = None
    tensor_judged: xr.DataArray | None = None
    # two frameworks compared with the tolerance calibrated on their noise floor: that calibration
    calibration: Any = None
    #: entries of a merged target whose replicated copies differ across their TP/CP group
    #: (:func:`precnb.analysis.layout.merge.merge_shards`); counted in ``differs``
    replicas_differ: xr.DataArray | None = None
    tensor_metrics: xr.Dataset | None = None
    tensor_thresholds: Any = None
    #: entries with no defined value on either side (:mod:`precnb.analysis.undefined`), never counted
    #: in ``differs``; ``undefined_why``: tensor label → why
    undefined: xr.DataArray | None = None
    undefined_why: dict[str, str] | None = None
    #: calls made in one run only at one (step, rank), their API's later labels there paired by value (``shifts``)
    shifted_calls: list[dict[str, Any]] = field(default_factory=list)

    def set_aside(self) -> list[dict[str, Any]]:
        """The undefined entries whose statistics differ, which the comparison set aside (by reason)."""
        from precnb.analysis.undefined import summarise

        if self.undefined is None:
            return []
        m = (self.undefined & (self.rel > self.rtol)).values
        return summarise(m, self.ds["step"].values, self.ds["rank"].values, self.ds["tensor"].values,
                         self.undefined_why or {}) if m.any() else []

    @property
    def baseline(self) -> xr.Dataset:
        """The baseline side."""
        return self.ds.isel(run=0)

    @property
    def target(self) -> xr.Dataset:
        """The target side."""
        return self.ds.isel(run=1)


def _by_schedule(both_ds: xr.Dataset, glue: dict[str, str]) -> np.ndarray:
    """Per tensor: a bias gradient that depends on the schedule (set aside against the baseline).

    Its baseline's value is not comparable, but the target's replicas share one schedule: their copies must agree.
    """
    from precnb.analysis.undefined import RETURNED

    return np.fromiter((glue.get(str(x)) == RETURNED for x in both_ds["tensor"].values), bool,
                       both_ds.sizes["tensor"])


def _nan_here_finite_there(bb: xr.Dataset, tt: xr.Dataset, both: xr.DataArray) -> np.ndarray:
    """(step, rank, tensor): entries both runs hold, with a NaN statistic in the target and none in the baseline."""
    nan_t = np.zeros(both.shape, bool)
    fin_b = np.asarray(both.values, bool).copy()
    for s in ("max", "min", "mean", "norm"):
        if s in tt.data_vars:
            nan_t |= np.isnan(np.asarray(tt[s].values, np.float64))
            fin_b &= np.isfinite(np.asarray(bb[s].values, np.float64))
    return nan_t & fin_b


def _replicas_differ(t: xr.Dataset, tt: xr.Dataset, both: xr.DataArray) -> xr.DataArray | None:
    """The target's ``replicas_differ`` marks on the comparison's grid (None when it has none)."""
    if "replicas_differ" not in t.data_vars or not bool(t["replicas_differ"].any()):
        return None
    rd = t["replicas_differ"].reindex(tensor=tt["tensor"].values, fill_value=False)
    out = xr.DataArray(np.asarray(rd.values, bool), dims=("step", "rank", "tensor"), coords=both.coords)
    # the target's own check: copies proven replicas (identical at the first steps) that differ later need no
    # baseline counterpart; copies classed as replicas by shape rules are judged where the baseline has them
    alone = np.asarray(proven_replicas(tt), bool)[None, None, :] & np.asarray(tt["present"].values, bool)
    return out & (both | xr.DataArray(alone, dims=out.dims, coords=out.coords))


def proven_replicas(ds: xr.Dataset) -> np.ndarray:
    """Per tensor: merged from copies found identical on every rank of a group at its first steps.

    Identical Max and Min of an integer or boolean tensor recorded without a Mean prove nothing
    (:func:`precnb.dtypes.weak_identity`: counts over each rank's own tokens agree by chance).

    >>> from precnb.schema import empty_dataset
    >>> proven_replicas(empty_dataset()).shape
    (0,)
    """
    from precnb.dtypes import weak_identity

    out = np.zeros(ds.sizes["tensor"], bool)
    for name in ds.coords:
        if str(name).startswith("shard_kind_"):
            out |= np.asarray(ds[name].values == "replicated", bool)
    if out.any():
        has_mean = np.asarray(np.isfinite(ds["mean"].values).any(axis=(0, 1)), bool)
        weak = np.fromiter((weak_identity(str(d), bool(m)) for d, m in zip(ds["dtype"].values, has_mean,
                                                                             strict=True)), bool, len(out))
        out &= ~weak
    return out


def _disjoint(b: xr.Dataset, t: xr.Dataset, names: tuple[str, str], off: int, tol: Tolerance) -> Comparison:
    """The comparison of two runs that share no step or rank: their union grid, nothing in both."""
    both_ds = combine_runs({names[0]: b, names[1]: t})
    pb, pt = both_ds["present"].isel(run=0, drop=True), both_ds["present"].isel(run=1, drop=True)
    none = xr.zeros_like(pb, dtype=bool)
    rtol = xr.DataArray(tol.rtol_array(both_ds["dtype"].values, both_ds["tensor"].values), dims="tensor",
                        coords={"tensor": both_ds["tensor"]})
    return Comparison(ds=both_ds, rel=xr.zeros_like(pb, dtype=np.float64), rtol=rtol, both=none, dtype_differs=none,
                      only_baseline=pb & ~pt, only_target=pt & ~pb, differs=none, crc_differs=none, crc_only=none,
                      dtype_changed={}, shape_changed={}, names=names, step_offset=off, base=b, targ=t)


def _restrict(ds: xr.Dataset, steps: list[Any], ranks: list[Any]) -> xr.Dataset:
    """*ds* on these steps and ranks: *ds* itself when they are all of its own, in its order (no copy)."""
    if ds["step"].values.tolist() == list(steps) and ds["rank"].values.tolist() == list(ranks):
        return ds
    return ds.sel(step=steps, rank=ranks)


def compare_runs(
    baseline: xr.Dataset,
    target: xr.Dataset | None = None,
    *,
    runs: tuple[str, str] | None = None,
    tolerance: Tolerance | None = None,
    steps: Any = None,
    ranks: Any = None,
    step_offset: int | str | None = None,
    stats: tuple[str, ...] = ("max", "min", "mean", "norm"),
    alignment: Any = None,
    tensor_metrics: xr.Dataset | None = None,
    tensor_thresholds: Any = None,
    precision_aware: bool = True,
    disjoint: Literal["raise", "union"] = "raise",
) -> Comparison:
    """Align two runs and compute difference masks.

    Parameters
    ----------
    baseline, target : xarray.Dataset
        Two single-run datasets, or *baseline* with a ``run`` dim and *target* None.
    runs : (str, str), optional
        Run names to pick from a combined dataset.
    tolerance : Tolerance, optional
    steps, ranks : sequence of int, optional
        Restrict the comparison (baseline step numbers).
    step_offset : int, "auto" or None
        Target step = baseline step + offset (None: see :func:`default_step_offset`).
    stats : tuple of str
        Statistics that must agree.
    alignment : precnb.analysis.align.Alignment, optional
        How the baseline's names map onto the target's (:func:`precnb.align`): the baseline is
        renamed into the target's names first and framework glue is left out. None: names as they are.
    tensor_metrics : xarray.Dataset, optional
        :func:`precnb.tensor_metrics` of the pair: where whole tensors were compared, their
        verdict replaces the statistics' (:mod:`precnb.analysis.tensor.verdicts`).
    tensor_thresholds : TensorThresholds, optional
        Bounds of that verdict (default: msprobe's).
    precision_aware : bool
        Compare a run in systematic lower precision with that precision's tolerance
        (:mod:`precnb.analysis.compare.precision`); False counts every dtype change as a difference.
    disjoint : {"raise", "union"}
        Runs that share no step or rank: raise :class:`NothingToCompareError`, or return the
        comparison of nothing (both runs on the union of their grids, every mask False: what the
        charts of a "nothing compared" answer draw).

    Returns
    -------
    Comparison
    """
    from precnb.analysis.compare.prep import prepared_pair
    from precnb.analysis.undefined import undefined_reasons

    tol = tolerance or Tolerance()
    # the tolerance-free part (renaming, common grid, shapes, dtypes), reused by a rerun with another tolerance
    args: dict[str, Any] = {"runs": runs, "steps": steps, "ranks": ranks, "step_offset": step_offset,
                            "alignment": alignment, "disjoint": disjoint}
    prep = prepared_pair(baseline, target, **args, compute=lambda: prepare_pair(baseline, target, **args))
    b, t, names, off = prep.b, prep.t, prep.names, prep.off
    if prep.disjoint:
        return _disjoint(b, t, names, off, tol)
    both_ds, glue, cross = prep.both_ds, prep.glue, prep.cross
    shape_changed, dtype_notes = dict(prep.shape_changed), dict(prep.dtype_notes)
    dtype_differs, dtype_changed = prep.dtype_differs, dict(prep.dtype_changed)
    bb, tt = both_ds.isel(run=0), both_ds.isel(run=1)
    # -- issue #17 hook: systematic lower precision (autocast) → that precision's tolerance, and its
    #    dtype differences are not findings; an isolated dtype change stays one
    precision = None
    if precision_aware:
        from precnb.analysis.compare.precision import apply_precision

        precision, tol, dtype_differs, dtype_changed = apply_precision(
            tol, dtype_differs, dtype_changed, bb["present"] & tt["present"], names)
    rel = prep.rel(stats, tol.atol)
    rtol = xr.DataArray(tol.rtol_array(both_ds["dtype"].values, both_ds["tensor"].values),
                        dims="tensor", coords={"tensor": both_ds["tensor"]})
    pb, pt = bb["present"], tt["present"]
    both = pb & pt
    differs = both & (rel > rtol)
    dtype_differs = both & dtype_differs
    differs = differs | dtype_differs
    replicas_differ = _replicas_differ(t, tt, both)
    # -- issue #17 hook: where whole tensors were compared, their metrics decide
    tensor_judged = None
    if tensor_metrics is not None:
        from precnb.analysis.tensor.verdicts import apply_tensor_verdicts

        differs, tensor_judged = apply_tensor_verdicts(
            tensor_metrics, differs, dtype_differs, both, rtol, bb, tensor_thresholds,
            low_precision=bool(precision is not None and precision.systematic))
    if "crc" in both_ds and not cross:  # checksums of two frameworks' byte layouts are not comparable
        cb, ct = bb["crc"], tt["crc"]
        crc_differs = both & (cb != "") & (ct != "") & (cb != ct)
    else:
        crc_differs = on_grid(both, np.zeros(both.shape, bool))
    if replicas_differ is not None:  # a merged replicated tensor whose copies differ across its group
        differs = differs | replicas_differ
    undefined = None
    why = {**undefined_reasons(b), **undefined_reasons(t)}
    if "undefined" in both_ds.data_vars or glue:  # no defined value, or none to compare: never a difference
        und = np.zeros(both.shape, bool)
        if "undefined" in both_ds.data_vars:
            und |= np.asarray(bb["undefined"].values, bool) | np.asarray(tt["undefined"].values, bool)
        defined = ~und
        if glue:
            cols = np.fromiter((str(x) in glue for x in both_ds["tensor"].values), bool, both_ds.sizes["tensor"])
            und |= cols[None, None, :] & np.asarray((pb | pt).values, bool)
            why.update(glue)
        undefined = on_grid(both, und)
        differs = differs & ~undefined
        if glue:  # no counterpart by construction, but a NaN is never by construction: NaN here, finite there
            differs = differs | on_grid(both, cols[None, None, :] & defined & _nan_here_finite_there(bb, tt, both))
        if replicas_differ is not None:  # no counterpart in the baseline, but copies that must agree and do not
            differs = differs | (replicas_differ & on_grid(both, defined | _by_schedule(both_ds, glue)[None, None, :]))
        crc_differs = crc_differs & ~undefined
    crc_only = crc_differs & ~differs
    return Comparison(
        ds=both_ds, rel=rel, rtol=rtol, both=both, only_baseline=pb & ~pt, only_target=pt & ~pb,
        differs=differs, crc_differs=crc_differs, crc_only=crc_only, dtype_changed=dtype_changed,
        dtype_differs=dtype_differs, dtype_notes=dtype_notes, shape_changed=shape_changed, names=names,
        step_offset=off, base=b, targ=t, precision=precision, tensor_judged=tensor_judged,
        tensor_metrics=tensor_metrics, replicas_differ=replicas_differ, tensor_thresholds=tensor_thresholds,
        undefined=undefined, undefined_why=why if undefined is not None else None, shifted_calls=prep.shifted,
    )


def _same_schedule(b: xr.Dataset, t: xr.Dataset, aligned: bool) -> bool:
    """Both runs as dumped, with the same names and ranks: the same layout and schedule (nothing merged).

    Then a module's records are made at the same point of the same schedule in both, including the gradient of
    a bias the module returns instead of using (Megatron's skip_bias_add), which is compared like any other.
    """
    return (not aligned and not b.attrs.get("merged_layout") and not t.attrs.get("merged_layout")
            and b["rank"].values.tolist() == t["rank"].values.tolist())


def prepare_pair(baseline: xr.Dataset, target: xr.Dataset | None, *, runs: Any, steps: Any, ranks: Any,
                 step_offset: Any, alignment: Any, disjoint: str) -> Any:
    """The :class:`~precnb.analysis.compare.prep.Prepared` part of :func:`compare_runs`.

    The runs renamed, on their common steps and ranks, combined; shapes and dtypes compared.
    """
    from precnb.analysis.compare.prep import Prepared
    from precnb.analysis.compare.shifts import realign_shifted
    from precnb.analysis.layout.rank_args import glue_labels
    from precnb.analysis.undefined import mark_undefined, returned_parameter_grads

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
    b, t = _restrict(b, common_steps, common_ranks), _restrict(t, common_steps, common_ranks)
    shape_changed: dict[str, tuple[str, str]] = {}
    shared = b.indexes["tensor"].intersection(t.indexes["tensor"])
    glue = {**glue_labels(b), **glue_labels(t)}  # tensor-parallel glue of a merged side: no counterpart
    if not _same_schedule(b, t, aligned):  # a returned bias's gradient is recorded where the schedule puts it
        glue.update({**returned_parameter_grads(b), **returned_parameter_grads(t)})
    if glue:
        shared = shared.difference(list(glue))  # a rank's own part has no whole-model shape to compare
    if len(shared):
        sb = b["shape"].sel(tensor=shared).values
        st = t["shape"].sel(tensor=shared).values
        for lbl, x, y in zip(shared, sb, st, strict=True):
            if x != y and x and y and not (aligned and _numel(str(x)) == _numel(str(y))):
                shape_changed[str(lbl)] = (str(x), str(y))  # (an aligned pair may differ by a reshape only)
    b, both_ds, shifted = realign_shifted(b, combine_runs({names[0]: b, names[1]: t}))  # counters shifted on one
    cross = aligned and len(set(getattr(alignment, "frameworks", ()))) > 1
    dtype_notes: dict[str, tuple[str, str, str]] = {}
    dtype_differs, dtype_changed = entry_dtype_differences(b, t, both_ds, cross=cross, notes=dtype_notes)
    return Prepared(b=b, t=t, names=names, off=off, aligned=aligned, both_ds=both_ds, shape_changed=shape_changed,
                    glue=glue, cross=cross, dtype_differs=dtype_differs, dtype_changed=dtype_changed,
                    dtype_notes=dtype_notes, shifted=shifted)
