"""Shard-merge panel: a parallel layout in, whole-layer statistics and a replica check out.

``precnb.analysis`` provides ``Layout``, ``merge_shards`` and ``check_replicas``; they are
imported when the button is pressed, and a missing one is reported in the panel instead of
breaking the explorer.
"""

from __future__ import annotations

import html
import importlib
from typing import Any

import ipywidgets as ipw
import pandas as pd

from precnb.widgets.charts import EMBED
from precnb.widgets.findings import _error, finding_html

__all__ = ["ShardPanel", "resolve_analysis"]

_MODULES = ("precnb.analysis.layout", "precnb.analysis.merge", "precnb.analysis.replicas",
            "precnb.analysis")


def resolve_analysis(name: str) -> Any:
    """Find *name* in the shard-merging modules of :mod:`precnb.analysis`, or raise ImportError."""
    problems: list[str] = []
    for mod in _MODULES:
        try:
            m = importlib.import_module(mod)
        except Exception as err:
            problems.append(f"{mod}: {type(err).__name__}")
            continue
        if hasattr(m, name):
            return getattr(m, name)
    extra = f" ({'; '.join(problems)})" if problems else ""
    raise ImportError(f"precnb.analysis does not provide {name} yet{extra}")


def _render(result: Any) -> str:
    """Generic HTML for whatever the analysis returns (Finding, DataFrame, list, dict...)."""
    if hasattr(result, "kind") and hasattr(result, "reason"):
        return finding_html(result)
    if isinstance(result, pd.DataFrame):
        return result.head(30).to_html(max_rows=30, border=0, classes="precnb-replicas")
    if isinstance(result, (list, tuple)):
        if not result:
            return "<b style='color:#2a7'>replicas agree</b>"
        items = "".join(f"<li>{html.escape(str(r))}</li>" for r in result[:20])
        more = f"<li>… {len(result) - 20} more</li>" if len(result) > 20 else ""
        return f"<b style='color:#b00'>{len(result)} replica mismatch(es)</b><ul>{items}{more}</ul>"
    return f"<pre>{html.escape(str(result))[:4000]}</pre>"


def _kinds_summary(merged: Any) -> str:
    parts = []
    for c in merged.coords:
        if str(c).startswith("shard_kind_"):
            counts = pd.Series(merged[c].values.astype(str)).value_counts()
            parts.append(f"{c[len('shard_kind_'):]}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return html.escape("; ".join(parts))


class ShardPanel(ipw.VBox):
    """Layout inputs (tp, pp, vpp, cp, ep, order) → merged whole-layer view + replica check."""

    def __init__(self, explorer: Any) -> None:
        self.explorer = explorer
        self.merged: Any = None
        self.replicas: Any = None
        names = explorer.runs.names
        small = ipw.Layout(width="95px")
        self.sizes = {k: ipw.BoundedIntText(value=1, min=1, max=4096, description=k, layout=small,
                                          style={"description_width": "24px"})
                      for k in ("tp", "pp", "vpp", "cp", "ep")}
        self.order = ipw.Text(value="tp-cp-ep-dp-pp", description="order",
                            layout=ipw.Layout(width="210px"), style={"description_width": "40px"})
        self.run_pick = ipw.Dropdown(description="run", options=names or ["—"],
                                   value=explorer.runs.target or (names[-1] if names else "—"),
                                   layout=ipw.Layout(width="200px", display=None if names else "none"))
        self.reference = ipw.Dropdown(description="unsharded ref.", options=["(none)", *names],
                                    value="(none)", style={"description_width": "initial"},
                                    layout=ipw.Layout(width="230px", display=None if names else "none"))
        self.merge_button = ipw.Button(description="Merge shards", icon="compress",
                                     layout=ipw.Layout(width="150px"))
        self.check_button = ipw.Button(description="Check replicas", icon="check",
                                     layout=ipw.Layout(width="150px"))
        self.output = ipw.HTML("<i>world size "
                             f"{explorer.runs.run().sizes['rank']}; set tp/pp/… and merge</i>")
        self.output.add_class("precnb-shard-output")
        self.chart_box = ipw.Box()
        self.merge_button.on_click(lambda _b: self.merge())
        self.check_button.on_click(lambda _b: self.check())
        super().__init__([
            ipw.HBox([*self.sizes.values(), self.order]),
            ipw.HBox([self.run_pick, self.reference, self.merge_button, self.check_button]),
            self.output, self.chart_box])

    def layout_text(self) -> str:
        """The layout as ``"tp=2,pp=1,...,order=..."``."""
        return ",".join(f"{k}={w.value}" for k, w in self.sizes.items()) + f",order={self.order.value}"

    def _layout(self, world: int) -> Any:
        Layout = resolve_analysis("Layout")  # noqa: N806
        if hasattr(Layout, "parse"):
            return Layout.parse(self.layout_text(), world_size=world)
        return Layout(world, **{k: w.value for k, w in self.sizes.items()}, order=self.order.value)

    def _run(self) -> Any:
        names = self.explorer.runs.names
        return self.explorer.runs.run(self.run_pick.value if names else None)

    def merge(self) -> Any:
        """Merge the run's shards; show the classification and a merged heat map."""
        ds = self._run()
        try:
            merge_shards = resolve_analysis("merge_shards")
            layout = self._layout(int(ds.sizes["rank"]))
            ref = None
            if self.reference.value not in ("(none)", None):
                ref = self.explorer.runs.run(self.reference.value)
            self.merged = merge_shards(ds, layout, reference=ref) if ref is not None else \
                merge_shards(ds, layout)
        except Exception as err:
            self.output.value = _error(err)
            return None
        m = self.merged
        self.output.value = (f"<b>merged</b> {ds.sizes['rank']} ranks → {m.sizes['rank']} "
                             f"({html.escape(str(m.attrs.get('merged_layout', self.layout_text())))}); "
                             f"{_kinds_summary(m)}")
        self._chart(m)
        return m

    def _chart(self, merged: Any) -> None:
        try:
            import altair as alt

            from precnb.viz import heatmap_chart, heatmap_frame

            frame = heatmap_frame(merged, by="rank" if merged.sizes["rank"] > 1 else "step",
                                  top_k=25, stat=self.explorer.filters.stat.value)
            chart = heatmap_chart(frame, selection=False, title="merged (whole-layer) statistics")
            self.chart_box.children = [alt.JupyterChart(chart, embed_options=EMBED)]
        except Exception as err:
            self.chart_box.children = [ipw.HTML(_error(err))]

    def check(self) -> Any:
        """Flag replicas that should be identical but are not."""
        ds = self._run()
        try:
            check_replicas = resolve_analysis("check_replicas")
            self.replicas = check_replicas(ds, self._layout(int(ds.sizes["rank"])))
        except Exception as err:
            self.output.value = _error(err)
            return None
        self.output.value = _render(self.replicas)
        return self.replicas
