"""Static (SVG) charts for executed notebooks, drawn by vl-convert in a child process.

altair's ``"svg"`` renderer runs vl-convert's JavaScript engine inside the kernel, and that
engine aborts its process under any ``ulimit -v`` (:mod:`precnb._jsbundle`): the kernel dies
and ``precnb template --html`` with it. :func:`enable_static` registers and enables the
``"precnb_svg"`` renderer instead: the same SVG, drawn in a child process; where the child
cannot draw (a hard memory cap), the chart's place says why in one line and the notebook runs on.

Examples
--------
>>> import precnb.viz as viz
>>> viz.enable_static()  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

__all__ = ["RENDERER", "enable_static", "svg_renderer"]

RENDERER = "precnb_svg"


def svg_renderer(spec: dict[str, Any], **metadata: Any) -> dict[str, str]:
    """An altair renderer: *spec* as an ``image/svg+xml`` bundle (or a one-line ``text/plain`` why not)."""
    from precnb._jsbundle import ChartScriptError, vegalite_to_svg, vl_version

    try:
        return {"image/svg+xml": vegalite_to_svg(spec, vl_version())}
    except ChartScriptError as exc:
        return {"text/plain": f"(chart not drawn: {str(exc).rstrip('.')})"}


def enable_static() -> None:
    """Draw every altair chart displayed from now on as a static SVG (it survives an HTML export)."""
    import altair as alt

    if RENDERER not in alt.renderers.names():
        alt.renderers.register(RENDERER, svg_renderer)
    alt.renderers.enable(RENDERER)
