"""Chart builders: frames in, :class:`altair.Chart` out. Nothing here displays anything.

Selections are named parameters from :mod:`precnb.viz.selections`, so the notebook explorer
(``alt.JupyterChart``) and a static HTML report use the same specification.

Examples
--------
>>> from precnb.viz import heatmap_chart, heatmap_frame
>>> chart = heatmap_chart(heatmap_frame(run))  # doctest: +SKIP
>>> chart.to_dict()["params"][0]["name"]  # doctest: +SKIP
'cell'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import altair as alt
import pandas as pd

from precnb.viz.selections import cell_selection, pick_selection, span_selection

__all__ = ["heatmap_chart", "line_chart", "linked_chart"]

NONFINITE_COLOR = "#d62728"
EMPTY_COLOR = "#eeeeee"
_SCALES: dict[str, dict[str, Any]] = {
    "stat": {"scheme": "blues", "type": "symlog"},
    "reldiff": {"scheme": "yelloworangered", "domain": [-8, 0], "clamp": True},
    "nonfinite": {"scheme": "reds"},
    "events": {"scheme": "reds"},
}
_COLOR_TITLES = {"stat": "max |{stat}|", "reldiff": "log10 rel. diff", "nonfinite": "non-finite",
                 "events": "NaN / new inf"}


def _order(frame: pd.DataFrame, field: str, key: str) -> list[Any]:
    if not len(frame):
        return []
    return frame.sort_values(key, kind="stable")[field].drop_duplicates().tolist()


def _sort_by(key: str) -> alt.EncodingSortField:
    """Order a discrete axis by a numeric column, not by a list of the labels.

    Vega-Lite turns a list sort into an expression holding every label; a label with U+2028 or
    U+2029 (legal in JSON, a line break to Vega's expression parser) would break the chart.
    """
    return alt.EncodingSortField(field=key, op="min", order="ascending")


def _rect_encoding(frame: pd.DataFrame, mode: str, stat: str, legend: bool = True,
                   selection: alt.Parameter | None = None) -> dict[str, Any]:
    invalid = "!isValid(datum.color) || !isFinite(datum.color)"
    conditions = [{"test": invalid, "value": EMPTY_COLOR}]
    if mode == "stat":  # a cell holding NaN/inf has no finite colour value: paint it red
        conditions.insert(0, {"test": f"({invalid}) && datum.nonfinite > 0", "value": NONFINITE_COLOR})
    elif mode in ("nonfinite", "events"):  # counts: zero means nothing to see, leave the cell blank
        conditions.append({"test": "datum.color == 0", "value": EMPTY_COLOR})
    fill = alt.Color("color:Q", title=_COLOR_TITLES.get(mode, "value").format(stat=stat),
                     scale=alt.Scale(**_SCALES.get(mode, {})), condition=conditions,
                     legend=alt.Legend(orient="top", gradientLength=160) if legend else None)
    nonfinite = alt.datum.nonfinite > 0
    stroke = alt.when(alt.datum.focus).then(alt.value("black"))
    width = alt.when(alt.datum.focus).then(alt.value(2.5))
    if selection is not None:  # selected cells: black outline (no dimming of the others)
        stroke = stroke.when(selection, empty=False).then(alt.value("black"))
        width = width.when(selection, empty=False).then(alt.value(2.5))
    return {
        "color": fill,
        "stroke": stroke.when(nonfinite).then(alt.value(NONFINITE_COLOR)).otherwise(alt.value("white")),
        "strokeWidth": width.when(nonfinite).then(alt.value(1.5)).otherwise(alt.value(0.5)),
    }


def heatmap_chart(
    frame: pd.DataFrame,
    *,
    stat: str = "norm",
    title: str | None = None,
    selection: bool | alt.Parameter = True,
    selected: Mapping[str, Any] | None = None,
    width: int | None = None,
) -> alt.Chart:
    """Heat map of :func:`precnb.viz.heatmap_frame` cells with a ``cell`` point selection.

    Parameters
    ----------
    frame : pandas.DataFrame
        From :func:`~precnb.viz.heatmap_frame`; its ``attrs`` name the colour mode and axis.
    stat : str
        For the legend title.
    title : str, optional
    selection : bool or altair.Parameter
        True: a :func:`~precnb.viz.selections.cell_selection` on ``row`` and ``col``.
    selected : mapping, optional
        Initially selected cell ``{"row": ..., "col": ...}``.
    width : int, optional

    Returns
    -------
    altair.Chart
        Cells outlined black where selected (dashed: ``focus``, a finding), red where
        non-finite values were recorded; cells with no finite value but non-finite ones are
        filled red (``stat``); in ``reldiff`` mode, exactly equal cells stay grey.
    """
    mode = frame.attrs.get("color", "stat")
    by = frame.attrs.get("by", "step")
    rows, cols = _order(frame, "row", "row_order"), _order(frame, "col", "col_order")
    width = width or max(160, min(760, 22 * max(len(cols), 1)))
    chart = alt.Chart(frame, title=title or "", width=width, height=max(60, min(15 * len(rows), 640)))
    sel = None
    if selection is not False:
        sel = cell_selection(value=selected) if selection is True else selection
    enc = _rect_encoding(frame, mode, stat, selection=sel)
    tooltip = [alt.Tooltip("row:N"), alt.Tooltip("col:N", title=by), alt.Tooltip("value_text:N",
               title=_COLOR_TITLES.get(mode, "value").format(stat=stat)),
               alt.Tooltip("nonfinite:Q", title="non-finite"), alt.Tooltip("records:Q"),
               alt.Tooltip("tensor:N", title="worst tensor"), alt.Tooltip("worst_step:Q"),
               alt.Tooltip("worst_rank:Q")]
    chart = chart.mark_rect(invalid="show").encode(
        x=alt.X("col:O", sort=_sort_by("col_order"), title="ranks" if by == "rank" else "step",
                axis=alt.Axis(labelAngle=-45 if by == "rank" else 0, labelOverlap=True)),
        y=alt.Y("row:N", sort=_sort_by("row_order"), title=None, axis=alt.Axis(labelLimit=260)),
        tooltip=tooltip, **enc,
    )
    return chart.add_params(sel) if sel is not None else chart


def line_chart(
    series: pd.DataFrame,
    *,
    stat: str = "norm",
    title: str | None = None,
    span: bool | alt.Parameter = True,
    pick: bool | alt.Parameter = True,
    log: bool = False,
    width: int = 420,
    height: int = 220,
) -> alt.LayerChart:
    """Lines of :func:`precnb.viz.series_frame` (one per rank or run), red rules at non-finite.

    Parameters
    ----------
    series : pandas.DataFrame
    stat : str
        Axis title.
    title : str, optional
    span : bool or altair.Parameter
        Interval brush over steps (``span``).
    pick : bool or altair.Parameter
        Click on one point (``pick``: step and series).
    log : bool
        Symlog y scale.
    width, height : int

    Returns
    -------
    altair.LayerChart
    """
    base = alt.Chart(series, width=width, height=height)
    steps = sorted({int(s) for s in series["step"]}) if len(series) else []
    axis = alt.Axis(values=steps, format="d") if 0 < len(steps) <= 24 else alt.Axis(
        tickMinStep=1, format="d")
    x = alt.X("step:Q", axis=axis, title="step", scale=alt.Scale(nice=False))
    y = alt.Y("value:Q", title=stat, scale=alt.Scale(type="symlog") if log else alt.Scale(zero=False))
    color = alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom", columns=2,
                                                                 labelLimit=260))
    tip = [alt.Tooltip("series:N"), alt.Tooltip("step:Q"), alt.Tooltip("value_text:N", title=stat),
           alt.Tooltip("tensor:N"), alt.Tooltip("rank:Q"), alt.Tooltip("run:N")]
    lines = base.mark_line(strokeWidth=1.6).encode(x=x, y=y, color=color, detail="series:N")
    points = base.mark_point(filled=True, size=45).encode(x=x, y=y, color=color, tooltip=tip)
    if span is not False:
        lines = lines.add_params(span_selection() if span is True else span)
    if pick is not False:
        sel = pick_selection() if pick is True else pick
        points = points.add_params(sel).encode(
            size=alt.when(sel, empty=False).then(alt.value(140)).otherwise(alt.value(45)))
    rules = base.transform_filter(alt.datum.nonfinite).mark_rule(
        color=NONFINITE_COLOR, strokeDash=[4, 2]).encode(x=x, tooltip=tip)
    return alt.layer(lines, points, rules, title=title or "")


def linked_chart(
    cube: pd.DataFrame,
    *,
    stat: str = "norm",
    title: str = "",
    selected_row: str | None = None,
) -> alt.VConcatChart:
    """Heat map (rows × steps) whose click filters a line chart, in pure Vega-Lite.

    Works without a kernel (an exported report): the heat map aggregates the cube over rank
    buckets in the browser, and selecting a row shows that row's value over steps, one line
    per rank bucket.

    Parameters
    ----------
    cube : pandas.DataFrame
        From :func:`precnb.viz.cube_frame` with ``rank_groups`` > 1 (a few thousand rows).
    stat : str
    title : str
    selected_row : str, optional
        Initially selected row (default: the first row holding the focus, else the first).

    Returns
    -------
    altair.VConcatChart
    """
    mode = cube.attrs.get("color", "stat")
    if selected_row is None and len(cube):
        hit = cube[cube["focus"]] if cube["focus"].any() else cube.sort_values("row_order")
        selected_row = str(hit["row"].iloc[0])
    sel = cell_selection(fields=("row",), value={"row": selected_row} if selected_row else None)
    rows = _order(cube, "row", "row_order")
    steps = sorted(cube["step"].unique().tolist()) if len(cube) else []
    heat_data = cube.groupby(["row", "row_order", "step"], as_index=False).agg(
        color=("color", "max"), nonfinite=("nonfinite", "sum"), records=("records", "sum"),
        value=("value", "max"), focus=("focus", "any"))
    heat_data["value_text"] = heat_data["value"].map(lambda v: f"{v:.4g}")
    heat = alt.Chart(heat_data, title=title, width=max(160, min(760, 22 * len(steps))),
                     height=max(60, min(15 * len(rows), 640))).mark_rect(invalid="show").encode(
        x=alt.X("step:O", title="step"),
        y=alt.Y("row:N", sort=_sort_by("row_order"), title=None, axis=alt.Axis(labelLimit=260)),
        tooltip=["row:N", "step:O", alt.Tooltip("value_text:N", title=stat), "nonfinite:Q"],
        **_rect_encoding(heat_data, mode, stat, selection=sel),
    ).add_params(sel)
    axis = alt.Axis(tickMinStep=1, format="d", values=steps) if 0 < len(steps) <= 24 else \
        alt.Axis(tickMinStep=1, format="d")
    lines = alt.Chart(cube, width=max(300, min(760, 22 * len(steps))), height=200).transform_filter(
        {"param": sel.name, "empty": False}).mark_line(point=True).encode(
        x=alt.X("step:Q", axis=axis),
        detail="row:N",  # several selected rows: one line per row and rank bucket
        y=alt.Y("value:Q", title=_COLOR_TITLES.get(mode, "value").format(stat=stat).replace(
            "log10 ", ""), scale=alt.Scale(type="symlog") if mode == "reldiff" else alt.Scale(zero=False)),
        color=alt.Color("ranks:N", title="ranks", sort=_sort_by("rank_lo")),
        tooltip=["row:N", "step:Q", "ranks:N", "value_text:N", "tensor:N", "worst_rank:Q"],
    )
    return alt.vconcat(heat, lines)
