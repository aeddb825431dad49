"""The explorer's static view: what a saved notebook shows once its kernel (and the widget models) are gone.

A notebook saved without widget state reopens with "Error displaying widget: model not found" in every
widget output (JupyterLab always renders the widget MIME type of an output, so a ``text/html`` beside it in the
same bundle is never shown). The explorer is therefore displayed as two outputs: this static view, then the
widget. Each hides the other with CSS:

* the live explorer's own style (:func:`live_css`, inside the widget) hides the static view of its model id;
* the static view's style hides, in a JupyterLab output area, a widget output that holds no live explorer
  (the "model not found" error, or "Loading widget..." until the explorer draws).

The static view is what the explorer shows when it is displayed: the finding bar (what, where, why), the
selected record (step, rank, node, module), its line chart as SVG and its detail table.
"""

from __future__ import annotations

import html
from typing import Any

__all__ = ["live_css", "static_class", "static_html"]

# JupyterLab renders a widget output in a panel (the "model not found" error too); an HTML output is no panel
_WIDGET_OUTPUT = ".jp-OutputArea-output.lm-Panel"


def static_class(model_id: str) -> str:
    """The CSS class of the static view of the explorer with widget *model_id*."""
    return f"precnb-static-{''.join(c for c in str(model_id) if c.isalnum())}"


def live_css(model_id: str) -> str:
    """CSS the live explorer carries: its static view (and that output's JupyterLab wrapper) hidden."""
    c = static_class(model_id)
    return f".{c} {{display: none}} .jp-OutputArea-child:has(.{c}) {{display: none}}"


def _fallback_css(model_id: str) -> str:
    """CSS the static view carries: its cell's widget output hidden while no live explorer is drawn in it."""
    c = static_class(model_id)
    return (f"<style>.jp-OutputArea:has(.{c}):not(:has(.precnb-explorer)) > "
            f".jp-OutputArea-child:has(> {_WIDGET_OUTPUT}) {{display: none}}</style>")


def _chart_svg(spec: dict[str, Any] | None) -> str:
    """The line chart as SVG, empty when it cannot be drawn.

    Drawn by vl-convert in a child process (:mod:`precnb._jsbundle`), never in the kernel's own: V8 cannot start
    under an address-space limit.
    """
    if not spec or not spec.get("datasets"):
        return ""
    try:
        from precnb._jsbundle import vegalite_to_svg, vl_version

        return str(vegalite_to_svg(spec, vl_version()))
    except Exception:  # no vl-convert, a spec it rejects, a child that cannot start: the table and text still say it
        return ""


def static_html(ex: Any) -> str:
    """The static view of explorer *ex* as it is now (HTML, self-contained: no script, no network).

    Parameters
    ----------
    ex : precnb.widgets.Explorer

    Returns
    -------
    str
        A ``<div class="precnb-static precnb-static-<model id>">`` with the finding bar's text, the
        selection line, the line chart (SVG) and the detail table.
    """
    e = html.escape
    rec = ex.record
    out = [_fallback_css(ex.model_id),
           f"<div class='precnb-static {static_class(ex.model_id)}' style='border-left:3px solid #ccc;"
           "padding-left:8px'>",
           "<div style='font-size:11px;color:#777'>precnb explorer, static view (saved with the notebook): run "
           "the cell again for the live explorer</div>",
           f"<div>{ex.header.value}</div>", f"<div class='precnb-static-finding'>{ex.bar.label.value}</div>",
           f"<div class='precnb-static-why'>{ex.bar.why.value}</div>",
           f"<div class='precnb-static-selection' style='font-size:12px'>{rec.status.value}</div>"]
    svg = _chart_svg(getattr(rec.lines.chart, "spec", None))
    if svg:
        out.append(f"<div class='precnb-static-chart'>{svg}</div>")
    if ex.tensor is not None:
        out.append(f"<div class='precnb-static-detail'>{rec.detail.html.value}</div>")
    else:
        out.append(f"<div><i>{e('no record selected')}</i></div>")
    out.append("</div>")
    return "".join(out)
