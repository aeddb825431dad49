"""Named selection parameters shared by the notebook explorer and the HTML report.

A linked view is just named parameters: the widget observes them through
``alt.JupyterChart.selections.<name>``, and a static report lets Vega-Lite evaluate them in
the browser. Building them in one place keeps both on the same names and fields.

Names
-----
``cell``  point selection of heat-map cells (fields ``row`` and ``col``)
``span``  interval brush over steps on the line chart (x encoding)
``pick``  point selection of one line-chart point (fields ``step``, ``series``)
``node``  point selection of a module in the hierarchy view (field ``node``)

Examples
--------
>>> cell_selection().name
'cell'
>>> cell_selection(value={"row": "blocks.1.attn", "col": "4"}).param.to_dict()["value"]
[{'row': 'blocks.1.attn', 'col': '4'}]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import altair as alt

__all__ = [
    "CELL",
    "NODE",
    "PICK",
    "SPAN",
    "cell_selection",
    "expression_safe",
    "node_selection",
    "pick_selection",
    "read_point",
    "span_selection",
]

CELL: Final = "cell"
SPAN: Final = "span"
PICK: Final = "pick"
NODE: Final = "node"


def cell_selection(
    *,
    fields: Sequence[str] = ("row", "col"),
    value: Mapping[str, Any] | None = None,
    name: str = CELL,
) -> alt.Parameter:
    """Heat-map cell selection (click; shift-click adds cells).

    Parameters
    ----------
    fields : sequence of str
        Data fields that identify a cell; ``("row",)`` selects whole rows, which is what a
        linked line chart filters on.
    value : mapping, optional
        Initially selected cell, e.g. ``{"row": "blocks.1.attn", "col": "4"}``. Vega-Lite writes
        it into an expression, where U+2028/U+2029 end the string: a value holding them is
        not preselected (the chart still draws).
    name : str

    Returns
    -------
    altair.Parameter
    """
    kw: dict[str, Any] = {}
    if value is not None and expression_safe(value):
        kw["value"] = [dict(value)]
    return alt.selection_point(name=name, fields=list(fields), on="click", clear="dblclick",
                               toggle="event.shiftKey", **kw)


def expression_safe(value: Any) -> bool:
    """Whether *value* (a string, mapping or sequence of them) can go into a Vega expression.

    Vega-Lite writes initial selections and list sorts with ``JSON.stringify``, which leaves
    U+2028 and U+2029 raw; Vega's expression parser reads them as line breaks inside a string
    literal and refuses the chart ("Unexpected token ILLEGAL").

    Examples
    --------
    >>> expression_safe({"row": "a.b"}), expression_safe({"row": "a\u2028b"})
    (True, False)
    """
    if isinstance(value, str):
        return "\u2028" not in value and "\u2029" not in value
    if isinstance(value, Mapping):
        return all(expression_safe(k) and expression_safe(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(expression_safe(v) for v in value)
    return True


def span_selection(*, name: str = SPAN) -> alt.Parameter:
    """Interval brush over the x (step) axis of a line chart."""
    return alt.selection_interval(name=name, encodings=["x"])


def pick_selection(*, name: str = PICK) -> alt.Parameter:
    """Click on one point of a line chart (fields ``step`` and ``series``)."""
    return alt.selection_point(name=name, fields=["step", "series"], on="click", clear="dblclick")


def node_selection(*, name: str = NODE) -> alt.Parameter:
    """Click on one module of the hierarchy view (field ``node``)."""
    return alt.selection_point(name=name, fields=["node"], on="click", clear="dblclick")


def read_point(selection: Any) -> list[dict[str, Any]]:
    """Selected records of a point selection, as plain dicts.

    Accepts an :class:`altair.utils.selection.PointSelection`, its ``value`` list or None.

    Examples
    --------
    >>> read_point(None)
    []
    >>> read_point([{"row": "a", "col": "1"}])
    [{'row': 'a', 'col': '1'}]
    """
    if selection is None:
        return []
    value = getattr(selection, "value", selection)
    if isinstance(value, Mapping):
        value = value.get("vlPoint", {}).get("or", [])
    return [dict(v) for v in (value or []) if isinstance(v, Mapping)]
