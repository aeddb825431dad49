"""The contract's constants, :func:`validate` and :func:`empty_dataset` (see :mod:`precnb.schema`)."""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import xarray as xr

SCHEMA_VERSION: Final = "1.0"
STATS: Final = ("max", "min", "mean", "norm")
NULL_BITS: Final = {"max": 1, "min": 2, "mean": 4, "norm": 8}
KINDS: Final = ("api", "module", "param_grad", "monitor", "kernel")
DIRECTIONS: Final = ("forward", "backward", "optimizer", "")
ROLES: Final = ("input", "output", "parameter", "grad", "state", "")
TENSOR_COORDS: Final = {
    "node": str,
    "module": str,
    "api": str,
    "kind": str,
    "direction": str,
    "role": str,
    "dtype": str,
    "shape": str,
    "parent": str,
    "call": np.int64,
    "micro_step": np.int64,
}
DIMS: Final = ("step", "rank", "tensor")
META_FIELDS: Final = ("module", "parent", "shape")
"""Per-tensor coordinates that may differ on some (step, rank) entries (``attrs["meta_changes"]``)."""
ENTRY_CHANGE_ATTRS: Final = ("dtype_changes", "meta_changes", "stack_changes")
"""Attributes keyed by (step, rank): run-specific, shifted with the steps (:func:`shift_entry_changes`)."""


class SchemaError(ValueError):
    """A dataset does not follow the canonical precnb contract."""


def _dims_of(ds: xr.Dataset) -> tuple[str, ...]:
    return ("run", *DIMS) if "run" in ds.dims else DIMS


def validate(ds: xr.Dataset) -> xr.Dataset:
    """Check that *ds* follows the canonical contract and return it unchanged.

    Parameters
    ----------
    ds : xarray.Dataset
        A dataset produced by a precnb reader.

    Returns
    -------
    xarray.Dataset
        The same object, so that readers can ``return validate(ds)``.

    Raises
    ------
    SchemaError
        Naming the first violated rule.

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> validate(empty_dataset()).attrs["precnb_schema"]
    '1.0'
    """
    errors: list[str] = []
    dims = _dims_of(ds)
    for d in DIMS:
        if d not in ds.dims:
            errors.append(f"missing dimension {d!r}")
    if errors:
        raise SchemaError("; ".join(errors))
    for name in ("step", "rank"):
        if not np.issubdtype(ds[name].dtype, np.integer):
            errors.append(f"coordinate {name!r} must be integer, got {ds[name].dtype}")
    for name, kind in TENSOR_COORDS.items():
        if name not in ds.coords:
            errors.append(f"missing tensor coordinate {name!r}")
        elif ds.coords[name].dims != ("tensor",):
            errors.append(f"coordinate {name!r} must be along 'tensor'")
        elif kind is not str and not np.issubdtype(ds.coords[name].dtype, np.integer):
            errors.append(f"coordinate {name!r} must be integer")
    required = {"present": np.bool_, "seq": np.integer, "numel": np.integer, "null_stats": np.integer}
    for name in (*STATS, *required):
        if name not in ds.data_vars:
            errors.append(f"missing data variable {name!r}")
            continue
        var = ds[name]
        if var.dims != dims:
            errors.append(f"variable {name!r} has dims {var.dims}, expected {dims}")
        want = required.get(name, np.floating)
        if not np.issubdtype(var.dtype, want):
            errors.append(f"variable {name!r} has dtype {var.dtype}")
    if ds.attrs.get("precnb_schema") != SCHEMA_VERSION:
        errors.append(f"attrs['precnb_schema'] must be {SCHEMA_VERSION!r}")
    if "kind" in ds.coords and ds.sizes.get("tensor", 0):
        bad = {str(k) for k in set(ds.coords["kind"].values)} - set(KINDS)  # no list of every tensor
        if bad:
            errors.append(f"unknown tensor kinds {sorted(bad)}")
    if errors:
        raise SchemaError("dataset does not follow the precnb schema: " + "; ".join(errors))
    return ds


def empty_dataset(**attrs: Any) -> xr.Dataset:
    """Return a valid dataset with no steps, ranks or tensors.

    Parameters
    ----------
    **attrs
        Extra attributes to set.

    Returns
    -------
    xarray.Dataset

    Examples
    --------
    >>> empty_dataset().sizes["tensor"]
    0
    """
    shape = (0, 0, 0)
    coords: dict[str, Any] = {
        "step": np.zeros(0, np.int64),
        "rank": np.zeros(0, np.int64),
        "tensor": np.zeros(0, object),
    }
    for name, kind in TENSOR_COORDS.items():
        coords[name] = ("tensor", np.zeros(0, object if kind is str else np.int64))
    data: dict[str, Any] = {s: (DIMS, np.zeros(shape)) for s in STATS}
    data["present"] = (DIMS, np.zeros(shape, bool))
    data["null_stats"] = (DIMS, np.zeros(shape, np.uint8))
    data["seq"] = (DIMS, np.zeros(shape, np.int32))
    data["numel"] = (DIMS, np.zeros(shape, np.int64))
    base = {"precnb_schema": SCHEMA_VERSION, "source_format": "", "construct": "{}", "stacks": "{}"}
    base.update(attrs)
    return xr.Dataset(data, coords=coords, attrs=base)
