"""Frame builders: canonical dataset in, small pandas DataFrame out (what the charts draw).

Heat-map frames aggregate to a bounded number of cells however large the run is: rows are
the top-k modules (or tensors, nodes) by the colour value, columns are steps or rank buckets
such as ``"0-31"``. Every cell remembers its worst record (step, rank, tensor), so a click
on an aggregated cell still leads to one tensor.

Examples
--------
>>> from precnb.viz.frames import heatmap_frame
>>> df = heatmap_frame(run, by="rank", color="nonfinite")  # doctest: +SKIP
>>> df[["row", "col", "value", "tensor", "worst_rank"]].head(1)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd
import xarray as xr

from precnb.viz._grid import bucket_size, reduce_grid
from precnb.viz.values import (
    COLORS,
    GROUPS,
    NO_MODULE,
    ROWS,
    Color,
    Rows,
    cell_values,
    pick_runs,
    row_groups,
    row_labels,
)

__all__ = [
    "COLORS",
    "GROUPS",
    "ROWS",
    "SORTS",
    "cell_values",
    "cube_frame",
    "heatmap_frame",
    "pick_runs",
    "row_groups",
    "row_labels",
]

SORTS: tuple[str, ...] = ("first", "value")
"""Row orders: by first occurrence (execution order), or by colour value (most salient first)."""

REL_CAP = 1e6  # relative differences above this (and inf) are drawn as this value


def _index(ds: xr.Dataset, dim: str, wanted: Any) -> np.ndarray:
    n = ds.sizes[dim]
    if wanted is None:
        return np.arange(n)
    arr = np.asarray(wanted)
    if arr.dtype == bool:
        return np.flatnonzero(arr)
    pos = ds.indexes[dim].get_indexer(list(arr))
    return np.sort(pos[pos >= 0])


def _label(vals: np.ndarray, lo: int, hi: int) -> str:
    a, b = vals[lo], vals[min(hi, len(vals) - 1)]
    return str(a) if a == b else f"{a}-{b}"


def cube_frame(
    ds: xr.Dataset,
    *,
    rows: Rows = "module",
    color: Color = "stat",
    stat: str = "norm",
    run: str | None = None,
    baseline: xr.Dataset | str | None = None,
    tensors: Sequence[str] | np.ndarray | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    top_k: int = 40,
    step_groups: int = 48,
    rank_groups: int = 8,
    focus: Mapping[str, Any] | None = None,
    values: tuple[np.ndarray, np.ndarray] | None = None,
    groups: bool = False,
    sort: str = "first",
    positions: np.ndarray | None = None,
) -> pd.DataFrame:
    """Aggregate a run into at most ``top_k × step_groups × rank_groups`` cells.

    Parameters
    ----------
    ds : xarray.Dataset
        A canonical run (or several, see *run* / *baseline* and :func:`pick_runs`).
    rows : {"module", "node", "tensor"}
        What a row is.
    color : {"first_bad", "stat", "reldiff", "nonfinite", "events"}
        How early the cell's first flagged record comes in causal order; largest ``|stat|``;
        largest relative difference to *baseline*; non-finite count; NaN / unexpected ±inf
        count (see :func:`cell_values`).
    stat : str
        Statistic for ``color="stat"``.
    run, baseline : optional
        See :func:`pick_runs`.
    tensors, steps, ranks : optional
        Restrict to these labels (tensors may also be a boolean mask).
    top_k : int
        Rows kept: the largest by colour value (rows with non-finite values first).
    step_groups, rank_groups : int
        Most step / rank buckets (``rank_groups=1``: one column for all ranks).
    focus : mapping, optional
        ``{"step", "rank", "tensor"}``: that cell is kept and flagged ``focus``.
    values : (score, nonfinite), optional
        Precomputed :func:`cell_values` of the whole run (a cache for widgets).
    groups : bool
        Split rows into :data:`GROUPS` (forward, backward, optimizer): the same module is one
        row per group (column ``group``).
    sort : {"first", "value"}
        Row order: first occurrence (execution order), or colour value (most salient first).
    positions : ndarray, optional
        Causal positions for ``color="first_bad"`` (:func:`precnb.viz.values.first_bad_positions`).

    Returns
    -------
    pandas.DataFrame
        One row per cell: ``row, group, row_order, col, col_order, x, x_hi, step, step_hi, ranks,
        rank_lo, rank_hi, value, color, value_text, first_bad, nonfinite, records, tensor,
        worst_step, worst_rank, focus``. ``x``/``x_hi`` are the first and last step (or rank)
        of the cell's column; ``first_bad`` numbers the flagged cells by how early their first
        flagged record comes (1 = earliest; 0 for clean cells) in ``first_bad`` colour; ``attrs``
        name the ``color``, the x dimension (``by`` and ``x``) and the row count.
    """
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {SORTS}, got {sort!r}")
    target, base = pick_runs(ds, run, baseline)
    score, nf = values if values is not None else cell_values(target, color=color, stat=stat,
                                                              baseline=base, positions=positions)
    si, ri, ti = (_index(target, "step", steps), _index(target, "rank", ranks),
                  _index(target, "tensor", tensors))
    if not (len(si) and len(ri) and len(ti)):
        return _empty()
    sub = np.ix_(si, ri, ti)
    labels = row_labels(target, rows)[ti]
    sc, nfs, pres, sq = score[sub], nf[sub], np.asarray(target["present"].values)[sub], \
        np.asarray(target["seq"].values)[sub]
    if rows == "module":  # entries whose rank recorded another op under the label: in that op's module row
        ti, labels, (sc, nfs, pres, sq) = _entry_rows(target, si, ri, ti, labels, (sc, nfs, pres, sq))
    if groups:
        phase = row_groups(target)[ti]
        rank_of = {g: i for i, g in enumerate(GROUPS)}
        keyed = np.array([f"{rank_of[p]}\x1f{p}\x1f{lbl}" for p, lbl in zip(phase, labels, strict=True)],
                         dtype=object)
        uniq_keys, groups_idx = np.unique(keyed, return_inverse=True)
        uniq = np.array([k.split("\x1f", 2)[2] for k in uniq_keys], dtype=object)
        uniq_group = np.array([k.split("\x1f", 2)[1] for k in uniq_keys], dtype=object)
    else:
        uniq, groups_idx = np.unique(labels, return_inverse=True)
        uniq_group = np.full(len(uniq), "", dtype=object)
    groups_arr = groups_idx
    ss, rs = bucket_size(len(si), step_groups), bucket_size(len(ri), rank_groups)
    g = reduce_grid(sc, nfs, pres, sq, groups_arr, len(uniq), step_size=ss, rank_size=rs)
    nfc = g.nonfinite.sum(axis=(0, 1))
    best = np.nan_to_num(g.score.max(axis=(0, 1)), nan=-np.inf)
    if color in ("nonfinite", "events"):
        keep = list(np.argsort(-nfc, kind="stable")[:top_k])
    elif color == "first_bad":  # the earliest flagged rows; clean rows only when all of them fit
        flagged = np.flatnonzero(best > -np.inf)
        keep = list(flagged[np.argsort(-best[flagged], kind="stable")][:top_k])
        clean = np.flatnonzero(best == -np.inf)
        if len(keep) + len(clean) <= top_k or not len(keep):
            keep += list(clean[np.argsort(g.first_seq[clean], kind="stable")][: top_k - len(keep)])
    else:  # by the largest value; rows with nothing finite but non-finite values first
        best = np.where((best == -np.inf) & (nfc > 0), np.inf, best)
        keep = list(np.argsort(-best, kind="stable")[:top_k])
    fcell = None
    if focus is not None and str(focus.get("tensor")) in target.indexes["tensor"]:
        tj = int(target.indexes["tensor"].get_loc(str(focus["tensor"])))
        hit = np.flatnonzero(ti == tj)
        if len(hit) > 1:  # the label is in several rows: the one holding the focused entry
            fs, fr = _pos(target, "step", focus.get("step"), si), _pos(target, "rank", focus.get("rank"), ri)
            if fs is not None and fr is not None:
                hit = hit[np.argsort(~pres[fs, fr, hit], kind="stable")]
        if len(hit):
            fg = int(groups_arr[hit[0]])
            if fg not in keep:
                keep = [*keep[: max(top_k - 1, 0)], fg]
            fcell = (fg, _bucket_of(target["step"].values[si], focus.get("step"), ss),
                     _bucket_of(target["rank"].values[ri], focus.get("rank"), rs))
    group_rank = {gname: i for i, gname in enumerate(("", *GROUPS))}
    # the records outside any module ("(none)") last in their group: a reader's first numbered cell is a
    # module's, not a row that names no place (issue 51)
    row_key: dict[int, tuple[Any, ...]]
    if sort == "value":
        row_key = {k: (group_rank[uniq_group[k]], str(uniq[k]) == NO_MODULE,
                       -float(best[k]) if np.isfinite(best[k]) else np.inf, g.first_seq[k], str(uniq[k])) for k in keep}
    else:
        row_key = {k: (group_rank[uniq_group[k]], str(uniq[k]) == NO_MODULE, g.first_seq[k], str(uniq[k]))
                   for k in keep}
    keep_arr = np.array(sorted(keep, key=lambda k: row_key[k]), dtype=np.intp)
    df = _assemble(g, target, uniq, keep_arr, si, ri, ti, color, fcell)
    df.insert(1, "group", uniq_group[keep_arr][df["row_order"].to_numpy()] if len(df) else [])
    df.attrs.update(groups=bool(groups), sort=sort)
    return df


def _pos(ds: xr.Dataset, dim: str, value: Any, idx: np.ndarray) -> int | None:
    """Position of coordinate *value* among the selected *idx* of *dim* (None when not selected)."""
    if value is None or int(value) not in ds.indexes[dim]:
        return None
    hit = np.flatnonzero(idx == int(ds.indexes[dim].get_loc(int(value))))
    return int(hit[0]) if len(hit) else None


def _entry_rows(ds: xr.Dataset, si: np.ndarray, ri: np.ndarray, ti: np.ndarray, labels: np.ndarray,
                arrays: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    """Move the entries whose rank recorded the label in another module into that module's row.

    A label names another op on a rank whose call counters are shifted; its entries there belong to
    the other op's module (:func:`precnb.schema.entry_meta`). Each (label, other module) becomes a
    column of its own holding only those entries (the label's column loses them). *arrays* are
    (score, nonfinite, present, seq) over (si, ri, ti); returns the new (ti, labels, arrays).
    """
    from precnb.schema import meta_changes

    moved = meta_changes(ds).get("module")
    if not moved:
        return ti, labels, arrays
    steps = {int(s): k for k, s in enumerate(ds["step"].values[si])}
    ranks = {int(r): k for k, r in enumerate(ds["rank"].values[ri])}
    tlabels = ds["tensor"].values[ti]
    cols: list[int] = []
    new_labels: list[str] = []
    masks: list[np.ndarray] = []
    for c in np.flatnonzero(np.isin(tlabels, list(moved))).tolist():
        by_module: dict[str, np.ndarray] = {}
        for (s, r), module in moved[str(tlabels[c])].items():
            if s in steps and r in ranks:
                m = by_module.setdefault(module or "(none)", np.zeros((len(si), len(ri)), bool))
                m[steps[s], ranks[r]] = True
        for module, m in by_module.items():
            cols.append(c)
            new_labels.append(module)
            masks.append(m)
    if not cols:
        return ti, labels, arrays
    mask = np.stack(masks, axis=-1)  # (S, R, E)
    fills = (-np.inf, False, False, -1)
    out = []
    for arr, fill in zip(arrays, fills, strict=True):
        extra = np.where(mask, arr[:, :, cols], np.asarray(fill, dtype=arr.dtype))
        base = arr.copy()
        for e, c in enumerate(cols):
            base[:, :, c] = np.where(mask[:, :, e], np.asarray(fill, dtype=arr.dtype), base[:, :, c])
        out.append(np.concatenate([base, extra], axis=2))
    return (np.concatenate([ti, ti[cols]]), np.concatenate([labels, np.asarray(new_labels, dtype=object)]),
            tuple(out))


def _bucket_of(vals: np.ndarray, value: Any, size: int) -> int | None:
    if value is None:
        return None
    hit = np.flatnonzero(vals == int(value))
    return int(hit[0]) // size if len(hit) else None


def _empty() -> pd.DataFrame:
    cols = ["row", "group", "row_order", "col", "col_order", "x", "x_hi", "step", "step_hi", "ranks",
            "rank_lo", "rank_hi", "value", "color", "value_text", "first_bad", "nonfinite", "records",
            "tensor", "worst_step", "worst_rank", "focus"]
    return pd.DataFrame({c: [] for c in cols})


def _fmt(v: float) -> str:
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.4g}"


def _assemble(g: Any, target: xr.Dataset, uniq: np.ndarray, keep: np.ndarray, si: np.ndarray,
              ri: np.ndarray, ti: np.ndarray, color: str, fcell: tuple | None) -> pd.DataFrame:
    sb, rb = g.score.shape[:2]
    steps = target["step"].values[si]
    ranks = target["rank"].values[ri]
    tlabels = target["tensor"].values[ti]
    sx, rx, kx = np.meshgrid(np.arange(sb), np.arange(rb), np.arange(len(keep)), indexing="ij")
    sx, rx, kx = sx.ravel(), rx.ravel(), kx.ravel()
    gx = keep[kx]
    score = g.score[sx, rx, gx]
    nf = g.nonfinite[sx, rx, gx]
    rec = g.records[sx, rx, gx]
    has = score > -np.inf
    if color in ("nonfinite", "events"):
        value = nf.astype(float)
        col_val = value
        has = np.ones(len(sx), bool)
        pick = nf > 0
    elif color == "first_bad":  # earliness score; the colour is the cell's rank (1 = earliest)
        value = np.where(has, score, np.nan)
        col_val = np.full(len(sx), np.nan)
        flagged = np.flatnonzero(has)
        col_val[flagged[np.argsort(-value[flagged], kind="stable")]] = np.arange(1, len(flagged) + 1)
    elif color == "reldiff":
        value = np.where(has, score, np.nan)
        col_val = np.log10(np.clip(np.nan_to_num(value, nan=0.0, posinf=REL_CAP), 1e-300, REL_CAP))
        col_val = np.where(has & (value > 0), col_val, np.nan)  # exactly equal: no colour
    else:  # no finite value: no colour (the chart paints non-finite cells red)
        value = np.where(has, score, np.nan)
        col_val = value
    s_lo, r_lo = sx * g.step_size, rx * g.rank_size
    s_hi = np.minimum(s_lo + g.step_size - 1, len(steps) - 1)
    r_hi = np.minimum(r_lo + g.rank_size - 1, len(ranks) - 1)
    rank_lbl = np.array([_label(ranks, a, b) for a, b in zip(r_lo, r_hi, strict=True)], dtype=object)
    step_lbl = np.array([_label(steps, a, b) for a, b in zip(s_lo, s_hi, strict=True)], dtype=object)
    by_rank = sb == 1 and rb > 1
    if color not in ("nonfinite", "events"):
        pick = has
    first_bad = np.nan_to_num(col_val, nan=0.0).astype(np.int64) if color == "first_bad" else np.zeros(len(sx),
                                                                                                   np.int64)
    astep, arank, aten = g.arg_step[sx, rx, gx], g.arg_rank[sx, rx, gx], g.arg_tensor[sx, rx, gx]
    focus = np.zeros(len(sx), bool)
    if fcell is not None:
        fg, fs, fr = fcell
        focus = (fg == gx) & ((fs == sx) if fs is not None else True) & ((fr == rx) if fr is not None
                                                                        else True)
    df = pd.DataFrame({
        "row": uniq[gx].astype(str),
        "row_order": kx,
        "col": rank_lbl if by_rank else step_lbl,
        "col_order": rx if by_rank else sx,
        "x": (ranks[r_lo] if by_rank else steps[s_lo]).astype(np.int64),
        "x_hi": (ranks[r_hi] if by_rank else steps[s_hi]).astype(np.int64),
        "step": steps[s_lo].astype(np.int64),
        "step_hi": steps[s_hi].astype(np.int64),
        "ranks": rank_lbl,
        "rank_lo": ranks[r_lo].astype(np.int64),
        "rank_hi": ranks[r_hi].astype(np.int64),
        "value": value,
        "color": col_val,
        "value_text": _texts(color, value, col_val, has, nf),
        "first_bad": first_bad,
        "nonfinite": nf.astype(np.int64),
        "records": rec.astype(np.int64),
        "tensor": np.where(pick, tlabels[aten], "").astype(str),
        "worst_step": np.where(pick, steps[np.minimum(astep, len(steps) - 1)], -1).astype(np.int64),
        "worst_rank": np.where(pick, ranks[np.minimum(arank, len(ranks) - 1)], -1).astype(np.int64),
        "focus": focus,
    })
    df.attrs.update(color=color, by="rank" if by_rank else "step", x="rank" if by_rank else "step",
                    n_rows_total=len(uniq), step_size=g.step_size, rank_size=g.rank_size,
                    n_flagged=int((first_bad > 0).sum()))
    return df


def _texts(color: str, value: np.ndarray, col_val: np.ndarray, has: np.ndarray, nf: np.ndarray) -> list[str]:
    if color in ("nonfinite", "events"):
        return [str(int(v)) for v in value]
    if color == "first_bad":
        return [f"#{int(k)}" if p else "clean" for k, p in zip(np.nan_to_num(col_val), has, strict=True)]
    return [_fmt(v) if p else ("non-finite" if n else "—") for v, p, n in zip(value, has, nf, strict=True)]


def heatmap_frame(
    ds: xr.Dataset,
    *,
    by: Literal["step", "rank"] = "step",
    max_cols: int | None = None,
    **kw: Any,
) -> pd.DataFrame:
    """Heat-map cells: rows × steps (all ranks in one column) or rows × rank buckets.

    Parameters
    ----------
    ds : xarray.Dataset
    by : {"step", "rank"}
        The x axis. ``"rank"`` aggregates over the selected steps and buckets ranks into at
        most *max_cols* columns labelled like ``"0-31"``.
    max_cols : int, optional
        Most columns (default 48 steps or 32 rank buckets).
    **kw
        Passed to :func:`cube_frame` (``rows``, ``color``, ``stat``, ``baseline``, ``top_k``,
        ``tensors``, ``steps``, ``ranks``, ``focus``, ``values``).

    Returns
    -------
    pandas.DataFrame
        At most ``top_k × max_cols`` rows; see :func:`cube_frame` for the columns.
    """
    if by == "step":
        return cube_frame(ds, step_groups=max_cols or 48, rank_groups=1, **kw)
    if by == "rank":
        return cube_frame(ds, step_groups=1, rank_groups=max_cols or 32, **kw)
    raise ValueError(f"by must be 'step' or 'rank', got {by!r}")
