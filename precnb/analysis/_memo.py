"""Reusing a pure function's result while the same dataset objects are passed again (the explorer's reruns).

A rerun of the triage (another tolerance, a Match / Unmatch) passes the very dataset objects the
previous run read: what depends on them alone (a run's tree, the alignment of an unchanged mapping,
the replica comparison of the target, the per-record relative differences of the pair) need not be
computed again. An entry is reused only while every dataset is the same object (held by a weak
reference: a dataset that is gone frees its entry) with the same variable objects, the same contents and the
same attribute objects (a variable replaced or added, an attribute set again, a value written in place is a
miss: an in-memory array's bytes are checksummed, CRC-32 at about 2.5 GB/s; a dask array's graph name
changes when it is written to). A mutable result is
returned as a deep copy (``copy=True``, the default: a caller may change what it gets); a result
no caller changes (a :class:`~precnb.analysis.align.tree.RunTree`) is shared as it is.

precnb never writes into a dataset's arrays in place, it builds new ones (``assign``, ``copy``); a user
may (``ds["max"].loc[...] = np.nan`` in a notebook), and the next call sees the edit. Inside one call of
precnb (:func:`scope`: a triage, an explorer's rerun and redraw) no user code runs, so a dataset's fingerprint
is checksummed once per call, not once per memo look-up (a Match / Unmatch looked the same datasets up ~25
times: 0.14 s of CRC-32 on a 5,000-tensor pair).
"""

from __future__ import annotations

import copy as _copy
import dataclasses
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # annotations only: the CLI's --help imports the diagnoses without xarray
    import xarray as xr

__all__ = ["DatasetMemo", "memos", "scope"]

T = TypeVar("T")

_ALL: list[DatasetMemo] = []


def _content(data: Any) -> Any:
    """What tells an array's contents apart: a CRC-32 of an in-memory numeric array's bytes, a dask array's name.

    Object arrays (labels) are told apart by identity only: precnb's label coordinates are pandas
    indexes, which cannot be written in place.
    """
    dtype = getattr(data, "dtype", None)
    if type(data).__module__ == "numpy" and dtype is not None and dtype.kind != "O":
        import numpy as np

        return zlib.crc32(np.ascontiguousarray(data).reshape(-1).view(np.uint8).data)  # empty arrays too
    return getattr(data, "name", None) if type(data).__module__.startswith("dask") else None


# inside scope(): id(dataset) -> (a weak reference to it, its fingerprint); None outside
_SCOPED: dict[int, tuple[weakref.ref[Any], tuple[Any, ...]]] | None = None


@contextmanager
def scope() -> Iterator[None]:
    """One call of precnb (no user code runs inside): each dataset's fingerprint is computed once in it.

    Re-entrant (an inner scope is the outer one's). Outside any scope every look-up checksums again.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"x": ("t", np.arange(3.0))})
    >>> with scope():
    ...     _fingerprint(ds) is _fingerprint(ds)
    True
    >>> _fingerprint(ds) is _fingerprint(ds)
    False
    """
    global _SCOPED
    if _SCOPED is not None:
        yield
        return
    _SCOPED = {}
    try:
        yield
    finally:
        _SCOPED = None


def _fingerprint(ds: xr.Dataset) -> tuple[Any, ...]:
    """Each variable's data (identity and contents) and the attributes: an edited variable changes it.

    Inside :func:`scope`, computed once per dataset.
    """
    scoped = _SCOPED
    if scoped is not None:
        got = scoped.get(id(ds))
        if got is not None and got[0]() is ds:
            return got[1]
    fp = (tuple((k, id(v._data), _content(v._data)) for k, v in ds.variables.items()),
          tuple((k, id(v)) for k, v in ds.attrs.items()))
    if scoped is not None:
        with suppress(TypeError):  # not weakly referable: checksummed each time
            scoped[id(ds)] = (weakref.ref(ds), fp)
    return fp


class DatasetMemo:
    """At most *size* results of a function of datasets, by dataset identity and a hashable key.

    Parameters
    ----------
    size : int
        Entries kept (the oldest is dropped first).

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> memo, calls = DatasetMemo(), []
    >>> ds = xr.Dataset({"x": ("t", np.arange(3.0))})
    >>> f = lambda: calls.append(1) or float(ds["x"].sum())
    >>> memo.get([ds], "sum", f), memo.get([ds], "sum", f), len(calls)
    (3.0, 3.0, 1)
    >>> memo.get([ds.assign(x=ds["x"] * 2)], "sum", f), len(calls)  # another dataset: computed
    (3.0, 2)
    >>> ds["x"][0] = 10.0  # written in place: computed again
    >>> memo.get([ds], "sum", f), len(calls)
    (13.0, 3)
    >>> _fingerprint(xr.Dataset({"e": ("t", np.zeros(0))})) is not None  # an empty array has a checksum too
    True
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self.hits = 0
        # key -> (weak references, fingerprints, the value as kept, whether it holds slots to fill)
        self._items: OrderedDict[Any, tuple[list[weakref.ref[xr.Dataset]], list[Any], Any, bool]] = OrderedDict()
        _ALL.append(self)

    def get(self, datasets: Sequence[xr.Dataset], key: Hashable, compute: Callable[[], T], *,
            copy: bool | Callable[[T], T] = True, holds: bool = True) -> T:
        """*compute()*'s result, reused while *datasets* are the same objects, unchanged (see the module).

        *copy*: True, a deep copy is kept and given; False, the result itself; a function, the copy it makes
        (cheaper than a deep copy when the caller knows what may change). *holds*: False when the result holds
        none of *datasets* (it is kept as it is, not searched for them: a large result, such as an alignment's
        thousands of pairs, took longer to search than to reuse).
        """
        dup: Callable[[T], T] = (copy if callable(copy) else _copy.deepcopy) if copy else (lambda v: v)
        k = (tuple(id(d) for d in datasets), key)
        got = self._items.get(k)
        if got is not None:
            refs, prints, value, slots = got
            if all(r() is d for r, d in zip(refs, datasets, strict=True)) and prints == [
                    _fingerprint(d) for d in datasets]:
                self._items.move_to_end(k)
                self.hits += 1
                return dup(_attach(value, datasets) if slots else value)
            del self._items[k]
        value = compute()
        try:
            items = self._items

            def forget(_ref: object, key: Any = k) -> None:  # the dataset is gone: so is its entry
                items.pop(key, None)

            refs = [weakref.ref(d, forget) for d in datasets]
        except TypeError:  # not weakly referable: not kept
            return value
        # kept without the datasets themselves: an entry that held them would keep them alive, and with them
        # everything computed from them, after the caller let them go (its weak references would never die)
        kept = dup(value)
        stored = _detach(kept, datasets) if holds else kept  # the value itself when it holds none of them
        self._items[k] = (refs, [_fingerprint(d) for d in datasets], stored, stored is not kept)
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forget every entry."""
        self._items.clear()


class _Slot:
    """Where an entry's value held the *i*-th dataset of its key (put back by :func:`_attach`)."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


_DEPTH = 3  # containers below the value searched for the key's datasets (a dataclass holding a tuple of runs)


def _detach(value: Any, datasets: Sequence[xr.Dataset], depth: int = 0) -> Any:
    """*value* with every reference to one of *datasets* (up to :data:`_DEPTH` containers down) made a slot.

    Tuples, lists, dicts and dataclass instances are searched; one that holds a dataset is copied
    shallowly (its other members are shared, as the value was); anything else is kept as it is.

    Examples
    --------
    >>> import xarray as xr
    >>> a, b = xr.Dataset(), xr.Dataset()
    >>> kept = _detach((a, {"x": b, "n": 1}), [a, b])
    >>> any(v is a or v is b for v in (kept[0], kept[1]["x"])), kept[1]["n"]
    (False, 1)
    >>> back = _attach(kept, [a, b])
    >>> back[0] is a and back[1]["x"] is b
    True
    """
    for i, d in enumerate(datasets):
        if value is d:
            return _Slot(i)
    if depth >= _DEPTH:
        return value
    return _rebuild(value, lambda v: _detach(v, datasets, depth + 1))


def _attach(value: Any, datasets: Sequence[xr.Dataset]) -> Any:
    """*value* with its slots filled by *datasets* again (see :func:`_detach`)."""
    if isinstance(value, _Slot):
        return datasets[value.i]
    return _rebuild(value, lambda v: _attach(v, datasets))


def _rebuild(value: Any, each: Callable[[Any], Any]) -> Any:
    """A shallow copy of a container with *each* applied to its members; *value* itself if none changed."""
    if isinstance(value, (tuple, list)):
        members = [each(v) for v in value]
        if all(m is v for m, v in zip(members, value, strict=True)):
            return value
        return type(value)(members) if not hasattr(value, "_fields") else type(value)(*members)
    if isinstance(value, dict):
        changed = {k: each(v) for k, v in value.items()}
        if all(changed[k] is v for k, v in value.items()):
            return value
        out = _copy.copy(value)
        out.update(changed)
        return out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value)]
        fields = {n: each(getattr(value, n)) for n in names}
        diff = {n: v for n, v in fields.items() if v is not getattr(value, n)}
        if not diff:
            return value
        obj: Any = _copy.copy(value)
        for n, v in diff.items():
            object.__setattr__(obj, n, v)  # (a frozen dataclass too)
        return obj
    return value


def memos() -> list[DatasetMemo]:
    """Every memo made (to clear them all, or to count their hits in a test)."""
    return list(_ALL)
