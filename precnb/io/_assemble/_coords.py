"""Labels to integer ids, and the per-tensor coordinates.

The first record (in (step, rank, order) order) holding a label sets its coordinates; a None value
never wins over a later record's value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from precnb.io._assemble._base import _INT_COORDS, _NO_OWNER, _column, _increasing
from precnb.io._assemble._changes import ChangesLayer
from precnb.io.records import FileRecords


class CoordsLayer(ChangesLayer):
    """The label table and the coordinate columns (grown, taken from records, their holes filled)."""

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

    def _materialize(self) -> None:
        """Copy the deferred first record's coordinates into the assembler's columns (before a second)."""
        if self._deferred is None:
            return
        rec, gids, order = self._deferred
        self._deferred = None
        self._encode_first()
        self._grow(len(self._labels))
        self._set_coords(rec, gids, order)

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
