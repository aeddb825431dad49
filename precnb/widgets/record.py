"""The selected record's views: the line chart over steps, the detail table, the status line.

The status line says what is selected and how the heat map's row relates to the finding's
module: a row is the innermost module that recorded the tensor (``blocks.1.attn``), while a
finding may name the module it blames (``blocks.1``: the innermost module whose inputs agree
and whose output differs).
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as ipw

from precnb.viz import detail_frame, line_chart, series_frame
from precnb.viz.series import informative_series, same_op_series
from precnb.widgets.charts import SeriesPanel
from precnb.widgets.detail import DetailPanel

__all__ = ["RecordView", "attribution_html", "elsewhere_html", "same_op_note"]


def elsewhere_html(evidence: dict[str, Any]) -> str:
    """A warning when the selected label names another op on other ranks (empty otherwise)."""
    groups = evidence.get("elsewhere") or []
    if not groups:
        return ""
    e = html.escape
    parts = [f"rank{'s' if len(g['ranks']) > 1 else ''} {e(', '.join(map(str, g['ranks'][:8])))}: module "
             f"<code>{e(g['module'] or '—')}</code>, shape <code>{e(g['shape'] or '—')}</code>" for g in groups[:3]]
    return ("<div class='precnb-elsewhere' style='color:#b76e00'>this label names another op on "
            + "; ".join(parts) + " (their call counters differ): module, shape and stack here are rank "
            f"{e(str(evidence.get('rank')))}'s own; lines of other ranks are other ops</div>")


def same_op_note(frame: Any, tensor: str, step: int, rank: int) -> str:
    """What a :func:`~precnb.viz.series.same_op_series` chart follows, and where that op does not exist (text)."""
    parts = [f"; the op rank {rank} recorded as {tensor} at step {step}, followed on every rank by its module, "
             "parent and shape (call counters differ between ranks)"]
    for r, labels in sorted(frame.attrs.get("relabelled", {}).items()):
        parts.append(f"; on rank {r} it is {', '.join(labels[:3])}")
    for r, steps in sorted(frame.attrs.get("missing", {}).items()):
        parts.append(f"; rank {r} has no such op at step{'s' if len(steps) > 1 else ''} "
                     f"{', '.join(map(str, steps[:12]))}{' …' if len(steps) > 12 else ''}")
    return "".join(parts)


def attribution_html(row: str | None, rows: str, finding: Any, *, node: str | None) -> str:
    """One line relating the selected heat-map row to the finding's module (empty without a finding)."""
    e = html.escape
    if finding is None or not getattr(finding, "found", False) or not row:
        return ""
    f_mod = finding.module or ""
    ev = finding.evidence if isinstance(finding.evidence, dict) else {}
    culprit = ev.get("culprit") or {}
    if rows != "module":
        return (f"<span class='precnb-attr'>rows are {e(rows)}s; the finding is <code>{e(finding.node or '')}"
                f"</code> in module <code>{e(f_mod or '—')}</code></span>")
    parts = [f"row <code>{e(row)}</code> is the innermost module that recorded <code>{e(node or '—')}</code>"]
    if f_mod == row:
        parts.append("the finding names the same module")
    elif f_mod and culprit.get("module") == f_mod:
        parts.append(f"the finding names <code>{e(f_mod)}</code>: the innermost module around its first "
                     f"difference whose inputs agree and whose output differs (<code>"
                     f"{e(str(culprit.get('node') or ''))}</code>), so the module to blame")
    elif f_mod:
        parts.append(f"the finding names <code>{e(f_mod)}</code>, the module of its node "
                     f"<code>{e(finding.node or '')}</code>")
    return "<span class='precnb-attr'>" + "; ".join(parts) + "</span>"


class RecordView:
    """Line chart, detail table, status and attribution for the explorer's selected record."""

    def __init__(self, data: Any, filters: Any, *, max_lines: int = 12,
                 on_pick: Any = None, on_span: Any = None) -> None:
        self.data = data
        self.filters = filters
        self.max_lines = max_lines
        self.lines = SeriesPanel(on_pick or (lambda _c: None), on_span or (lambda _c: None))
        self.detail = DetailPanel()
        self.status = ipw.HTML("<b>selected</b>: nothing yet — click a heat-map cell")
        self.status.add_class("precnb-selection")
        self.attribution = ipw.HTML("")
        self.attribution.add_class("precnb-attribution")
        self.series: Any = None
        # the selected tensor's values in both runs (tensor-mode pairs), loaded only when asked for
        self.hist_toggle = ipw.ToggleButton(value=False, description="value histogram", icon="bar-chart",
                                            tooltip="load the selected tensor from both runs' tensor files",
                                            layout=ipw.Layout(width="170px", display="none"))
        self.hist_box = ipw.VBox([])
        self.hist_box.add_class("precnb-histogram")
        self.histogram: Any = None
        self._state: Any = None
        self.hist_toggle.observe(lambda _c: self.update_histogram(self._state), names="value")

    def _ds(self, unmerged: bool) -> Any:
        raw = self.data.raw() if unmerged else None
        return raw if raw is not None else self.data.target()

    def show(self, state: Any, *, tensors: list[str] | None = None, ranks: tuple[int, int] | None = None,
             redraw_lines: bool = True) -> None:
        """Redraw for ``state`` (the explorer: step, rank, tensor, row, unmerged, current_finding)."""
        if state.tensor is None:
            return
        if redraw_lines:
            self._lines(state, tensors or [state.tensor], ranks)
        self.update_detail(state)

    # -- values of one tensor (tensor-mode pairs) -------------------------------------------------
    def tensor_pair(self) -> bool:
        """The runs are a tensor-mode pair (their tensor files can be read)."""
        t = self.data.triage
        return t is not None and t.paired and getattr(t, "tensor_metrics", None) is not None

    def update_histogram(self, state: Any) -> None:
        """Draw the selected tensor's value histogram, both runs overlaid, when the toggle is on."""
        self._state = state
        self.hist_toggle.layout.display = None if self.tensor_pair() else "none"
        if state is None or not self.hist_toggle.value or not self.tensor_pair() or state.tensor is None:
            self.hist_box.children = []
            return
        chart, message = self._histogram_chart(state)
        self.histogram = chart
        self.hist_box.children = [chart] if chart is not None else [ipw.HTML(message)]

    def _histogram_chart(self, state: Any) -> tuple[Any, str]:
        """(JupyterChart, "") of the values of both runs, or (None, why not)."""
        from precnb.io.tensors import load_array, tensor_file
        from precnb.viz.histogram import histogram_chart, histogram_frame
        from precnb.widgets.charts import offline_chart

        t = self.data.triage
        names = (str(t.names[0]), str(t.names[1]))
        off = int(t.step_offset or 0)
        m = t.tensor_metrics
        label = state.tensor
        base_label = str(m["baseline_tensor"].sel(tensor=label).values) if label in m.indexes["tensor"] else label
        step, rank = int(state.step), int(state.rank)
        e = html.escape
        try:
            values = {names[0]: load_array(tensor_file(t.raw_baseline, base_label, step=step, rank=rank))[0],
                      names[1]: load_array(tensor_file(t.raw_target, label, step=step + off, rank=rank))[0]}
        except Exception as err:  # no file for this record, a .pt only torch can read, ...
            return None, (f"<span style='color:#b76e00'>no values for <code>{e(label)}</code> at step {step}, rank "
                          f"{rank}: {e(type(err).__name__)}: {e(str(err))}</span>")
        frame = histogram_frame(values)
        note = "; ".join(f"{k}: {v} NaN/inf" for k, v in frame.attrs["nonfinite"].items() if v)
        chart = histogram_chart(frame, title=f"values of {label}" + (f" ({note})" if note else ""))
        return offline_chart(chart), ""

    def _lines(self, state: Any, tensors: list[str], ranks: tuple[int, int] | None) -> None:
        f = self.filters
        runs = self.data.runs
        ds = self._ds(state.unmerged)
        steps = f.step_list(ds)
        stat = f.stat.value
        if len(tensors) == 1:  # a flat line says nothing: add the node's inputs that change, or another stat
            tensors, stat = informative_series(ds, tensors, stat)
        other = self.data.evidence(state.tensor, ds, state.step, None if state.unmerged else state.rank).get(
            "elsewhere") or []
        same_op = bool(other) and "run" not in ds.dims and not (runs.names and not state.unmerged)
        if same_op:  # the label names other ops elsewhere: follow the op itself (issue 51)
            sel = None if state.unmerged else f.rank_list()
            every = [int(r) for r in ds["rank"].values.tolist() if sel is None or r in sel]
            keep = [state.rank, *[r for r in every if r != state.rank][: max(self.max_lines - 1, 0)]]
            tensors, stat = [state.tensor], f.stat.value
            frame = same_op_series(ds, state.tensor, step=state.step, rank=state.rank, stat=stat,
                                   ranks=sorted(keep), steps=steps)
        elif runs.names and not state.unmerged:
            run = f.run.value
            both = [runs.baseline, run] if runs.baseline != run else [run]
            frame = series_frame(runs.ds, tensors, stat=stat, ranks=[state.rank], steps=steps, runs=both)
        else:
            sel = None if state.unmerged else f.rank_list()
            if ranks is not None and f.by.value == "rank" and not state.unmerged:
                sel = [r for r in ds["rank"].values.tolist() if ranks[0] <= r <= ranks[1]]
            frame = series_frame(ds, tensors, stat=stat, ranks=sel, steps=steps,
                                 keep_ranks=[state.rank], max_lines=self.max_lines)
        self.series = frame
        shown = frame.attrs.get("ranks_drawn", 0)
        note = (f" ({shown} of {frame.attrs.get('ranks_total')} ranks: selected + most deviating)"
                if frame.attrs.get("ranks_total", 0) > shown else "")
        key = (stat, tuple(sorted(set(frame["step"].tolist()))), bool(len(frame) and frame["nonfinite"].any()))
        added = [t for t in tensors if t != state.tensor]
        note += f"; with its node's input {', '.join(added)} (its own {f.stat.value} is flat)" if added else ""
        note += f"; {stat} shown ({f.stat.value} does not change)" if stat != f.stat.value else ""
        if same_op:
            note += same_op_note(frame, state.tensor, state.step, state.rank)
        elif other:
            other_ranks = sorted({r for g in other for r in g["ranks"]})
            note += (f"; on rank(s) {', '.join(map(str, other_ranks[:8]))} this label is another op (their call "
                     "counters differ): their lines are not this tensor")
        title = state.tensor
        self.lines.show(frame, key=key, title=title,
                        build=lambda: line_chart(frame, stat=stat, title=title, width=420, height=180),
                        caption=f"{html.escape(stat)} over steps{html.escape(note)}; click a point for its "
                                "record, drag to zoom the heat map to those steps")

    def update_detail(self, state: Any) -> None:
        """Redraw the detail table, the status line and the attribution line."""
        f = self.filters
        runs = self.data.runs
        ds = self._ds(state.unmerged)
        cmp = bool(runs.names) and runs.baseline != f.run.value and not state.unmerged
        tensors = self.data.node_tensors(state.tensor, ds)
        if state.row and not state.unmerged:
            row_t = self.data.row_tensors(state.row, getattr(state, "group", None), None, state.step, state.rank)
            tensors = row_t if state.tensor in row_t else tensors
        frame = detail_frame(runs.ds if cmp else ds, step=state.step, rank=state.rank, tensors=tensors,
                             run=f.run.value if cmp else None, baseline=runs.baseline if cmp else None,
                             focus=state.tensor, merged=None if state.unmerged else self.data.shard_kinds(),
                             limit=8)  # the origin, its neighbours and its stack on one screen
        ev = self.data.evidence(state.tensor, self._owner(state, ds), state.step, state.rank)  # that rank's own
        where = " (rank as dumped, before merging shards)" if state.unmerged else ""
        self.detail.show(frame, ev, focus=state.tensor,
                         title=f"{state.row or ev.get('module') or ''} at step {state.step}, rank {state.rank}{where}")
        e = html.escape
        hidden = "" if (state.unmerged or self._visible(state)) else (
            " <i style='color:#b76e00'>(hidden by the filters: clear the search or tick its group)</i>")
        self.status.value = (f"<b>selected</b>: step {state.step} · rank {state.rank}{e(where)} · "
                             f"<code>{e(state.tensor or '')}</code> · node <code>{e(ev.get('node') or '—')}</code>"
                             f" · module <code>{e(ev.get('module') or '—')}</code> · shape "
                             f"<code>{e(ev.get('shape') or '—')}</code>{hidden}{elsewhere_html(ev)}")
        self.attribution.value = attribution_html(state.row, f.rows.value, state.current_finding,
                                                  node=ev.get("node"))
        self.update_histogram(state)

    def _owner(self, state: Any, ds: Any) -> Any:
        """The run that recorded the selected entry: the baseline for a computation only the baseline has."""
        runs = self.data.runs
        if state.unmerged or not runs.names or not runs.baseline or runs.baseline == self.filters.run.value:
            return ds
        t, s, r = state.tensor, state.step, state.rank
        if t in ds.indexes["tensor"] and s in ds.indexes["step"] and r in ds.indexes["rank"] and bool(
                ds["present"].sel(step=s, rank=r, tensor=t)):
            return ds
        base = runs.run(runs.baseline)
        here = t in base.indexes["tensor"] and s in base.indexes["step"] and r in base.indexes["rank"] and bool(
            base["present"].sel(step=s, rank=r, tensor=t))
        return base if here else ds

    def _visible(self, state: Any) -> bool:
        ds = self.data.target()
        if state.tensor not in ds.indexes["tensor"]:
            return False
        return bool(self.data.mask()[ds.indexes["tensor"].get_loc(state.tensor)])
