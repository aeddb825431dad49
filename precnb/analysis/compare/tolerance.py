"""Tolerances for comparing statistics between runs.

Differences are measured on statistics, relative to the tensor's own magnitude::

    scale = max(|a|, |b|, rms_a, rms_b, amax_a, amax_b, atol)     rms = norm / sqrt(numel), amax = max(|Max|, |Min|)
    rel   = |a - b| / scale

so a Mean near zero is judged against the tensor's magnitude (its largest element, its RMS) instead of against
itself. Two
non-finite values agree when both are NaN or both are the same infinity. Defaults come from
the dtype (bf16 2^-8, fp16 2^-11, fp32 2^-14, fp64 2^-40; integers and bools exact), can be
overridden per call, or calibrated from a reference pair of healthy runs.

Examples
--------
>>> tol = Tolerance()
>>> tol.rtol_for("torch.bfloat16") == 2 ** -8
True
>>> Tolerance(rtol=0.0).rtol_for("torch.float32")
0.0
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from precnb.dtypes import canonical_dtype

__all__ = ["DTYPE_RTOL", "Tolerance", "relative_arrays", "relative_difference"]

DTYPE_RTOL: dict[str, float] = {
    "bfloat16": 2.0 ** -8,
    "float16": 2.0 ** -11,
    "half": 2.0 ** -11,
    "float32": 2.0 ** -14,
    "float": 2.0 ** -14,
    "float64": 2.0 ** -40,
    "double": 2.0 ** -40,
    "float8": 2.0 ** -3,
    "hifloat8": 2.0 ** -3,
}


def _dtype_key(dtype: str) -> str:
    return canonical_dtype(dtype)  # the one spelling (precnb.dtypes)


@dataclass(frozen=True)
class Tolerance:
    """How far two statistics may differ and still count as equal.

    Parameters
    ----------
    rtol : float, optional
        One relative tolerance for every tensor (overrides the dtype defaults).
    by_dtype : dict, optional
        Overrides for some dtypes, e.g. ``{"bfloat16": 1e-2}``.
    per_tensor : dict, optional
        Calibrated tolerances by tensor label (see :meth:`calibrate`); the larger of this
        and the dtype tolerance applies.
    atol : float
        Absolute floor of the scale, so all-zero tensors compare exactly.
    """

    rtol: float | None = None
    by_dtype: dict[str, float] = field(default_factory=dict)
    per_tensor: dict[str, float] = field(default_factory=dict)
    atol: float = 1e-30

    def rtol_for(self, dtype: str, tensor: str | None = None) -> float:
        """Relative tolerance for one tensor."""
        base: float
        if self.rtol is not None:
            base = self.rtol
        else:
            key = _dtype_key(str(dtype))
            known = self.by_dtype.get(key, self.by_dtype.get(str(dtype), DTYPE_RTOL.get(key)))
            fallback = 0.0 if ("int" in key or "bool" in key) else DTYPE_RTOL["float32"]
            base = known if known is not None else fallback
            if "float8" in key or "fp8" in key:
                base = max(base, DTYPE_RTOL["float8"])
        if tensor is not None and tensor in self.per_tensor:
            return max(base, self.per_tensor[tensor])
        return base

    def rtol_array(self, dtypes: Any, tensors: Any) -> np.ndarray:
        """Vector of tolerances aligned with the tensor coordinate."""
        return np.asarray([self.rtol_for(str(d), str(t)) for d, t in zip(dtypes, tensors, strict=True)],
                          dtype=np.float64)

    @classmethod
    def calibrate(cls, reference_a: xr.Dataset, reference_b: xr.Dataset, *, factor: float = 4.0,
                  **kw: Any) -> Tolerance:
        """Learn per-tensor tolerances from two healthy runs of the same job.

        The largest relative difference seen for each tensor across steps, ranks and the four
        statistics, times *factor*, becomes that tensor's tolerance.

        Parameters
        ----------
        reference_a, reference_b : xarray.Dataset
            Two healthy runs (e.g. a run and its identical rerun).
        factor : float
            Safety factor.
        **kw
            Other :class:`Tolerance` fields.

        Returns
        -------
        Tolerance
        """
        from precnb.combine import combine_runs

        both = combine_runs({"a": reference_a, "b": reference_b})
        rel = relative_difference(both.sel(run="a"), both.sel(run="b"))
        mask = both["present"].all("run")
        worst = rel.where(mask).max(["step", "rank", "stat"], skipna=True)
        per = {}
        for t, v in zip(both["tensor"].values, worst.values, strict=True):
            if np.isfinite(v) and v > 0:
                per[str(t)] = float(v) * factor
            elif v == np.inf:
                per[str(t)] = math.inf
        return cls(per_tensor=per, **kw)


def relative_difference(a: xr.Dataset, b: xr.Dataset, stats: tuple[str, ...] = ("max", "min", "mean", "norm"),
                        *, atol: float = 1e-30) -> xr.DataArray:
    """Relative difference of statistics, stacked along a new ``stat`` dimension.

    Non-finite pairs: equal NaN/NaN or same-signed infinities give 0; any other pair that
    involves a non-finite value gives ``inf``. A statistic null on either side gives 0.

    *a* and *b* must be aligned (same dims and coordinates, e.g. two runs of one combined
    dataset); computed with numpy in one pass (dask-backed inputs are loaded).
    """
    if a["max"].dims != b["max"].dims or a["max"].shape != b["max"].shape:
        raise ValueError(f"relative_difference needs aligned runs, got dims {a['max'].dims} {a['max'].shape} "
                         f"and {b['max'].dims} {b['max'].shape}")
    from precnb.analysis._arrays import on_grid

    out = relative_arrays(lambda name: a[name].values, lambda name: b[name].values, stats, atol=atol)
    return on_grid(a["max"], out, stack=("stat", stats))  # (the coordinates shared, not deep-copied)


def relative_arrays(a: Callable[[str], Any], b: Callable[[str], Any], stats: tuple[str, ...] = ("max", "min", "mean",
                    "norm"), *, atol: float = 1e-30) -> np.ndarray:
    """:func:`relative_difference` as a numpy array (``stat`` first), each run's variables given as ``a(name)``.

    The variables read: *stats*, ``numel``, ``norm``, ``max``, ``min``, ``present``, ``null_stats``, as the
    datasets' arrays (broadcast as numpy broadcasts them).
    """
    from precnb.schema import NULL_BITS

    def rms(get: Callable[[str], Any]) -> np.ndarray:
        n = np.asarray(get("numel"))
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            r = np.abs(np.asarray(get("norm"), np.float64)) / np.sqrt(np.where(n > 0, n, 1).astype(np.float64))
        return np.where(np.isnan(r), 0.0, r)

    def amax(get: Callable[[str], Any]) -> np.ndarray:  # max |x|: what the rounding of a sum over a tensor scales with
        with np.errstate(invalid="ignore"):
            m = np.fmax(np.abs(np.asarray(get("max"), np.float64)), np.abs(np.asarray(get("min"), np.float64)))
        return np.where(np.isfinite(m), m, 0.0)

    # every statistic is judged against the tensor's own magnitude: a Mean that is ~0 by construction (the rows
    # of a softmax backward sum to zero) is rounding noise of the order of max |x| times the dtype's epsilon
    scale_rms = np.fmax(rms(a), rms(b))
    scale_rms = np.fmax(np.where(np.isfinite(scale_rms), scale_rms, 0.0), np.fmax(amax(a), amax(b)))
    pa, pb = np.asarray(a("present"), bool), np.asarray(b("present"), bool)
    na, nb = np.asarray(a("null_stats")), np.asarray(b("null_stats"))
    out = np.empty((len(stats), *pa.shape), np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for k, s in enumerate(stats):
            x = np.asarray(a(s), np.float64)
            y = np.asarray(b(s), np.float64)
            bit = NULL_BITS.get(s, 0)
            both_rec = pa & pb
            if bit:
                both_rec &= ((na & bit) == 0) & ((nb & bit) == 0)
            scale = np.fmax(np.fmax(np.abs(x), np.abs(y)), scale_rms)
            scale = np.fmax(np.where(np.isfinite(scale), scale, 0.0), atol)
            rel = np.abs(x - y) / scale
            same_nf = (np.isnan(x) & np.isnan(y)) | ((x == y) & np.isinf(x))
            rel = np.where(same_nf, 0.0, rel)
            rel = np.where(~np.isfinite(rel) & ~same_nf, np.inf, rel)
            out[k] = np.where(both_rec, rel, 0.0)
    return out
