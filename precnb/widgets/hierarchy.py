"""Module-hierarchy panel: the construct.json tree coloured by flagged records."""

from __future__ import annotations

import re
from typing import Any

import ipywidgets as ipw

from precnb.widgets.charts import EMBED
from precnb.widgets.findings import _error

__all__ = ["HierarchyPanel"]


class HierarchyPanel(ipw.VBox):
    """Icicle chart of the module tree; clicking a module narrows the heat map to it."""

    def __init__(self, explorer: Any) -> None:
        self.explorer = explorer
        self.frame: Any = None
        options = [("NaN / new inf", "events"), ("non-finite values", "nonfinite")]
        if len(explorer.runs.names) > 1:
            options.insert(0, ("differences vs baseline", "reldiff"))
        self.counts = ipw.Dropdown(description="colour by", options=options, value=options[0][1],
                                 style={"description_width": "initial"},
                                 layout=ipw.Layout(width="260px"))
        self.button = ipw.Button(description="Draw hierarchy", icon="sitemap",
                               layout=ipw.Layout(width="160px"))
        self.message = ipw.HTML("<i>click a module to narrow the heat map to it</i>")
        self.chart: Any = None
        self.chart_box = ipw.Box()
        self.button.on_click(lambda _b: self.draw())
        self.counts.observe(lambda _c: self.draw(), names="value")
        super().__init__([ipw.HBox([self.counts, self.button]), self.message, self.chart_box])
        self.add_class("precnb-hierarchy")

    def draw(self) -> None:
        """(Re)build the hierarchy frame and chart."""
        import altair as alt

        from precnb.viz import hierarchy_chart, hierarchy_frame

        ex = self.explorer
        try:
            base = ex.runs.run(ex.runs.baseline) if self.counts.value == "reldiff" else None
            self.frame = hierarchy_frame(ex.runs.run(ex.filters.run.value or None),
                                         counts=self.counts.value, baseline=base)
            label = {v: k for k, v in self.counts.options}[self.counts.value]
            chart = hierarchy_chart(self.frame, title="module hierarchy (construct.json)",
                                    counts_label=label)
        except Exception as err:
            self.message.value = _error(err)
            return
        self.chart = alt.JupyterChart(chart, embed_options=EMBED)
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
            self.explorer.filters.pattern.value = ""
            return
        self.message.value = f"narrowed the heat map to <code>{module}</code>"
        self.explorer.filters.pattern.value = "^" + re.escape(module) + r"(\.|$)"
