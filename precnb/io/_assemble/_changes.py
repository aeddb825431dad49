"""Entries whose dtype, shape or metadata is not their tensor's: the per-entry exception tables.

A label names one tensor, but a rank may record it with another dtype (a mixed-precision cast),
another shape (a pipeline stage's local op of the same name) or another module / parent: those
entries are noted per (step, rank) for ``attrs["dtype_changes"]``, ``attrs["shape_changes"]`` and
``attrs["meta_changes"]``, at most :data:`MAX_DTYPE_CHANGES` / :data:`MAX_META_CHANGES` of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from precnb.io._assemble._base import AssemblerState, _Rec

MAX_DTYPE_CHANGES = 200_000
MAX_META_CHANGES = 500_000


class ChangesLayer(AssemblerState):
    """Value codes of metadata columns and the entries that differ from their tensor's coordinates."""

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
