"""Append a streamed run to a zarr store one step at a time (what :func:`precnb.io.store.to_zarr` streams into).

Memory: the string coordinates are the largest part of a step (the labels of hundreds of thousands
of tensors). zarr encodes a string array by copying it three times (a numpy string array, new
Python strings again, then their UTF-8 bytes) and xarray hands it each variable whole, so writing a
column in one piece added about 1.5 times its strings to the peak of ``precnb convert``. Here
xarray writes the metadata (the same it writes for the whole dataset) with each string
coordinate as empty strings, its fill value, so no chunk is stored, and the columns are then
written :data:`STRING_CHUNK` tensors at a time, one chunk each: the transient is one chunk's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from precnb.schema import DIMS, TENSOR_COORDS

__all__ = ["STRING_CHUNK", "StepWriter", "coord_vars"]

_FILLS: dict[str, Any] = {"present": False, "null_stats": 0, "seq": -1, "numel": -1}

_STR = getattr(np.dtypes, "StringDType", None)
STRING_CHUNK = 1 << 16
"""Tensors per chunk of a string coordinate: each chunk is encoded (and held twice over) alone."""


def fill_for(name: str, arr: np.ndarray) -> Any:
    """The value of an absent entry of variable *name* (of *arr*'s dtype)."""
    if name in _FILLS:
        return _FILLS[name]
    if arr.dtype == object:
        return ""
    return np.nan


def coord_vars(coords: Mapping[str, Any]) -> dict[str, xr.Variable]:
    """The tensor coordinates as variables that share the reader's arrays.

    ``xr.Dataset(coords=...)`` passes an object array through pandas, which (pandas >= 3) infers
    its str dtype and converts back, allocating a new Python string for every element of every
    coordinate (about 0.3 GB for 157k tensors); the reader's arrays are already numpy arrays.
    """
    out: dict[str, xr.Variable] = {}
    for name, col in coords.items():
        dims, values = (col[0], col[1]) if isinstance(col, tuple) else (("tensor",), col)
        values = np.asarray(values)
        out[name] = xr.Variable(dims, values, fastpath=values.ndim == len(np.atleast_1d(dims)))
    return out


def _placeholders(cvars: Mapping[str, xr.Variable]) -> tuple[dict[str, xr.Variable], dict[str, np.ndarray]]:
    """*cvars* with each string column replaced by empty strings (one shared array), and those columns."""
    strings = {name: np.asarray(v.values) for name, v in cvars.items() if v.dtype == object and v.dims == ("tensor",)}
    if not strings:
        return dict(cvars), strings
    n = len(next(iter(strings.values())))
    # numpy >= 2: a string array xarray writes as it is (an object array it first copies, every column at once)
    empty = np.full(n, "", dtype=_STR() if _STR is not None else object)
    out = {name: (xr.Variable(v.dims, empty, fastpath=True) if name in strings else v) for name, v in cvars.items()}
    return out, strings


def write_strings(path: Path, columns: Mapping[str, np.ndarray], start: int = 0) -> None:
    """Write *columns* (object arrays of str) from index *start* into the store's arrays of the same name."""
    import zarr

    if not columns:
        return
    group = zarr.open_group(path, mode="r+", zarr_format=3)
    for name, values in columns.items():
        arr = group[name]
        assert isinstance(arr, zarr.Array)
        step = int(arr.chunks[0])
        first = start - start % step  # chunk-aligned slices: each write encodes one chunk
        for i in range(first, len(values), step):
            lo = max(i, start)
            arr[lo:i + step] = values[lo:i + step]


class StepWriter:
    """Append one step at a time to a zarr store; grow the ``tensor`` dimension when needed.

    Parameters
    ----------
    path : Path
        The empty locked folder of the store.
    ranks : sequence of int
    chunks : callable
        ``chunks(n_rank, n_tensor)``: the chunk shape of a (step, rank, tensor) variable.
    """

    def __init__(self, path: Path, ranks: Sequence[int], chunks: Callable[[int, int], tuple[int, int, int]]) -> None:
        self.path = path
        self.ranks = np.asarray(ranks, np.int64)
        self.steps: list[int] = []
        self.n_tensor = 0
        self.chunk = 1
        self.chunks = chunks
        self.vars: dict[str, np.dtype[Any]] = {}
        self.coord_names = ""  # the data variables' "coordinates" attribute

    def _to_zarr(self, ds: xr.Dataset, **kw: Any) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=UserWarning)
            warnings.simplefilter("ignore", category=FutureWarning)
            ds.to_zarr(self.path, zarr_format=3, consolidated=False, **kw)

    def _encoding(self, names: Sequence[str]) -> dict[str, Any]:
        return {n: {"chunks": self.chunks(len(self.ranks), self.chunk)} for n in names}

    def append(self, step: int, arrays: Mapping[str, np.ndarray], coords: Mapping[str, Any]) -> None:
        """Write the arrays (1, rank, tensor) of *step*; *coords* are the tensor coordinates so far."""
        n = next(iter(arrays.values())).shape[2]
        data = {name: (DIMS, arr) for name, arr in arrays.items()}
        if not self.steps:
            self._first(step, data, coords, n)
        else:
            if n > self.n_tensor:
                self._grow(n, coords)
            new = [name for name in arrays if name not in self.vars]
            if new:
                self._add_vars({name: arrays[name] for name in new})
            ds = xr.Dataset(data, coords={"step": np.asarray([step], np.int64), "rank": self.ranks})
            self._to_zarr(ds, append_dim="step")
        self.steps.append(int(step))
        self.n_tensor = n
        for name, arr in arrays.items():
            self.vars.setdefault(name, arr.dtype)

    def _first(self, step: int, data: Mapping[str, Any], coords: Mapping[str, Any], n: int) -> None:
        """Create the store: xarray writes every variable, the string coordinates as their fill value."""
        self.chunk = max(n, 1)
        cvars, strings = _placeholders(coord_vars(coords))
        self.coord_names = " ".join(sorted(name for name in cvars if name not in DIMS))
        ds = xr.Dataset(data, coords=xr.Coordinates(
            {"step": np.asarray([step], np.int64), "rank": self.ranks, **cvars}, indexes={}))
        enc = self._encoding(list(data))
        enc.update({c: {"chunks": (min(self.chunk, STRING_CHUNK) if c in strings else self.chunk,)}
                    for c in ("tensor", *TENSOR_COORDS) if c in cvars})
        self._to_zarr(ds, mode="a", encoding=enc)  # into the empty locked folder
        del ds, cvars
        write_strings(self.path, strings)

    def _grow(self, n: int, coords: Mapping[str, Any]) -> None:
        """Resize every ``tensor`` array to *n*; earlier steps get the absent fill values there."""
        import zarr

        old = self.n_tensor
        group = zarr.open_group(self.path, mode="r+", zarr_format=3)
        strings: dict[str, np.ndarray] = {}
        for name, arr in group.arrays():
            dims = tuple(getattr(arr.metadata, "dimension_names", None) or ())
            if "tensor" not in dims:
                continue
            shape = list(arr.shape)
            shape[dims.index("tensor")] = n
            arr.resize(tuple(shape))
            if dims == ("tensor",):
                col = coords[name]
                values = np.asarray(col[1] if isinstance(col, tuple) else col)
                if values.dtype == object:
                    strings[name] = values
                else:
                    arr[old:n] = values[old:n]
            else:
                fill = fill_for(name, np.empty(0, dtype=self.vars[name]))
                block = np.full((arr.shape[0], arr.shape[1], n - old), fill, dtype=self.vars[name])
                arr[:, :, old:n] = block
        write_strings(self.path, strings, start=old)

    def _add_vars(self, arrays: Mapping[str, np.ndarray]) -> None:
        """A variable first seen at this step: write it as absent for the earlier steps.

        The coordinates are in the store already: the variables name them (the attribute xarray
        writes) instead of writing them again.
        """
        shape = (len(self.steps), len(self.ranks), next(iter(arrays.values())).shape[2])
        named = {"coordinates": self.coord_names} if self.coord_names else {}
        data = {name: xr.Variable(DIMS, np.full(shape, fill_for(name, arr), dtype=arr.dtype), attrs=named)
                for name, arr in arrays.items()}
        ds = xr.Dataset(data, coords={"step": np.asarray(self.steps, np.int64), "rank": self.ranks})
        self._to_zarr(ds, mode="a", encoding=self._encoding(list(arrays)))

    def finish(self, attrs: Mapping[str, Any]) -> None:
        """Set the dataset attributes (side tables and load report are complete only now)."""
        import zarr

        group = zarr.open_group(self.path, mode="r+", zarr_format=3)
        group.attrs.update(dict(attrs))
