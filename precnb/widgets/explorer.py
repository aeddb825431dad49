"""The explorer: filter bar, linked heat map → line chart → detail table, diagnosis panels.

Wiring only: frames and charts come from :mod:`precnb.viz`, findings from
:mod:`precnb.analysis`. The selected record is Python state (``step``, ``rank``, ``tensor``,
``row`` traits) that a cell click, a line-chart click or a finding sets.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as ipw
import numpy as np
import pandas as pd
import traitlets

from precnb.viz import detail_frame, heatmap_chart, heatmap_frame, line_chart, series_frame
from precnb.viz.selections import read_point
from precnb.widgets._data import ExplorerData
from precnb.widgets._inputs import Runs
from precnb.widgets.charts import HeatmapPanel, SeriesPanel
from precnb.widgets.detail import DetailPanel
from precnb.widgets.export import ExportPanel
from precnb.widgets.filters import FilterPanel
from precnb.widgets.findings import DivergencePanel, NanOriginPanel
from precnb.widgets.hierarchy import HierarchyPanel
from precnb.widgets.preflight import PreflightPanel
from precnb.widgets.shards import ShardPanel

__all__ = ["Explorer"]


class Explorer(ipw.VBox):
    """Linked notebook explorer of one run, or of several runs against a baseline.

    Create it with :func:`precnb.widgets.explore`. State: ``step``, ``rank``, ``tensor``,
    ``row`` (the selected heat-map row), ``finding`` (the pipeline finding it opened on) and
    ``current_finding`` (the finding shown now).
    """

    step = traitlets.Int(None, allow_none=True)
    rank = traitlets.Int(None, allow_none=True)
    tensor = traitlets.Unicode(None, allow_none=True)
    row = traitlets.Unicode(None, allow_none=True)
    finding = traitlets.Any(None)
    current_finding = traitlets.Any(None)

    def __init__(self, runs: Runs, *, auto: bool = True, max_lines: int = 12, triage: Any = None) -> None:
        self.runs = runs
        self.triage = triage
        self.max_lines = max_lines
        self._pinned: tuple[str, str] | None = None
        self.frame = pd.DataFrame()
        self.series = pd.DataFrame()
        self.filters = FilterPanel(runs.run(), runs.names, self.refresh)
        self.data = ExplorerData(runs, self.filters)
        self.heatmap = HeatmapPanel(self._on_cell)
        self.lines = SeriesPanel(self._on_pick, self._on_span)
        self.detail = DetailPanel()
        self.status = ipw.HTML("<b>selected</b>: nothing yet — click a heat-map cell")
        self.status.add_class("precnb-selection")
        self.divergence = DivergencePanel(self)
        self.nan = NanOriginPanel(self)
        self.shards = ShardPanel(self)
        self.hierarchy = HierarchyPanel(self)
        self.export = ExportPanel(self)
        self.tabs = ipw.Tab([self.divergence, self.nan, self.shards, self.hierarchy, self.export])
        for i, t in enumerate(["Divergence", "NaN origin", "Shards", "Hierarchy", "Export"]):
            self.tabs.set_title(i, t)
        self.tabs.selected_index = 0 if len(runs.names) > 1 else 1
        self.tabs.observe(self._on_tab, names="selected_index")
        ds = runs.run()
        title = ipw.HTML(f"<b>precnb explorer</b> — {html.escape(self._describe(ds))}")
        pre = triage.result("preflight") if triage is not None else None
        self.preflight = PreflightPanel(pre) if pre is not None else None
        super().__init__([title, self.filters,
                          ipw.HBox([self.heatmap, ipw.VBox([self.lines, self.status])]),
                          self.detail, *([self.preflight] if self.preflight is not None else []), self.tabs])
        self.add_class("precnb-explorer")
        self.refresh()
        if auto:
            self.start()

    # -- data helpers ---------------------------------------------------------------------
    def _describe(self, ds: Any) -> str:
        runs = self.runs.names
        what = f"runs {', '.join(runs)} (baseline: {self.runs.baseline}); " if runs else ""
        return (f"{what}{ds.sizes['step']} steps × {ds.sizes['rank']} ranks × "
                f"{ds.sizes['tensor']} tensors")

    def target(self) -> Any:
        """The run the heat map shows."""
        return self.data.target()

    # -- heat map -------------------------------------------------------------------------
    def refresh(self, focus: dict[str, Any] | None = None, *, redraw_lines: bool = True
                ) -> pd.DataFrame:
        """Rebuild the heat map from the filter bar (``focus``: keep and outline that record)."""
        f = self.filters
        ds = self.target()
        color = f.color.value if (f.color.value != "reldiff" or self.runs.baseline) else "stat"
        frame = heatmap_frame(ds, by=f.by.value, rows=f.rows.value, color=color, stat=f.stat.value,
                              tensors=self.data.mask(), steps=f.step_list(ds), ranks=f.rank_list(),
                              top_k=f.top_k.value, focus=focus,
                              values=self.data.values(color, f.stat.value))
        selected = None
        if focus is not None and frame["focus"].any():
            hit = frame[frame["focus"]]
        elif self.row is not None and self.step is not None:  # keep the selected cell selected
            hit = frame[(frame["row"] == self.row) & (frame["step"] <= self.step)
                        & (frame["step_hi"] >= self.step) & (frame["rank_lo"] <= self.rank)
                        & (frame["rank_hi"] >= self.rank)]
        else:
            hit = frame.iloc[:0]
        if len(hit):
            selected = {"row": str(hit["row"].iloc[0]), "col": str(hit["col"].iloc[0])}
            self._pinned = (selected["row"], selected["col"])
        self.frame = frame
        n_total = frame.attrs.get("n_rows_total", 0)
        caption = (f"{frame['row'].nunique()} of {n_total} {f.rows.value}s (top by colour), "
                   f"{frame['col'].nunique()} columns; click a cell, shift-click to add")
        self.heatmap.set_chart(heatmap_chart(frame, stat=f.stat.value, selected=selected),
                               caption=html.escape(caption))
        if self.tensor is not None:
            if redraw_lines:
                self.update_views()
            else:
                self.update_detail()
        return frame

    def _on_cell(self, change: dict[str, Any]) -> None:
        cells = read_point(change["new"])
        if not cells:
            return
        last = (str(cells[-1].get("row")), str(cells[-1].get("col")))
        if len(cells) == 1 and last == self._pinned:
            return  # the echo of a cell selected from Python
        self._pinned = None
        self.select_cells(cells)

    def select_cells(self, cells: list[dict[str, Any]]) -> None:
        """Select heat-map cells (``{"row", "col"}``): the last one sets the state."""
        fr = self.frame
        tensors: list[str] = []
        hit = None
        for c in cells:
            m = fr[(fr["row"] == str(c.get("row"))) & (fr["col"].astype(str) == str(c.get("col")))]
            if not len(m):
                continue
            hit = m.iloc[0]
            t = str(hit["tensor"]) or self.data.largest(str(hit["row"]), int(hit["step"]))
            if t and t not in tensors:
                tensors.append(t)
        if hit is None or not tensors:
            return
        with self.hold_trait_notifications():
            self.row = str(hit["row"])
            self.tensor = tensors[-1]
            self.step = int(hit["worst_step"]) if hit["worst_step"] >= 0 else int(hit["step"])
            self.rank = int(hit["worst_rank"]) if hit["worst_rank"] >= 0 else int(hit["rank_lo"])
        self._cell = hit
        self.update_views(tensors=tensors[-4:])

    def select_cell(self, row: str, col: Any) -> None:
        """Select one heat-map cell, as a click would."""
        self.select_cells([{"row": row, "col": str(col)}])

    # -- line chart and detail ------------------------------------------------------------
    def update_views(self, tensors: list[str] | None = None) -> None:
        """Redraw the line chart and the detail table for the current state."""
        if self.tensor is None:
            return
        f = self.filters
        ds = self.target()
        tensors = tensors or [self.tensor]
        cell = getattr(self, "_cell", None)
        ranks = f.rank_list()
        if cell is not None and f.by.value == "rank" and self.row == cell["row"]:
            ranks = [r for r in ds["rank"].values.tolist() if cell["rank_lo"] <= r <= cell["rank_hi"]]
        if self.runs.names:
            both = [self.runs.baseline, f.run.value] if self.runs.baseline != f.run.value else [f.run.value]
            frame = series_frame(self.runs.ds, tensors, stat=f.stat.value, ranks=[self.rank],
                                 steps=f.step_list(ds), runs=both)
        else:
            frame = series_frame(ds, tensors, stat=f.stat.value, ranks=ranks, steps=f.step_list(ds),
                                 keep_ranks=[self.rank], max_lines=self.max_lines)
        self.series = frame
        shown = frame.attrs.get("ranks_drawn", 0)
        note = (f" ({shown} of {frame.attrs.get('ranks_total')} ranks: selected + most deviating)"
                if frame.attrs.get("ranks_total", 0) > shown else "")
        stat = f.stat.value
        key = (stat, tuple(sorted(set(frame["step"].tolist()))))
        self.lines.show(frame, key=key, title=self.tensor,
                        build=lambda: line_chart(frame, stat=stat, title=self.tensor, width=460),
                        caption=f"{html.escape(stat)} over steps{html.escape(note)}; click a "
                                "point for its record, drag to zoom the heat map to those steps")
        self.update_detail()

    def update_detail(self) -> None:
        """Redraw the detail table and the selection label."""
        ds = self.target()
        cmp = bool(self.runs.names) and self.runs.baseline != self.filters.run.value
        frame = detail_frame(self.runs.ds if cmp else ds, step=self.step, rank=self.rank,
                             tensors=self.data.row_tensors(self.row) if self.row else [self.tensor],
                             run=self.filters.run.value if cmp else None,
                             baseline=self.runs.baseline if cmp else None)
        ev = self.data.evidence(self.tensor)
        self.detail.show(frame, ev, focus=self.tensor,
                         title=f"{self.row} at step {self.step}, rank {self.rank}")
        e = html.escape
        self.status.value = (f"<b>selected</b>: step {self.step} · rank {self.rank} · "
                             f"<code>{e(self.tensor or '')}</code> ({e(ev.get('module') or '—')})")

    def _on_pick(self, change: dict[str, Any]) -> None:
        pts = read_point(change["new"])
        if not pts or not len(self.series):
            return
        m = self.series[(self.series["series"] == pts[-1].get("series"))
                        & (self.series["step"] == pts[-1].get("step"))]
        if len(m) and int(m.iloc[0]["rank"]) >= 0:
            with self.hold_trait_notifications():
                self.step, self.rank = int(m.iloc[0]["step"]), int(m.iloc[0]["rank"])
                self.tensor = str(m.iloc[0]["tensor"])
            self.update_detail()

    def _on_span(self, change: dict[str, Any]) -> None:
        """Zoom the heat map to a step brush drawn on the line chart.

        An empty brush is ignored (a redrawn chart sends one); the step slider resets.
        """
        steps = (getattr(change["new"], "value", {}) or {}).get("step")
        if not steps:
            return
        lo, hi = int(np.ceil(min(steps))), int(np.floor(max(steps)))
        f = self.filters
        if hi < lo or (lo, hi) == tuple(f.steps.value):
            return
        with f.quiet():
            f.steps.value = (max(lo, f.steps.min), min(hi, f.steps.max))
        self.refresh(redraw_lines=False)

    # -- findings -------------------------------------------------------------------------
    def show_finding(self, f: Any, *, color: str, target: str | None = None,
                     baseline: str | None = None) -> None:
        """Move the heat map, line chart and detail table to a Finding."""
        if not f.found or f.tensor is None:
            return
        fb = self.filters
        with fb.quiet():
            if target and target in self.runs.names:
                fb.run.value = target
            if baseline and baseline in self.runs.names:
                self.runs.baseline = baseline
            ds = self.target()
            visible = f.tensor in ds.indexes["tensor"] and bool(
                self.data.mask()[ds.indexes["tensor"].get_loc(f.tensor)])
            fb.show(step=f.step, rank=f.rank, color=color, tensor_visible=visible)
        focus = {"step": f.step, "rank": f.rank, "tensor": f.tensor}
        frame = self.refresh(focus=focus)
        hit = frame[frame["focus"]]
        with self.hold_trait_notifications():
            self.current_finding = f
            self.row = str(hit["row"].iloc[0]) if len(hit) else str(self.data.labels()[
                ds.indexes["tensor"].get_loc(f.tensor)])
            self.step, self.rank, self.tensor = int(f.step), int(f.rank), str(f.tensor)
        self._cell = hit.iloc[0] if len(hit) else None
        self.update_views()

    def start(self) -> None:
        """Open on the pipeline's first finding (the first divergence of two runs, the NaN origin of one)."""
        from precnb.analysis.registry import get

        t = self.triage
        if t is None or not t.findings:
            return
        f = t.finding
        panel = self.divergence if t.paired else self.nan
        shown = next((x for x in t.findings if x.kind == ("first_divergence" if t.paired else "nan_origin")), f)
        panel.show(shown if not f.found else (f if f.kind in ("first_divergence", "nan_origin") else shown))
        self.finding = f  # what it opened on (a "nothing found" finding on a clean run)
        if f.found and f.tensor is None:  # a failing pre-flight check names no tensor: show what comes after it
            f = next((x for x in t.findings if x.found and x.tensor is not None), f)
        if not f.found:
            return
        try:
            color = get(f.kind).color
        except KeyError:
            color = "events"
        color = {"first_bad": "reldiff" if t.paired else "events"}.get(color, color)
        self.show_finding(f, color=color, target=self.runs.target, baseline=self.runs.baseline)

    def findings(self) -> list[Any]:
        """Findings for the report: the pipeline's, plus any a panel found since."""
        out = list(self.triage.findings) if self.triage is not None else []
        for p in (self.divergence, self.nan):
            if p.finding is not None and all(p.finding is not f for f in out):
                out.append(p.finding)
        return out

    def _on_tab(self, change: dict[str, Any]) -> None:
        if self.tabs.children[change["new"] or 0] is self.hierarchy and self.hierarchy.chart is None:
            self.hierarchy.draw()
