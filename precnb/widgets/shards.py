"""The Shards tab: a parallel layout in, the triage rerun on whole-layer statistics out.

Setting tp / pp / vpp / cp / ep (and Megatron's order) for the target or the baseline reruns the
pipeline with that layout (``target_layout`` / ``baseline_layout``): the heat map then shows the
merged (whole-layer) statistics, the replica check runs on the target's shards and the rank ×
step view shows the dump's own ranks where replicas disagree. This tab also says how each tensor
was merged (sharded, replicated, partial sum).
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as ipw
import pandas as pd

from precnb.widgets.findings import _error, finding_html
from precnb.widgets.panel import Panel

__all__ = ["ShardPanel", "layout_text"]


def layout_text(sizes: dict[str, int], order: str) -> str:
    """``"tp=2,pp=1,...,order=..."`` from the size boxes (dims of size 1 left out; ``etp`` 0 is Megatron's default).

    Examples
    --------
    >>> layout_text({"tp": 2, "pp": 1}, "tp-cp-ep-dp-pp")
    'tp=2,order=tp-cp-ep-dp-pp'
    >>> layout_text({"tp": 1}, "tp-dp")
    ''
    >>> layout_text({"tp": 2, "ep": 2, "etp": 1}, "tp-cp-ep-dp-pp")
    'tp=2,ep=2,etp=1,order=tp-cp-ep-dp-pp'
    """
    experts = int(sizes.get("ep", 1)) > 1  # etp means something only with expert parallelism
    dims = [f"{k}={v}" for k, v in sizes.items()
            if (k != "etp" and int(v) > 1) or (k == "etp" and experts and int(v) >= 1)]
    return ",".join([*dims, f"order={order}"]) if dims else ""


def _kinds_summary(merged: Any) -> str:
    parts = []
    for c in merged.coords:
        if str(c).startswith("shard_kind_"):
            counts = pd.Series(merged[c].values.astype(str)).value_counts()
            parts.append(f"{c[len('shard_kind_'):]}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return html.escape("; ".join(parts))


class ShardPanel(Panel):
    """Layout boxes and "Apply layout" (rerun); the merge classification and the replica check."""

    title = "Shards"
    lazy = True

    def build(self) -> None:
        """The layout boxes, Apply layout, and what the triage merged and found of the replicas."""
        api = self.api
        small = ipw.Layout(width="95px")
        self.sizes = {k: ipw.BoundedIntText(value=1, min=1, max=4096, description=k, layout=small,
                                            style={"description_width": "24px"})
                      for k in ("tp", "pp", "vpp", "cp", "ep")}
        self.sizes["etp"] = ipw.BoundedIntText(value=0, min=0, max=4096, description="etp", layout=small,
                                               tooltip="expert tensor-parallel size (0: Megatron's default)",
                                               style={"description_width": "24px"})
        self.order = ipw.Text(value="tp-cp-ep-dp-pp", description="order", layout=ipw.Layout(width="210px"),
                              style={"description_width": "40px"})
        self.side = ipw.Dropdown(description="for", options=["target", "baseline"], value="target",
                                 layout=ipw.Layout(width="170px"), style={"description_width": "30px"})
        self.side.layout.display = None if (api.triage is not None and api.triage.paired) else "none"
        self.apply = ipw.Button(description="Apply layout", icon="compress", button_style="primary",
                                layout=ipw.Layout(width="150px"))
        self.output = ipw.HTML("")
        self.output.add_class("precnb-shard-output")
        self.replicas = ipw.HTML("")
        self.replicas.add_class("precnb-replica-output")
        self.apply.on_click(lambda _b: self.run())
        self.children = [ipw.HBox([*self.sizes.values(), self.order]), ipw.HBox([self.side, self.apply]),
                         self.output, self.replicas]
        self.refresh()

    def layout_text(self) -> str:
        """The layout the boxes say (blank: no layout)."""
        return layout_text({k: w.value for k, w in self.sizes.items()}, self.order.value)

    def refresh(self) -> None:
        """Show the layouts in use, how the target was merged and what the replica check found."""
        t = self.api.triage
        if t is None:
            self.output.value = "<i>no triage (auto=False): apply a layout to run one</i>"
            return
        lay = t.target_layout if self.side.value == "target" else t.baseline_layout
        if lay is not None:
            with_sizes = {k: int(getattr(lay, k, 1)) for k in self.sizes}
            for k, w in self.sizes.items():
                w.value = max(1, with_sizes.get(k, 1))
            self.order.value = str(getattr(lay, "order", self.order.value) or self.order.value)
        world = t.raw_target.sizes["rank"] if t.raw_target is not None else t.target.sizes["rank"]
        lines = [f"target: {world} rank(s) as dumped"]
        if t.target_layout is not None and t.paired:
            lines.append(f"merged into {t.target.sizes['rank']} ({html.escape(t.target_layout.describe())}); "
                         f"{_kinds_summary(t.target)}")
        lines += [html.escape(n) for n in t.notes if "merged" in n]
        self.output.value = "<div style='font-size:12px'>" + "<br>".join(lines) + "</div>"
        from precnb.analysis.diagnoses import REPLICAS

        rep = t.result(REPLICAS)
        self.replicas.value = finding_html(rep) if rep is not None else (
            "<i>the replica check runs when the target has a layout (tp, cp or dp groups)</i>")

    def run(self) -> Any:
        """Rerun the triage with the layout for the chosen side; returns the new triage (None on an error)."""
        text = self.layout_text() or None
        key = "target_layout" if self.side.value == "target" else "baseline_layout"
        self.output.value = "<i>merging shards and rerunning the triage…</i>"
        try:
            return self.api.rerun(**{key: text})
        except Exception as err:  # shown here: the explorer keeps its runs
            self.output.value = _error(err)
            return None
