"""The :class:`Assembler` (the layers of :mod:`precnb.io._assemble` stacked) and :func:`assemble`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from precnb.io._assemble._base import _increasing, _Rec
from precnb.io._assemble._values import ValuesLayer
from precnb.io._lazy_dask import defer_dask_array_import
from precnb.io._memory import return_free_memory
from precnb.io.records import FileRecords
from precnb.schema import DIMS, META_FIELDS, validate

__all__ = ["Assembler", "assemble", "dataset"]

defer_dask_array_import()  # before the first Dataset is built


class Assembler(ValuesLayer):
    """Collect :class:`FileRecords` one at a time and align them on the union of tensor labels.

    What :func:`assemble` does, but records are folded in as they arrive (from a dask cluster,
    say): labels become integer ids at once, side tables that are byte-identical are parsed
    and merged once, and a step can be materialised and dropped before the next is read
    (:meth:`take_steps`, used to stream a run into zarr). The result does not depend on the
    arrival order: records are ordered by ``(step, rank, order)`` as :func:`assemble` does.

    Parameters
    ----------
    steps, ranks : sequence of int, optional
        Force these coordinates; records outside them add tensor labels but no values.

    Examples
    --------
    >>> from precnb.io.records import RecordBuilder
    >>> b = RecordBuilder(step=0, rank=0)
    >>> b.add("x.output.0", {"max": 1.0, "min": 0.0, "mean": 0.5, "norm": 2.0}, node="x", kind="api")
    >>> acc = Assembler()
    >>> acc.add(b.build())
    >>> acc.build(source_format="synthetic").sizes["tensor"]
    1
    """

    def add(self, rec: FileRecords, order: int | None = None) -> None:
        """Fold in one record; *order* breaks ties between records of the same (step, rank)."""
        if self._finished:
            raise RuntimeError("this Assembler has built its dataset; start a new one")
        order = self._n if order is None else int(order)
        self._n += 1
        for key in ("task", "level", "framework"):
            v = rec.meta.get(key)
            if v:
                self._meta[key].add(str(v))
        gids = self._ids(rec.labels, rec.unique_labels)
        self._materialize()
        skipped = (self._steps_set is not None and rec.step not in self._steps_set) or (
            self._ranks_set is not None and rec.rank not in self._ranks_set)
        first = self._n == 1 and not skipped and len(gids) == len(self._labels) and _increasing(gids)
        if first:  # every label is this record's, in its order: its coordinates are taken at build
            self._deferred = (rec, gids, order)
        else:
            self._grow(len(self._labels))
        if not skipped:
            if not first:
                self._set_coords(rec, gids, order)
            self.facts.add(rec.meta.get("facts"), step=rec.step, rank=rec.rank)
        construct, stacks = self._side(rec.construct), self._side(rec.stacks)
        dt, sh = rec.coords.get("dtype"), rec.coords.get("shape")
        n = len(rec.labels)
        meta = {f: col for f in META_FIELDS if (col := rec.coords.get(f)) is not None and len(col) == n} \
            if not skipped else {}
        r = _Rec(rec, gids, order, skipped, construct, stacks, dt if dt is not None and len(dt) == n else None,
                 sh if sh is not None and len(sh) == n else None)
        if first:  # compared only with a second record's: encoded when one comes (a run of one file never does)
            self._unencoded = (r, meta)
        else:
            r.codes = {f: self._codes(col) for f, col in meta.items()}
        self._pending.append(r)

    def build(self, *, source_format: str, attrs: dict[str, Any] | None = None) -> xr.Dataset:
        """Materialise everything added into the canonical dataset (see :func:`assemble`)."""
        recs = sorted(self._pending, key=lambda r: r.key)
        self._pending = []
        step_vals = self.forced_steps if self.forced_steps is not None else sorted({r.step for r in recs})
        rank_vals = self.forced_ranks if self.forced_ranks is not None else sorted({r.rank for r in recs})
        self._place(recs)
        arrays = self._fill(recs, step_vals, rank_vals)
        del recs
        coords = self.tensor_coords(copy=False)
        coords["step"] = np.asarray(step_vals, np.int64)
        coords["rank"] = np.asarray(rank_vals, np.int64)
        self.release()  # the label list and the record: the columns are in arrays and coords now
        return_free_memory()  # the parse's lists and tables, before the side tables' text is written
        meta = self.attrs(source_format, attrs)
        return validate(dataset(arrays, coords, meta))

    def release(self) -> None:
        """Free what only adding needs (the columns are the dataset's or the store's now); :meth:`attrs` still works."""
        self._finished = True
        self._gid, self._labels, self._owner, self._deferred, self._holes = {}, [], self._owner[:0].copy(), None, {}
        self._unencoded = None
        self._cv = {k: np.zeros(0, v.dtype) for k, v in self._cv.items()}


def _variable(dims: tuple[str, ...], data: np.ndarray) -> xr.Variable:
    """An xarray Variable over *data* as it is.

    xarray otherwise passes every object array through pandas to look for datetimes; with
    pandas 3 that turns the strings into a new string array and back, duplicating every string
    (labels, node names, ...) and taking seconds for millions of tensors. The arrays built here
    hold only str, numbers and bools, which need no conversion.
    """
    try:
        return xr.Variable(dims, data, fastpath=True)
    except TypeError:  # pragma: no cover - an xarray without the keyword
        return xr.Variable(dims, data)


def dataset(arrays: Mapping[str, np.ndarray], coords: Mapping[str, Any], attrs: Mapping[str, Any]) -> xr.Dataset:
    """The canonical dataset of (step, rank, tensor) *arrays* and their coordinates (not validated)."""
    data = {name: _variable(DIMS, arr) for name, arr in arrays.items()}
    cvars: dict[str, Any] = {}
    for name, val in coords.items():
        if isinstance(val, tuple) and name not in ("tensor", "step", "rank"):
            cvars[name] = _variable((val[0],), np.asarray(val[1]))
        elif name == "tensor" and isinstance(val, np.ndarray) and val.dtype == object:
            cvars[name] = _variable(("tensor",), val)  # the labels (str): their index is built from them as they are
        else:
            cvars[name] = val
    return xr.Dataset(data, coords=cvars, attrs=dict(attrs))


def assemble(
    records: Sequence[FileRecords],
    *,
    source_format: str,
    attrs: dict[str, Any] | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
) -> xr.Dataset:
    """Align per-file records on the union of tensor labels.

    Records are ordered by (step, rank) (ties keep their order); tensor labels in order of
    first appearance; coordinates of a tensor come from the first record holding it.

    Parameters
    ----------
    records : sequence of FileRecords
    source_format : str
        Recorded in ``attrs["source_format"]``.
    attrs : dict, optional
        Extra attributes.
    steps, ranks : sequence of int, optional
        Force these coordinates (e.g. to keep a rank whose file was unreadable).

    Returns
    -------
    xarray.Dataset
        A dataset that passes :func:`precnb.schema.validate`.
    """
    acc = Assembler(steps=steps, ranks=ranks)
    for r in records:
        acc.add(r)
    return acc.build(source_format=source_format, attrs=attrs)
