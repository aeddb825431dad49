"""Chart panels: ``alt.JupyterChart`` wrappers that keep their selection observers attached.

``JupyterChart`` replaces its ``selections`` object whenever its chart changes, so the
observers are re-attached after every :meth:`set_chart`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import altair as alt
import ipywidgets as ipw
import numpy as np
import pandas as pd

__all__ = ["HeatmapPanel", "OfflineChart", "SeriesPanel", "WherePanel", "enable_offline", "offline_chart", "records",
           "spec_once", "unvalidated"]

EMBED = {"renderer": "svg", "actions": False}


def unvalidated(chart: alt.TopLevelMixin) -> alt.TopLevelMixin:
    """*chart*, whose ``to_dict()`` (what ``JupyterChart`` calls) skips the schema validation.

    Examples
    --------
    >>> import altair as alt
    >>> c = unvalidated(alt.Chart().mark_point())
    >>> c.to_dict()["mark"]["type"]
    'point'
    """
    import functools

    if chart.__dict__.get("_precnb_spec") is not None:  # spec_once: its kept spec
        return chart
    object.__setattr__(chart, "to_dict", functools.partial(type(chart).to_dict, chart, validate=False))
    return chart


def spec_once(chart: alt.TopLevelMixin, spec: dict[str, Any]) -> alt.TopLevelMixin:
    """*chart*, whose ``to_dict()`` (without arguments) gives a shallow copy of *spec*, its spec made once.

    For a chart shared by every explorer of a kernel (:mod:`precnb.widgets.heat`, :class:`SeriesPanel`):
    ``JupyterChart.chart = shared`` serialised the whole chart, its first explorer's data included, again
    for each explorer (issue 51: a good part of what ``explore()`` cost beyond the triage), only for the
    explorer to send its own data in its place. The spec's members are never changed in place (a template
    is copied before its data and domains are set).

    Examples
    --------
    >>> import altair as alt
    >>> c = alt.Chart().mark_point()
    >>> s = spec_once(c, c.to_dict())
    >>> unvalidated(s) is s and s.to_dict() == c.to_dict() and s.to_dict() is not s.to_dict()
    True
    """
    import functools

    kept = dict(spec)
    full = functools.partial(type(chart).to_dict, chart, validate=False)

    def to_dict(*args: Any, **kw: Any) -> dict[str, Any]:
        return dict(kept) if not args and not kw else full(*args, **kw)

    object.__setattr__(chart, "_precnb_spec", kept)
    object.__setattr__(chart, "to_dict", to_dict)
    return chart


class OfflineChart(alt.JupyterChart):
    """A ``JupyterChart`` whose offline JavaScript (vl-convert's 0.9 MB bundle, no CDN) is compiled once per page.

    anywidget imports each widget's ``_esm`` from a blob of its own, and a model must be ready within
    2 s: every chart on a page compiled the whole bundle again, and a notebook of explorers, opened
    again (every model restored at once), ran past that limit (``[anywidget] Failed to initialize
    model``). Here ``_esm`` is a small module holding the bundle as a string, ready at once; its
    ``render`` imports the bundle the first time a chart on the page draws, and every other chart
    waits for that one import (a page-wide promise keyed by the bundle's digest).
    """


def _shared_esm(bundle: str) -> str:
    """The ES module that imports *bundle* once per page and re-exports its default (the widget)."""
    import hashlib
    import json

    key = "__precnb_jupyterchart_" + hashlib.sha1(bundle.encode("utf-8"), usedforsecurity=False).hexdigest()[:16]
    return (f"const key = {json.dumps(key)};\n"
            f"const src = {json.dumps(bundle)};\n"
            "const load = () => (globalThis[key] ??= import(URL.createObjectURL(new Blob([src], "
            "{type: 'text/javascript'}))));\n"
            "export default {\n"
            "  async render(ctx) {\n"
            "    const mod = await load();\n"
            "    return mod.default.render(ctx);\n"
            "  },\n"
            "};\n")


def enable_offline() -> None:
    """``alt.JupyterChart.enable_offline(True)``, with vl-convert run in a child process.

    altair's own runs vl-convert's JavaScript engine in the kernel, which aborts it under any
    ``ulimit -v`` (:mod:`precnb._jsbundle`); this builds the same bundle outside, or raises
    :class:`precnb._jsbundle.ChartScriptError` saying why it cannot.
    """
    cls = alt.JupyterChart
    if getattr(cls, "_is_offline", False):
        return
    try:
        from altair.jupyter.jupyter_chart import load_js_src
        from altair.utils._importers import vl_version_for_vl_convert
    except ImportError:  # pragma: no cover - an altair without these: its own way
        cls.enable_offline(True)
        return
    from precnb._jsbundle import javascript_bundle

    lines = load_js_src().split("\n")
    while lines and (not lines[0].strip() or lines[0].startswith(("import", "//"))):  # as altair does
        lines.pop(0)
    cls._esm = javascript_bundle("\n".join(lines), vl_version_for_vl_convert())
    cls._is_offline = True


def offline_chart(chart: alt.TopLevelMixin | None = None) -> alt.JupyterChart:
    """A ``JupyterChart`` (empty, or of *chart*, unvalidated) whose JavaScript comes from vl-convert (no CDN)."""
    if not OfflineChart.__dict__.get("_precnb_ready"):
        enable_offline()  # altair's offline bundle, built once per process (in a child: precnb._jsbundle)
        OfflineChart._esm = _shared_esm(str(alt.JupyterChart._esm))
        OfflineChart._precnb_ready = True
    spec: Any = unvalidated(chart) if chart is not None else None  # JupyterChart takes None: empty
    return OfflineChart(spec, embed_options=EMBED)


class _ChartPanel(ipw.VBox):
    _names: tuple[str, ...] = ()

    _width = 420

    def __init__(self, handlers: dict[str, Callable[[dict[str, Any]], None]]) -> None:
        self.chart = offline_chart()
        self.caption = ipw.HTML("")
        self._handlers = handlers
        super().__init__([self.caption, self.chart])

    def set_caption(self, text: str) -> None:
        """A small wrapped caption above the chart."""
        self.caption.value = (f"<div style='white-space:normal;max-width:{self._width}px;"
                              f"font-size:11px;line-height:1.3;color:#555'>{text}</div>")

    def set_chart(self, chart: alt.TopLevelMixin, caption: str = "") -> None:
        """Replace the chart (one comm message) and re-attach the selection observers.

        The spec is not validated against the Vega-Lite schema here (a second or more of
        ``jsonschema`` per chart on a large run): the builders are validated by the tests.
        """
        with self.chart.hold_sync():
            self.chart.chart = cast(Any, unvalidated(chart))
        self.set_caption(caption)
        for name, handler in self._handlers.items():
            if name in self.chart.selections.trait_names():
                self.chart.selections.observe(handler, names=[name])


class HeatmapPanel(_ChartPanel):
    """The heat map; its ``cell`` selection calls ``on_cell(change)``."""

    css_class = "precnb-heatmap"

    def __init__(self, on_cell: Callable[[dict[str, Any]], None]) -> None:
        super().__init__({"cell": on_cell})
        self._width = 380
        self.layout.margin = "0 16px 0 0"
        self.layout.flex = "0 0 auto"
        self.add_class(self.css_class)


class WherePanel(HeatmapPanel):
    """The rank × step view (same cell selection as the heat map)."""

    css_class = "precnb-where"

    def __init__(self, on_cell: Callable[[dict[str, Any]], None]) -> None:
        super().__init__(on_cell)
        self._width = 480
        self.layout.margin = "0"


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON-ready records of a frame (NaN → None, numpy scalars → Python).

    Examples
    --------
    >>> records(pd.DataFrame({"a": [1.0, float("nan")], "b": ["x", "y"]}))
    [{'a': 1.0, 'b': 'x'}, {'a': None, 'b': 'y'}]
    """
    cols = {}
    for name in frame.columns:
        col = frame[name]
        if col.dtype.kind == "f":
            vals = col.to_numpy()
            cols[name] = [None if v != v else float(v) for v in vals.tolist()]  # v != v: NaN
        elif col.dtype.kind in "iub":
            cols[name] = col.to_numpy().tolist()
        else:
            cols[name] = [v.item() if isinstance(v, np.generic) else (None if v is None or v != v else v)
                          for v in col.tolist()]
    names = list(cols)
    return [dict(zip(names, row, strict=True)) for row in zip(*cols.values(), strict=True)]


_SHARED_LINES: dict[Any, Any] = {}  # a line chart of each key (statistic, steps, non-finite), any explorer's


class SeriesPanel(_ChartPanel):
    """The line chart; ``pick`` (a point) and ``span`` (a step brush) call their handlers.

    The chart is built (and validated) once per statistic; a new selection only swaps the
    data and title in the synced spec, which keeps a selection's update well under the
    200 ms budget on 1,000-rank runs.
    """

    def __init__(self, on_pick: Callable[[dict[str, Any]], None],
                 on_span: Callable[[dict[str, Any]], None]) -> None:
        super().__init__({"pick": on_pick, "span": on_span})
        self.chart.debounce_wait = 250  # send the brush once the drag settles
        self.chart.max_wait = False
        self._width = 520
        self._template: tuple[Any, dict[str, Any], str] | None = None
        self.add_class("precnb-lines")

    def show(self, frame: pd.DataFrame, *, key: Any, build: Callable[[], alt.TopLevelMixin],
             title: str, caption: str = "") -> None:
        """Show *frame*; *build* makes the chart when *key* (e.g. the statistic) changed."""
        tpl = self._template
        if tpl is None or tpl[0] != key:
            # the charts of a key are shared by every explorer of the kernel (issue 51: building them again was a
            # good part of explore()'s cost beyond the triage); one spec message, with this frame's data
            with self.chart.hold_sync():
                shared = _SHARED_LINES.get(key)
                chart = shared if shared is not None else build()
                self.set_chart(chart, caption=caption)
                spec = self.chart.spec or {}
                names = list(spec.get("datasets", {}))
                self._template = (key, spec, names[0]) if len(names) == 1 else None
                if shared is None:
                    _SHARED_LINES[key] = spec_once(chart, spec)
                    while len(_SHARED_LINES) > 32:
                        _SHARED_LINES.pop(next(iter(_SHARED_LINES)))
                    return
                if self._template is not None:
                    self.chart.spec = {**spec, "datasets": {names[0]: records(frame)}, "title": title}
            return
        spec = dict(tpl[1])
        spec["datasets"] = {tpl[2]: records(frame)}
        spec["title"] = title
        self.chart.spec = spec
        self.set_caption(caption)
