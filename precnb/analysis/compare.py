"""Pairing two runs tensor by tensor: what is shared, what differs, what exists in one only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.tolerance import Tolerance, relative_difference
from precnb.combine import combine_runs

__all__ = ["Comparison", "align_steps", "compare_runs", "split_runs"]


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
        b = baseline.sel(run=runs[0]).drop_vars("run")
        t = baseline.sel(run=runs[1]).drop_vars("run")
        return b, t, runs
    return baseline, target, runs or ("baseline", "target")


def align_steps(baseline: xr.Dataset, target: xr.Dataset, step_offset: int | str = 0) -> int:
    """Return the step offset (target step = baseline step + offset).

    ``"auto"`` picks the offset under which the most parameter statistics agree exactly
    (a resumed run whose step counter restarted, or started later).
    """
    if step_offset != "auto":
        return int(step_offset)
    bsteps = [int(s) for s in baseline["step"].values]
    tsteps = [int(s) for s in target["step"].values]
    params_b = baseline["role"].values == "parameter"
    labels = [t for t, p in zip(baseline["tensor"].values, params_b, strict=True) if p]
    labels = [t for t in labels if t in target.indexes["tensor"]] or list(
        set(baseline["tensor"].values) & set(target["tensor"].values))
    if not labels:
        return 0
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
    return best


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

    @property
    def baseline(self) -> xr.Dataset:
        """The baseline side."""
        return self.ds.isel(run=0)

    @property
    def target(self) -> xr.Dataset:
        """The target side."""
        return self.ds.isel(run=1)


def compare_runs(
    baseline: xr.Dataset,
    target: xr.Dataset | None = None,
    *,
    runs: tuple[str, str] | None = None,
    tolerance: Tolerance | None = None,
    steps: Any = None,
    ranks: Any = None,
    step_offset: int | str = 0,
    stats: tuple[str, ...] = ("max", "min", "mean", "norm"),
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
    step_offset : int or "auto"
        Target step = baseline step + offset.
    stats : tuple of str
        Statistics that must agree.

    Returns
    -------
    Comparison
    """
    tol = tolerance or Tolerance()
    b, t, names = split_runs(baseline, target, runs=runs)
    off = align_steps(b, t, step_offset)
    if off:
        t = t.assign_coords(step=t["step"] - off)
    common_steps = sorted(set(b["step"].values.tolist()) & set(t["step"].values.tolist()))
    common_ranks = sorted(set(b["rank"].values.tolist()) & set(t["rank"].values.tolist()))
    if steps is not None:
        common_steps = [s for s in common_steps if s in set(steps)]
    if ranks is not None:
        common_ranks = [r for r in common_ranks if r in set(ranks)]
    if not common_steps or not common_ranks:
        raise ValueError(
            f"the runs share no step/rank to compare (baseline steps {b['step'].values.tolist()}, "
            f"target steps {t['step'].values.tolist()} after offset {off}; baseline ranks "
            f"{b['rank'].values.tolist()}, target ranks {t['rank'].values.tolist()})")
    b = b.sel(step=common_steps, rank=common_ranks)
    t = t.sel(step=common_steps, rank=common_ranks)
    dtype_changed: dict[str, tuple[str, str]] = {}
    shape_changed: dict[str, tuple[str, str]] = {}
    shared = b.indexes["tensor"].intersection(t.indexes["tensor"])
    for coord, changed in (("dtype", dtype_changed), ("shape", shape_changed)):
        if len(shared):
            db = b[coord].sel(tensor=shared).values
            dt = t[coord].sel(tensor=shared).values
            for lbl, x, y in zip(shared, db, dt, strict=True):
                if x != y and x and y:
                    changed[str(lbl)] = (str(x), str(y))
    both_ds = combine_runs({names[0]: b, names[1]: t})
    bb, tt = both_ds.isel(run=0), both_ds.isel(run=1)
    rel = relative_difference(bb, tt, stats, atol=tol.atol).max("stat")
    rtol = xr.DataArray(tol.rtol_array(both_ds["dtype"].values, both_ds["tensor"].values),
                        dims="tensor", coords={"tensor": both_ds["tensor"]})
    pb, pt = bb["present"], tt["present"]
    both = pb & pt
    differs = both & (rel > rtol)
    if dtype_changed:
        changed = xr.DataArray(np.isin(both_ds["tensor"].values, list(dtype_changed)), dims="tensor",
                               coords={"tensor": both_ds["tensor"]})
        differs = differs | (both & changed)
    if "crc" in both_ds:
        cb, ct = bb["crc"], tt["crc"]
        crc_differs = both & (cb != "") & (ct != "") & (cb != ct)
    else:
        crc_differs = xr.zeros_like(both)
    crc_only = crc_differs & ~differs
    return Comparison(
        ds=both_ds, rel=rel, rtol=rtol, both=both, only_baseline=pb & ~pt, only_target=pt & ~pb,
        differs=differs, crc_differs=crc_differs, crc_only=crc_only, dtype_changed=dtype_changed,
        shape_changed=shape_changed, names=names, step_offset=off, base=b, targ=t,
    )
