"""The explorer's parts by name (``ex.heatmap``, ``ex.lines``, ``ex.export``, ...): a mixin of read-only views."""

from __future__ import annotations

from typing import Any

import pandas as pd

__all__ = ["EXPLORER_CSS", "ExplorerViews"]

# a click on a cell's number (or on a tree label) goes to the cell (the mark holding the selection) beneath it
EXPLORER_CSS = ("<style>.precnb-explorer .precnb-heatmap g.mark-text, .precnb-explorer .precnb-where g.mark-text, "
                ".precnb-explorer .precnb-alignment g.mark-text, .precnb-explorer .precnb-alignment g.mark-symbol, "
                ".precnb-explorer .precnb-hierarchy g.mark-text, .precnb-explorer .precnb-hierarchy g.mark-rect + "
                "g.mark-rect {pointer-events: none}"
                # a suspect's whole text, wrapped: never clipped to "inherited via co…"
                ".precnb-explorer .precnb-suspect {white-space: normal; height: auto; min-height: 24px; "
                "text-align: left; line-height: 1.3; padding: 2px 8px; overflow: visible; text-overflow: clip}"
                ".precnb-explorer .precnb-suspect .widget-label-basic, .precnb-explorer .precnb-suspect span "
                "{white-space: normal}</style>")


class ExplorerViews:
    """Named access to the explorer's panels and frames (mixed into :class:`~precnb.widgets.Explorer`)."""

    heat: Any
    record: Any
    panels: list[Any]
    css: Any
    model_id: str

    # -- compatibility names ------------------------------------------------------------------
    @property
    def heatmap(self) -> Any:
        """The main heat-map panel (its ``chart`` is the ``alt.JupyterChart``)."""
        return self.heat.main

    @property
    def where(self) -> Any:
        """The rank × step panel."""
        return self.heat.where

    @property
    def lines(self) -> Any:
        """The line-chart panel."""
        return self.record.lines

    @property
    def detail(self) -> Any:
        """The detail-table panel."""
        return self.record.detail

    @property
    def status(self) -> Any:
        """The selection line."""
        return self.record.status

    @property
    def frame(self) -> pd.DataFrame:
        """The main heat map's frame as :func:`precnb.viz.heatmap_frame` made it."""
        return self.heat.frame

    @property
    def series(self) -> pd.DataFrame:
        """The line chart's frame."""
        return self.record.series if self.record.series is not None else pd.DataFrame()

    @property
    def hierarchy(self) -> Any:
        """The Hierarchy tab (None when absent)."""
        return self.panel("Hierarchy")

    @property
    def export(self) -> Any:
        """The Export tab (None when absent)."""
        return self.panel("Export")

    def panel(self, title: str) -> Any:
        """The tab titled *title* (None when absent)."""
        return next((p for p in self.panels if p.title == title), None)

    # -- displaying ---------------------------------------------------------------------------
    def _ipython_display_(self) -> None:
        """Display the static view (:mod:`precnb.widgets.static`), then the widget, which hides it while live.

        A notebook saved without widget state shows the static view once the kernel is gone (not "Error
        displaying widget: model not found"); running the cell again brings the live explorer back.
        """
        from IPython.display import display

        from precnb.widgets.static import live_css, static_html

        live = live_css(self.model_id)
        if live not in self.css.value:
            self.css.value = self.css.value.replace("</style>", live + "</style>")
        display({"text/html": static_html(self)}, raw=True)
        display(self._repr_mimebundle_(), raw=True)  # type: ignore[attr-defined]
