"""Reusing a pure function's result while the same dataset objects are passed again (the explorer's reruns).

A rerun of the triage (another tolerance, a Match / Unmatch) passes the very dataset objects the
previous run read: what depends on them alone (a run's tree, the alignment of an unchanged mapping,
the replica comparison of the target, the per-record relative differences of the pair) need not be
computed again. An entry is reused only while every dataset is the same object (held by a weak
reference: a dataset that is gone frees its entry) with the same variable objects and the same
attribute objects (a variable replaced or added, an attribute set again, is a miss). A mutable result is
returned as a deep copy (``copy=True``, the default: a caller may change what it gets); a result
no caller changes (a :class:`~precnb.analysis.align.tree.RunTree`) is shared as it is.

Datasets are treated as values: precnb never writes into a dataset's arrays in place, it builds
new ones (``assign``, ``copy``), which a fingerprint tells apart.
"""

from __future__ import annotations

import copy as _copy
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import xarray as xr

__all__ = ["DatasetMemo", "memos"]

T = TypeVar("T")

_ALL: list[DatasetMemo] = []


def _fingerprint(ds: xr.Dataset) -> tuple[Any, ...]:
    """The identity of each variable's data and the attributes (a replaced or added variable changes it)."""
    return (tuple((k, id(v._data)) for k, v in ds.variables.items()), tuple((k, id(v)) for k, v in ds.attrs.items()))


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
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self.hits = 0
        self._items: OrderedDict[Any, tuple[list[weakref.ref[xr.Dataset]], list[Any], Any]] = OrderedDict()
        _ALL.append(self)

    def get(self, datasets: Sequence[xr.Dataset], key: Hashable, compute: Callable[[], T], *,
            copy: bool | Callable[[T], T] = True) -> T:
        """*compute()*'s result, reused while *datasets* are the same objects, unchanged (see the module).

        *copy*: True, a deep copy is kept and given; False, the result itself; a function, the copy it makes
        (cheaper than a deep copy when the caller knows what may change).
        """
        dup: Callable[[T], T] = (copy if callable(copy) else _copy.deepcopy) if copy else (lambda v: v)
        k = (tuple(id(d) for d in datasets), key)
        got = self._items.get(k)
        if got is not None:
            refs, prints, value = got
            if all(r() is d for r, d in zip(refs, datasets, strict=True)) and prints == [
                    _fingerprint(d) for d in datasets]:
                self._items.move_to_end(k)
                self.hits += 1
                return dup(value)
            del self._items[k]
        value = compute()
        try:
            items = self._items

            def forget(_ref: object, key: Any = k) -> None:  # the dataset is gone: so is its entry
                items.pop(key, None)

            refs = [weakref.ref(d, forget) for d in datasets]
        except TypeError:  # not weakly referable: not kept
            return value
        self._items[k] = (refs, [_fingerprint(d) for d in datasets], dup(value))
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forget every entry."""
        self._items.clear()


def memos() -> list[DatasetMemo]:
    """Every memo made (to clear them all, or to count their hits in a test)."""
    return list(_ALL)
