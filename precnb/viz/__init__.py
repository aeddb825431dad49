"""Pure chart layer: canonical dataset → pandas frame → :class:`altair.Chart`.

Nothing here displays anything or keeps state; the notebook explorer
(:mod:`precnb.widgets`) and the HTML report build on the same frames, charts and named
selections. Importing :mod:`precnb` does not import this package (it needs altair).

Examples
--------
>>> import precnb.viz as viz
>>> frame = viz.heatmap_frame(run, by="rank", color="nonfinite")  # doctest: +SKIP
>>> viz.heatmap_chart(frame).to_dict()["params"][0]["name"]  # doctest: +SKIP
'cell'
"""

from __future__ import annotations

from precnb.viz.charts import heatmap_chart, line_chart, linked_chart
from precnb.viz.frames import COLORS, ROWS, cell_values, cube_frame, heatmap_frame, pick_runs, row_labels
from precnb.viz.hierarchy import hierarchy_chart, hierarchy_frame, tensor_counts
from precnb.viz.selections import CELL, NODE, PICK, SPAN
from precnb.viz.series import detail_frame, series_frame, tensor_evidence
from precnb.viz.static import enable_static

__all__ = [
    "CELL",
    "COLORS",
    "NODE",
    "PICK",
    "ROWS",
    "SPAN",
    "cell_values",
    "cube_frame",
    "detail_frame",
    "enable_static",
    "heatmap_chart",
    "heatmap_frame",
    "hierarchy_chart",
    "hierarchy_frame",
    "line_chart",
    "linked_chart",
    "pick_runs",
    "row_labels",
    "series_frame",
    "tensor_counts",
    "tensor_evidence",
]
