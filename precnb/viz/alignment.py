"""Two module trees side by side, paired modules (or calls) linked, coloured by divergence.

The frame lists each run's modules (or the calls inside one module) in execution order with
their depth, the partner the alignment gave them and how (name, structure, shape, value, user)
and a divergence rank (1 = the module whose first flagged record comes first); the chart draws
the baseline's tree on the left, the target's on the right and a line per pair, with a
``left`` and a ``right`` point selection for picking one node on each side.

Examples
--------
>>> from precnb.viz.alignment import alignment_frame
>>> rows, links = alignment_frame(alignment, baseline, target)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import altair as alt
import numpy as np
import pandas as pd
import xarray as xr

from precnb.analysis._memo import DatasetMemo

__all__ = ["alignment_chart", "alignment_frame", "chart_data", "extent", "first_seen", "resized", "with_selected"]

ROW_COLUMNS = ["side", "name", "label", "depth", "y", "rank", "partner", "how", "confidence", "status"]
LINK_COLUMNS = ["baseline", "target", "y_b", "y_t", "how", "confidence"]
# one colour per way a pair was found (ColorBrewer Dark2 + grey): the legend tells them apart
_HOW_COLORS = {"user": "#1f5fbf", "name": "#999999", "value": "#1b9e77", "structure": "#d95f02",
               "shape": "#7570b3"}


_FIRST = DatasetMemo(size=8)


def first_seen(ds: xr.Dataset, by: str) -> dict[str, int]:
    """Earliest execution position of every value of coordinate *by* (``module`` or ``node``).

    Read once per dataset: the Alignment tab redraws each run's tree after a Match or an Unmatch, whose runs
    (each in its own names) are the same datasets.
    """
    return _FIRST.get([ds], ("first_seen", by), lambda: _first_seen(ds, by), copy=dict, holds=False)


def _first_seen(ds: xr.Dataset, by: str) -> dict[str, int]:
    seq = np.asarray(ds["seq"].values)
    first = np.where(seq >= 0, seq, np.iinfo(np.int32).max).min(axis=(0, 1)) if seq.size else np.zeros(0)
    out: dict[str, int] = {}
    for key, f in zip(ds[by].values.astype(str), np.asarray(first).ravel(), strict=False):
        if key and (key not in out or f < out[key]):
            out[key] = int(f)
    return out


def _tree(names: Mapping[str, int]) -> list[tuple[str, int]]:
    """Module paths (plus ancestors) depth first, children in execution order: (path, depth)."""
    seen: dict[str, int] = {}
    for n, f in names.items():
        parts = n.split(".")
        for i in range(1, len(parts) + 1):
            p = ".".join(parts[:i])
            seen[p] = min(seen.get(p, f), f)
    kids: dict[str, list[str]] = {}
    for p in seen:
        kids.setdefault(p.rsplit(".", 1)[0] if "." in p else "", []).append(p)
    out: list[tuple[str, int]] = []
    stack = [(k, 0) for k in sorted(kids.get("", []), key=lambda k: (seen[k], k), reverse=True)]
    while stack:
        p, d = stack.pop()
        out.append((p, d))
        stack.extend((k, d + 1) for k in sorted(kids.get(p, []), key=lambda k: (seen[k], k), reverse=True))
    return out


def alignment_frame(
    alignment: Any,
    baseline: xr.Dataset,
    target: xr.Dataset,
    *,
    level: str = "modules",
    within: tuple[str | None, str | None] = (None, None),
    ranks: Mapping[str, int] | None = None,
    limit: int = 240,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rows of both trees and the links between pairs.

    Parameters
    ----------
    alignment : precnb.Alignment
    baseline, target : xarray.Dataset
        The runs in their own names (shards merged).
    level : {"modules", "calls"}
        Module paths, or the calls (nodes) of each run.
    within : (baseline module, target module), optional
        For ``calls``: only the calls inside these modules.
    ranks : mapping, optional
        Divergence rank of target modules (or nodes): 1 = first flagged; baseline rows take their
        partner's.
    limit : int
        Most rows per side (in execution order).

    Returns
    -------
    (rows, links) : pandas.DataFrame
        ``rows``: ``side, name, label, depth, y, rank, partner, how, confidence, status``
        (``status`` is ``paired``, ``unpaired``, or ``glue``: framework glue, a module path without
        records of its own, or a name both runs have — unless a mapping or an Unmatch left that call
        unpaired: then ``unpaired``, ``how`` ``"unmatched by hand"``); ``links``: ``baseline, target, y_b,
        y_t, how, confidence``.
    """
    if level not in ("modules", "calls"):
        raise ValueError(f"level must be 'modules' or 'calls', got {level!r}")
    pairs = alignment.modules if level == "modules" else alignment.nodes
    b2t = {p.baseline: p for p in pairs}
    t2b = {p.target: p for p in pairs}
    glue = {(g["side"], g["node"]) for g in alignment.unpaired.get("glue", [])}
    # calls a mapping (or an Unmatch) left unpaired are unpaired by decision, not glue — though both runs have the
    # name (issue 51); at the calls level only (a module is never unpaired by hand)
    by_hand = set(getattr(alignment, "user_unpaired", []) or []) if level == "calls" else set()
    ranks = dict(ranks or {})
    rows: list[dict[str, Any]] = []
    other_names = {"baseline": set(target[("module" if level == "modules" else "node")].values.astype(str)),
                   "target": set(baseline[("module" if level == "modules" else "node")].values.astype(str))}
    for side, ds, own, inside in (("baseline", baseline, b2t, within[0]), ("target", target, t2b, within[1])):
        real = set(ds["module" if level == "modules" else "node"].values.astype(str))
        if level == "modules":
            items = _tree(first_seen(ds, "module"))
        else:
            nodes = first_seen(ds, "node")
            if inside:
                mod = dict(zip(ds["node"].values.astype(str), ds["module"].values.astype(str), strict=True))
                nodes = {n: f for n, f in nodes.items() if mod.get(n) == inside or mod.get(n, "").startswith(
                    inside + ".")}
            items = [(n, 0) for n in sorted(nodes, key=lambda n: (nodes[n], n))]
        for y, (name, depth) in enumerate(items[:limit]):
            p = own.get(name)
            partner = (p.target if side == "baseline" else p.baseline) if p is not None else ""
            key = name if side == "target" else partner
            if p is not None:
                status = "paired"
            elif name in by_hand and (side == "target" or name not in b2t):
                status = "unpaired"  # the target call left unpaired, and its same-named baseline call
            elif (side, name) in glue or name not in real or name in other_names[side]:
                status = "glue"  # framework glue, a path without records, or a name both runs share
            else:
                status = "unpaired"
            rows.append({"side": side, "name": name, "label": name.rsplit(".", 1)[-1] if level == "modules" else name,
                         "depth": depth, "y": y, "rank": int(ranks.get(key, 0)) if key else 0, "partner": partner,
                         "how": p.how if p is not None else (
                             "unmatched by hand" if status == "unpaired" and name in by_hand else ""),
                         "confidence": float(p.confidence) if p else 0.0, "status": status})
    frame = pd.DataFrame(rows, columns=ROW_COLUMNS)
    yb = {r["name"]: r["y"] for r in rows if r["side"] == "baseline"}
    yt = {r["name"]: r["y"] for r in rows if r["side"] == "target"}
    links = [{"baseline": p.baseline, "target": p.target, "y_b": yb[p.baseline], "y_t": yt[p.target], "how": p.how,
              "confidence": float(p.confidence)} for p in pairs if p.baseline in yb and p.target in yt]
    return frame, pd.DataFrame(links, columns=LINK_COLUMNS)


_PARAMS = {"baseline": "left", "target": "right"}


def chart_data(rows: pd.DataFrame, links: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The chart's data by name: ``links``, and each side's rows with its own selection field (``left_name`` ...)."""
    out = {"links": links}
    for side, param in _PARAMS.items():
        mine = rows["side"] == side
        out[side] = rows[mine].assign(**{f"{param}_name": rows.loc[mine, "name"]})
    return out


def with_selected(spec: dict[str, Any], selected: tuple[str | None, str | None]) -> dict[str, Any]:
    """A copy of an :func:`alignment_chart` spec whose ``left`` / ``right`` selections hold *selected*.

    What ``alignment_chart(..., selected=selected)`` would declare, without building the chart again.
    """
    out = dict(spec)
    params = []
    for p in spec.get("params", []):
        side = next((s for s, n in _PARAMS.items() if n == p.get("name")), None)
        if side is not None:
            p = {k: v for k, v in p.items() if k != "value"}
            value = selected[0] if side == "baseline" else selected[1]
            if value:
                p["value"] = [{f"{_PARAMS[side]}_name": value}]
        params.append(p)
    out["params"] = params
    return out


def extent(rows: pd.DataFrame) -> tuple[int, float]:
    """(rows drawn, top "first bad" rank) of an :func:`alignment_chart`'s rows: what its spec holds beyond its data.

    Examples
    --------
    >>> extent(pd.DataFrame({"y": [0, 2], "rank": [0.0, 3.0]})), extent(pd.DataFrame({"y": [], "rank": []}))
    ((3, 3.0), (1, 1.0))
    """
    n = int(rows["y"].max()) + 1 if len(rows) else 1
    top = float(rows["rank"].max()) if len(rows) and rows["rank"].max() > 0 else 1.0
    return n, top


def resized(spec: dict[str, Any], old: tuple[int, float], new: tuple[int, float], *,
            row_height: int = 16) -> dict[str, Any]:
    """An :func:`alignment_chart` spec (named data) of rows of extent *old* (:func:`extent`) made one of *new*.

    What ``alignment_chart(rows, links, named=True)`` gives for rows of extent *new* (the height, the rows'
    scale and the "first bad" colour scale; the views' generated names aside), without building the chart
    again: a Match or an Unmatch adds or removes a row of the trees, which drew a new chart each time.
    """
    if old == new:
        return spec
    swap = {(-0.5, old[0] - 0.5): [-0.5, new[0] - 0.5], (1, max(2.0, old[1])): [1, max(2.0, new[1])]}

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: (swap.get(tuple(x), x) if k == "domain" and isinstance(x, list) and len(x) == 2 else walk(x))
                    for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    out = {k: (v if k == "datasets" else walk(v)) for k, v in spec.items()}  # the data: the caller's to set
    if "height" in out:
        out["height"] = max(80, row_height * new[0])
    return out


def alignment_chart(rows: pd.DataFrame, links: pd.DataFrame, *, names: tuple[str, str] = ("baseline", "target"),
                    selected: tuple[str | None, str | None] = (None, None), width: int = 900,
                    row_height: int = 16, named: bool = False) -> alt.LayerChart:
    """Both trees and the pair links, with ``left`` / ``right`` point selections.

    The selections' fields are ``left_name`` / ``right_name`` (each side's rows carry only their own),
    so a click on a target row never selects a baseline node. *named*: the layers name their data
    (``links``, ``baseline``, ``target``: :func:`chart_data`) instead of holding it, for a caller that
    sends other data on the same spec (the same number of rows and top rank).
    """
    data = {k: (alt.NamedData(k) if named else v) for k, v in chart_data(rows, links).items()}
    n, top = extent(rows)
    height = max(80, row_height * n)
    y_scale = alt.Scale(domain=[-0.5, n - 0.5], reverse=True, nice=False)
    y = alt.Y("y:Q", axis=None, scale=y_scale)
    x_scale = alt.Scale(domain=[0, 1], nice=False)
    conditions = [{"test": "datum.status == 'unpaired'", "value": "#f0a030"},
                  {"test": "datum.status == 'glue'", "value": "#ffffff"},
                  {"test": "!(datum.rank > 0)", "value": "#dddddd"}]
    fill = alt.Color("rank:Q", scale=alt.Scale(type="log", domain=[1, max(2.0, top)], scheme="reds", reverse=True),
                     title="first bad (1 = earliest)", legend=alt.Legend(orient="top", gradientLength=140),
                     condition=conditions)
    tip = [alt.Tooltip("name:N"), alt.Tooltip("partner:N"), alt.Tooltip("how:N", title="paired by"),
           alt.Tooltip("confidence:Q", format=".2f"), alt.Tooltip("status:N"), alt.Tooltip("rank:Q", title="first bad")]
    layers: list[Any] = []
    # channels given as objects: altair's guessing of a channel's class from a string or a dict (validating
    # each guess) was a third of a redraw's time
    base_links = alt.Chart(data["links"]).mark_rule(strokeWidth=1.2).encode(
        x=alt.XDatum(0.425, scale=x_scale, axis=None), x2=alt.X2Datum(0.575),
        y=alt.Y("y_b:Q", scale=y_scale, axis=None),
        y2=alt.Y2("y_t:Q"), color=alt.Color("how:N", scale=alt.Scale(domain=list(_HOW_COLORS), range=list(
            _HOW_COLORS.values())), title="paired by", legend=alt.Legend(orient="top")),
        opacity=alt.Opacity("confidence:Q", scale=alt.Scale(domain=[0, 1], range=[0.25, 0.9]), legend=None),
        tooltip=[alt.Tooltip("baseline:N"), alt.Tooltip("target:N"), alt.Tooltip("how:N"),
                 alt.Tooltip("confidence:Q", format=".2f")])
    layers.append(base_links)
    for side, x0, x_box, align, param in (("baseline", 0.0, 0.41, "left", "left"),
                                         ("target", 0.6, 0.59, "left", "right")):
        key = f"{param}_name"  # a side's own field: a click on the other side's rows cannot fill it
        part = data[side]
        value = selected[0] if side == "baseline" else selected[1]
        sel = alt.selection_point(name=param, fields=[key], on="click", clear="dblclick",
                                  **({"value": [{key: value}]} if value else {}))
        hit = alt.Chart(part).mark_rect(opacity=1).encode(
            x=alt.XDatum(x0 if side == "target" else 0.0, scale=x_scale, axis=None),
            x2=alt.X2Datum(0.4 if side == "baseline" else 1.0),
            y=alt.Y("y:Q", scale=y_scale, axis=None), y2=alt.Y2("y2:Q"),
            color=alt.ColorValue(value="#ffffff", condition=[{"param": param, "empty": False, "value": "#ffe39a"}]),
            tooltip=tip).transform_calculate(y2="datum.y + 0.5").transform_calculate(y="datum.y - 0.5") \
            .add_params(sel)
        fill_side = fill if side == "baseline" else alt.Color(
            "rank:Q", scale=alt.Scale(type="log", domain=[1, max(2.0, top)], scheme="reds", reverse=True), legend=None,
            condition=conditions)
        box = alt.Chart(part).mark_square(size=90).encode(x=alt.XDatum(x_box, scale=x_scale, axis=None), y=y,
                                                          color=fill_side,
                                                          stroke=alt.value("#888"), tooltip=tip)
        text = alt.Chart(part).mark_text(align=align, baseline="middle", fontSize=11, limit=int(width * 0.38)).encode(
            x=alt.X("tx:Q", scale=x_scale, axis=None), y=y, text=alt.Text("label:N"), tooltip=tip,
            color=alt.ColorValue(value="#222222", condition={"test": "datum.status == 'unpaired'", "value": "#a05a00"}),
        ).transform_calculate(tx=f"{x0 + 0.005} + datum.depth * 0.014")
        layers += [hit, box, text]
    title = alt.TitleParams(f"{names[0]} (left)  ↔  {names[1]} (right)", anchor="start", fontSize=12)
    return alt.layer(*layers, title=title).properties(width=width, height=height).resolve_scale(color="independent")
