"""Cached arrays behind the explorer (per run): colour values, row labels, masks, evidence.

Computed once per (run, colour, statistic) so that a selection only slices numpy arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import xarray as xr

from precnb.viz.frames import cell_values, row_labels
from precnb.viz.series import tensor_evidence
from precnb.widgets._inputs import Runs

__all__ = ["ExplorerData"]


class ExplorerData:
    """The explorer's view of its runs, as the filter bar selects them.

    Parameters
    ----------
    runs : Runs
    filters : precnb.widgets.filters.FilterPanel
    """

    def __init__(self, runs: Runs, filters: Any) -> None:
        self.runs = runs
        self.filters = filters
        self._cache: dict[tuple[Any, ...], Any] = {}

    def target(self) -> xr.Dataset:
        """The run the heat map shows."""
        return self.runs.run(self.filters.run.value or None)

    def cached(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """Memoise *make()* under *key*."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def values(self, color: str, stat: str) -> tuple[np.ndarray, np.ndarray]:
        """:func:`precnb.viz.cell_values` of the whole target run (``reldiff`` vs the baseline)."""
        run, base = self.filters.run.value, self.runs.baseline
        if color == "reldiff" and (not base or base == run):
            color = "stat"
        key = ("values", run, color, stat if color == "stat" else "", base if color == "reldiff" else "")
        baseline = self.runs.run(base) if color == "reldiff" else None
        return self.cached(key, lambda: cell_values(self.target(), color=color, stat=stat,
                                                    baseline=baseline))

    def mask(self) -> np.ndarray:
        """Tensors kept by the filter bar."""
        nf = self.cached(("nf", self.filters.run.value),
                         lambda: self.values("nonfinite", "")[1].any(axis=(0, 1)))
        return self.filters.tensor_mask(self.target(), nf)

    def labels(self) -> np.ndarray:
        """Row label of every tensor for the current ``rows`` choice."""
        rows = self.filters.rows.value
        return self.cached(("rows", self.filters.run.value, rows), lambda: row_labels(self.target(), rows))

    def row_tensors(self, row: str) -> list[str]:
        """Tensors of a heat-map row (for a tensor row: the tensors of its node)."""
        ds = self.target()
        keep = self.mask() & (self.labels() == row)
        if self.filters.rows.value == "tensor" and row in ds.indexes["tensor"]:
            node = ds["node"].values[ds.indexes["tensor"].get_loc(row)]
            keep = ds["node"].values == node
        return [str(t) for t in ds["tensor"].values[keep]]

    def largest(self, row: str, step: int) -> str:
        """The row's tensor with the largest |stat| at *step* (for a cell with nothing flagged)."""
        ds = self.target()
        tensors = self.row_tensors(row)
        if not tensors:
            return ""
        score = self.values("stat", self.filters.stat.value)[0]
        ti = ds.indexes["tensor"].get_indexer(tensors)
        si = int(ds.indexes["step"].get_loc(step)) if step in ds.indexes["step"] else 0
        return tensors[int(np.argmax(score[si][:, ti].max(axis=0)))]

    def evidence(self, tensor: str) -> dict[str, Any]:
        """:func:`precnb.viz.tensor_evidence`, memoised (stack.json is parsed once per tensor)."""
        return self.cached(("evidence", self.filters.run.value, tensor),
                           lambda: tensor_evidence(self.target(), tensor))
