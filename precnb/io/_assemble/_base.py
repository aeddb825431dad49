"""The assembler's state and the small helpers its parts share (:mod:`precnb.io._assemble`).

:class:`AssemblerState` holds what grows record by record across the files of a load: the label
table, the per-tensor coordinates and their owners, the records waiting for their step, the side
tables and the per-entry exception tables. Each concern that reads or writes it is a layer of its
own (:mod:`._changes`, :mod:`._coords`, :mod:`._sides`, :mod:`._values`), stacked in that order, so
a layer calls only what the layers below it define.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from precnb.io._runfacts import FactsAccumulator
from precnb.io.records import FileRecords
from precnb.schema import STATS, TENSOR_COORDS

__all__ = ["AssemblerState", "select_items"]

_INT_COORDS = {k for k, v in TENSOR_COORDS.items() if v is not str}
_NO_OWNER = np.iinfo(np.int64).max
_STR_OK = frozenset({str})


def _column(col: Any, name: str, n: int) -> tuple[np.ndarray, np.ndarray | None]:
    """A record's coordinate as an array (int64 or object) and the positions holding None (or None).

    An ndarray is taken as it is (its values are final); a list is checked: ``None`` is marked,
    values that are not strings (string coordinates) are turned into strings.
    """
    if isinstance(col, np.ndarray):
        if name in _INT_COORDS:
            return col.astype(np.int64, copy=False), None
        return col, None
    if col is None:
        return np.full(n, -1 if name in _INT_COORDS else "", dtype=np.int64 if name in _INT_COORDS else object), \
            np.ones(n, bool)
    obj = np.empty(len(col), object)
    obj[:] = col
    none: np.ndarray | None = None
    if None in col:
        none = np.fromiter((v is None for v in col), bool, len(col))
        obj[none] = -1 if name in _INT_COORDS else ""
    if name in _INT_COORDS:
        return obj.astype(np.int64), none
    if not set(map(type, col)) <= _STR_OK | {type(None)}:
        obj[:] = [v if v.__class__ is str else ("" if v is None else str(v)) for v in col]
    return obj, none


def select_items(items: Sequence[Any], steps: Sequence[int] | None, ranks: Sequence[int] | None) -> list[Any]:
    """The parse items (with ``step`` and ``rank``) in *steps* and *ranks* (None: all).

    Examples
    --------
    >>> from types import SimpleNamespace as N
    >>> [(i.step, i.rank) for i in select_items([N(step=0, rank=1), N(step=2, rank=1)], [2], None)]
    [(2, 1)]
    """
    want_s = None if steps is None else {int(s) for s in steps}
    want_r = None if ranks is None else {int(r) for r in ranks}
    return [i for i in items if (want_s is None or i.step in want_s) and (want_r is None or i.rank in want_r)]


def _increasing(a: np.ndarray) -> bool:
    """Whether *a* is strictly increasing (so holds no repeats), without sorting it."""
    return bool(len(a) < 2 or (a[1:] > a[:-1]).all())


def _is_range(a: np.ndarray, n: int) -> bool:
    """Whether *a* is ``0, 1, ..., n - 1`` (integers), without building that range.

    Examples
    --------
    >>> _is_range(np.arange(4), 4), _is_range(np.array([0, 2, 3]), 3), _is_range(np.zeros(0, int), 0)
    (True, False, True)
    """
    return bool(len(a) == n and (not n or (a[0] == 0 and a[-1] == n - 1 and _increasing(a))))


class _Rec:
    """The part of a :class:`FileRecords` kept until its step is materialised (no Python lists of labels)."""

    __slots__ = ("codes", "construct", "dtypes", "gids", "key", "null", "numel", "order", "rank", "seq", "shapes",
                 "skipped", "stacks", "step", "strings", "values")

    def __init__(self, rec: FileRecords, gids: np.ndarray, order: int, skipped: bool,
                 construct: tuple[Any, Mapping[str, Any]], stacks: tuple[Any, Mapping[str, Any]],
                 dtypes: Any = None, shapes: Any = None, codes: dict[str, np.ndarray] | None = None) -> None:
        self.step, self.rank, self.order = rec.step, rec.rank, order
        self.key = (rec.step, rec.rank, order)
        self.skipped = skipped
        self.gids = gids
        self.values = rec.values
        self.null, self.seq, self.numel = rec.null_stats, rec.seq, rec.numel
        self.strings = rec.strings
        self.construct, self.stacks = construct, stacks
        self.dtypes = dtypes  # the record's dtype column, to find entries whose dtype changed
        self.shapes = shapes  # its shape column: a label another rank records with another shape (PP stages)
        self.codes = codes or {}  # the record's META_FIELDS columns as value codes (entries whose metadata changed)


class AssemblerState:
    """The state an :class:`~precnb.io._assemble.Assembler` grows as records arrive (see the module docstring)."""

    def __init__(self, *, steps: Sequence[int] | None = None, ranks: Sequence[int] | None = None) -> None:
        self.forced_steps = sorted(set(steps)) if steps is not None else None
        self.forced_ranks = sorted(set(ranks)) if ranks is not None else None
        self._steps_set = set(self.forced_steps) if self.forced_steps is not None else None
        self._ranks_set = set(self.forced_ranks) if self.forced_ranks is not None else None
        self._gid: dict[str, int] | None = {}  # None: not built yet (the labels of one checked record)
        self._labels: list[str] = []
        self._cap = 0
        self._cv: dict[str, np.ndarray] = {k: np.zeros(0, np.int64 if k in _INT_COORDS else object)
                                           for k in TENSOR_COORDS}
        self._owner = np.zeros((0, 3), np.int64)  # (step, rank, order) of the record that set the coords
        self._holes: dict[str, dict[int, tuple[int, ...]]] = {}  # coords still None: key of their value
        # the first record's coordinates, not yet copied into _cv: a run of one record (one large
        # dump.json) keeps its own columns; a second record copies them first (_materialize)
        self._deferred: tuple[FileRecords, np.ndarray, int] | None = None
        self._unencoded: tuple[_Rec, dict[str, Any]] | None = None  # that record's metadata columns (add)
        self._pending: list[_Rec] = []
        self._n = 0
        self._meta: dict[str, set[str]] = {"task": set(), "level": set(), "framework": set()}
        self._side_cache: dict[Any, Any] = {}
        # state of what has been materialised (label order, variables, side tables)
        self._pos = np.zeros(0, np.int64)  # gid -> column, -1 before the label is placed
        self._order = np.zeros(0, np.int64)  # gids in column order
        self.stat_names: list[str] = list(STATS)
        self.string_names: set[str] = set()
        self.construct: dict[str, str] = {}
        self.construct_ranks: dict[str, dict[str, str]] = {}  # node -> "step,rank" -> parent, where files disagree
        self._exceptions: dict[Any, dict[str, str]] = {}  # shared construct table -> its disagreeing entries
        self.stacks: dict[str, list[str]] = {}
        self._merged: set[Any] = set()
        self._finished = False
        self._borrowed: dict[str, bool] = {}  # construct/stacks is a parsed shared table, not our own dict
        # entries whose dtype differs from their tensor's dtype coordinate (attrs["dtype_changes"])
        self._dtype_code: dict[Any, int] = {None: 0, "": 0}
        self._dtype_names: list[str] = [""]
        self._codes_cache: dict[tuple[Any, ...], np.ndarray] = {}
        self.dtype_changes: dict[str, dict[str, list[list[int]]]] = {}
        self.n_dtype_changes = 0
        self.shape_changes: dict[str, dict[tuple[int, int], str]] = {}
        self.n_shape_changes = 0
        # entries whose module / parent / shape (attrs["meta_changes"]) or stack frames (attrs["stack_changes"])
        # are not their tensor's (node's): a label that names another op on some rank
        self.meta_changes: dict[str, dict[str, dict[str, list[list[int]]]]] = {}
        self.n_meta_changes = 0
        self.stack_changes: dict[str, dict[tuple[str, ...], list[Any]]] = {}
        self._stack_diff: dict[Any, dict[str, Any]] = {}
        self.facts = FactsAccumulator()  # requires_grad / optimizer scalar arguments (attrs)
