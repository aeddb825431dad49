"""Module hierarchy from construct.json, coloured by flagged records (an icicle chart).

Every node's width is the number of tensors below it; its colour is the number of flagged
records (non-finite values, NaN events, or differences beyond tolerance) in its subtree.
Siblings are laid out in execution order.

Examples
--------
>>> from precnb.viz.hierarchy import hierarchy_frame
>>> hierarchy_frame(run, counts="nonfinite").head()  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import altair as alt
import numpy as np
import pandas as pd
import xarray as xr

from precnb.naming import parse_node
from precnb.schema import side_table
from precnb.viz.selections import node_selection

__all__ = ["hierarchy_chart", "hierarchy_frame", "tensor_counts"]

ROOT = "(run)"
_DIR = {"forward": "fwd", "backward": "bwd"}
Counts = Literal["nonfinite", "events", "reldiff"]


def tensor_counts(ds: xr.Dataset, counts: Counts = "nonfinite", *,
                  baseline: xr.Dataset | None = None) -> np.ndarray:
    """Flagged records per tensor (summed over steps and ranks).

    ``nonfinite``: any recorded NaN/Inf; ``events``: NaN and unexpected ±inf as
    :func:`precnb.analysis.nan_origin` sees them (masks excluded); ``reldiff``: records whose
    relative difference to *baseline* exceeds the dtype tolerance.
    """
    if counts == "nonfinite":
        from precnb.analysis import nonfinite

        return np.asarray(nonfinite(ds).sum(("step", "rank")).values, dtype=np.int64)
    if counts == "events":
        from precnb.analysis.events import event_mask

        return np.asarray(event_mask(ds)[0].sum(("step", "rank")).values, dtype=np.int64)
    if counts == "reldiff":
        if baseline is None:
            raise ValueError("counts='reldiff' needs a baseline run")
        from precnb.analysis import Tolerance, relative_difference

        rel = relative_difference(baseline, ds).max("stat")
        tol = Tolerance().rtol_array(ds["dtype"].values, ds["tensor"].values)
        both = ds["present"] & baseline["present"]
        return np.asarray(((rel > tol) & both).sum(("step", "rank")).values, dtype=np.int64)
    raise ValueError(f"unknown counts {counts!r}")


def _label(node: str) -> str:
    if node == ROOT:
        return node
    p = parse_node(node)
    if p.kind == "module":
        return f"{p.module} · {p.api} {_DIR.get(p.direction, p.direction)}"
    if p.kind == "param_grad":
        return f"{p.module} · grad"
    return node


def hierarchy_frame(
    ds: xr.Dataset,
    *,
    counts: Counts | Mapping[str, int] | np.ndarray = "nonfinite",
    baseline: xr.Dataset | None = None,
    max_depth: int = 6,
    modules_only: bool = True,
) -> pd.DataFrame:
    """Tree of nodes (construct.json; module paths when there is none) with subtree counts.

    Parameters
    ----------
    ds : xarray.Dataset
        One run.
    counts : {"nonfinite", "events", "reldiff"}, mapping or ndarray
        What to count (see :func:`tensor_counts`), or counts per tensor label / position.
    baseline : xarray.Dataset, optional
        For ``counts="reldiff"``.
    max_depth : int
        Deepest level drawn (the root is depth 0).
    modules_only : bool
        Draw module nodes (and other parents such as ``optimizer``) only; API leaves still
        count in their parents.

    Returns
    -------
    pandas.DataFrame
        ``node, label, parent, depth, x0, x1, count, tensors, order``, in depth-first order.
    """
    labels = ds["tensor"].values.astype(str)
    if isinstance(counts, str):
        per = tensor_counts(ds, counts, baseline=baseline)
    elif isinstance(counts, Mapping):
        per = np.array([int(counts.get(t, 0)) for t in labels], dtype=np.int64)
    else:
        per = np.asarray(counts, dtype=np.int64)
    tree = {str(k): str(v) for k, v in side_table(ds, "construct").items()}
    nodes = ds["node"].values.astype(str)
    by_path = not tree
    if by_path:  # monitor / kernel data: use the module paths
        for mod in {str(m) for m in ds["module"].values if str(m)}:
            parts = mod.split(".")
            for i in range(1, len(parts) + 1):
                tree.setdefault(".".join(parts[:i]), ".".join(parts[: i - 1]))
        nodes = np.where(ds["module"].values.astype(str) == "", nodes, ds["module"].values.astype(str))
    seq = np.asarray(ds["seq"].values)
    first = np.where(seq >= 0, seq, np.iinfo(np.int32).max).min(axis=(0, 1)) if seq.size else seq
    own_count: dict[str, int] = {}
    own_n: dict[str, int] = {}
    own_first: dict[str, float] = {}
    for n, c, f in zip(nodes, per, np.asarray(first).ravel(), strict=False):
        own_count[n] = own_count.get(n, 0) + int(c)
        own_n[n] = own_n.get(n, 0) + 1
        own_first[n] = min(own_first.get(n, np.inf), float(f))
    children: dict[str, list[str]] = {}
    allnodes = (set(tree) | set(tree.values()) | set(own_n)) - {"", ROOT}
    for n in sorted(allnodes):
        children.setdefault(tree.get(n, "") or ROOT, []).append(n)
    agg: dict[str, tuple[int, int, float]] = {}

    def total(n: str, seen: frozenset[str] = frozenset()) -> tuple[int, int, float]:
        if n in agg:
            return agg[n]
        c, w, f = own_count.get(n, 0), own_n.get(n, 0), own_first.get(n, np.inf)
        for ch in children.get(n, []):
            if ch in seen:
                continue
            cc, cw, cf = total(ch, seen | {n})
            c, w, f = c + cc, w + cw, min(f, cf)
        agg[n] = (c, max(w, 1), f)
        return agg[n]

    total(ROOT)
    rows: list[dict[str, Any]] = []
    stack: list[tuple[str, str, int, float]] = [(ROOT, "", 0, 0.0)]
    visited: set[str] = set()
    while stack:
        n, parent, depth, x0 = stack.pop()
        if n in visited or depth > max_depth:
            continue
        visited.add(n)
        c, w, _f = total(n)
        is_api = not by_path and n != ROOT and parse_node(n).kind == "api" and not children.get(n)
        draw = not (modules_only and is_api)
        if draw:
            rows.append({"node": n, "label": _label(n), "parent": parent, "depth": depth,
                         "x0": x0, "x1": x0 + w, "count": c, "tensors": w, "order": len(rows)})
        kids = sorted(children.get(n, []), key=lambda k: (total(k)[2], k))
        offsets = np.concatenate([[0.0], np.cumsum([total(k)[1] for k in kids])])
        for k, off in reversed(list(zip(kids, offsets[:-1], strict=True))):
            stack.append((k, n, depth + 1, x0 + float(off)))
    return pd.DataFrame(rows, columns=["node", "label", "parent", "depth", "x0", "x1", "count",
                                       "tensors", "order"])


def hierarchy_chart(frame: pd.DataFrame, *, title: str = "module hierarchy", width: int = 760,
                    counts_label: str = "flagged records", select: bool = True,
                    current: str | None = None, row_height: int = 15, max_rows: int = 400) -> alt.LayerChart:
    """Labelled tree of :func:`hierarchy_frame`: one row per module, indented by depth.

    Every module carries its label (``blocks.1.attn · Attention fwd``) and a bar of its
    subtree's flagged records; *current* (a node, with its ancestors) is highlighted, so the
    module of the selected record is found at a glance. A click selects a module (``node``).
    """
    frame = frame[frame["depth"] > 0].head(max_rows).reset_index(drop=True)  # the root is the chart itself
    frame = frame.assign(row=np.arange(len(frame)), shade=frame["count"].where(frame["count"] > 0))
    chain: set[str] = set()
    if current:
        parents = dict(zip(frame["node"], frame["parent"], strict=True))
        cur: str | None = current
        while cur and cur not in chain:
            chain.add(cur)
            cur = parents.get(cur)
    top = max(float(frame["count"].max()) if len(frame) else 1.0, 1.0)
    frame = frame.assign(current=frame["node"] == current, on_path=frame["node"].isin(chain),
                         tx=0.005 + (frame["depth"] - 1) * 0.018, bar_lo=0.62,
                         bar_hi=0.62 + 0.36 * np.where(frame["count"] > 0, np.maximum(0.02, frame["count"] / top),
                                                       0.01))
    y = alt.Y("row:O", axis=None, sort="ascending")
    base = alt.Chart(frame, title=title, width=width, height=alt.Step(row_height))
    band = base.mark_rect(opacity=1).encode(
        x=alt.XDatum(0, scale=alt.Scale(domain=[0, 1], nice=False), axis=None), x2=alt.X2Datum(1), y=y,
        color=alt.when("datum.current").then(alt.value("#ffd45c")).when("datum.on_path").then(
            alt.value("#fff3c8")).otherwise(alt.value("#ffffff")),
        tooltip=[alt.Tooltip("label:N", title="module"), alt.Tooltip("node:N"),
                 alt.Tooltip("count:Q", title=counts_label), alt.Tooltip("tensors:Q")])
    bar = base.mark_bar(height=row_height - 5).encode(
        x=alt.X("bar_lo:Q", scale=alt.Scale(domain=[0, 1], nice=False), axis=None),
        x2=alt.X2("bar_hi:Q"), y=y,
        color=alt.Color("shade:Q", scale=alt.Scale(scheme="orangered", domainMin=0), title=counts_label,
                        legend=alt.Legend(orient="top", gradientLength=160),
                        condition=[{"test": "!isValid(datum.shade)", "value": "#e4e4e4"}]),
        tooltip=[alt.Tooltip("label:N", title="module"), alt.Tooltip("count:Q", title=counts_label)],
    )
    def text(weight: str, test: str) -> alt.Chart:
        return base.mark_text(align="left", baseline="middle", fontSize=11, fontWeight=weight,
                              limit=int(width * 0.6)).encode(
            x=alt.X("tx:Q", scale=alt.Scale(domain=[0, 1], nice=False), axis=None), y=y, text="label:N",
            tooltip=[alt.Tooltip("node:N"), alt.Tooltip("count:Q", title=counts_label)],
        ).transform_filter(test)

    layers: list[Any] = [band, bar, text("bold", "datum.on_path"), text("normal", "!datum.on_path")]
    if select:
        sel = node_selection()
        layers[0] = band.add_params(sel)
    return alt.layer(*layers)
