"""The canonical precnb dataset contract.

Every reader in :mod:`precnb.io` returns an :class:`xarray.Dataset` that passes
:func:`validate`; every analysis function in :mod:`precnb.analysis` may rely on it.

Dimensions
----------
``step`` (int64), ``rank`` (int64), ``tensor`` (str) and, when several runs are
combined by :func:`precnb.open_runs`, a leading ``run`` (str).

Coordinates along ``tensor``
----------------------------
``node``       node record name (``Functional.linear.0.forward``)
``module``     module path (``blocks.1.attn``), ``""`` when unknown
``api``        API name (``Functional.linear``) or module class (``Linear``)
``kind``       one of :data:`KINDS`
``direction``  one of :data:`DIRECTIONS`
``role``       one of :data:`ROLES`
``dtype``      dtype string as written by the producer (``torch.float32``)
``shape``      shape as JSON text (``"[4, 16, 32]"``), first seen
``parent``     parent node from construct.json (``""`` for roots / unknown)
``call``       call counter parsed from the node name (-1 when none)
``micro_step`` Megatron / monitor micro step (-1 when none)

Data variables over (step, rank, tensor)
----------------------------------------
``max``, ``min``, ``mean``, ``norm``  float64; NaN and ±inf exactly as in the file
``present``    bool; False where the tensor was not recorded at that (step, rank)
``null_stats`` uint8 bit mask of statistics that were recorded as ``null``
               (bit 0 max, 1 min, 2 mean, 3 norm); absent ≠ null ≠ NaN
``seq``        int32 position in execution (dump) order within (step, rank); -1 absent
``numel``      int64 element count from the shape; -1 absent
``crc``        str checksum (md5 mode), ``""`` where absent — only when recorded
``nans``, ``zeros``, ...  extra float64 monitor / kernel statistics where they exist

Attributes
----------
``precnb_schema`` (:data:`SCHEMA_VERSION`), ``source_format``, ``task``, ``level``,
``framework``, ``source`` (path), and JSON text side tables ``construct``
(node → parent) and ``stacks`` (node → list of frames).

Examples
--------
>>> from precnb.schema import empty_dataset, validate
>>> ds = empty_dataset()
>>> validate(ds) is ds
True
"""

from __future__ import annotations

import json
from typing import Any, Final

import numpy as np
import xarray as xr

__all__ = [
    "DIRECTIONS",
    "KINDS",
    "NULL_BITS",
    "ROLES",
    "SCHEMA_VERSION",
    "STATS",
    "TENSOR_COORDS",
    "SchemaError",
    "empty_dataset",
    "side_table",
    "validate",
]

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
        bad = set(np.unique(ds.coords["kind"].values.astype(str))) - set(KINDS)
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


def side_table(ds: xr.Dataset, name: str) -> dict[str, Any]:
    """Decode a JSON side table (``construct`` or ``stacks``) from the attributes.

    Parameters
    ----------
    ds : xarray.Dataset
    name : {"construct", "stacks"}

    Returns
    -------
    dict

    Examples
    --------
    >>> side_table(empty_dataset(), "stacks")
    {}
    """
    raw = ds.attrs.get(name, "{}")
    if isinstance(raw, dict):
        return raw
    return json.loads(raw or "{}")
