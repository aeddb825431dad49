"""What colours a heat-map cell: per-record scores for each colour mode, and run picking."""

from __future__ import annotations

from typing import Literal

import numpy as np
import xarray as xr

__all__ = ["COLORS", "GROUPS", "METRICS", "ROWS", "cell_values", "first_bad_positions", "metric_salience",
           "pick_runs", "row_groups", "row_labels"]

Color = Literal["first_bad", "stat", "reldiff", "nonfinite", "events", "tensor"]
Rows = Literal["module", "node", "tensor"]
COLORS: tuple[str, ...] = ("first_bad", "stat", "reldiff", "nonfinite", "events", "tensor")
METRICS: dict[str, str] = {"cosine": "1 − cosine", "max_rel_err": "max rel. error", "max_abs_err": "max abs. error",
                           "one_thousandth_err_ratio": "share off by > 0.1 %", "euc_dist": "Euclidean distance"}
"""Tensor metrics (:func:`precnb.tensor_metrics`) the heat map can colour by, as salience (larger = worse)."""
ROWS: tuple[str, ...] = ("module", "node", "tensor")
GROUPS: tuple[str, ...] = ("forward", "backward", "optimizer")
"""Row groups: forward records, backward records (and parameter gradients), optimizer records."""
_BIG = float(2**52)


def pick_runs(ds: xr.Dataset, run: str | None = None, baseline: xr.Dataset | str | None = None,
              ) -> tuple[xr.Dataset, xr.Dataset | None]:
    """Split *ds* into (target, baseline), both single-run and aligned on step/rank/tensor.

    With a ``run`` dim, *run* (default: the last run) is the target and *baseline* a run name
    (default: the first other run). Without one, *baseline* is a dataset or None.
    """
    if "run" in ds.dims:
        names = [str(r) for r in ds["run"].values]
        run = run if run is not None else names[-1]
        target = ds.sel(run=run)
        if isinstance(baseline, str):
            return target, ds.sel(run=baseline)
        if baseline is None:
            others = [n for n in names if n != run]
            return target, (ds.sel(run=others[0]) if others else None)
        ds = target
    if baseline is None or isinstance(baseline, str):
        return ds, None
    if not all(ds.indexes[d].equals(baseline.indexes[d]) for d in ("step", "rank", "tensor")):
        from precnb.combine import combine_runs

        both = combine_runs({"baseline": baseline, "target": ds})
        return both.sel(run="target"), both.sel(run="baseline")
    return ds, baseline


def _recorded(ds: xr.Dataset, stat: str) -> np.ndarray:
    from precnb.analysis.masks import recorded

    return np.asarray(recorded(ds, stat).values)


def first_bad_positions(ds: xr.Dataset, baseline: xr.Dataset | None = None) -> np.ndarray:
    """Causal position of every flagged record of *ds* (0 = first; NaN: not flagged).

    One run: NaN and unexpected ±inf; with *baseline* (same grid): differences beyond the dtype
    tolerance and records present in one run only (:mod:`precnb.analysis.causal.earliness`).
    """
    from precnb.analysis.causal.earliness import bad_records, causal_positions_of

    if baseline is None:
        bad, seq = bad_records(ds)
    else:
        from precnb.analysis.compare import compare_runs

        cmp = compare_runs(baseline, ds)
        bad, seq = bad_records(ds, cmp)
    return causal_positions_of(ds, bad, seq=seq)


def metric_salience(name: str, values: np.ndarray) -> np.ndarray:
    """A tensor metric as "larger = worse": ``1 − cosine``, ``1 − ratio`` for the within-tolerance ratios.

    Examples
    --------
    >>> metric_salience("cosine", np.array([1.0, 0.9])).round(6).tolist()
    [0.0, 0.1]
    >>> metric_salience("max_rel_err", np.array([0.5])).tolist()
    [0.5]
    """
    v = np.asarray(values, dtype=np.float64)
    if name == "cosine" or name.endswith("_err_ratio"):
        return 1.0 - v
    return v


def cell_values(ds: xr.Dataset, *, color: Color = "stat", stat: str = "norm",
                baseline: xr.Dataset | None = None, positions: np.ndarray | None = None,
                metric: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-record (score, nonfinite) arrays over (step, rank, tensor) for one colour mode.

    ``tensor``: a tensor metric per record (*metric*, e.g. :func:`metric_salience` of
    :func:`precnb.tensor_metrics`' ``cosine``), larger = worse.
    ``first_bad``: how early the record comes among the flagged ones in causal order (step,
    then rank by rank as the searches rank them, then execution order): the first flagged
    record scores highest (*positions* from :func:`first_bad_positions`, or computed here).
    ``stat``: score is ``|stat|`` where recorded and finite (non-finite records are only
    counted: healthy attention masks carry -inf). ``reldiff``: the largest relative
    difference to *baseline* over the four statistics (``inf`` where one side is non-finite;
    counted non-finite where only one run is). ``nonfinite``: non-finite records, the
    earliest (step, then execution order) scoring highest; ``events``: the same for NaN and unexpected ±inf only, as
    :func:`precnb.analysis.nan_origin` sees them (mask infinities are not counted). Records
    that cannot be picked score ``-inf``.
    """
    from precnb.analysis.masks import nonfinite as nonfinite_mask

    nf = np.asarray(nonfinite_mask(ds).values)
    present = np.asarray(ds["present"].values)
    if color == "tensor":  # a tensor metric over the grid (NaN: no tensor pair), larger = worse
        if metric is None:
            raise ValueError("color='tensor' needs metric values (precnb.tensor_metrics of a tensor-mode pair)")
        m = np.asarray(metric, dtype=np.float64)
        return np.where(np.isfinite(m) & present, m, -np.inf), nf
    if color == "first_bad":
        pos = first_bad_positions(ds, baseline) if positions is None else np.asarray(positions, float)
        n = float(np.nanmax(pos)) + 1 if np.isfinite(pos).any() else 0.0
        return np.where(np.isfinite(pos), n - np.nan_to_num(pos, nan=0.0), -np.inf), nf
    if color == "stat":
        v = np.asarray(ds[stat].values, dtype=np.float64)
        ok = _recorded(ds, stat) & np.isfinite(v)
        return np.where(ok, np.abs(v), -np.inf), nf
    if color in ("nonfinite", "events"):
        if color == "events":
            from precnb.analysis.events import event_mask

            nf = np.asarray(event_mask(ds)[0].values)
        seq = np.maximum(np.asarray(ds["seq"].values, dtype=np.float64), 0)
        span = float(seq.max()) + 1 if seq.size else 1.0
        order = np.arange(seq.shape[0], dtype=np.float64)[:, None, None] * span + seq
        return np.where(nf, _BIG - order, -np.inf), nf
    if color == "reldiff":
        if baseline is None:
            raise ValueError("color='reldiff' needs a baseline run")
        from precnb.analysis import relative_difference

        rel = np.asarray(relative_difference(baseline, ds).max("stat").values, dtype=np.float64)
        both = present & np.asarray(baseline["present"].values)
        new_nf = nf ^ np.asarray(nonfinite_mask(baseline).values)  # non-finite in one run only
        return np.where(both, np.nan_to_num(rel, nan=0.0), -np.inf), new_nf
    raise ValueError(f"color must be one of {COLORS}, got {color!r}")


def row_groups(ds: xr.Dataset) -> np.ndarray:
    """Row group of every tensor: ``optimizer``, ``backward`` or ``forward``.

    ``optimizer``: module or direction ``optimizer``; ``backward``: backward records and parameter
    gradients.

    Optimizer ops are recorded as ``.forward`` calls: the direction alone does not separate them.
    """
    module = ds["module"].values.astype(str)
    direction = ds["direction"].values.astype(str)
    back = (direction == "backward") | (ds["kind"].values.astype(str) == "param_grad")
    opt = (module == "optimizer") | (direction == "optimizer")  # kernel dumps name the optimizer's kernels so
    return np.where(opt, "optimizer", np.where(back, "backward", "forward")).astype(object)


NO_MODULE = "(none)"
"""Row label of the records outside any module (or node)."""


def row_labels(ds: xr.Dataset, rows: Rows = "module") -> np.ndarray:
    """Row label of every tensor (:data:`NO_MODULE` for an unknown module)."""
    if rows not in ROWS:
        raise ValueError(f"rows must be one of {ROWS}, got {rows!r}")
    vals = ds[rows].values.astype(str)
    return np.where(vals == "", NO_MODULE, vals).astype(object)
