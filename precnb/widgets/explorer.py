"""The explorer: finding bar, filter bar, heat map + "where" view → line chart → detail table, tabs.

Wiring only: frames and charts come from :mod:`precnb.viz`, findings and the "first bad" order
from the triage (:func:`precnb.diagnose`). The selected record is Python state (``step``,
``rank``, ``tensor``, ``row``, ``unmerged``) that a cell click, a key press, a line-chart
click, a suspect link or a finding sets. Tabs are panels (:mod:`precnb.widgets.panel`).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import ipywidgets as ipw
import numpy as np
import pandas as pd
import traitlets

from precnb.analysis.registry import checklist, lookup
from precnb.viz.selections import read_point
from precnb.widgets._data import ExplorerData, has_metrics
from precnb.widgets._inputs import Runs
from precnb.widgets._rerun import input_paths, rerun_triage, sources_of
from precnb.widgets._views import EXPLORER_CSS, ExplorerViews
from precnb.widgets.filters import FilterPanel
from precnb.widgets.findings import FindingBar
from precnb.widgets.heat import HEATMAP_COLUMNS, HeatView, Pick, contract_frame
from precnb.widgets.keys import KeyNav
from precnb.widgets.panel import PanelFactory, PanelProtocol, built, run_hook
from precnb.widgets.preflight import PreflightPanel
from precnb.widgets.record import RecordView
from precnb.widgets.tabs import default_panels

__all__ = ["HEATMAP_COLUMNS", "Explorer"]

_MOVES = {"ArrowUp": (-1, 0), "ArrowDown": (1, 0), "ArrowLeft": (0, -1), "ArrowRight": (0, 1)}



class Explorer(ExplorerViews, ipw.VBox):
    """Linked notebook explorer of one run, or of several runs against a baseline.

    Create it with :func:`precnb.widgets.explore`. State: ``step``, ``rank``, ``tensor``,
    ``row`` (the selected heat-map row), ``unmerged`` (the rank is the dump's, before its shards
    were merged), ``finding`` (the pipeline finding it opened on) and ``current_finding`` (the
    finding shown now). :meth:`heatmap_frame` is the main heat map as data.
    """

    step = traitlets.Int(None, allow_none=True)
    rank = traitlets.Int(None, allow_none=True)
    tensor = traitlets.Unicode(None, allow_none=True)
    row = traitlets.Unicode(None, allow_none=True)
    group = traitlets.Unicode(None, allow_none=True)
    unmerged = traitlets.Bool(False)
    finding = traitlets.Any(None)
    current_finding = traitlets.Any(None)

    def __init__(self, runs: Runs, *, auto: bool = True, max_lines: int = 12, triage: Any = None,
                 panels: Sequence[PanelFactory] | None = None, sources: dict[str, Any] | None = None) -> None:
        self.runs = runs
        self.triage = triage
        self.max_lines = max_lines
        self._sources = sources or sources_of(runs, triage)
        self.filters = FilterPanel(runs.run(), runs.names, self._on_filters, tensor_metrics=has_metrics(triage))
        self.data = ExplorerData(runs, self.filters, triage)
        self.heat = HeatView(self.data, self.filters, self._on_pick, current=lambda: self.tensor)
        self.record = RecordView(self.data, self.filters, max_lines=max_lines, on_pick=self._on_line_pick,
                                 on_span=self._on_span)
        self.bar = FindingBar(self)
        self.keynav = KeyNav(self.on_key)
        self.header = ipw.HTML("")
        self.css = ipw.HTML(EXPLORER_CSS, layout=ipw.Layout(height="0px", margin="0"))
        factories = default_panels() if panels is None else list(panels)
        self.panels: list[PanelProtocol] = [p for p in (make(self) for make in factories) if p is not None]
        self.tabs = ipw.Tab(list(self.panels))
        for i, p in enumerate(self.panels):
            self.tabs.set_title(i, p.title)
        self.tabs.observe(self._on_tab, names="selected_index")
        # only the tab open at start is built now; a lazy panel (Panel.lazy) builds when its tab is first opened
        start = self.tabs.selected_index
        if start is not None and 0 <= start < len(self.panels):
            built(self.panels[start])
        self.filters.matches.observe(self._on_match, names="value")
        self.preflight: PreflightPanel | None = None  # the pre-flight checklist, above the tabs when run
        self.preflight_box = ipw.Box([])
        self._checklist()
        # two columns that use the width: the maps (rank × step view over the main heat map) on the left, the
        # selected record on the right (selection line, its chart, its detail table), so the origin, its chart
        # and its record are on one screen; on a narrow notebook the right column wraps below the maps
        selection = ipw.VBox([self.record.status, self.record.attribution])
        self.maps = ipw.VBox([self.heat.where, self.heat.main], layout=ipw.Layout(flex="0 1 auto", min_width="0"))
        self.maps.add_class("precnb-maps")
        self.side = ipw.VBox([selection, self.record.lines, ipw.HBox([self.record.hist_toggle]), self.record.hist_box,
                              self.record.detail],
                             layout=ipw.Layout(flex="1 1 420px", min_width="420px", margin="0 0 0 16px"))
        self.side.add_class("precnb-record")
        grid = ipw.HBox([self.maps, self.side], layout=ipw.Layout(flex_flow="row wrap", align_items="flex-start",
                                                                   width="100%"))
        grid.add_class("precnb-grid")
        super().__init__([self.css, self.header, self.bar, self.filters, grid, self.keynav, self.preflight_box,
                          self.tabs])
        self.add_class("precnb-explorer")
        self._describe()
        if not (auto and self._opening() is not None):  # start() draws everything once, on the finding
            self.refresh()
        if auto:
            self.start()
        else:
            self.bar.update()

    def sources(self) -> dict[str, Any]:
        """The runs as given (before merging), by name."""
        return dict(self._sources)

    def input_paths(self) -> list[str]:
        """The paths the explored runs were read from (a report or mapping file is never written inside)."""
        return input_paths(self.runs, self.triage, self._sources)

    # -- the contract -------------------------------------------------------------------------
    def heatmap_frame(self) -> pd.DataFrame:
        """The main heat map's cells (whatever view or tab is open).

        Returns
        -------
        pandas.DataFrame
            Columns :data:`HEATMAP_COLUMNS`: ``row`` (module path, node or tensor, as the rows
            choice says; module by default), ``group`` (forward / backward / optimizer), ``x`` the
            step (or rank) of the column — for a bucket its first, ``x_hi`` its last —, ``value``
            the colour value (larger = more salient; in "first bad" colour the earliest cell has
            the largest) and NaN for clean cells, ``first_bad`` (1 = earliest flagged cell, 0
            clean), the record each cell stands for (``tensor``, ``worst_step``, ``worst_rank``).
            ``attrs["x"]`` is ``"step"`` or ``"rank"``; ``attrs["color"]`` the colour mode.
        """
        return contract_frame(self.heat.frame, color=self.heat.color(), by=self.filters.by.value,
                              rows=self.filters.rows.value)

    # -- drawing ------------------------------------------------------------------------------
    def _checklist(self) -> None:
        pre = next((f for f in self.triage.results.values() if checklist(f) is not None), None) if self.triage else None
        self.preflight = PreflightPanel(pre) if pre is not None else None
        self.preflight_box.children = [self.preflight] if self.preflight is not None else []

    def _describe(self) -> None:
        ds = self.runs.run()
        names = self.runs.names
        what = f"runs {', '.join(names)} (baseline: {self.runs.baseline}); " if names else ""
        self.header.value = (f"<b>precnb explorer</b> — {html.escape(what)}{ds.sizes['step']} steps × "
                            f"{ds.sizes['rank']} ranks × {ds.sizes['tensor']} tensors")

    def _selected(self) -> tuple[dict[str, str] | None, dict[str, str] | None]:
        """The cells holding the selected record: in the main map, and in the rank × step view."""
        main = self.heat.main_cell(self.step, None if self.unmerged else self.rank, self.tensor)
        same_ranks = self.unmerged == self.heat.where_unmerged
        return main, self.heat.where_cell(self.step, self.rank if same_ranks else None)

    def refresh(self, focus: dict[str, Any] | None = None, *, redraw_lines: bool = True) -> pd.DataFrame:
        """Rebuild both heat maps from the filter bar, keeping the selected record selected."""
        if self.tensor is not None and not self.unmerged:  # its row at the current row level
            gr = self.data.row_of(self.tensor, None, self.step, self.rank)
            if gr is not None:
                with self.hold_trait_notifications():
                    self.group, self.row = gr
        frame = self.heat.update(focus=focus)
        main, where = self._selected()
        self.heat.draw_main(main)
        self.heat.draw_where(where)
        if self.tensor is not None:
            self.record.show(self, redraw_lines=redraw_lines)
        return frame

    def _on_filters(self) -> None:
        self.filters.list_matches(self.data.target())
        self.refresh()

    def _on_match(self, change: dict[str, Any]) -> None:
        key = change["new"]
        if key:
            self.go_to(*str(key).split(":", 1))

    def go_to(self, kind: str, name: str) -> None:
        """Select a module's or node's first flagged record (else its first record)."""
        rec = self.data.first_record(kind, name)
        if rec is not None:
            self.select_record(*rec)

    def _sync_selection(self, *, main: bool = True, where: bool = True) -> None:
        """Outline the selected record's cell in the map(s) it was not clicked in."""
        sel_main, sel_where = self._selected()
        if main:
            self.heat.draw_main(sel_main)
        if where:
            self.heat.draw_where(sel_where)

    # -- selecting ----------------------------------------------------------------------------
    def _apply(self, pick: Pick) -> None:
        with self.hold_trait_notifications():
            self.row, self.group = pick.row, pick.group
            self.unmerged = pick.unmerged
            self.step, self.rank, self.tensor = int(pick.step), int(pick.rank), str(pick.tensor)

    def _on_pick(self, pick: Pick) -> None:
        self._apply(pick)
        self.record.show(self, tensors=pick.tensors, ranks=pick.ranks)
        self._sync_selection()  # both maps: the clicked one too, or its previous outline would stay
        self._notify()

    def select_cells(self, cells: list[dict[str, Any]]) -> None:
        """Select main heat-map cells (``{"row", "col"[, "group"]}``): the last one sets the state."""
        pick = self.heat.pick_cells(cells)
        if pick is not None:
            self._on_pick(Pick(**{**pick.__dict__, "source": "python"}))

    def select_cell(self, row: str, col: Any, group: str | None = None) -> None:
        """Select one main heat-map cell, as a click would (*group*: forward / backward / optimizer)."""
        cell = {"row": row, "col": str(col)}
        if group is not None:
            cell["group"] = group
        self.select_cells([cell])

    def select_where(self, row: Any, col: Any) -> None:
        """Select one rank × step cell (row: the rank label, col: the step label), as a click would."""
        pick = self.heat.pick_where({"row": str(row), "col": str(col)}, self.tensor)
        if pick is not None:
            self._on_pick(Pick(**{**pick.__dict__, "source": "python"}))

    def select_record(self, step: int, rank: int, tensor: str, *, unmerged: bool = False) -> None:
        """Select one record, making it visible (filters widened, its group shown)."""
        ds = self._ds(unmerged)
        gr = self.data.row_of(tensor, ds, step, None if unmerged else rank)
        visible = gr is not None and tensor in ds.indexes["tensor"] and bool(
            self.data.mask(ds)[ds.indexes["tensor"].get_loc(tensor)])
        self.filters.show(step=step, rank=rank if not unmerged else None, group=gr[0] if gr else None,
                          tensor_visible=visible)
        self._apply(Pick(step=step, rank=rank, tensor=tensor, row=gr[1] if gr else None, group=gr[0] if gr else None,
                         unmerged=unmerged))
        self.refresh(focus={"step": step, "rank": rank, "tensor": tensor} if not unmerged else None)
        self._notify()

    def _ds(self, unmerged: bool) -> Any:
        raw = self.data.raw() if unmerged else None
        return raw if raw is not None else self.data.target()

    def narrow(self, text: str, *, regex: bool = False) -> None:
        """Show only tensors whose node, module or label matches *text* (substring; *regex*: a pattern)."""
        with self.filters.quiet():
            self.filters.regex.value = regex
            self.filters.pattern.value = text
        self.refresh()

    def on_key(self, key: str) -> None:
        """A key pressed in the explorer: arrows move the selection in the heat map, n / p change finding."""
        if key in ("n", "p"):
            self.bar.step(1 if key == "n" else -1)
            return
        if key not in _MOVES:
            return
        cur, _ = self._selected()
        d_row, d_col = _MOVES[key]
        cell = self.heat.neighbour(cur, d_row, d_col)
        if cell is None:
            return
        pick = self.heat.pick_cells([cell])
        if pick is not None:
            self._on_pick(Pick(**{**pick.__dict__, "source": "key"}))

    def _on_line_pick(self, change: dict[str, Any]) -> None:
        pts = read_point(change["new"])
        s = self.series
        if not pts or not len(s):
            return
        m = s[(s["series"] == pts[-1].get("series")) & (s["step"] == pts[-1].get("step"))]
        if len(m) and int(m.iloc[0]["rank"]) >= 0:
            with self.hold_trait_notifications():
                self.step, self.rank = int(m.iloc[0]["step"]), int(m.iloc[0]["rank"])
                self.tensor = str(m.iloc[0]["tensor"])
            self.record.update_detail(self)
            self._sync_selection()
            self._notify()

    def _on_span(self, change: dict[str, Any]) -> None:
        """Zoom the heat maps to a step brush drawn on the line chart (an empty brush is ignored)."""
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

    def _notify(self) -> None:
        for p in self.panels:
            run_hook(p, "on_select")

    # -- findings -----------------------------------------------------------------------------
    def show_finding(self, f: Any, **_legacy: Any) -> None:
        """Move the heat maps, line chart and detail table to a Finding (its origin record when it has one)."""
        from precnb.analysis.findings import shown_record

        unmerged = bool((d := lookup(f.kind)) is not None and d.explorer.unmerged and self.data.raw() is not None)
        ds = self._ds(unmerged)
        rec = shown_record(f, [int(r) for r in ds["rank"].values])
        dep = None if unmerged else self.data.departing(f)
        if dep is not None:  # a replica copy departs: its own record as dumped (and its replica's line) is shown
            unmerged, ds, rec = True, self.data.raw(), dep
        if rec is None:
            self.current_finding = f
            self.bar.update()
            self._notify()
            return
        step, rank, tensor = rec
        if tensor not in ds.indexes["tensor"]:  # e.g. a computation only the baseline has
            alt_label = f"{tensor} (baseline)"
            tensor = alt_label if alt_label in ds.indexes["tensor"] else tensor
        gr = self.data.row_of(tensor, ds, int(step), None if unmerged or rank is None else int(rank))
        visible = gr is not None and bool(self.data.mask(ds)[ds.indexes["tensor"].get_loc(tensor)])
        self.filters.show(step=step, rank=None if unmerged else rank, group=gr[0] if gr else None,
                          tensor_visible=visible)
        self.current_finding = f
        self._apply(Pick(step=step, rank=rank, tensor=tensor, row=gr[1] if gr else None,
                         group=gr[0] if gr else None, unmerged=unmerged))
        self.refresh(focus={"step": step, "rank": rank, "tensor": tensor} if not unmerged else None)
        self.bar.update()
        self._notify()

    def _opening(self) -> Any:
        """The finding :meth:`start` shows a record of (None: nothing located to open on)."""
        t = self.triage
        if t is None:
            return None
        return next((x for x in t.findings if x.found and (
            (x.tensor is not None and x.step is not None and x.rank is not None)
            or (x.values or {}).get("origin"))), None)  # a loss spike: its origin record (values["origin"])

    def start(self) -> None:
        """Open on the pipeline's first finding that names a record (``finding`` is the first finding)."""
        t = self.triage
        if t is None or not t.findings:
            self.bar.update()
            return
        self.finding = t.finding  # what it opened on (a "nothing found" finding on a clean run)
        self.show_finding(self._opening() or t.finding)

    def findings(self) -> list[Any]:
        """Findings for the report and the finding bar: the triage's, most important first."""
        return list(self.triage.findings) if self.triage is not None else []

    # -- rerunning ----------------------------------------------------------------------------
    def rerun(self, *, target: str | None = None, baseline: Any = "keep", **options: Any) -> Any:
        """Run the triage again (:func:`precnb.diagnose`) and show its runs and first finding.

        Parameters
        ----------
        target, baseline : str, optional
            Names of :meth:`sources` (default: the current ones; ``baseline=None``: the target alone).
        **options
            Options that change (``target_layout``, ``baseline_layout``, ``step_offset``,
            ``tolerance``, ``mapping``, ...); the others stay as they were.

        Returns
        -------
        precnb.Triage
        """
        from precnb.analysis._memo import scope

        with scope():  # the triage and the redraw: each dataset checksummed once for the memos
            runs, t = rerun_triage(self._sources, self.triage, target=target, baseline=baseline, **options)
            self._load(runs, t)
        return t

    def _load(self, runs: Runs, triage: Any) -> None:
        self.runs, self.triage = runs, triage
        self.filters.reset(runs.run(), runs.names, tensor_metrics=has_metrics(triage))
        self.data = ExplorerData(runs, self.filters, triage)
        self.heat.data = self.record.data = self.data
        # the charts' templates are data-free (their shape is in their key): kept, only new data is sent
        with self.hold_trait_notifications():
            self.step = self.rank = None
            self.tensor = self.row = self.group = None
            self.unmerged = False
            self.current_finding = None
        self._describe()
        self._checklist()
        for p in self.panels:
            run_hook(p, "refresh")
        if self._opening() is None:  # start() draws everything once, on the finding
            self.refresh()
        self.start()

    def _on_tab(self, change: dict[str, Any]) -> None:
        i = change["new"]
        if i is not None and 0 <= i < len(self.panels):
            built(self.panels[i]).on_show()

