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

import copy
import json
from collections.abc import Mapping
from typing import Any

import altair as alt
import pandas as pd
from altair.expr.core import Expression

from precnb.viz.selections import cell_selection, pick_selection, span_selection

__all__ = ["first_bad_domain", "heatmap_chart", "heatmap_width", "line_chart", "linked_chart", "mark_selected"]

NONFINITE_COLOR = "#d62728"
EMPTY_COLOR = "#eeeeee"
_SCALES: dict[str, dict[str, Any]] = {
    # the earliest cell dark, every later one pale (issue 51: with the reds scheme every row downstream of a NaN was
    # as dark as the origin); piecewise over [1, 2, last]
    "first_bad": {"type": "log", "range": ["#a50f15", "#fcae91", "#fff1ea"]},
    "tensor": {"scheme": "purples", "type": "symlog"},
    "stat": {"scheme": "blues", "type": "symlog"},
    "reldiff": {"scheme": "yelloworangered", "domain": [-8, 0], "clamp": True},
    "nonfinite": {"scheme": "reds"},
    "events": {"scheme": "reds"},
}
_COLOR_TITLES = {"first_bad": "first bad (1 = earliest)", "tensor": "tensor metric", "stat": "max |{stat}|",
                 "reldiff": "log10 rel. diff", "nonfinite": "non-finite", "events": "NaN / new inf"}
LABELLED = 3
"""In ``first_bad`` colour the earliest cells carry their number (1, 2, 3) as text."""


def first_bad_domain(top: float) -> list[float]:
    """Colour domain of ``first_bad`` cells numbered 1 to *top*: cell 1, cell 2, the last one.

    Examples
    --------
    >>> first_bad_domain(1), first_bad_domain(37)
    ([1.0, 2.0, 3.0], [1.0, 2.0, 37.0])
    """
    return [1.0, 2.0, max(3.0, float(top))]


def heatmap_width(n_cols: int, *, cell: int = 22, lo: int = 160, hi: int = 760) -> int:
    """Pixel width of a heat map's cells for *n_cols* columns (*cell* px each, within *lo*-*hi*).

    Examples
    --------
    >>> heatmap_width(3), heatmap_width(100), heatmap_width(3, cell=36, lo=240)
    (160, 760, 240)
    """
    return max(lo, min(hi, cell * max(n_cols, 1)))


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
    if mode == "first_bad":
        conditions = [{"test": f"({invalid}) || datum.color < 1", "value": EMPTY_COLOR}]
    elif mode == "stat":  # a cell holding NaN/inf has no finite colour value: paint it red
        conditions.insert(0, {"test": f"({invalid}) && datum.nonfinite > 0", "value": NONFINITE_COLOR})
    elif mode in ("nonfinite", "events"):  # counts: zero means nothing to see, leave the cell blank
        conditions.append({"test": "datum.color == 0", "value": EMPTY_COLOR})
    scale = dict(_SCALES.get(mode, {}))
    if mode == "first_bad":
        top = float(frame["color"].max()) if len(frame) and frame["color"].notna().any() else 1.0
        scale["domain"] = first_bad_domain(top)
    fill = alt.Color("color:Q", title=_COLOR_TITLES.get(mode, "value").format(stat=stat),
                     scale=alt.Scale(**scale), condition=conditions,
                     legend=alt.Legend(orient="top", gradientLength=160) if legend else None)
    nonfinite = (alt.datum.nonfinite > 0) if mode != "first_bad" else (alt.datum.nonfinite < 0)
    marked = alt.datum.focus | alt.datum.selected  # the finding's cell, the selected record's cell
    stroke = alt.when(marked).then(alt.value("black"))
    width = alt.when(marked).then(alt.value(2.5))
    if selection is not None:  # selected cells: black outline (no dimming of the others)
        stroke = stroke.when(selection, empty=False).then(alt.value("black"))
        width = width.when(selection, empty=False).then(alt.value(2.5))
    return {
        "color": fill,
        "stroke": _typed(alt.StrokeValue,
                         stroke.when(nonfinite).then(alt.value(NONFINITE_COLOR)).otherwise(alt.value("white"))),
        "strokeWidth": _typed(alt.StrokeWidthValue,
                              width.when(nonfinite).then(alt.value(1.5)).otherwise(alt.value(0.5))),
    }


def _typed(channel: Any, cond: Any) -> Any:
    """A conditional value (``alt.when(...)...otherwise(...)``) as the channel object ``encode`` makes of it.

    ``encode`` makes it through altair's ``from_dict``, which indexes every schema class on each call (~5 ms a
    channel): the same call, made once per distinct condition (a few per colour mode), then copied.
    """
    d = cond.to_dict() if hasattr(cond, "to_dict") else cond
    try:
        key = (channel, json.dumps(d, default=_expression))
    except TypeError:  # not JSON and expressions: made as encode makes it
        return channel.from_dict(d, validate=False)
    made = _CHANNELS.get(key)
    if made is None:
        if len(_CHANNELS) >= 256:
            _CHANNELS.clear()
        made = _CHANNELS[key] = channel.from_dict(d, validate=False)
    return copy.deepcopy(made)


_CHANNELS: dict[tuple[Any, str], Any] = {}  # (channel class, its JSON) -> the channel object


def _expression(x: Any) -> list[str]:
    """An altair expression (``alt.datum.x > 0``) in a cache key: its text, which is what its spec holds."""
    if isinstance(x, Expression):
        return ["expression", repr(x)]
    raise TypeError(type(x).__name__)


def mark_selected(frame: pd.DataFrame, selected: Mapping[str, Any] | None) -> pd.DataFrame:
    """*frame* with a boolean ``selected`` column: True for the cell *selected* names (row, col[, group])."""
    mask = pd.Series(False, index=frame.index)
    if selected and len(frame):
        mask = (frame["row"].astype(str) == str(selected.get("row"))) & (
            frame["col"].astype(str) == str(selected.get("col")))
        if "group" in selected and "group" in frame:
            mask &= frame["group"].astype(str) == str(selected["group"])
    out = frame.assign(selected=mask.to_numpy())
    out.attrs = dict(frame.attrs)
    return out


def heatmap_chart(
    frame: pd.DataFrame,
    *,
    stat: str = "norm",
    title: str | None = None,
    selection: bool | alt.Parameter = True,
    selected: Mapping[str, Any] | None = None,
    width: int | None = None,
    y_title: str | None = None,
    row_height: int = 14,
    label_limit: int = 260,
) -> alt.Chart | alt.LayerChart | alt.FacetChart:
    """Heat map of :func:`precnb.viz.heatmap_frame` cells with a ``cell`` point selection.

    Parameters
    ----------
    frame : pandas.DataFrame
        From :func:`~precnb.viz.heatmap_frame` (or :func:`~precnb.viz.where.where_frame`); its
        ``attrs`` name the colour mode and axis. A frame with row groups (``attrs["groups"]``)
        is drawn as one panel per group (forward, backward, optimizer).
    stat : str
        For the legend title.
    title : str, optional
    selection : bool or altair.Parameter
        True: a :func:`~precnb.viz.selections.cell_selection` on ``row`` and ``col`` (and
        ``group`` for a grouped frame).
    selected : mapping, optional
        The selected cell ``{"row": ..., "col": ...}`` (plus ``"group"``), outlined through the
        data (column ``selected``), not as the selection's initial value: a click on that cell
        still reaches Python.
    width : int, optional
    y_title : str, optional
        Title of the row axis (none by default: the labels say it).
    row_height : int
        Pixels per row.
    label_limit : int
        Most pixels of a row label (longer ones are cut with an ellipsis; the tooltip has them whole).

    Returns
    -------
    altair.Chart, LayerChart or FacetChart
        Cells outlined black where selected or where the finding is (``focus``), red where
        non-finite values were recorded; cells with no finite value but non-finite ones are
        filled red (``stat``); in ``reldiff`` mode, exactly equal cells stay grey. In
        ``first_bad`` mode the colour is the cell's number in causal order (1 = earliest, darkest)
        and the first :data:`LABELLED` cells carry that number.
    """
    mode = frame.attrs.get("color", "stat")
    by = frame.attrs.get("by", "step")
    grouped = bool(frame.attrs.get("groups")) and "group" in frame and frame["group"].astype(str).ne("").any()
    frame = mark_selected(frame, selected)
    cols = _order(frame, "col", "col_order")
    n_rows = int(frame.groupby("group")["row"].nunique().max()) if grouped and len(frame) else \
        (frame["row"].nunique() if len(frame) else 0)
    width = width or heatmap_width(len(cols))
    height: Any = alt.Step(row_height) if grouped else max(60, min(row_height * n_rows, 640))
    base = alt.Chart(frame, width=width, height=height)
    sel = None
    if selection is not False:
        fields = ("group", "row", "col") if grouped else ("row", "col")
        sel = cell_selection(fields=fields) if selection is True else selection
    enc = _rect_encoding(frame, mode, stat, selection=sel)
    tooltip = [alt.Tooltip("row:N", title=y_title or "row"), alt.Tooltip("col:N", title=by),
               alt.Tooltip("value_text:N", title=_COLOR_TITLES.get(mode, "value").format(stat=stat)),
               alt.Tooltip("nonfinite:Q", title="non-finite"), alt.Tooltip("records:Q"),
               alt.Tooltip("tensor:N", title="first bad tensor" if mode == "first_bad" else "worst tensor"),
               alt.Tooltip("worst_step:Q", title="its step"), alt.Tooltip("worst_rank:Q", title="its rank")]
    if grouped:
        tooltip.insert(1, alt.Tooltip("group:N"))
    if "device" in frame and frame["device"].astype(str).ne("").any():  # a rank table was given (issue #28)
        tooltip.insert(1, alt.Tooltip("device:N", title="host:device"))
    x = alt.X("col:O", sort=_sort_by("col_order"), title="ranks" if by == "rank" else "step",
              axis=alt.Axis(labelAngle=-45 if by == "rank" else 0, labelOverlap=True))
    y = alt.Y("row:N", sort=_sort_by("row_order"), title=y_title,
              axis=alt.Axis(labelLimit=label_limit, labelOverlap=False))
    rect = base.mark_rect(invalid="show").encode(x=x, y=y, tooltip=tooltip, **enc)
    if sel is not None:
        rect = rect.add_params(sel)
    chart: Any = rect
    if mode == "first_bad" and len(frame):
        ink = _typed(alt.ColorValue, alt.when(alt.datum.first_bad == 1).then(alt.value("white")).otherwise(
            alt.value("#67000d")))
        text = base.transform_filter(f"datum.first_bad > 0 && datum.first_bad <= {LABELLED}").mark_text(
            fontSize=10, fontWeight="bold").encode(x=x, y=y, text=alt.Text("first_bad:Q"), tooltip=tooltip, color=ink)
        chart = alt.layer(rect, text)
    if grouped:
        order = [g for g in ("forward", "backward", "optimizer") if g in set(frame["group"].astype(str))]
        chart = chart.facet(row=alt.Row("group:N", sort=order, title=None,
                                        header=alt.Header(labelAngle=0, labelOrient="top", labelAnchor="start",
                                                          labelFontWeight="bold", labelPadding=2)),
                            spacing=6).resolve_scale(y="independent")
    return chart.properties(title=title) if title else chart


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
    lines = base.mark_line(strokeWidth=1.6).encode(x=x, y=y, color=color, detail=alt.Detail("series:N"))
    points = base.mark_point(filled=True, size=45).encode(x=x, y=y, color=color, tooltip=tip)
    if span is not False:
        lines = lines.add_params(span_selection() if span is True else span)
    if pick is not False:
        sel = pick_selection() if pick is True else pick
        points = points.add_params(sel).encode(
            size=_typed(alt.SizeValue, alt.when(sel, empty=False).then(alt.value(140)).otherwise(alt.value(45))))
    layers: list[Any] = [lines, points]
    if len(series) and bool(series["nonfinite"].any()):  # an empty layer gives vega an infinite step extent
        layers.append(base.transform_filter(alt.datum.nonfinite).mark_rule(
            color=NONFINITE_COLOR, strokeDash=[4, 2]).encode(x=x, tooltip=tip))
    return alt.layer(*layers, title=title or "")


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
    heat = alt.Chart(heat_data, title=title, width=heatmap_width(len(steps)),
                     height=max(60, min(15 * len(rows), 640))).mark_rect(invalid="show").encode(
        x=alt.X("step:O", title="step"),
        y=alt.Y("row:N", sort=_sort_by("row_order"), title=None, axis=alt.Axis(labelLimit=260)),
        tooltip=[alt.Tooltip("row:N"), alt.Tooltip("step:O"), alt.Tooltip("value_text:N", title=stat),
                 alt.Tooltip("nonfinite:Q")],
        **_rect_encoding(heat_data, mode, stat, selection=sel),
    ).add_params(sel)
    axis = alt.Axis(tickMinStep=1, format="d", values=steps) if 0 < len(steps) <= 24 else \
        alt.Axis(tickMinStep=1, format="d")
    lines = alt.Chart(cube, width=max(300, min(760, 22 * len(steps))), height=200).transform_filter(
        {"param": sel.name, "empty": False}).mark_line(point=True).encode(
        x=alt.X("step:Q", axis=axis),
        detail=alt.Detail("row:N"),  # several selected rows: one line per row and rank bucket
        y=alt.Y("value:Q", title=_COLOR_TITLES.get(mode, "value").format(stat=stat).replace(
            "log10 ", ""), scale=alt.Scale(type="symlog") if mode == "reldiff" else alt.Scale(zero=False)),
        color=alt.Color("ranks:N", title="ranks", sort=_sort_by("rank_lo")),
        tooltip=[alt.Tooltip(f) for f in ("row:N", "step:Q", "ranks:N", "value_text:N", "tensor:N", "worst_rank:Q")],
    )
    return alt.vconcat(heat, lines)
