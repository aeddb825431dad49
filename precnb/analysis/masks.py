"""Masks that separate recorded values from absent and null ones.

A statistic is *recorded* where the tensor is ``present`` and its ``null_stats`` bit is
clear. Only recorded values may count as NaN or Inf: absent tensors and null statistics
(an int tensor's Mean in msprobe 26.x) are neither.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import xarray as xr

from precnb.schema import NULL_BITS, STATS

__all__ = ["nonfinite", "recorded", "stat_vars"]


def stat_vars(ds: xr.Dataset) -> list[str]:
    """The float statistic variables of *ds* (max/min/mean/norm first, then extras).

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> stat_vars(empty_dataset())
    ['max', 'min', 'mean', 'norm']
    """
    extras = [str(n) for n, v in ds.data_vars.items()  # (copy_*: a merge's departing replica, not a statistic)
              if n not in STATS and v.dtype.kind == "f" and v.dims == ds["max"].dims
              and not str(n).startswith("copy_")]
    return [*STATS, *sorted(extras)]


def recorded(ds: xr.Dataset, stat: str) -> xr.DataArray:
    """Boolean mask: *stat* was recorded (present and not null).

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> recorded(empty_dataset(), "max").dtype
    dtype('bool')
    """
    mask = ds["present"]
    bit = NULL_BITS.get(stat)
    if bit is not None:
        mask = mask & ((ds["null_stats"] & bit) == 0)
    return mask


def nonfinite(ds: xr.Dataset, stats: tuple[str, ...] = STATS, *, kind: str = "any") -> xr.DataArray:
    """Boolean mask over (…, step, rank, tensor): a recorded statistic is NaN/Inf.

    Parameters
    ----------
    ds : xarray.Dataset
    stats : tuple of str
        Statistics to look at.
    kind : {"any", "nan", "inf"}

    Returns
    -------
    xarray.DataArray
    """
    names = [s for s in stats if s in ds]
    if not any(ds[n].chunks is not None for n in (*names, "present", "null_stats")):
        return _nonfinite_in_memory(ds, names, kind)  # numpy: no xarray alignment per operation
    out: xr.DataArray | None = None
    for s in names:
        v = ds[s]
        if kind == "nan":
            bad = np.isnan(v)
        elif kind == "inf":
            bad = np.isinf(v)
        else:
            bad = ~np.isfinite(v)
        # a DataArray (np.isnan & co. dispatch through DataArray.__array_ufunc__, which numpy's stubs do not model)
        m = cast(xr.DataArray, bad & recorded(ds, s))
        out = m if out is None else (out | m)
    if out is None:
        return xr.zeros_like(ds["present"])
    return out


def _nonfinite_in_memory(ds: xr.Dataset, names: list[str], kind: str) -> xr.DataArray:
    """:func:`nonfinite` of an in-memory run, in numpy (the mask wraps ``present``'s coordinates, not copied)."""
    present = np.asarray(ds["present"].values, bool)
    null = np.asarray(ds["null_stats"].values)
    out = np.zeros(present.shape, bool)
    with np.errstate(invalid="ignore"):
        for s in names:
            v = np.asarray(ds[s].values)
            bad = np.isnan(v) if kind == "nan" else np.isinf(v) if kind == "inf" else ~np.isfinite(v)
            bit = NULL_BITS.get(s)
            rec = present if bit is None else present & ((null & bit) == 0)
            out |= bad & rec
    return ds["present"].copy(deep=False, data=out)
