"""The Experts tab: tokens per MoE expert per step (summed over the ranks holding it), experts that got none.

Shown only for runs with MoE experts (:mod:`precnb.analysis.experts` reads the experts' own input records). Each
layer is a table, expert × step, a cell with no token marked; picking a starved expert narrows the heat map to its
module on its rank, where a NaN or a departure involving it shows.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as ipw

from precnb.widgets.panel import ExplorerAPI, Panel

__all__ = ["ExpertsPanel", "tokens_html"]


def _raw(api: ExplorerAPI) -> Any:
    """The target as dumped (its experts under their local names, with its own ranks)."""
    raw = api.data.raw()
    if raw is not None:
        return raw
    ds = api.data.target()
    return ds.isel(run=-1) if "run" in ds.dims else ds


def _layout(api: ExplorerAPI, ds: Any) -> Any:
    lay = getattr(api.triage, "target_layout", None) if api.triage is not None else None
    if lay is not None and getattr(lay, "world_size", None) == ds.sizes.get("rank"):
        return lay
    from precnb.analysis.layout.infer import infer_layout

    return infer_layout(ds).layout


def tokens_html(rows: list[dict[str, Any]]) -> str:
    """One HTML table per layer: experts × steps, the tokens each expert received (0 marked).

    Examples
    --------
    >>> "0</b>" in tokens_html([{"step": 1, "rank": 1, "layer": "decoder.layers.1", "local": 0, "expert": 2,
    ...                          "tokens": 0}])
    True
    """
    by_layer: dict[str, dict[int, dict[int, int]]] = {}
    for r in rows:
        cell = by_layer.setdefault(str(r["layer"]), {}).setdefault(int(r["expert"]), {})
        cell[int(r["step"])] = cell.get(int(r["step"]), 0) + int(r["tokens"])
    parts = []
    for layer, experts in by_layer.items():
        steps = sorted({s for per in experts.values() for s in per})
        head = "".join(f"<th>step {s}</th>" for s in steps)
        body = []
        for e in sorted(experts):
            cells = []
            for s in steps:
                n = experts[e].get(s)
                cells.append("<td></td>" if n is None else
                             f"<td style='color:#b00020'><b>{n}</b></td>" if n == 0 else f"<td>{n}</td>")
            body.append(f"<tr><th>expert {e}</th>{''.join(cells)}</tr>")
        parts.append(f"<p><b>{html.escape(layer)}</b> — tokens received per step</p>"
                     f"<table class='precnb-experts'><tr><th></th>{head}</tr>{''.join(body)}</table>")
    return "".join(parts)


class ExpertsPanel(Panel):
    """Tokens per expert per step; a starved expert picked narrows the heat map to its module."""

    title = "Experts"
    lazy = True

    def __init__(self, api: ExplorerAPI) -> None:
        super().__init__(api)
        self._rows: list[dict[str, Any]] = []

    def build(self) -> None:
        """The tokens table and the starved experts' list."""
        self.table = ipw.HTML()
        self.starved = ipw.Dropdown(description="no token", options=[], style={"description_width": "initial"},
                                    layout=ipw.Layout(width="560px"))
        self.starved.observe(self._pick, names="value")
        self.children = [self.starved, self.table]
        self.add_class("precnb-experts")
        self.refresh()

    @classmethod
    def applies(cls, api: ExplorerAPI) -> bool:
        """Only for runs whose dumps record MoE experts."""
        from precnb.analysis.experts import expert_tokens

        try:
            return bool(expert_tokens(_raw(api)))
        except (KeyError, ValueError):
            return False

    def refresh(self) -> None:
        """Read the tokens again (new runs or triage)."""
        from precnb.analysis.experts import describe_starved, expert_tokens

        ds = _raw(self.api)
        lay = _layout(self.api, ds)
        rows = expert_tokens(ds, lay if lay is not None and lay.ep > 1 else None)
        self.table.value = tokens_html(rows)
        starved = [r for r in rows if r["tokens"] == 0]
        self._rows = starved
        self.starved.options = [("—", -1)] + [(describe_starved(r), i) for i, r in enumerate(starved)]
        self.starved.value = -1
        self.starved.layout.display = "" if starved else "none"

    def _pick(self, change: dict[str, Any]) -> None:
        i = change.get("new")
        if not isinstance(i, int) or i < 0 or i >= len(self._rows):
            return
        r = self._rows[i]
        self.api.narrow(f"experts.local_experts.{r['local']}")
