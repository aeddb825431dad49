"""msprobe compare's tensor metrics for one pair of whole tensors (pure numpy).

Each value equals what ``msprobe compare`` (mindstudio-probe 26.2.0, tensor mode) writes for the
same pair; the rules were learned from its source and checked against its CSVs on the bundled
``tensor_bf16`` / ``tensor_bug`` samples (``tests/test_tensor_metrics.py``):

- **Loading** (``pytorch/compare/utils.py::read_pt_data``): bfloat16 and float8 are widened to
  float32, then the array is ``np.squeeze``-d, so any one-element tensor becomes 0-d.
- **Matching** (``core/compare/acc_compare.py::gen_dtype_condition``): dtypes must be equal or
  both floating (fp16/bf16/fp32/fp64), else msprobe leaves the pair unmatched (``unsupported``).
- **Checks, in order** (``core/compare/npy_compare.py::ValidateTensor``): an empty target →
  every metric ``unsupported``; shapes differ (after squeeze) → ``shape unmatch``; a 0-d pair gets
  only MaxAbsErr and MaxRelativeErr (the NaN/inf check is skipped for it); NaN/±inf at different
  positions → every metric ``N/A``; at the same positions they are set to 0 on both sides (the
  sign of an infinity is not compared); a dtype difference is only a message.
- **Cosine** (``algorithm/builtin_algorithm/alg_cosine_similarity.py``): float64 ``dot / (‖n‖‖b‖)``;
  1.0 when both norms are ≤ float64 eps, ``Nan`` when one is; rounded to 12 decimals, then to 6
  when above 0.9999.
- **EucDist** (``alg_euclidean_distance.py``): float64 ``‖n − b‖₂``, not rounded.
- **MaxAbsErr** (``alg_max_absolute_error.py``): float64 ``max |n − b|`` (0-d: in the tensors' own
  dtype, bool as float), rounded to 12 decimals.
- **MaxRelativeErr / One Thousandth / Five Thousandths Err Ratio** (``core/compare/utils.py::
  get_relative_err``, ``calc_relative_err_ratio``): ``|(n − b) / b|`` computed in
  ``result_type(n, b, float32)`` (float32 for fp32/bf16/fp16 data, float64 for fp64 and
  non-float data), with that dtype's eps added to both sides where ``b == 0``; the ratios count
  elements with relative error ``< 0.001`` / ``< 0.005`` (0-d: unsupported); rounded to 12
  decimals.

Dot products and norms are float64 sums taken with ``numpy.einsum`` rather than ``np.dot``:
msprobe's ``np.dot`` goes through OpenBLAS, whose result changes in the last bits with its thread
count (so msprobe's own EucDist differs between machines), and whose threads stall on a busy
machine. Agreement is therefore to the last decimal msprobe writes (±1 unit of the 12th decimal;
EucDist to 1e-12 relative); on the bundled pairs it is exact.

precnb adds ``bitwise_equal`` (same dtype, shape and bits), ``rel_l2_err`` = ``‖n − b‖₂ / ‖b‖₂``
(float64; the whole tensor's relative error, what tolerances judge; inf when the baseline is all
zero and the target is not) and ``ulp_err``: when one side is bf16 or fp16, the largest
``|n − b|`` in units in the last place of the coarser of the two dtypes, taken at the baseline
value (NaN for other pairs).

Examples
--------
>>> import numpy as np
>>> m = pair_metrics(np.array([1.0, 2.0, 3.0], np.float32), np.array([1.0, 2.0, 3.5], np.float32))
>>> m.status, m.values["max_abs_err"], m.values["one_thousandth_err_ratio"]
('ok', 0.5, 0.666666666667)
>>> pair_metrics(np.float32(2.0), np.float32(2.0)).values["cosine"]  # 0-d: unsupported
nan
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from precnb.dtypes import canonical_dtype

__all__ = [
    "FLOAT_METRICS",
    "METRICS",
    "MSPROBE_COLUMNS",
    "STATUSES",
    "PairMetrics",
    "pair_metrics",
    "ulp_error",
]

MSPROBE_COLUMNS: dict[str, str] = {
    "cosine": "Cosine",
    "euc_dist": "EucDist",
    "max_abs_err": "MaxAbsErr",
    "max_rel_err": "MaxRelativeErr",
    "one_thousandth_err_ratio": "One Thousandth Err Ratio",
    "five_thousandths_err_ratio": "Five Thousandths Err Ratio",
}
"""precnb variable → msprobe compare CSV column."""

FLOAT_METRICS = (*MSPROBE_COLUMNS, "rel_l2_err", "ulp_err")
METRICS = (*FLOAT_METRICS, "bitwise_equal")
STATUSES = ("ok", "zero_d", "empty", "shape_mismatch", "nan_inf_mismatch", "dtype_unmatched", "no_data",
            "unreadable")
"""``ok``: every metric computed; ``zero_d``: a 0-d pair (max errors only); ``empty``,
``shape_mismatch``, ``nan_inf_mismatch``: msprobe's ``unsupported`` / ``shape unmatched`` / ``N/A``;
``dtype_unmatched``: dtypes differ outside the float group (msprobe leaves the pair unmatched);
``no_data``: no tensor file on one side; ``unreadable``: a file could not be read."""

_FLOAT_EPS = float(np.finfo(np.float64).eps)
_COSINE_ROUND_ABOVE = 0.9999
_THOUSANDTH, _FIVE_THOUSANDTHS = 0.001, 0.005
_FLOAT_TYPES = (np.float16, np.float32, np.float64, np.longdouble)
# mantissa bits (with the implicit one) and smallest normal exponent
_PRECISION = {"bfloat16": (8, -126), "float16": (11, -14), "float32": (24, -126), "float64": (53, -1022)}


@dataclass
class PairMetrics:
    """The metrics of one (target, baseline) pair; NaN where msprobe writes unsupported / N/A / Nan."""

    values: dict[str, float] = field(default_factory=lambda: dict.fromkeys(FLOAT_METRICS, math.nan))
    bitwise_equal: bool = False
    status: str = "ok"
    message: str = ""


def _fmt(value: Any) -> float:
    """The ``format_value`` of msprobe: ``float('{:.12f}'.format(value))``."""
    return float(f"{value:.12f}")


def _dtype_key(dtype: str | None, array: np.ndarray) -> str:
    if dtype:
        return canonical_dtype(str(dtype))  # the one spelling (precnb.dtypes); which pairs compare is msprobe's rule
    return str(array.dtype)


def ulp_error(target: np.ndarray, baseline: np.ndarray, dtype: str) -> float:
    """Largest ``|target − baseline|`` in ulps of *dtype* at the baseline value.

    Parameters
    ----------
    target, baseline : numpy.ndarray
        Same shape; NaN/inf positions already neutralised.
    dtype : str
        ``bfloat16``, ``float16``, ``float32`` or ``float64``.

    Returns
    -------
    float
        NaN for other dtypes or an empty pair.

    Examples
    --------
    >>> ulp_error(np.array([1.0 + 2 ** -7]), np.array([1.0]), "bfloat16")  # bf16 ulp at 1 is 2^-7
    1.0
    """
    if dtype not in _PRECISION or target.size == 0:
        return math.nan
    bits, emin = _PRECISION[dtype]
    with np.errstate(invalid="ignore", over="ignore"):
        if bits < 24:  # the ulp of a 16-bit float from float32's spacing (same exponent, fewer bits)
            b32 = np.asarray(baseline, np.float32)
            ulp = np.maximum(np.abs(np.spacing(b32)) * np.float32(2.0 ** (24 - bits)),
                             np.float32(2.0 ** (emin - bits + 1)))
            err = np.abs(np.asarray(target, np.float32) - b32) / ulp
        else:
            b = np.abs(np.asarray(baseline, np.float64))
            _, e = np.frexp(b)  # b = m * 2**e, 0.5 <= m < 1
            ulp = np.ldexp(1.0, np.maximum(e - bits, emin - bits + 1))
            err = np.abs(np.asarray(target, np.float64) - np.asarray(baseline, np.float64)) / ulp
    return float(np.max(err))


def _coarser(a: str, b: str) -> str | None:
    """The lower of two float dtypes when it is bf16 or fp16 (else None)."""
    known = [d for d in (a, b) if d in _PRECISION]
    if len(known) != 2:
        return None
    low = min(known, key=lambda d: _PRECISION[d][0])
    return low if low in ("bfloat16", "float16") else None


_FLOAT_GROUP = frozenset(("bfloat16", "float16", "float32", "float64"))


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """float64 dot product without BLAS threads (msprobe's ``np.dot``; see the module notes)."""
    return float(np.einsum("i,i->", a, b))


def _cosine(n: np.ndarray, b: np.ndarray) -> tuple[float, str]:
    if n.ndim == 0 or b.ndim == 0 or n.size <= 1 or b.size <= 1:
        return math.nan, "unsupported"
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        num = _dot(n, b)
        na, nb = math.sqrt(_dot(n, n)), math.sqrt(_dot(b, b))
        if na <= _FLOAT_EPS and nb <= _FLOAT_EPS:
            return 1.0, ""
        if na <= _FLOAT_EPS:
            return math.nan, "all the target data is zero"
        if nb <= _FLOAT_EPS:
            return math.nan, "all the baseline data is zero"
        cos = num / (na * nb)
    if np.isnan(cos):
        return math.nan, "NaN in the cosine"
    result = _fmt(cos)
    return (round(result, 6) if result > _COSINE_ROUND_ABOVE else result), ""


def _relative_err(n: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if n.dtype not in _FLOAT_TYPES:
            n = n.astype(float)
        if b.dtype not in _FLOAT_TYPES:
            b = b.astype(float)
        rtype = np.result_type(n, b, np.float32)
        zero = b == 0
        has_zero = bool(zero.any())
        # copies only where the eps is added in place (or the dtype must change)
        nn = n.astype(rtype) if (has_zero or n.dtype != rtype) else n
        bb = b.astype(rtype) if (has_zero or b.dtype != rtype) else b
        if has_zero:
            eps = np.finfo(rtype).eps
            nn[zero] += eps
            bb[zero] += eps
        return np.abs(np.divide(nn - bb, bb))


def _max_abs(n: np.ndarray, b: np.ndarray) -> float:
    if n.ndim:
        n, b = n.reshape(-1).astype(float), b.reshape(-1).astype(float)
    elif n.dtype == bool:
        n, b = n.astype(float), b.astype(float)
    with np.errstate(invalid="ignore", over="ignore"):
        value = np.max(np.abs(n - b))
    return math.nan if np.isnan(value) else _fmt(value)


def _nonfinite(x: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(inf mask, nan mask) of a float array holding any, else None."""
    if x.dtype.kind != "f" or bool(np.isfinite(x).all()):
        return None
    return np.isinf(x), np.isnan(x)


def _neutralise_nonfinite(n: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Like msprobe's ``handle_inf_nan``: zero NaN/inf on both sides if at the same places, else None."""
    mn, mb = _nonfinite(n), _nonfinite(b)
    if mn is None and mb is None:
        return n, b
    if mn is None or mb is None:
        return None
    if not (np.array_equal(mn[0], mb[0]) and np.array_equal(mn[1], mb[1])):
        return None
    n, b = n.copy(), b.copy()
    bad = mn[0] | mn[1]
    n[bad] = 0
    b[bad] = 0
    return n, b


def pair_metrics(target: Any, baseline: Any, *, target_dtype: str | None = None,
                 baseline_dtype: str | None = None) -> PairMetrics:
    """Compute msprobe's metrics (plus ``bitwise_equal`` and ``ulp_err``) for one pair.

    Parameters
    ----------
    target, baseline : array_like
        The whole tensors (msprobe's NPU and Bench sides), bfloat16 already widened to float32.
    target_dtype, baseline_dtype : str, optional
        The dtypes the tensors were saved in (``torch.bfloat16``); default: the arrays' dtypes.

    Returns
    -------
    PairMetrics

    Examples
    --------
    >>> m = pair_metrics(np.array([np.nan, 1.0, 0.0]), np.array([np.nan, 1.0, 0.0]))
    >>> m.status, m.values["cosine"], m.bitwise_equal
    ('ok', 1.0, True)
    >>> pair_metrics(np.array([np.nan, 1.0]), np.array([0.0, 1.0])).status
    'nan_inf_mismatch'
    """
    n0, b0 = np.asarray(target), np.asarray(baseline)
    tkey, bkey = _dtype_key(target_dtype, n0), _dtype_key(baseline_dtype, b0)
    out = PairMetrics()
    out.bitwise_equal = bool(tkey == bkey and n0.shape == b0.shape and n0.dtype == b0.dtype and np.array_equal(
        np.ascontiguousarray(n0).view(np.uint8), np.ascontiguousarray(b0).view(np.uint8)))
    if tkey != bkey and not (tkey in _FLOAT_GROUP and bkey in _FLOAT_GROUP):
        out.status, out.message = "dtype_unmatched", f"dtypes {tkey} and {bkey}"
        return out
    n, b = np.squeeze(n0), np.squeeze(b0)
    if n.size == 0:
        out.status, out.message = "empty", "empty tensor"
        return out
    if n.shape != b.shape:
        out.status, out.message = "shape_mismatch", f"shapes {list(n0.shape)} and {list(b0.shape)}"
        return out
    v = out.values
    if n.ndim == 0:  # msprobe computes MaxAbsErr and MaxRelativeErr only, without the NaN/inf check
        out.status = "zero_d"
        try:
            v["max_abs_err"] = _max_abs(n, b)
        except TypeError:  # bool - bool
            v["max_abs_err"] = math.nan
        rel = np.max(_relative_err(n, b))
        v["max_rel_err"] = math.nan if np.isnan(rel) else _fmt(rel)
        n64, b64 = np.asarray(n, np.float64).reshape(1), np.asarray(b, np.float64).reshape(1)
        v["rel_l2_err"] = _rel_l2(n64, b64)
        _add_ulp(v, n, b, tkey, bkey)
        return out
    if out.bitwise_equal and n.dtype.kind in "biuf" and (n.dtype.kind != "f" or n.dtype.itemsize <= 4):
        # identical bits: the values msprobe's formulas give (no float64 overflow is possible here)
        v.update(cosine=1.0, euc_dist=0.0, max_abs_err=0.0, max_rel_err=0.0, one_thousandth_err_ratio=1.0,
                 five_thousandths_err_ratio=1.0, rel_l2_err=0.0)
        if _coarser(tkey, bkey) is not None:
            v["ulp_err"] = 0.0
        return out
    pair = _neutralise_nonfinite(n, b)
    if pair is None:
        out.status, out.message = "nan_inf_mismatch", "NaN/inf at different positions"
        return out
    n, b = pair
    if tkey != bkey:
        out.message = f"dtypes {tkey} and {bkey}"
    n64, b64 = n.reshape(-1).astype(float), b.reshape(-1).astype(float)
    v["cosine"], why = _cosine(n64, b64)
    if why and not out.message:
        out.message = why
    d64 = n64 - b64
    with np.errstate(over="ignore", invalid="ignore"):
        v["euc_dist"] = math.sqrt(_dot(d64, d64))
    v["rel_l2_err"] = _rel_l2(n64, b64, v["euc_dist"])
    with np.errstate(invalid="ignore", over="ignore"):
        mx = np.max(np.abs(d64))
    v["max_abs_err"] = math.nan if np.isnan(mx) else _fmt(mx)
    rel = _relative_err(n, b)
    mr = np.max(rel)
    v["max_rel_err"] = math.nan if np.isnan(mr) else _fmt(mr)
    total = rel.size
    v["one_thousandth_err_ratio"] = _fmt(np.sum(rel < _THOUSANDTH) / total)
    v["five_thousandths_err_ratio"] = _fmt(np.sum(rel < _FIVE_THOUSANDTHS) / total)
    _add_ulp(v, n, b, tkey, bkey)
    return out


def _rel_l2(n64: np.ndarray, b64: np.ndarray, dist: float | None = None) -> float:
    with np.errstate(invalid="ignore", over="ignore"):
        d = float(np.sqrt(np.sum((n64 - b64) ** 2))) if dist is None else dist
        ref = math.sqrt(_dot(b64, b64))
    if math.isnan(d):
        return math.nan
    if ref == 0.0:
        return 0.0 if d == 0.0 else math.inf
    return d / ref


def _add_ulp(v: dict[str, float], n: np.ndarray, b: np.ndarray, tkey: str, bkey: str) -> None:
    coarse = _coarser(tkey, bkey)
    if coarse is not None:
        v["ulp_err"] = ulp_error(n, b, coarse)
