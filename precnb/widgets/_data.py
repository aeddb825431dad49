"""Cached arrays behind the explorer (per run): colour values, row labels, masks, evidence.

Computed once per (run, colour, statistic) so that a selection only slices numpy arrays. The
"first bad" order comes from the triage (:meth:`precnb.Triage.flagged`), so the heat map's
earliest cell is the record the diagnosis put first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import xarray as xr

from precnb.viz.frames import cell_values, row_groups, row_labels
from precnb.viz.series import tensor_evidence
from precnb.widgets._inputs import Runs

__all__ = ["ExplorerData", "has_metrics"]


def has_metrics(triage: Any) -> bool:
    """Whether *triage* carries tensor metrics (a tensor-mode pair)."""
    return triage is not None and getattr(triage, "tensor_metrics", None) is not None


def _same_grid(a: xr.Dataset, b: xr.Dataset) -> bool:
    return all(a.indexes[d].equals(b.indexes[d]) for d in ("step", "rank", "tensor"))


class ExplorerData:
    """The explorer's view of its runs, as the filter bar selects them.

    Parameters
    ----------
    runs : Runs
    filters : precnb.widgets.filters.FilterPanel
    triage : precnb.Triage, optional
        Where the "first bad" order comes from (without one it is computed from the runs).
    """

    def __init__(self, runs: Runs, filters: Any, triage: Any = None) -> None:
        self.runs = runs
        self.filters = filters
        self.triage = triage
        self._cache: dict[tuple[Any, ...], Any] = {}

    def target(self) -> xr.Dataset:
        """The run the heat map shows."""
        return self.runs.run(self.filters.run.value or None)

    def raw(self) -> xr.Dataset | None:
        """The target as dumped (before its shards were merged), when that differs from :meth:`target`."""
        t = self.triage
        if t is None or t.raw_target is None or t.target_layout is None:
            return None
        if t.raw_target.sizes["rank"] == self.target().sizes["rank"]:
            return None
        return t.raw_target

    def departing(self, finding: Any) -> tuple[int, int, str] | None:
        """(step, dump rank, tensor as dumped) of a finding whose merged entry hides a departing replica copy.

        A merged replicated entry is its group's first copy; when another copy departs from the baseline
        (``values["departing_rank"]``, its dump rank and name in ``evidence["dump"]``) the record to show is that
        copy as dumped, beside its replica's. None otherwise (or when the dump does not hold it).
        """
        raw = self.raw()
        values = getattr(finding, "values", None) or {}
        dump = (getattr(finding, "evidence", None) or {}).get("dump") or {}
        if raw is None or values.get("departing_rank") is None or dump.get("rank") is None or finding.step is None:
            return None
        tensor, node = str(finding.tensor or ""), str(finding.node or "")
        local = str(dump.get("node") or node) + tensor[len(node):] if tensor.startswith(node) else tensor
        step, rank = int(values.get("target_step", finding.step)), int(dump["rank"])
        if local not in raw.indexes["tensor"] or step not in raw.indexes["step"] or rank not in raw.indexes["rank"]:
            return None
        return (step, rank, local) if bool(raw["present"].sel(step=step, rank=rank, tensor=local)) else None

    def device_labels(self) -> dict[int, str]:
        """``{rank: "host:device"}`` from the triage's rank table, suspect devices marked (``{}`` without one)."""
        if self.triage is None:
            return {}
        from precnb.pipeline.devices import device_labels

        return self.cached(("device_labels",), lambda: device_labels(self.triage))

    def cached(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """Memoise *make()* under *key*."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def _is_triage_target(self) -> bool:
        t = self.triage
        if t is None or t.target is None:
            return False
        name = self.filters.run.value
        return not self.runs.names or name == self.runs.target

    def positions(self) -> np.ndarray:
        """Causal positions of the flagged records of the shown run (NaN: not flagged)."""
        def make() -> np.ndarray:
            from precnb.viz.values import first_bad_positions

            ds = self.target()
            if self._is_triage_target():
                f = self.triage.flagged()
                if _same_grid(f.ds, ds):
                    return f.positions
            base = self.runs.baseline
            if base and base != self.filters.run.value:
                return first_bad_positions(ds, self.runs.run(base))
            return first_bad_positions(ds)

        return self.cached(("positions", self.filters.run.value), make)

    def what_flagged(self) -> str:
        """What "first bad" colours, in words."""
        if self._is_triage_target():
            return str(self.triage.flagged().what)
        base = self.runs.baseline
        return ("differences beyond the dtype tolerance vs " + base) if base and base != self.filters.run.value \
            else "NaN and unexpected ±inf"

    def tensor_metric(self, name: str) -> np.ndarray | None:
        """A tensor metric (as salience) on the shown run's grid; None without tensor metrics."""
        from precnb.viz.values import metric_salience

        t = self.triage
        if t is None or t.tensor_metrics is None or name not in t.tensor_metrics or not self._is_triage_target():
            return None

        def make() -> np.ndarray:
            ds = self.target()
            m = t.tensor_metrics[name].reindex(step=ds["step"].values, rank=ds["rank"].values,
                                                tensor=ds["tensor"].values)
            return metric_salience(name, np.asarray(m.transpose("step", "rank", "tensor").values))

        return self.cached(("metric", name, self.filters.run.value), make)

    def values(self, color: str, stat: str) -> tuple[np.ndarray, np.ndarray]:
        """:func:`precnb.viz.cell_values` of the whole target run (``reldiff`` vs the baseline)."""
        run, base = self.filters.run.value, self.runs.baseline
        if color == "reldiff" and (not base or base == run):
            color = "stat"
        if color == "tensor":
            name = self.filters.metric.value
            metric = self.tensor_metric(name)
            if metric is not None:
                return self.cached(("values", run, "tensor", name), lambda: cell_values(
                    self.target(), color="tensor", metric=metric))
            color = "stat"
        key = ("values", run, color, stat if color == "stat" else "", base if color == "reldiff" else "")
        baseline = self.runs.run(base) if color == "reldiff" else None
        pos = self.positions() if color == "first_bad" else None
        return self.cached(key, lambda: cell_values(self.target(), color=color, stat=stat,  # type: ignore[arg-type]
                                                    baseline=baseline, positions=pos))

    def where(self, color: str, stat: str) -> tuple[xr.Dataset, tuple[np.ndarray, np.ndarray], bool, str]:
        """(run, cell values, unmerged, what) for the rank × step view.

        In "first bad" colour a target whose shards were merged and whose replicas disagree is
        shown as dumped (:meth:`precnb.Triage.flagged_ranks`); otherwise the shown run.
        """
        if color == "first_bad" and self._is_triage_target():
            f = self.triage.flagged_ranks()
            if f.unmerged:
                vals = self.cached(("where", "unmerged"), lambda: cell_values(f.ds, color="first_bad",
                                                                                 positions=f.positions))
                return f.ds, vals, True, str(f.what)
        return self.target(), self.values(color, stat), False, self.what_flagged() if color == "first_bad" else ""

    def mask(self, ds: xr.Dataset | None = None) -> np.ndarray:
        """Tensors kept by the filter bar (of *ds*, default the shown run)."""
        ds = self.target() if ds is None else ds
        nf = self.cached(("nf", id(ds)), lambda: self._nonfinite(ds))
        return self.filters.tensor_mask(ds, nf, groups=self.groups(ds))  # the groups read once per run

    @staticmethod
    def _nonfinite(ds: xr.Dataset) -> np.ndarray:
        from precnb.analysis.masks import nonfinite

        return np.asarray(np.asarray(nonfinite(ds).values).any(axis=(0, 1)))

    def labels(self, ds: xr.Dataset | None = None) -> np.ndarray:
        """Row label of every tensor for the current ``rows`` choice."""
        ds = self.target() if ds is None else ds
        rows = self.filters.rows.value
        return self.cached(("rows", id(ds), rows), lambda: row_labels(ds, rows))

    def labels_at(self, ds: xr.Dataset | None, step: int | None, rank: int | None) -> np.ndarray:
        """Row label of every tensor as (*step*, *rank*) recorded it (module rows: that rank's own module)."""
        ds = self.target() if ds is None else ds
        base = self.labels(ds)
        if self.filters.rows.value != "module" or step is None or rank is None or not ds.attrs.get("meta_changes"):
            return base

        def make() -> np.ndarray:
            from precnb.schema import meta_changes

            out = base.copy()
            for t, where in meta_changes(ds).get("module", {}).items():
                m = where.get((int(step), int(rank)))
                if m is not None and t in ds.indexes["tensor"]:
                    out[ds.indexes["tensor"].get_loc(t)] = m or "(none)"
            return out

        return self.cached(("rows_at", id(ds), "module", int(step), int(rank)), make)

    def groups(self, ds: xr.Dataset | None = None) -> np.ndarray:
        """Row group (forward / backward / optimizer) of every tensor."""
        ds = self.target() if ds is None else ds
        return self.cached(("groups", id(ds)), lambda: row_groups(ds))

    def row_of(self, tensor: str, ds: xr.Dataset | None = None, step: int | None = None,
               rank: int | None = None) -> tuple[str, str] | None:
        """(group, row label) of a tensor at the current row level (None when absent); at (*step*, *rank*)."""
        ds = self.target() if ds is None else ds
        if tensor not in ds.indexes["tensor"]:
            return None
        j = int(ds.indexes["tensor"].get_loc(tensor))
        return str(self.groups(ds)[j]), str(self.labels_at(ds, step, rank)[j])

    def row_tensors(self, row: str, group: str | None = None, ds: xr.Dataset | None = None,
                    step: int | None = None, rank: int | None = None) -> list[str]:
        """Tensors of a heat-map row (for a tensor row: the tensors of its node), as (*step*, *rank*) recorded them."""
        ds = self.target() if ds is None else ds
        keep = self.mask(ds) & (self.labels_at(ds, step, rank) == row)
        if group:
            keep &= self.groups(ds) == group
        if self.filters.rows.value == "tensor" and row in ds.indexes["tensor"]:
            node = ds["node"].values[ds.indexes["tensor"].get_loc(row)]
            keep = ds["node"].values == node
        return [str(t) for t in ds["tensor"].values[keep]]

    def node_tensors(self, tensor: str, ds: xr.Dataset | None = None) -> list[str]:
        """The tensors of *tensor*'s node."""
        ds = self.target() if ds is None else ds
        if tensor not in ds.indexes["tensor"]:
            return [tensor]
        node = ds["node"].values[ds.indexes["tensor"].get_loc(tensor)]
        return [str(t) for t in ds["tensor"].values[ds["node"].values == node]]

    def largest(self, row: str, step: int, group: str | None = None) -> str:
        """The row's tensor with the largest |stat| at *step* (for a cell with nothing flagged)."""
        ds = self.target()
        tensors = self.row_tensors(row, group)
        if not tensors:
            return ""
        score = self.values("stat", self.filters.stat.value)[0]
        ti = ds.indexes["tensor"].get_indexer(tensors)
        si = int(ds.indexes["step"].get_loc(step)) if step in ds.indexes["step"] else 0
        return tensors[int(np.argmax(score[si][:, ti].max(axis=0)))]

    def first_record(self, kind: str, name: str) -> tuple[int, int, str] | None:
        """(step, rank, tensor) of a module's or node's (*kind*) first flagged record, else its first record."""
        ds = self.target()
        cols = np.flatnonzero(ds[kind].values.astype(str) == name)
        if not len(cols):
            return None
        pos = self.positions()[:, :, cols]
        if np.isfinite(pos).any():
            s, r, k = np.unravel_index(int(np.nanargmin(pos)), pos.shape)
        else:  # nothing flagged: its first record in execution order
            seq = np.asarray(ds["seq"].values)[:, :, cols].astype(float)
            s, r, k = np.unravel_index(int(np.argmin(np.where(seq >= 0, seq, np.inf))), seq.shape)
        return int(ds["step"].values[s]), int(ds["rank"].values[r]), str(ds["tensor"].values[cols[k]])

    def shard_kinds(self) -> dict[str, str]:
        """How merging shards made each tensor of the triage's target (:func:`precnb.viz.series.shard_kinds`)."""
        from precnb.viz.series import shard_kinds

        t = self.triage
        return self.cached(("shard_kinds",), lambda: shard_kinds(t.target) if t is not None and
                           t.target is not None else {})

    def evidence(self, tensor: str, ds: xr.Dataset | None = None, step: int | None = None,
                 rank: int | None = None) -> dict[str, Any]:
        """:func:`precnb.viz.tensor_evidence` at (*step*, *rank*) (that rank's own), memoised."""
        ds = self.target() if ds is None else ds
        return self.cached(("evidence", id(ds), tensor, step, rank),
                           lambda: tensor_evidence(ds, tensor, step, rank))
