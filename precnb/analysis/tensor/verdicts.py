"""Verdicts from tensor metrics: does a (step, rank, tensor) entry differ, judged on the whole tensor.

Used by :func:`precnb.analysis.compare.compare_runs` (and so by ``first_divergence``) when a
:func:`precnb.tensor_metrics` dataset is given: where a pair of tensor files was compared, its
verdict replaces the statistics' one. An entry **differs** when

1. NaN/±inf sit at different positions, or the shapes differ (msprobe: ``N/A`` / ``shape
   unmatched``);
2. msprobe's accuracy rule says No (``core/compare/multiprocessing_compute.py::check_accuracy``,
   ``CompareConst.COS_THRESHOLD`` …): ``cosine < 0.99 and max_abs_err > 0.001``, or
   ``cosine < 0.9``, or ``max_abs_err > 1``. For a run in systematic lower precision the two
   absolute bounds scale with the tensor's magnitude ``max(1, |max|, |min|)``;
3. msprobe's One Thousandth rule for outputs (``indicator_analysis/algorithm.py::
   OneThousandthErrChecker``, output bound 0.1): fewer than 10 % of the elements agree to 0.1 %
   — only between runs of the same precision (bf16's resolution, 2^-8 ≈ 0.4 %, is coarser than
   0.1 %);
4. the whole tensor's relative error ``rel_l2_err = ‖t − b‖ / ‖b‖`` exceeds the tolerance in
   effect (by dtype, calibrated, or the mixed-precision one). This catches a wrong scale, which
   leaves the cosine at 1.0. A 0-d pair (msprobe computes no cosine for it) is judged by this
   rule alone.

Entries without a compared pair (``no_data``, ``empty``, ``unreadable``, ``dtype_unmatched``)
get no tensor verdict: their statistics decide. :meth:`TensorThresholds.calibrate` loosens the
bounds per tensor from the metrics of a healthy reference pair.

Examples
--------
>>> TensorThresholds().cosine, TensorThresholds().one_thousandth_ratio
(0.99, 0.1)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

__all__ = ["JUDGED_STATUSES", "TensorThresholds", "apply_tensor_verdicts", "tensor_differs", "verdict_reason"]

JUDGED_STATUSES = ("ok", "zero_d", "nan_inf_mismatch", "shape_mismatch")


@dataclass(frozen=True)
class TensorThresholds:
    """Bounds of the tensor-metric verdict (defaults: msprobe 26.2.0's).

    Parameters
    ----------
    cosine, max_abs_err : float
        Differs when ``cosine < cosine`` **and** ``max_abs_err > max_abs_err`` (0.99, 0.001).
    cosine_floor : float
        Differs when ``cosine < cosine_floor`` (0.9).
    max_abs_err_ceiling : float
        Differs when ``max_abs_err > max_abs_err_ceiling`` (1.0).
    one_thousandth_ratio : float
        Differs when ``one_thousandth_err_ratio < one_thousandth_ratio`` (0.1), same precision only.
    per_tensor : mapping
        Calibrated overrides: tensor → {name: bound}, names as above plus ``rel_l2_err``.
    """

    cosine: float = 0.99
    max_abs_err: float = 0.001
    cosine_floor: float = 0.9
    max_abs_err_ceiling: float = 1.0
    one_thousandth_ratio: float = 0.1
    per_tensor: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def bounds(self, labels: Any) -> dict[str, np.ndarray]:
        """Per-tensor bound arrays (aligned with *labels*) for the five bounds and ``rel_l2_err``."""
        names = ("cosine", "max_abs_err", "cosine_floor", "max_abs_err_ceiling", "one_thousandth_ratio")
        out = {n: np.full(len(labels), float(getattr(self, n))) for n in names}
        out["rel_l2_err"] = np.zeros(len(labels))
        for j, lbl in enumerate(labels):
            over = self.per_tensor.get(str(lbl))
            if over:
                for n, v in over.items():
                    if n in out:
                        out[n][j] = float(v)
        return out

    @classmethod
    def calibrate(cls, reference: xr.Dataset, *, factor: float = 4.0, **kw: Any) -> TensorThresholds:
        """Loosen the bounds per tensor from the metrics of a healthy reference pair.

        For each tensor, over steps and ranks: the cosine bounds drop to ``1 - factor·(1 - worst
        cosine)``, the max-abs bounds rise to ``factor × worst max_abs_err``, the One Thousandth
        bound drops to ``worst ratio / factor`` and ``rel_l2_err`` may reach ``factor × worst``;
        never stricter than the defaults.

        Parameters
        ----------
        reference : xarray.Dataset
            :func:`precnb.tensor_metrics` of two healthy runs (e.g. fp32 vs bf16 of a good commit).
        factor : float
        **kw
            Other :class:`TensorThresholds` fields.

        Returns
        -------
        TensorThresholds
        """
        base = cls(**kw)
        ok = reference["status"].isin(["ok", "zero_d"])

        def worst(var: str, how: str) -> np.ndarray:
            if var not in reference:
                return np.full(reference.sizes["tensor"], np.nan)
            v = reference[var].where(ok)
            red = v.min(["step", "rank"], skipna=True) if how == "min" else v.max(["step", "rank"], skipna=True)
            return np.asarray(red.values, np.float64)

        cos, mae = worst("cosine", "min"), worst("max_abs_err", "max")
        ratio, rel = worst("one_thousandth_err_ratio", "min"), worst("rel_l2_err", "max")
        per: dict[str, dict[str, float]] = {}
        for j, lbl in enumerate(reference["tensor"].values):
            d: dict[str, float] = {}
            if math.isfinite(cos[j]):
                lo = 1.0 - factor * (1.0 - cos[j])
                d["cosine"] = min(base.cosine, lo)
                d["cosine_floor"] = min(base.cosine_floor, lo)
            if math.isfinite(mae[j]):
                d["max_abs_err"] = max(base.max_abs_err, factor * mae[j])
                d["max_abs_err_ceiling"] = max(base.max_abs_err_ceiling, factor * mae[j])
            if math.isfinite(ratio[j]):
                d["one_thousandth_ratio"] = min(base.one_thousandth_ratio, ratio[j] / factor)
            if math.isfinite(rel[j]) or rel[j] == math.inf:
                d["rel_l2_err"] = factor * rel[j]
            if d:
                per[str(lbl)] = d
        return cls(**{**kw, "per_tensor": per})


def _on_grid(metrics: xr.Dataset, grid: xr.DataArray) -> xr.Dataset:
    """*metrics* reindexed onto the (step, rank, tensor) grid of a comparison (missing = no_data)."""
    keep = [v for v in ("cosine", "max_abs_err", "one_thousandth_err_ratio", "rel_l2_err", "status") if v in metrics]
    sub = metrics[keep].drop_vars([c for c in metrics.coords if c not in ("step", "rank", "tensor")])
    out = sub.reindex(step=grid["step"].values, rank=grid["rank"].values, tensor=grid["tensor"].values,
                      fill_value={"status": "no_data", **{v: np.nan for v in keep if v != "status"}})
    return out


def tensor_differs(
    metrics: xr.Dataset,
    grid: xr.DataArray,
    rtol: Any,
    *,
    thresholds: TensorThresholds | None = None,
    low_precision: bool = False,
    magnitude: Any = None,
) -> tuple[xr.DataArray, xr.DataArray]:
    """Entries that differ by their tensor metrics, and entries that have a tensor verdict.

    Parameters
    ----------
    metrics : xarray.Dataset
        :func:`precnb.tensor_metrics` result (target labels; steps already on the grid's numbering).
    grid : xarray.DataArray
        Any (step, rank, tensor) array of the comparison (gives the coordinates).
    rtol : array_like
        Tolerance per tensor of the grid (for ``rel_l2_err``).
    thresholds : TensorThresholds, optional
    low_precision : bool
        One run computes in systematic lower precision (rule 3 off, rule 2 scaled).
    magnitude : array_like, optional
        (step, rank, tensor) ``max(|max|, |min|)`` of the baseline, for the scaling of rule 2.

    Returns
    -------
    differs, judged : xarray.DataArray
        Bool over the grid.
    """
    thr = thresholds or TensorThresholds()
    m = _on_grid(metrics, grid)
    status = np.asarray(m["status"].values, dtype=object)
    judged = np.isin(status, JUDGED_STATUSES)
    b = thr.bounds(grid["tensor"].values)
    cos = np.asarray(m["cosine"].values, np.float64)
    mae = np.asarray(m["max_abs_err"].values, np.float64)
    ratio = np.asarray(m["one_thousandth_err_ratio"].values, np.float64)
    rel = np.asarray(m["rel_l2_err"].values, np.float64) if "rel_l2_err" in m else np.full(cos.shape, np.nan)
    scale = np.ones(cos.shape)
    if low_precision and magnitude is not None:
        mag = np.asarray(magnitude, np.float64)
        scale = np.where(np.isfinite(mag), np.maximum(1.0, mag), 1.0)
    tol = np.maximum(np.asarray(rtol, np.float64)[None, None, :], b["rel_l2_err"][None, None, :])
    with np.errstate(invalid="ignore"):
        accuracy_no = ((cos < b["cosine"]) & (mae > b["max_abs_err"] * scale)) | (cos < b["cosine_floor"]) | \
                      (mae > b["max_abs_err_ceiling"] * scale)
        thousandth = (ratio < b["one_thousandth_ratio"]) if not low_precision else np.zeros(cos.shape, bool)
        rel_rule = rel > tol
    ok = status == "ok"
    differs = (np.isin(status, ("nan_inf_mismatch", "shape_mismatch"))
               | (ok & (accuracy_no | thousandth | rel_rule))
               | ((status == "zero_d") & rel_rule))
    dims = ("step", "rank", "tensor")
    coords = {d: grid[d] for d in dims}
    return (xr.DataArray(differs & judged, dims=dims, coords=coords),
            xr.DataArray(judged, dims=dims, coords=coords))


def verdict_reason(entry: Mapping[str, Any], rtol: float, thresholds: TensorThresholds | None = None, *,
                   low_precision: bool = False, scale: float = 1.0, tensor: str = "") -> str:
    """Which rule(s) make one entry differ, in words (``""`` when none).

    Examples
    --------
    >>> verdict_reason({"status": "ok", "cosine": 1.0, "max_abs_err": 0.4, "one_thousandth_err_ratio": 0.0,
    ...                 "rel_l2_err": 0.5}, 2 ** -14)
    'one_thousandth_err_ratio 0 < 0.1; rel_l2_err 0.5 > 6.1e-05'
    """
    thr = thresholds or TensorThresholds()
    b = {k: float(v[0]) for k, v in thr.bounds([tensor]).items()}
    status = str(entry.get("status", ""))
    if status in ("nan_inf_mismatch", "shape_mismatch"):
        return {"nan_inf_mismatch": "NaN/inf at different positions", "shape_mismatch": "shapes differ"}[status]
    cos, mae = float(entry.get("cosine", math.nan)), float(entry.get("max_abs_err", math.nan))
    ratio, rel = float(entry.get("one_thousandth_err_ratio", math.nan)), float(entry.get("rel_l2_err", math.nan))
    tol = max(rtol, b["rel_l2_err"])
    out = []
    if status == "ok":
        if cos < b["cosine"] and mae > b["max_abs_err"] * scale:
            out.append(f"cosine {cos:.6g} < {b['cosine']:.6g} and max_abs_err {mae:.3g} > "
                       f"{b['max_abs_err'] * scale:.3g}")
        elif cos < b["cosine_floor"]:
            out.append(f"cosine {cos:.6g} < {b['cosine_floor']:.6g}")
        if mae > b["max_abs_err_ceiling"] * scale:
            out.append(f"max_abs_err {mae:.3g} > {b['max_abs_err_ceiling'] * scale:.3g}")
        if not low_precision and ratio < b["one_thousandth_ratio"]:
            out.append(f"one_thousandth_err_ratio {ratio:.3g} < {b['one_thousandth_ratio']:.3g}")
    if status in ("ok", "zero_d") and rel > tol:
        out.append(f"rel_l2_err {rel:.3g} > {tol:.2g}")
    return "; ".join(out)


def magnitude(ds: xr.Dataset) -> np.ndarray:
    """``max(|max|, |min|)`` per entry of one run (NaN where unknown)."""
    with np.errstate(invalid="ignore"):
        return np.fmax(np.abs(np.asarray(ds["max"].values, np.float64)),
                       np.abs(np.asarray(ds["min"].values, np.float64)))


def apply_tensor_verdicts(metrics: xr.Dataset, differs: xr.DataArray, dtype_differs: xr.DataArray,
                          both: xr.DataArray, rtol: xr.DataArray, baseline: xr.Dataset,
                          thresholds: TensorThresholds | None, *, low_precision: bool
                          ) -> tuple[xr.DataArray, xr.DataArray]:
    """The comparison hook: entries with a tensor verdict take it (a dtype difference still counts).

    Returns
    -------
    (differs, judged)
    """
    tdiff, judged = tensor_differs(metrics, differs, rtol.values, thresholds=thresholds,
                                   low_precision=low_precision, magnitude=magnitude(baseline))
    judged = judged & both
    return xr.where(judged, tdiff | dtype_differs, differs), judged
