"""The "where" view: ranks × steps, every cell aggregating all (selected) tensors of its ranks.

With a main heat map of modules × steps, the rank of a record is hidden inside a cell; this
view shows it without narrowing anything: one row per rank (or rank bucket on large runs),
one column per step (bucket), the same colour modes and the same worst-record tracking (a
click still names one record: its step, rank and tensor).

Examples
--------
>>> from precnb.viz.where import where_frame
>>> where_frame(run, color="first_bad").head(1)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from precnb.viz._grid import bucket_size, reduce_grid
from precnb.viz.frames import _bucket_of, _fmt, _index, _label
from precnb.viz.values import Color, cell_values

__all__ = ["WHERE_COLUMNS", "where_frame", "with_devices"]

WHERE_COLUMNS = ["row", "row_order", "col", "col_order", "x", "x_hi", "step", "step_hi", "rank_lo", "rank_hi",
                 "value", "color", "value_text", "first_bad", "nonfinite", "records", "tensor", "worst_step",
                 "worst_rank", "focus"]


def where_frame(
    ds: xr.Dataset,
    *,
    color: Color = "first_bad",
    stat: str = "norm",
    values: tuple[np.ndarray, np.ndarray] | None = None,
    positions: np.ndarray | None = None,
    tensors: Sequence[str] | np.ndarray | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    max_rows: int = 32,
    max_cols: int = 48,
    focus: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """Ranks (rows) × steps (columns) cells over the selected tensors.

    Parameters
    ----------
    ds : xarray.Dataset
        One run.
    color : {"first_bad", "stat", "nonfinite", "events"}
        As for :func:`precnb.viz.cube_frame` (``reldiff`` needs *values* computed against a baseline).
    stat : str
    values : (score, nonfinite), optional
        Precomputed :func:`precnb.viz.cell_values` of the whole run.
    positions : ndarray, optional
        Causal positions for ``first_bad``.
    tensors, steps, ranks : optional
        Restrict (tensors may be a boolean mask).
    max_rows, max_cols : int
        Most rank buckets (rows) and step buckets (columns).
    focus : mapping, optional
        ``{"step", "rank"}``: that cell is flagged ``focus``.

    Returns
    -------
    pandas.DataFrame
        One row per cell; ``row`` is the rank (bucket) label, ``x``/``x_hi`` the first/last step
        of the column, ``rank_lo``/``rank_hi`` the ranks of the row; ``attrs["x"] == "step"``.
    """
    score, nf = values if values is not None else cell_values(ds, color=color, stat=stat, positions=positions)
    si, ri, ti = _index(ds, "step", steps), _index(ds, "rank", ranks), _index(ds, "tensor", tensors)
    if not (len(si) and len(ri) and len(ti)):
        return pd.DataFrame({c: [] for c in WHERE_COLUMNS})
    sub = np.ix_(si, ri, ti)
    ss, rs = bucket_size(len(si), max_cols), bucket_size(len(ri), max_rows)
    g = reduce_grid(score[sub], nf[sub], np.asarray(ds["present"].values)[sub],
                    np.asarray(ds["seq"].values)[sub], np.zeros(len(ti), np.intp), 1, step_size=ss, rank_size=rs)
    sb, rb = g.score.shape[:2]
    sx, rx = (a.ravel() for a in np.meshgrid(np.arange(sb), np.arange(rb), indexing="ij"))
    steps_v, ranks_v, labels = ds["step"].values[si], ds["rank"].values[ri], ds["tensor"].values[ti]
    sc = g.score[sx, rx, 0]
    nfc = g.nonfinite[sx, rx, 0]
    has = sc > -np.inf
    counts = color in ("nonfinite", "events")
    pick = nfc > 0 if counts else has
    value = nfc.astype(float) if counts else np.where(has, sc, np.nan)
    rank_k = np.zeros(len(sx), np.int64)
    col_val = value.copy()
    if color == "first_bad":
        flagged = np.flatnonzero(has)
        rank_k[flagged[np.argsort(-value[flagged], kind="stable")]] = np.arange(1, len(flagged) + 1)
        col_val = np.where(rank_k > 0, rank_k.astype(float), np.nan)
    s_lo, r_lo = sx * ss, rx * rs
    s_hi, r_hi = np.minimum(s_lo + ss - 1, len(steps_v) - 1), np.minimum(r_lo + rs - 1, len(ranks_v) - 1)
    astep = np.minimum(g.arg_step[sx, rx, 0], len(steps_v) - 1)
    arank = np.minimum(g.arg_rank[sx, rx, 0], len(ranks_v) - 1)
    focus_mask = np.zeros(len(sx), bool)
    if focus is not None:
        fs = _bucket_of(steps_v, focus.get("step"), ss)
        fr = _bucket_of(ranks_v, focus.get("rank"), rs)
        focus_mask = ((sx == fs) if fs is not None else False) & ((rx == fr) if fr is not None else False)
    text = [f"#{k}" if k else "clean" for k in rank_k] if color == "first_bad" else (
        [str(int(v)) for v in value] if counts else [_fmt(v) if p else "—" for v, p in zip(value, has, strict=True)])
    df = pd.DataFrame({
        "row": [_label(ranks_v, a, b) for a, b in zip(r_lo, r_hi, strict=True)],
        "row_order": rx,
        "col": [_label(steps_v, a, b) for a, b in zip(s_lo, s_hi, strict=True)],
        "col_order": sx,
        "x": steps_v[s_lo].astype(np.int64),
        "x_hi": steps_v[s_hi].astype(np.int64),
        "step": steps_v[s_lo].astype(np.int64),
        "step_hi": steps_v[s_hi].astype(np.int64),
        "rank_lo": ranks_v[r_lo].astype(np.int64),
        "rank_hi": ranks_v[r_hi].astype(np.int64),
        "value": value,
        "color": col_val,
        "value_text": text,
        "first_bad": rank_k,
        "nonfinite": nfc.astype(np.int64),
        "records": g.records[sx, rx, 0].astype(np.int64),
        "tensor": np.where(pick, labels[g.arg_tensor[sx, rx, 0]], "").astype(str),
        "worst_step": np.where(pick, steps_v[astep], -1).astype(np.int64),
        "worst_rank": np.where(pick, ranks_v[arank], -1).astype(np.int64),
        "focus": focus_mask,
    })
    df.attrs.update(color=color, x="step", by="step", rows="rank", step_size=ss, rank_size=rs,
                    n_flagged=int((rank_k > 0).sum()))
    return df


def with_devices(frame: pd.DataFrame, labels: Mapping[int, str] | None) -> pd.DataFrame:
    """*frame* (a :func:`where_frame`) with a ``device`` column: the host and device of each row's rank.

    A row of one rank gets its label (``"10.0.0.1:1 (suspect)"``); a bucket of ranks the labels of its
    marked devices, else ``""``. Without *labels* the frame is returned as is.

    Examples
    --------
    >>> f = pd.DataFrame({"rank_lo": [0, 2], "rank_hi": [0, 3]})
    >>> with_devices(f, {0: "h:0", 2: "h:2", 3: "h:3 (suspect)"})["device"].tolist()
    ['h:0', 'h:3 (suspect)']
    """
    if not labels or not len(frame):
        return frame
    out = frame.copy()

    def label(lo: int, hi: int) -> str:
        if lo == hi:
            return labels.get(int(lo), "")
        marked = [labels[r] for r in range(int(lo), int(hi) + 1) if r in labels and "(" in labels[r]]
        return ", ".join(marked[:3]) + (" ..." if len(marked) > 3 else "")

    out["device"] = [label(a, b) for a, b in zip(out["rank_lo"], out["rank_hi"], strict=True)]
    out.attrs.update(frame.attrs)
    return out
