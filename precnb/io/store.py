"""Materialise a canonical dataset into a zarr store and reopen it.

The store reopens to a dataset identical to the one written (values, NaN/±inf, masks,
string coordinates and attributes), so ``precnb convert`` is lossless.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from precnb.errors import NotADumpError
from precnb.schema import validate

__all__ = ["open_store", "to_zarr"]


def _strings_to_object(ds: xr.Dataset) -> xr.Dataset:
    """Turn numpy StringDType / fixed-width unicode arrays back into object arrays."""
    out = ds.copy()
    for name, var in list(out.variables.items()):
        kind = var.dtype.kind
        if kind in ("U", "T"):
            out[name] = var.copy(data=np.asarray(var.values, dtype=object))
    return out


def to_zarr(ds: xr.Dataset, path: str | Path, *, mode: str = "w-") -> Path:
    """Write *ds* to a zarr (format 3) store.

    Parameters
    ----------
    ds : xarray.Dataset
        A canonical dataset (possibly dask-backed: written chunk by chunk).
    path : str or Path
        Store folder to create.
    mode : {"w-", "w"}
        ``"w-"`` (default) refuses to overwrite an existing store.

    Returns
    -------
    Path
    """
    p = Path(path)
    if mode == "w-" and p.exists():
        raise FileExistsError(f"{p} exists; pass mode='w' (CLI: --overwrite) to replace it")
    out = ds.drop_encoding()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        warnings.simplefilter("ignore", category=FutureWarning)
        out.to_zarr(p, mode="w", zarr_format=3, consolidated=False)
    return p


def open_store(path: str | Path, *, lazy: bool = False) -> xr.Dataset:
    """Open a store written by :func:`to_zarr`.

    Parameters
    ----------
    path : str or Path
    lazy : bool
        Keep variables dask-backed instead of loading them.

    Returns
    -------
    xarray.Dataset
    """
    p = Path(path)
    if not p.is_dir():
        raise NotADumpError(f"{p}: not a zarr store")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(p, consolidated=False)
    if not lazy:
        ds = ds.load()
    ds = _strings_to_object(ds)
    ds = ds.drop_encoding()
    return validate(ds)
