"""The (step, rank, tensor) value arrays: columns given to labels in first-seen order, records placed in them.

A run that is one record holding every column in order keeps that record's own arrays (no copy).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from precnb.io._assemble._base import _increasing, _is_range, _Rec
from precnb.io._assemble._sides import SidesLayer


class ValuesLayer(SidesLayer):
    """Placing labels in columns and filling the value arrays of the steps taken."""

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
