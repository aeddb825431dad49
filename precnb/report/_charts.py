"""Vega-Lite specifications for the report, built with :mod:`precnb.viz` (bounded in size).

Every chart is aggregated by :mod:`precnb.viz` to a bounded number of cells (top rows ×
step buckets × rank buckets), so a 1,000-rank run gives specs of the same size as a 2-rank
one. Specs are plain dicts (no ``$schema`` URL); the page embeds them with one inlined
vega-embed bundle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import xarray as xr

from precnb.report._inputs import ReportData

__all__ = ["ChartSpec", "Limits", "build_charts", "comparison_dataset"]


@dataclass(frozen=True)
class Limits:
    """Size bounds of the report's charts and tables."""

    top_k: int = 30
    step_groups: int = 24
    rank_groups: int = 8
    rank_cols: int = 32
    max_lines: int = 8
    detail_rows: int = 40
    table_rows: int = 50


@dataclass
class ChartSpec:
    """One chart of the report."""

    id: str
    title: str
    caption: str
    spec: dict[str, Any]
    kind: str = "static"  # "linked" for the heat map → line chart view
    frame: pd.DataFrame | None = field(default=None, repr=False)


def _spec(chart: Any) -> dict[str, Any]:
    import altair as alt

    with alt.data_transformers.disable_max_rows():  # the builders are validated by the tests: not again here
        spec = chart.to_dict(validate=False)
    spec.pop("$schema", None)
    spec.setdefault("config", {}).setdefault("view", {}).setdefault("stroke", "transparent")
    return spec


def _step_ticks(spec: dict[str, Any], steps: Any) -> dict[str, Any]:
    """Integer step ticks on the linked line chart (a quantitative axis repeats labels like 1, 1)."""
    vals = sorted({int(s) for s in steps})
    for view in spec.get("vconcat", [])[1:]:
        axis = view.get("encoding", {}).get("x", {}).get("axis")
        if isinstance(axis, dict) and 0 < len(vals) <= 24 and "values" not in axis:
            axis["values"] = vals
    return spec


def comparison_dataset(data: ReportData) -> xr.Dataset | None:
    """Baseline and target on shared steps/ranks (target steps shifted by the offset), as runs."""
    if data.baseline is None:
        return None
    from precnb.analysis import compare_runs

    cmp = compare_runs(data.baseline, data.target, step_offset=data.step_offset, disjoint="union")
    return cmp.ds.assign_coords(run=("run", list(data.names)))


def color_mode(data: ReportData, finding: Any) -> str:
    """What the heat maps colour: relative difference, NaN events or the statistic."""
    if data.compared:
        return "reldiff"
    from precnb.analysis.registry import lookup

    d = lookup(finding.kind) if finding is not None else None
    return d.report.color if d is not None else "stat"  # the diagnosis's own colour (the NaN origin: "events")


_CAPTIONS = {
    "reldiff": "largest relative difference target vs baseline over the four statistics (log10; grey = equal)",
    "events": "NaN and unexpected ±inf records (mask infinities are not counted)",
    "stat": "largest |{stat}| (red: only non-finite values recorded)",
    "nonfinite": "non-finite records",
}


def _focus(finding: Any, ds: xr.Dataset | None = None) -> dict[str, Any] | None:
    if finding is None or not finding.found or not finding.tensor:
        return None
    from precnb.analysis.findings import shown_record

    rec = shown_record(finding, [int(r) for r in ds["rank"].values] if ds is not None else [])
    if rec is not None and (ds is None or rec[2] in ds.indexes["tensor"]):  # the origin record, when it has one
        return {"step": rec[0], "rank": rec[1], "tensor": rec[2]}
    return {"step": finding.step, "rank": finding.rank, "tensor": finding.tensor}


def build_charts(data: ReportData, finding: Any, *, stat: str = "norm", limits: Limits | None = None,
                 combined: xr.Dataset | None = None) -> list[ChartSpec]:
    """The report's charts: linked heat map → line chart, the finding's tensor, ranks.

    Parameters
    ----------
    data : ReportData
    finding : Finding or None
        The primary finding (focus of the views).
    stat : str
        Statistic drawn when colouring by value.
    limits : Limits, optional
    combined : xarray.Dataset, optional
        :func:`comparison_dataset` of *data* (computed when needed and not given).

    Returns
    -------
    list of ChartSpec
    """
    import precnb.viz as viz
    from precnb.viz.series import informative_series

    lim = limits or Limits()
    mode = color_mode(data, finding)
    focus = _focus(finding, data.target)
    names = data.names
    if data.compared and combined is None:
        combined = comparison_dataset(data)
    src: xr.Dataset = combined if combined is not None else data.target
    kw: dict[str, Any] = {"rows": "module", "color": mode, "stat": stat, "top_k": lim.top_k, "focus": focus}
    if combined is not None:
        kw.update(run=names[1], baseline=names[0])
    charts: list[ChartSpec] = []
    n_ranks = int(data.target.sizes["rank"])

    cube = viz.cube_frame(src, step_groups=lim.step_groups, rank_groups=lim.rank_groups, **kw)
    if len(cube):
        n_total = cube.attrs.get("n_rows_total", 0)
        rank_note = (f"ranks in {cube['ranks'].nunique()} buckets of {cube.attrs.get('rank_size', 1)}"
                     if cube.attrs.get("rank_size", 1) > 1 else "one line per rank")
        charts.append(ChartSpec(
            id="linked", kind="linked", frame=cube,
            title="Modules × steps → values over steps",
            caption=(f"Heat map: {_CAPTIONS[mode].format(stat=stat)}; {cube['row'].nunique()} of {n_total} "
                     f"modules, top by colour. Click a row's cell to plot that module over steps below "
                     f"({rank_note}); shift-click adds rows, double-click clears. Outlined in black: the selected "
                     f"module{', which starts on the finding' if focus else ''}."),
            spec=_step_ticks(_spec(viz.linked_chart(cube, stat=stat)), cube["step"])))

    tensors = _series_tensors(finding, src)
    s_stat = stat
    if tensors:
        tensors, s_stat = informative_series(data.target if combined is None else src, tensors, stat,
                                             node=finding.node)
        if combined is not None:
            frame = viz.series_frame(combined, tensors, stat=s_stat, ranks=[finding.rank],
                                     runs=[names[0], names[1]])
            what = f"{names[0]} vs {names[1]} on rank {finding.rank}"
        else:
            rank = focus["rank"] if focus is not None else finding.rank
            frame = viz.series_frame(data.target, tensors, stat=s_stat, keep_ranks=[rank] if rank is not None else [],
                                     max_lines=lim.max_lines)
            shown = frame.attrs.get("ranks_drawn", 0)
            total = frame.attrs.get("ranks_total", 0)
            what = (f"{shown} of {total} ranks: rank {rank}, the most deviating ones and the median"
                    if total > shown else "every rank")
        if len(frame):
            own = _series_tensors(finding, src)
            added = [t for t in tensors if t not in own]
            extra = (f" and {' and '.join(own[1:])}" if len(own) > 1 else "") + (
                f" with its node's input {', '.join(added)} (the finding's {stat} alone is a flat line)" if added
                else "") + (f"; {s_stat} shown ({stat} does not change)" if s_stat != stat else "")
            charts.append(ChartSpec(
                id="series", title=f"{s_stat} of the finding's tensor over steps", frame=frame,
                caption=f"{tensors[0]}{extra}: {what}; red dashed rules mark non-finite values. Drag to zoom "
                        "the step range.",
                spec=_spec(viz.line_chart(frame, stat=s_stat, title=" ", width=440, height=220))))

    if n_ranks > 1:
        frame = viz.heatmap_frame(src, by="rank", max_cols=lim.rank_cols, **kw)
        if len(frame):
            size = frame.attrs.get("rank_size", 1)
            charts.append(ChartSpec(
                id="ranks", title="Modules × ranks (all steps)", frame=frame,
                caption=(f"{_CAPTIONS[mode].format(stat=stat)}, over all steps; "
                         + (f"ranks in buckets of {size}; " if size > 1 else "")
                         + "hover a cell for its worst record (tensor, step, rank)."),
                spec=_spec(viz.heatmap_chart(frame, stat=stat, selection=False))))
    return charts


def _series_tensors(finding: Any, ds: xr.Dataset) -> list[str]:
    if finding is None or not finding.found or not finding.tensor:
        return []
    out = [finding.tensor]
    fvd = (finding.values or {}).get("first_value_difference")
    if isinstance(fvd, dict) and fvd.get("tensor"):
        out.append(str(fvd["tensor"]))
    have = ds.indexes["tensor"]
    return [t for t in dict.fromkeys(out) if t in have]
