"""The two heat maps: modules (or nodes, tensors) × steps, and ranks × steps ("where").

Wiring only: frames from :mod:`precnb.viz`, colour values from :class:`ExplorerData`. A click
(or a key press) on either becomes a :class:`Pick` — the record its cell stands for (in "first
bad" colour the cell's first flagged record, else its worst one) — handed to ``on_pick``.
"""

from __future__ import annotations

import copy
import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd

from precnb.viz import heatmap_chart, heatmap_frame
from precnb.viz.charts import first_bad_domain, heatmap_width, mark_selected
from precnb.viz.selections import read_point
from precnb.viz.values import Color
from precnb.viz.where import where_frame
from precnb.widgets.charts import HeatmapPanel, WherePanel, records, spec_once

__all__ = ["HEATMAP_COLUMNS", "HeatView", "Pick", "contract_frame"]

LABEL_LIMIT = 200
"""Most pixels of a heat-map row label in the explorer (the record's column needs the rest of the width)."""

HEATMAP_COLUMNS = ["row", "group", "x", "x_hi", "value", "first_bad", "col", "step", "step_hi", "rank_lo", "rank_hi",
                   "tensor", "worst_step", "worst_rank", "nonfinite", "records", "focus"]
"""Columns of :meth:`precnb.widgets.explorer.Explorer.heatmap_frame`."""


def contract_frame(frame: pd.DataFrame, *, color: str, by: str, rows: str) -> pd.DataFrame:
    """The main heat map's cells as :meth:`~precnb.widgets.explorer.Explorer.heatmap_frame` returns them.

    ``value`` is the colour value (larger = more salient) and NaN for clean cells: no flagged record
    (first bad), a zero count, an exactly equal cell (rel. diff), no finite value (statistic).
    """
    if not len(frame):
        out = pd.DataFrame({c: [] for c in HEATMAP_COLUMNS})
        out.attrs.update(x=by, color=color, rows=rows)
        return out
    out = frame[HEATMAP_COLUMNS].copy()
    mode = frame.attrs.get("color", color)
    value = out["value"].astype(float)
    if mode == "first_bad":
        clean = out["first_bad"] <= 0
    elif mode in ("nonfinite", "events"):
        clean = value <= 0
    elif mode == "reldiff":
        clean = ~(value > 0)
    else:
        clean = ~np.isfinite(value)
    out["value"] = value.where(~clean, np.nan)
    out.attrs.update(x=frame.attrs.get("x", frame.attrs.get("by", by)), color=mode, rows=rows)
    return out


@dataclass
class Pick:
    """One selected record and the cell it was picked from."""

    step: int
    rank: int
    tensor: str
    row: str | None = None
    group: str | None = None
    unmerged: bool = False
    tensors: list[str] = field(default_factory=list)
    ranks: tuple[int, int] | None = None  # the cell's rank range (x = rank, or a rank bucket)
    source: str = "heatmap"


def _key(cell: Mapping[str, Any], grouped: bool) -> dict[str, str]:
    k = {"row": str(cell["row"]), "col": str(cell["col"])}
    if grouped:
        k["group"] = str(cell["group"])
    return k


def _set_domain(spec: Any, top: float) -> None:
    if isinstance(spec, dict):
        scale = spec.get("scale")
        if isinstance(scale, dict) and scale.get("type") == "log" and "domain" in scale:
            scale["domain"] = first_bad_domain(top)
        for v in spec.values():
            _set_domain(v, top)
    elif isinstance(spec, list):
        for v in spec:
            _set_domain(v, top)


_SHARED_CHARTS: dict[Any, Any] = {}
_SHARED_TEMPLATES: dict[Any, Any] = {}
_SHARED_MAX = 32


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    """Keep *value* under *key* (the oldest entries dropped beyond :data:`_SHARED_MAX`); returns *value*."""
    cache[key] = value
    while len(cache) > _SHARED_MAX:
        cache.pop(next(iter(cache)))
    return value


class _Drawn:
    """Charts built once per shape (colour mode, x dimension, groups): later frames only swap data.

    The first chart of a panel goes through ``JupyterChart.chart`` (validated; it sets up the
    ``cell`` selection); every later spec is assigned to ``JupyterChart.spec`` directly, built
    without validation (the builders are validated by the tests) and cached by shape, so switching
    back to a shape seen before only sends its new data.
    """

    def __init__(self, panel: HeatmapPanel) -> None:
        self.panel = panel
        self.templates: dict[Any, tuple[dict[str, Any], str]] = {}

    def draw(self, frame: pd.DataFrame, shape: Any, build: Callable[[], Any], selected: dict[str, str] | None,
             caption: str) -> None:
        frame = mark_selected(frame, selected)  # outlined through the data: a click on it still reaches Python
        with self.panel.chart.hold_sync():  # one spec message: this frame's (not a shared chart's own data)
            self._draw(frame, shape, build, caption)

    def _draw(self, frame: pd.DataFrame, shape: Any, build: Callable[[], Any], caption: str) -> None:
        tpl = self.templates.get(shape)
        if tpl is None:
            # every explorer of the kernel shares the charts and templates of a shape (issue 51: building the
            # altair charts again was most of what explore() cost beyond the triage)
            key = (shape, "device" in frame and bool(frame["device"].astype(str).ne("").any()))
            shared = _SHARED_TEMPLATES.get(key)
            if self.panel.chart.spec is None:  # the panel's first chart: sets up its selections
                chart = _SHARED_CHARTS.get(key)
                fresh = chart is None
                if fresh:
                    chart = build()
                self.panel.set_chart(chart, caption=caption)
                spec = dict(self.panel.chart.spec or {})
                if fresh:  # its spec kept: the next explorer's first chart does not serialise it again
                    _remember(_SHARED_CHARTS, key, spec_once(chart, spec))
            elif shared is not None:
                spec = {**shared[0], "datasets": {shared[1]: []}}
            else:
                import altair as alt

                with alt.data_transformers.disable_max_rows():
                    spec = build().to_dict(validate=False)
            names = list(spec.get("datasets", {}))
            if len(names) != 1:  # not the one-dataset shape the fast path knows: draw it as it is
                self.panel.chart.spec = spec
                self.panel.set_caption(caption)
                return
            tpl = _remember(_SHARED_TEMPLATES, key, ({k: v for k, v in spec.items() if k != "datasets"}, names[0]))
            self.templates[shape] = tpl
        spec = copy.deepcopy(tpl[0])
        spec["datasets"] = {tpl[1]: records(frame)}
        if frame.attrs.get("color") == "first_bad":
            _set_domain(spec, float(frame["color"].max()) if frame["color"].notna().any() else 1.0)
        self.panel.chart.spec = spec
        self.panel.set_caption(caption)

    def reset(self) -> None:
        """Forget the cached shapes (new runs)."""
        self.templates.clear()


class HeatView:
    """Builds and draws both heat maps from the filter bar; turns clicks into :class:`Pick`."""

    def __init__(self, data: Any, filters: Any, on_pick: Callable[[Pick], None],
                 current: Callable[[], str | None] = lambda: None) -> None:
        self.data = data
        self.filters = filters
        self.on_pick = on_pick
        self.current = current
        self.main = HeatmapPanel(self._on_main)
        self.where = WherePanel(self._on_where)
        self._main = _Drawn(self.main)
        self._where = _Drawn(self.where)
        self.frame = pd.DataFrame()
        self.where_frame_ = pd.DataFrame()
        self.where_ds: Any = None
        self.where_unmerged = False

    # -- building -----------------------------------------------------------------------------
    def color(self) -> str:
        """The colour mode in effect (rel. diff without a baseline, or tensor metrics without them: the statistic)."""
        c = self.filters.color.value
        if c == "tensor" and self.data.tensor_metric(self.filters.metric.value) is None:
            return "stat"
        return c if (c != "reldiff" or self.data.runs.baseline) else "stat"

    def build_main(self, focus: Mapping[str, Any] | None = None) -> pd.DataFrame:
        """The main heat map's frame for the filter bar (``focus``: keep and outline that record)."""
        f, ds = self.filters, self.data.target()
        color = self.color()
        return heatmap_frame(ds, by=f.by.value, rows=f.rows.value, color=color, stat=f.stat.value,
                             tensors=self.data.mask(), steps=f.step_list(ds), ranks=f.rank_list(),
                             top_k=f.top_k.value, focus=focus, values=self.data.values(color, f.stat.value),
                             groups=True, sort=f.sort.value)

    def build_where(self, focus: Mapping[str, Any] | None = None) -> pd.DataFrame:
        """The rank × step frame (the dump's ranks when the target's merged shards disagree)."""
        f = self.filters
        color = self.color()
        ds, values, unmerged, what = self.data.where(color, f.stat.value)
        self.where_ds, self.where_unmerged = ds, unmerged
        if unmerged:  # a finding's rank is a merged one: it names no row of the dump's ranks
            focus = None
        mask, steps, ranks = self.data.mask(ds), f.step_list(ds), None if unmerged else f.rank_list()
        # rows, x and sort do not change it: rebuilt only when what it aggregates changes
        key = ("where_frame", id(ds), color, f.stat.value, mask.tobytes(), tuple(steps),
               tuple(ranks) if ranks is not None else None, tuple(sorted((focus or {}).items())))
        mode = cast(Color, color)
        frame = self.data.cached(key, lambda: where_frame(ds, color=mode, stat=f.stat.value, values=values,
                                                          tensors=mask, steps=steps, ranks=ranks, focus=focus))
        frame.attrs["what"] = what
        labels = self.data.device_labels()
        if labels and (unmerged or self.data.raw() is None):  # the dump's ranks: host and device beside each
            from precnb.viz.where import with_devices

            frame = with_devices(frame, labels)
        return frame

    def update(self, *, focus: Mapping[str, Any] | None = None) -> pd.DataFrame:
        """Rebuild both frames (not drawn yet); returns the main one."""
        self.frame = self.build_main(focus)
        wfocus = {"step": focus.get("step"), "rank": focus.get("rank")} if focus else None
        self.where_frame_ = self.build_where(wfocus)
        return self.frame

    def draw_main(self, selected: dict[str, str] | None) -> None:
        """Draw the main frame with *selected* outlined."""
        f, frame = self.filters, self.frame
        n_total = frame.attrs.get("n_rows_total", 0)
        n_rows = len(frame[["group", "row"]].drop_duplicates()) if len(frame) else 0
        color = self.color()
        hidden = ""
        if color == "first_bad":
            n_flag = frame.loc[frame["first_bad"] > 0, ["group", "row"]].drop_duplicates().shape[0] if len(frame) \
                else 0
            hidden = (f"; {n_total - n_rows} clean row(s) not shown" if n_rows < n_total and n_flag == n_rows
                      else "")
            lead = (f"colour: how early each cell's first flagged record comes (1 = earliest; flagged: "
                    f"{html.escape(self.data.what_flagged())})")
        elif color == "tensor":
            lead = (f"colour: tensor metric {html.escape(dict((v, k) for k, v in f.metric.options)[f.metric.value])} "
                    "of the whole tensors (msprobe compare's formulas), the worst record of each cell")
        else:
            lead = "colour: " + html.escape(dict((v, k) for k, v in f.color.options).get(color, color))
        caption = (f"{n_rows} of {n_total} {html.escape(f.rows.value)} rows{hidden}; {lead}. Click a cell "
                   "(shift-click adds); arrow keys move")
        width = self.cells_width(frame)  # the template holds the width
        shape = ("main", color, f.by.value, f.stat.value, f.metric.value if color == "tensor" else "",
                 tuple(sorted(set(frame["group"]))) if len(frame) else (), width)
        self._main.draw(frame, shape, lambda: heatmap_chart(frame, stat=f.stat.value, selected=selected, width=width,
                                                            label_limit=LABEL_LIMIT), selected, caption)
        # the panel as wide as its chart (cells + row labels + the facet's margin): the record beside it
        self.main.layout.width = f"{width + LABEL_LIMIT + 40}px"

    @staticmethod
    def cells_width(frame: pd.DataFrame) -> int:
        """The cells' width in the explorer: up to 36 px a column, 240-720 px (a few steps still fill the map)."""
        return heatmap_width(frame["col"].nunique() if len(frame) else 1, cell=36, lo=240, hi=720)

    def draw_where(self, selected: dict[str, str] | None) -> None:
        """Draw the rank × step frame with *selected* outlined."""
        f, wf = self.filters, self.where_frame_
        color = self.color()
        what = wf.attrs.get("what") or ""
        n_ranks = self.where_ds.sizes["rank"] if self.where_ds is not None else 0
        marked = [f"rank {r} on {lab}" for r, lab in self.data.device_labels().items() if "(" in lab]
        caption = (f"where: {n_ranks} rank(s) × steps" + (" — the target as dumped, before merging its shards"
                                                           if self.where_unmerged else "")
                   + (f"; devices: {html.escape(', '.join(marked))}" if marked else "")
                   + (f"; first bad = {html.escape(what)}" if color == "first_bad" and what else ""))
        width = self.cells_width(wf)
        shape = ("where", color, f.stat.value, self.where_unmerged, width)
        self._where.draw(wf, shape, lambda: heatmap_chart(wf, stat=f.stat.value, selected=selected, width=width,
                                                          y_title="rank", row_height=16, label_limit=LABEL_LIMIT),
                         selected, caption)

    # -- picking ------------------------------------------------------------------------------
    def _on_main(self, change: dict[str, Any]) -> None:
        cells = read_point(change["new"])
        if cells:
            pick = self.pick_cells(cells)
            if pick is not None:
                self.on_pick(pick)

    def _on_where(self, change: dict[str, Any]) -> None:
        cells = read_point(change["new"])
        if cells:
            pick = self.pick_where(cells[-1], self.current())
            if pick is not None:
                self.on_pick(pick)

    def _match(self, fr: pd.DataFrame, c: Mapping[str, Any]) -> pd.DataFrame:
        m = fr[(fr["row"] == str(c.get("row"))) & (fr["col"].astype(str) == str(c.get("col")))]
        if "group" in c and "group" in fr:
            m = m[m["group"] == str(c["group"])]
        return m

    def pick_cells(self, cells: Sequence[Mapping[str, Any]]) -> Pick | None:
        """The record of main-map cells (``{"row", "col"[, "group"]}``): the last one decides."""
        tensors: list[str] = []
        hit = None
        for c in cells:
            m = self._match(self.frame, c)
            if not len(m):
                continue
            hit = m.iloc[0]
            t = str(hit["tensor"]) or self.data.largest(str(hit["row"]), int(hit["step"]), str(hit["group"]) or None)
            if t and t not in tensors:
                tensors.append(t)
        if hit is None or not tensors:
            return None
        step = int(hit["worst_step"]) if hit["worst_step"] >= 0 else int(hit["step"])
        rank = int(hit["worst_rank"]) if hit["worst_rank"] >= 0 else int(hit["rank_lo"])
        return Pick(step=step, rank=rank, tensor=tensors[-1], row=str(hit["row"]), group=str(hit["group"]) or None,
                    tensors=tensors[-4:], ranks=(int(hit["rank_lo"]), int(hit["rank_hi"])))

    def pick_where(self, c: Mapping[str, Any], current: str | None = None) -> Pick | None:
        """The record of a rank × step cell: its first flagged record, else *current* (the selected tensor)."""
        m = self._match(self.where_frame_, c)
        if not len(m):
            return None
        hit = m.iloc[0]
        tensor = str(hit["tensor"])
        ds = self.where_ds
        if not tensor:  # nothing flagged here: the same tensor at this step and rank
            if current is None or current not in ds.indexes["tensor"]:
                return None
            tensor = current
        step = int(hit["worst_step"]) if hit["worst_step"] >= 0 else int(hit["step"])
        rank = int(hit["worst_rank"]) if hit["worst_rank"] >= 0 else int(hit["rank_lo"])
        grp_row = self.data.row_of(tensor, ds, step, None if self.where_unmerged else rank)
        return Pick(step=step, rank=rank, tensor=tensor, row=grp_row[1] if grp_row else None,
                    group=grp_row[0] if grp_row else None, unmerged=self.where_unmerged, tensors=[tensor],
                    ranks=(int(hit["rank_lo"]), int(hit["rank_hi"])), source="where")

    # -- locating -----------------------------------------------------------------------------
    def main_cell(self, step: int | None, rank: int | None, tensor: str | None) -> dict[str, str] | None:
        """The main-map cell holding a record (as a selection value), None when not shown."""
        fr = self.frame
        if tensor is None or step is None or not len(fr):
            return None
        gr = self.data.row_of(tensor, None, step, rank)
        if gr is None:
            return None
        m = fr[(fr["group"] == gr[0]) & (fr["row"] == gr[1]) & (fr["step"] <= step) & (fr["step_hi"] >= step)]
        if rank is not None and len(m):
            m = m[(m["rank_lo"] <= rank) & (m["rank_hi"] >= rank)] if self.filters.by.value == "rank" else m
        if not len(m):
            return None
        return _key(m.iloc[0], True)

    def where_cell(self, step: int | None, rank: int | None) -> dict[str, str] | None:
        """The rank × step cell holding (step, rank)."""
        fr = self.where_frame_
        if step is None or rank is None or not len(fr):
            return None
        m = fr[(fr["step"] <= step) & (fr["step_hi"] >= step) & (fr["rank_lo"] <= rank) & (fr["rank_hi"] >= rank)]
        return _key(m.iloc[0], False) if len(m) else None

    def neighbour(self, cell: Mapping[str, str] | None, d_row: int, d_col: int) -> dict[str, str] | None:
        """The main-map cell *d_row* rows down and *d_col* columns right of *cell* (clamped)."""
        fr = self.frame
        if not len(fr):
            return None
        rows = fr.drop_duplicates(["group", "row"]).sort_values(["row_order"])[["group", "row"]].values.tolist()
        cols = fr.drop_duplicates("col").sort_values("col_order")["col"].tolist()
        if cell is None:
            r_i, c_i = 0, 0
        else:
            try:
                r_i = rows.index([cell.get("group"), cell.get("row")])
                c_i = cols.index(cell.get("col"))
            except ValueError:
                r_i, c_i = 0, 0
            r_i = min(max(r_i + d_row, 0), len(rows) - 1)
            c_i = min(max(c_i + d_col, 0), len(cols) - 1)
        return {"group": str(rows[r_i][0]), "row": str(rows[r_i][1]), "col": str(cols[c_i])}
