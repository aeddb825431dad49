"""Assembly of per-file records into the canonical dataset (any reader, any format).

Every reader turns one (step, rank) source into a :class:`~precnb.io.records.FileRecords` and
hands it to an :class:`Assembler` (or :func:`assemble`), which aligns the records on the union of
tensor labels. Nothing here knows a file format: side tables arrive as dicts or as
:class:`~precnb.io.records.SharedTable` objects parsed once per distinct content.

Labels become integer ids as records arrive and columns are kept as numpy arrays, so a record
of millions of tensors is folded in with array operations, not a Python step per tensor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from precnb.io._lazy_dask import defer_dask_array_import
from precnb.io._memory import return_free_memory
from precnb.io._runfacts import FactsAccumulator
from precnb.io.records import FileRecords, LoadReport, RecordBuilder, SharedTable, dedup_labels, stat_value
from precnb.schema import (
    DIMS,
    META_FIELDS,
    SCHEMA_VERSION,
    STATS,
    TENSOR_COORDS,
    encode_entry_changes,
    side_text,
    validate,
)

__all__ = ["Assembler", "FileRecords", "LoadReport", "RecordBuilder", "SharedTable", "assemble", "dedup_labels",
           "select_items", "stat_value"]

_INT_COORDS = {k for k, v in TENSOR_COORDS.items() if v is not str}
defer_dask_array_import()  # before the first Dataset is built
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


MAX_DTYPE_CHANGES = 200_000
MAX_META_CHANGES = 500_000


class Assembler:
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
    >>> b = RecordBuilder(step=0, rank=0)
    >>> b.add("x.output.0", {"max": 1.0, "min": 0.0, "mean": 0.5, "norm": 2.0}, node="x", kind="api")
    >>> acc = Assembler()
    >>> acc.add(b.build())
    >>> acc.build(source_format="synthetic").sizes["tensor"]
    1
    """

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

    # ----------------------------------------------------------------------------- adding
    def _side(self, table: dict[str, Any] | SharedTable) -> tuple[Any, Mapping[str, Any]]:
        if not isinstance(table, SharedTable):
            return None, table
        hit = self._side_cache.get(table.key)
        if hit is None:
            hit = self._side_cache[table.key] = table.get()
        return table.key, hit

    def _grow(self, n: int) -> None:
        """Room for *n* labels in the coordinate and owner arrays."""
        if n <= self._cap:
            return
        cap = max(n, 2 * self._cap, 1024)
        for name, arr in self._cv.items():
            new = np.full(cap, -1, np.int64) if name in _INT_COORDS else np.full(cap, "", object)
            new[:len(arr)] = arr
            self._cv[name] = new
        owner = np.full((cap, 3), _NO_OWNER, np.int64)
        owner[:len(self._owner)] = self._owner
        self._owner = owner
        self._cap = cap

    def _ids(self, labels: Sequence[str], unique: bool = False) -> np.ndarray:
        n = len(labels)
        if not self._labels:  # the first record: one pass at most
            if unique:  # checked by the reader: the table is built only if a second record comes
                self._gid = None
                self._labels = list(labels)
                return np.arange(n, dtype=np.int64)
            first = dict(zip(labels, range(n), strict=True))
            if len(first) == n:
                self._gid = first
                self._labels = list(labels)
                return np.arange(n, dtype=np.int64)
        gid = self._gid
        if gid is None:
            gid = self._gid = dict(zip(self._labels, range(len(self._labels)), strict=True))
        ids = list(map(gid.get, labels))
        if ids.count(None):
            base = len(self._labels)
            if ids.count(None) == n and len(set(labels)) == n:  # all new (the first record, one big file)
                gid.update(zip(labels, range(base, base + n), strict=True))
                self._labels.extend(labels)
                return np.arange(base, base + n, dtype=np.int64)
            for i, g in enumerate(ids):
                if g is None:
                    lbl = labels[i]
                    g = gid.get(lbl)
                    if g is None:
                        g = gid[lbl] = len(self._labels)
                        self._labels.append(lbl)
                    ids[i] = g
        return np.asarray(ids, dtype=np.int64)

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

    def _materialize(self) -> None:
        """Copy the deferred first record's coordinates into the assembler's columns (before a second)."""
        if self._deferred is None:
            return
        rec, gids, order = self._deferred
        self._deferred = None
        self._encode_first()
        self._grow(len(self._labels))
        self._set_coords(rec, gids, order)

    def _encode_first(self) -> None:
        """The value codes of the first record's metadata columns, left unencoded by :meth:`add` until needed."""
        if self._unencoded is not None:
            r, meta = self._unencoded
            self._unencoded = None
            r.codes = {f: self._codes(col) for f, col in meta.items()}

    def _codes(self, names: Sequence[Any] | np.ndarray) -> np.ndarray:
        small = len(names) <= 200_000
        key = tuple(names) if small else None  # the ranks of a run repeat the same dtype column: encode it once
        if key is not None:
            hit = self._codes_cache.get(key)
            if hit is not None:
                return hit
        code = self._dtype_code
        for d in set(names) - code.keys():
            code[d] = len(self._dtype_names)
            self._dtype_names.append(str(d))
        out = np.fromiter(map(code.__getitem__, names), np.int32, len(names))
        if key is not None:
            if len(self._codes_cache) > 256:
                self._codes_cache.clear()
            self._codes_cache[key] = out
        return out

    def _note_meta_changes(self, recs: list[_Rec]) -> None:
        """Record entries of *recs* whose module / parent / shape is not their tensor's coordinate (both known)."""
        coords: dict[str, np.ndarray] = {}
        self._encode_first()
        for r in recs:
            if r.skipped:
                continue
            for f, codes in r.codes.items():
                if f not in coords:
                    coords[f] = self._codes(self._cv[f][:len(self._labels)])
                own = coords[f][r.gids]
                bad = np.flatnonzero((codes != own) & (codes != 0))
                for j in bad.tolist():
                    if self.n_meta_changes >= MAX_META_CHANGES:
                        return
                    label = self._labels[int(r.gids[j])]
                    name = self._dtype_names[int(codes[j])]
                    self.meta_changes.setdefault(f, {}).setdefault(label, {}).setdefault(name, []).append(
                        [r.step, r.rank])
                    self.n_meta_changes += 1

    def _note_dtype_changes(self, recs: list[_Rec]) -> None:
        """Record entries of *recs* whose dtype (or other metadata) is not their tensor's coordinate (both known)."""
        coord: np.ndarray | None = None
        if len(recs) == 1 and self._n == 1:  # the coordinates are this record's own
            return
        self._note_meta_changes(recs)
        for r in recs:
            if r.skipped or r.dtypes is None:
                continue
            if coord is None:
                coord = self._codes(self._cv["dtype"][:len(self._labels)])
            codes = self._codes(r.dtypes)
            own = coord[r.gids]
            bad = np.flatnonzero((codes != own) & (codes != 0) & (own != 0))
            for j in bad.tolist():
                if self.n_dtype_changes >= MAX_DTYPE_CHANGES:
                    return
                label = self._labels[int(r.gids[j])]
                name = self._dtype_names[int(codes[j])]
                self.dtype_changes.setdefault(label, {}).setdefault(name, []).append([r.step, r.rank])
                self.n_dtype_changes += 1

    def _note_shape_changes(self, recs: list[_Rec]) -> None:
        """Record entries of *recs* whose shape is not their tensor's coordinate (both known).

        A pipeline stage names its layers and calls locally: another stage's ``Functional.dropout.0`` is
        another op, of another shape. ``attrs["shape_changes"]``: label -> shape -> [[step, rank], ...].
        """
        if (len(recs) == 1 and self._n == 1) or "shape" not in self._cv:
            return
        coord = self._cv["shape"]
        for r in recs:
            if r.skipped or r.shapes is None:
                continue
            own = coord[r.gids]
            mine = np.asarray(r.shapes, dtype=object)
            bad = np.flatnonzero((mine != own) & (mine != "") & (own != ""))
            for j in bad.tolist():
                if self.n_shape_changes >= MAX_DTYPE_CHANGES:
                    return
                label = self._labels[int(r.gids[j])]
                self.shape_changes.setdefault(label, {})[(int(r.step), int(r.rank))] = str(mine[j])
                self.n_shape_changes += 1

    def _set_coords(self, rec: FileRecords, gids: np.ndarray, order: int) -> None:
        """Coordinates come from the first record (in (step, rank, order) order) holding the label."""
        own = self._owner[gids]
        s, r = rec.step, rec.rank
        earlier = (s < own[:, 0]) | ((s == own[:, 0]) & ((r < own[:, 1]) | ((r == own[:, 1]) & (order < own[:, 2]))))
        if earlier.any():
            self._take_coords(rec, gids, np.flatnonzero(earlier), (s, r, order))
        if self._holes:
            self._fill_holes(rec, gids, (s, r, order))

    def _take_coords(self, rec: FileRecords, gids: np.ndarray, js: np.ndarray, key: tuple[int, int, int]) -> None:
        if len(js) > 1:  # a label repeated within one record: its first occurrence wins
            targets = gids[js]
            if not _increasing(targets) and len(np.unique(targets)) != len(targets):
                _, first = np.unique(targets, return_index=True)
                js = js[np.sort(first)]
        targets = gids[js]
        prev = self._owner[targets]  # fancy indexing: a copy
        self._owner[targets] = key
        n = len(rec.labels)
        whole = len(js) == n and n and js[0] == 0 and js[-1] == n - 1  # every label, in order (js is increasing)
        run = whole and targets[-1] - targets[0] == n - 1 and _increasing(targets)
        for name, arr in self._cv.items():
            col, none = _column(rec.coords.get(name), name, n)
            holes = self._holes.get(name)
            if none is None and run:  # labels new in this record, in its order: a slice
                arr[targets[0]:targets[0] + n] = col
                if holes:
                    for t in targets.tolist():
                        holes.pop(t, None)
                continue
            vals = col if whole else col[js]
            if none is None:
                arr[targets] = vals
                if holes:
                    for t in targets.tolist():
                        holes.pop(t, None)
                continue
            isnone = none[js]
            keep = ~isnone
            arr[targets[keep]] = vals[keep]
            if holes:
                for t in targets[keep].tolist():
                    holes.pop(t, None)
            for t, old in zip(targets[isnone].tolist(), prev[isnone].tolist(), strict=True):
                # a None value never wins (assemble() took the first value that is not None)
                self._holes.setdefault(name, {}).setdefault(t, tuple(old))

    def _fill_holes(self, rec: FileRecords, gids: np.ndarray, key: tuple[int, int, int]) -> None:
        """Coordinates whose earliest record had None: the earliest record with a value wins."""
        where: dict[int, int] = {}
        for i, g in enumerate(gids.tolist()):
            where.setdefault(g, i)
        n = len(rec.labels)
        for name, holes in self._holes.items():
            if name not in rec.coords:
                continue
            col, none = _column(rec.coords[name], name, n)
            for t, best in list(holes.items()):
                j = where.get(t)
                if j is not None and (none is None or not none[j]) and key < best:
                    self._cv[name][t] = col[j]
                    holes[t] = key

    # ------------------------------------------------------------------------ materialising
    def _place(self, recs: list[_Rec]) -> None:
        """Give columns to labels first seen in *recs* (sorted), and register their variables."""
        n = len(self._labels)
        if not len(self._order) and len(recs) == 1 and len(recs[0].gids) == n and self._deferred is not None \
                and self._deferred[1] is recs[0].gids:  # one record holding every label in order (add's check)
            # the identity, column j is label j, as one array for both (read-only: later records that bring
            # labels of their own concatenate new arrays before they write)
            self._pos = self._order = np.arange(n, dtype=np.int64)
            self._pos.flags.writeable = False
            self.stat_names += [k for k in recs[0].values if k not in self.stat_names]
            self.string_names.update(recs[0].strings)
            return
        if len(self._pos) < n:
            self._pos = np.concatenate([self._pos, np.full(n - len(self._pos), -1, np.int64)])
        for r in recs:
            new = r.gids[self._pos[r.gids] < 0]
            if len(new):
                if not _increasing(new) and len(np.unique(new)) != len(new):
                    _, first = np.unique(new, return_index=True)
                    new = new[np.sort(first)]
                self._pos[new] = np.arange(len(self._order), len(self._order) + len(new))
                self._order = np.concatenate([self._order, new])
            self.stat_names += [k for k in r.values if k not in self.stat_names]
            self.string_names.update(r.strings)

    def _note_stacks(self, r: _Rec, diff: Mapping[str, Any] | None) -> None:
        """The (step, rank) of *r* holds the frames of *diff* (node → frames) where the merged table has others."""
        for node, frames in (diff or {}).items():
            variant = tuple(str(f) for f in frames) if isinstance(frames, list) else (str(frames),)
            self.stack_changes.setdefault(node, {}).setdefault(variant, []).append([r.step, r.rank])

    def _merge_sides(self, r: _Rec) -> None:
        for (key, table), name in ((r.construct, "construct"), (r.stacks, "stacks")):
            if key is not None:
                if key in self._merged:
                    if name == "construct":  # the same table again: its disagreements hold for this file too
                        at = f"{int(r.step)},{int(r.rank)}"
                        for node, val in self._exceptions.get(key, {}).items():
                            self.construct_ranks.setdefault(node, {})[at] = val
                    if name == "stacks" and not r.skipped:
                        self._note_stacks(r, self._stack_diff.get(key))
                    continue
                self._merged.add(key)
            target = getattr(self, name)
            if not target and key is not None and not self._borrowed.get(name):  # the first shared table: as is
                setattr(self, name, table)
                self._borrowed[name] = True
                continue
            if self._borrowed.get(name):  # a second table: merge into a copy of the one borrowed
                target = dict(target)
                setattr(self, name, target)
                self._borrowed[name] = False
            if name == "stacks" and target:  # what this table records otherwise than the merged one
                diff = {node: val for node, val in table.items()
                        if (old := target.get(node)) is not None and old != val}
                if key is not None:
                    self._stack_diff[key] = diff
                if not r.skipped:
                    self._note_stacks(r, diff)
            if name == "construct":  # a parent another (step, rank) gives the same node name: PP stages'
                ranks_of, at = self.construct_ranks, f"{int(r.step)},{int(r.rank)}"  # local names, cached ops
                mine = self._exceptions.setdefault(key, {}) if key is not None else {}
                for node, val in table.items():
                    have = target.setdefault(node, val)
                    if have != val and not node.startswith(("Module.", "Cell.")):  # calls: they hold tensors
                        ranks_of.setdefault(node, {})[at] = mine[node] = val
                continue
            for node, val in table.items():
                target.setdefault(node, val)

    def _sole(self, recs: list[_Rec], step_vals: Sequence[int],
              rank_vals: Sequence[int]) -> dict[str, np.ndarray] | None:
        """The arrays of a run that is one record holding every column in order: its own columns, no copy."""
        if len(recs) != 1 or len(step_vals) != 1 or len(rank_vals) != 1:
            return None
        r = recs[0]
        n = len(self._order)
        if r.skipped or (r.step, r.rank) != (step_vals[0], rank_vals[0]) or len(r.gids) != n \
                or not (_is_range(self._pos[:n], n) if _is_range(r.gids, n)
                        else np.array_equal(self._pos[r.gids], np.arange(n))):
            return None
        shape = (1, 1, n)
        arrays = {name: np.asarray(r.values[name], np.float64).reshape(shape) if name in r.values
                  else np.full(shape, np.nan) for name in self.stat_names}
        arrays["present"] = np.ones(shape, bool)
        arrays["null_stats"] = np.asarray(r.null, np.uint8).reshape(shape)
        arrays["seq"] = np.asarray(r.seq, np.int32).reshape(shape)
        arrays["numel"] = np.asarray(r.numel, np.int64).reshape(shape)
        for name in sorted(self.string_names):
            col = np.empty(n, object)
            col[:] = r.strings.get(name, "")
            arrays[name] = col.reshape(shape)
        self._merge_sides(r)
        return arrays

    def _fill(self, recs: list[_Rec], step_vals: Sequence[int], rank_vals: Sequence[int]) -> dict[str, np.ndarray]:
        si = {s: i for i, s in enumerate(step_vals)}
        ri = {r: i for i, r in enumerate(rank_vals)}
        self._note_dtype_changes([r for r in recs if r.step in si and r.rank in ri])
        self._note_shape_changes([r for r in recs if r.step in si and r.rank in ri])
        sole = self._sole(recs, step_vals, rank_vals)
        if sole is not None:
            return sole
        shape = (len(step_vals), len(rank_vals), len(self._order))
        arrays: dict[str, np.ndarray] = {k: np.full(shape, np.nan) for k in self.stat_names}
        arrays["present"] = np.zeros(shape, bool)
        arrays["null_stats"] = np.zeros(shape, np.uint8)
        arrays["seq"] = np.full(shape, -1, np.int32)
        arrays["numel"] = np.full(shape, -1, np.int64)
        for name in sorted(self.string_names):
            arrays[name] = np.full(shape, "", dtype=object)
        for r in recs:
            if r.skipped or r.step not in si or r.rank not in ri:
                continue
            cols = self._pos[r.gids]
            s, k = si[r.step], ri[r.rank]
            for name, vals in r.values.items():
                arrays[name][s, k, cols] = vals
            arrays["present"][s, k, cols] = True
            arrays["null_stats"][s, k, cols] = r.null
            arrays["seq"][s, k, cols] = r.seq
            arrays["numel"][s, k, cols] = r.numel
            for name, col in r.strings.items():
                arrays[name][s, k, cols] = col
            self._merge_sides(r)
        return arrays

    def take_steps(self, steps: Sequence[int], ranks: Sequence[int]) -> dict[str, np.ndarray]:
        """Materialise (and drop) the pending records of *steps*: arrays (step, rank, tensor).

        Columns are every label placed so far, in :func:`assemble` order; call in increasing
        step order so that labels first seen later are appended after the earlier ones.
        """
        want = set(steps)
        take = sorted((r for r in self._pending if r.step in want), key=lambda r: r.key)
        self._pending = [r for r in self._pending if r.step not in want]
        self._place(take)
        return self._fill(take, list(steps), list(ranks))

    def tensor_coords(self, *, copy: bool = True) -> dict[str, Any]:
        """The ``tensor`` coordinate and the per-tensor coordinates of the columns placed so far.

        ``copy=False`` (the final build) returns views of the coordinate arrays where the columns
        are in label order.
        """
        order = self._order
        n = len(order)
        in_order = not copy and n == len(self._labels) and _increasing(order) and (not n or order[-1] == n - 1)
        if self._deferred is not None and not in_order:
            self._materialize()
        labels = np.empty(len(self._labels), object)
        labels[:] = self._labels
        out: dict[str, Any] = {"tensor": labels if in_order else labels[order]}
        if self._deferred is not None:  # one record holding every label in order: its own columns
            rec = self._deferred[0]
            for name in self._cv:
                out[name] = ("tensor", _column(rec.coords.get(name), name, n)[0])
            return out
        for name, vals in self._cv.items():
            out[name] = ("tensor", vals[:n] if in_order else vals[order])
        return out

    def attrs(self, source_format: str, attrs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Dataset attributes: schema version, format, side tables, task/level/framework."""
        meta: dict[str, Any] = {
            "precnb_schema": SCHEMA_VERSION,
            "source_format": source_format,
            "construct": side_text(self.construct),  # the text other code writes too (concat_steps, merge)
            "stacks": side_text(self.stacks),
        }
        for key in ("task", "level", "framework"):
            vals = self._meta[key]
            if key == "framework" and len(vals) > 1:
                vals = vals - {"unknown"}  # a file without framework evidence says nothing against the others
            meta[key] = ",".join(sorted(vals))
        if self.dtype_changes:
            meta["dtype_changes"] = json.dumps(self.dtype_changes)
        if self.shape_changes:
            meta["shape_changes"] = encode_entry_changes(self.shape_changes)
        if self.construct_ranks:  # read with precnb.analysis.pp (stage-local names of pipeline stages)
            meta["construct_ranks"] = json.dumps({
                n: dict(sorted(by.items(), key=lambda kv: tuple(int(x) for x in kv[0].split(","))))
                for n, by in sorted(self.construct_ranks.items())})
        if self.meta_changes:
            meta["meta_changes"] = json.dumps(self.meta_changes)
        if self.stack_changes:
            meta["stack_changes"] = json.dumps({node: [[list(frames), where] for frames, where in variants.items()]
                                                for node, variants in self.stack_changes.items()})
        meta.update(self.facts.attrs())
        meta.update(attrs or {})
        return meta

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
