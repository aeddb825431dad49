"""The Hierarchy tab: the module tree (construct.json), labelled, the selected record's module highlighted.

Each module is a labelled row with a bar of its subtree's flagged records; the module of the
selected record and its ancestors are highlighted, which is how a heat-map row (the innermost
module that recorded a tensor, e.g. ``blocks.1.attn``) relates to a finding's module (e.g.
``blocks.1``). Clicking a module narrows the heat map to it.
"""

from __future__ import annotations

import html
import re
from typing import Any

import ipywidgets as ipw

from precnb.widgets.charts import offline_chart
from precnb.widgets.findings import _error
from precnb.widgets.panel import ExplorerAPI, Panel

__all__ = ["HierarchyPanel"]


class HierarchyPanel(Panel):
    """Labelled module tree coloured by flagged records; a click narrows the heat map to a module."""

    title = "Hierarchy"
    lazy = True

    def __init__(self, api: ExplorerAPI) -> None:
        super().__init__(api)
        self.frame: Any = None
        self.chart: Any = None
        self.shown = False
        self._stale = False

    def build(self) -> None:
        """The colour choice, the message line and the (empty until drawn) chart box."""
        api = self.api
        options = [("NaN / new inf", "events"), ("non-finite values", "nonfinite")]
        if len(api.runs.names) > 1:
            options.insert(0, ("differences vs baseline", "reldiff"))
        self.counts = ipw.Dropdown(description="colour by", options=options, value=options[0][1],
                                   style={"description_width": "initial"}, layout=ipw.Layout(width="260px"))
        self.message = ipw.HTML("<i>the selected record's module is highlighted; click a module to narrow the "
                                "heat map to it</i>")
        self.chart_box = ipw.Box(layout=ipw.Layout(max_height="520px", overflow="auto", width="100%"))
        self.counts.observe(lambda _c: self.draw(recount=True), names="value")
        self.children = [self.counts, self.message, self.chart_box]
        self.add_class("precnb-hierarchy")

    def refresh(self) -> None:
        """New runs: recount now when the tab is open, else when it is opened next."""
        self.frame = None
        if self.shown and self.is_open():
            self.draw(recount=True)

    def on_show(self) -> None:
        """Draw on first opening; redraw a highlight that moved while another tab was shown."""
        self.shown = True
        if self.chart is None or self.frame is None:
            self.draw(recount=True)
        elif getattr(self, "_stale", False):
            self.draw()

    def on_select(self) -> None:
        """Move the highlight to the selected record's module (when the tab is shown; else when it is next)."""
        if not self.shown:
            return
        if self.is_open():
            self.draw()
        else:  # a hidden tree is not redrawn on every selection or rerun (~0.2 s each on 5,000 tensors)
            self._stale = True

    def current_node(self) -> str | None:
        """The construct.json node of the selected record's module (its own node for a module record)."""
        api = self.api
        if api.tensor is None or self.frame is None:
            return None
        ds = api.data.target()
        ev = api.data.evidence(api.tensor, ds, api.step, None if api.unmerged else api.rank)
        nodes = set(self.frame["node"])
        if ev.get("node") in nodes:
            return str(ev["node"])
        path = ev.get("module_path") or []
        return next((n for n in path if n in nodes), None)

    def draw(self, *, recount: bool = False) -> None:
        """(Re)build the tree; *recount* recomputes the flagged counts."""
        from precnb.viz import hierarchy_chart, hierarchy_frame

        self._stale = False
        api = self.api
        try:
            if recount or self.frame is None:
                run = api.filters.run.value or None
                base = api.runs.run(api.runs.baseline) if self.counts.value == "reldiff" else None
                self.frame = hierarchy_frame(api.runs.run(run), counts=self.counts.value, baseline=base)
            label = {v: k for k, v in self.counts.options}[self.counts.value]
            chart = hierarchy_chart(self.frame, title="module hierarchy (construct.json)", counts_label=label,
                                    current=self.current_node())
        except Exception as err:
            self.message.value = _error(err)
            return
        self.chart = offline_chart(chart)
        self.chart.selections.observe(self._on_node, names=["node"])
        self.chart_box.children = [self.chart]

    def _on_node(self, change: dict[str, Any]) -> None:
        from precnb.naming import parse_node
        from precnb.viz.selections import read_point

        picked = read_point(change["new"])
        if not picked:
            return
        node = str(picked[0].get("node", ""))
        p = parse_node(node)
        module = p.module if p.kind in ("module", "param_grad") else node
        if module in ("(run)", ""):
            self.api.narrow("")
            return
        self.message.value = f"narrowed the heat map to <code>{html.escape(module)}</code>"
        self.api.narrow("^" + re.escape(module) + r"(\.|$)", regex=True)
