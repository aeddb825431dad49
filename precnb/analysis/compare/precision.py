"""Systematic lower precision (autocast bf16/fp16) versus an isolated dtype change.

A run under ``torch.autocast(dtype=torch.bfloat16)`` differs from its fp32 baseline in dtype on
whole op families (every linear, matmul, softmax, ... at every step and rank): that is a
precision choice, and its values should be judged with the lower precision's tolerance, not
reported as a divergence at the first linear. One op cast to bf16 on one rank, or from one step
on, stays a finding.

:func:`detect_precision` decides from the entries whose dtype differs between two aligned runs:
the change is **systematic** when every such entry has the same lower-precision dtype (bf16 or
fp16, the other side fp32/fp64) in the same run, it holds at every (step, rank) where both runs
recorded the tensor, and it spans at least :data:`MIN_FAMILIES` API families. Otherwise it is
isolated and stays a difference. :func:`mixed_precision_tolerance` then raises the float
tolerances to :data:`MIXED_PRECISION_FACTOR` × the lower dtype's (rounding accumulates through the
network: 8 × 2^-8 ≈ 3 % for bf16); an explicit ``Tolerance(rtol=...)`` and calibrated per-tensor
tolerances are kept.

Examples
--------
>>> ctx = PrecisionContext(systematic=True, low_run="target", low_dtype="bfloat16",
...                        high_dtype="float32", families=("Functional.linear", "Torch.matmul"),
...                        tensors=40, entries=40, reason="")
>>> ctx.statement()
'target runs in bf16: compared with bf16 tolerance'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.compare.tolerance import DTYPE_RTOL, Tolerance
from precnb.dtypes import canonical_dtype

__all__ = [
    "LOW_PRECISION",
    "MIN_FAMILIES",
    "MIXED_PRECISION_FACTOR",
    "PrecisionContext",
    "apply_precision",
    "detect_precision",
    "mixed_precision_tolerance",
    "normalise_dtype",
]

LOW_PRECISION = {"bfloat16": "bf16", "float16": "fp16"}
"""Lower-precision float dtypes and their short names."""
_HIGH = ("float32", "float64")
MIN_FAMILIES = 2
"""A systematic change spans at least this many API families (``Functional.linear``, ...)."""
MIXED_PRECISION_FACTOR = 8.0
"""Tolerance of a systematically lower-precision run, in units of that dtype's rtol."""


def normalise_dtype(dtype: Any) -> str:
    """``torch.bfloat16`` / ``BFloat16`` / ``bf16`` → ``bfloat16`` (lower case, no framework prefix).

    Examples
    --------
    >>> normalise_dtype("torch.bfloat16"), normalise_dtype("Float16"), normalise_dtype("torch.float")
    ('bfloat16', 'float16', 'float32')
    """
    return canonical_dtype(str(dtype))  # the one spelling (precnb.dtypes)


@dataclass(frozen=True)
class PrecisionContext:
    """What the dtype differences between two runs say about their precision.

    Attributes
    ----------
    systematic : bool
        One run computes in lower precision on whole op families at every step and rank.
    low_run : str or None
        The run in lower precision (when every differing entry agrees on it).
    low_dtype, high_dtype : str or None
        e.g. ``"bfloat16"`` and ``"float32"``.
    families : tuple of str
        API families whose dtype differs.
    tensors, entries : int
        How many tensors and (step, rank, tensor) entries differ in dtype.
    reason : str
        Why it is (or is not) systematic.
    """

    systematic: bool
    low_run: str | None
    low_dtype: str | None
    high_dtype: str | None
    families: tuple[str, ...]
    tensors: int
    entries: int
    reason: str

    def statement(self) -> str:
        """One line for the user, e.g. ``target runs in bf16: compared with bf16 tolerance``."""
        if not self.systematic or not self.low_dtype:
            return self.reason
        short = LOW_PRECISION.get(self.low_dtype, self.low_dtype)
        return f"{self.low_run} runs in {short}: compared with {short} tolerance"

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (for ``Finding.stats``)."""
        out = dataclasses.asdict(self)
        out["families"] = list(self.families)
        out["statement"] = self.statement()
        return out


def _family(api: str, node: str) -> str:
    if api:
        return api
    parts = node.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else node


def detect_precision(
    dtype_differs: xr.DataArray,
    examples: Mapping[str, tuple[str, str]],
    both: xr.DataArray,
    *,
    names: Sequence[str] = ("baseline", "target"),
    kinds: Any = None,
    apis: Any = None,
    nodes: Any = None,
    min_families: int = MIN_FAMILIES,
) -> PrecisionContext | None:
    """Tell a systematic lower-precision run from isolated dtype changes.

    Parameters
    ----------
    dtype_differs : xarray.DataArray
        (step, rank, tensor) bool: both dtypes known and different
        (:func:`precnb.analysis.compare.entry_dtype_differences`).
    examples : mapping
        tensor → (baseline dtype, target dtype) at its first differing entry.
    both : xarray.DataArray
        (step, rank, tensor) bool: recorded in both runs.
    names : (str, str)
        Run names (baseline, target).
    kinds, apis, nodes : array_like, optional
        The ``kind``, ``api`` and ``node`` coordinates along ``tensor`` (default: those of
        *both*, else of *dtype_differs*).
    min_families : int
        API families a systematic change must span.

    Returns
    -------
    PrecisionContext or None
        None when no entry differs in dtype.

    Examples
    --------
    >>> m = xr.DataArray(np.ones((1, 2, 2), bool), dims=("step", "rank", "tensor"),
    ...                  coords={"tensor": ["Functional.linear.0.forward.output.0",
    ...                                     "Torch.matmul.0.forward.output.0"]})
    >>> ex = {t: ("torch.float32", "torch.bfloat16") for t in m["tensor"].values}
    >>> ctx = detect_precision(m, ex, m, apis=["Functional.linear", "Torch.matmul"], kinds=["api", "api"])
    >>> ctx.systematic, ctx.low_run, ctx.low_dtype
    (True, 'target', 'bfloat16')
    >>> on_rank0 = m.copy(data=np.array([[[True, True], [False, False]]]))  # differs on one rank of two
    >>> detect_precision(on_rank0, ex, m, apis=["Functional.linear", "Torch.matmul"], kinds=["api", "api"]).systematic
    False
    """
    mask = np.asarray(dtype_differs.values, bool)
    if not mask.any():
        return None
    labels = [str(x) for x in dtype_differs["tensor"].values]
    coords = both.coords if "kind" in both.coords else dtype_differs.coords
    kinds = np.asarray(kinds if kinds is not None else coords["kind"].values if "kind" in coords else
                       ["api"] * len(labels), dtype=object)
    apis = np.asarray(apis if apis is not None else coords["api"].values if "api" in coords else
                      [""] * len(labels), dtype=object)
    nodes = np.asarray(nodes if nodes is not None else coords["node"].values if "node" in coords else
                       labels, dtype=object)
    rec = np.asarray(both.values, bool)
    cols = np.flatnonzero(mask.any(axis=(0, 1)))
    pairs: set[tuple[str, str, str]] = set()  # (low run, low dtype, high dtype)
    families: set[str] = set()
    other: list[str] = []
    not_uniform: list[str] = []
    for j in cols:
        lbl = labels[j]
        a, b = (normalise_dtype(x) for x in examples.get(lbl, ("", "")))
        if a in LOW_PRECISION and b in _HIGH:
            pairs.add((str(names[0]), a, b))
        elif b in LOW_PRECISION and a in _HIGH:
            pairs.add((str(names[1]), b, a))
        else:
            other.append(f"{lbl} ({a} vs {b})")
        if not np.array_equal(mask[:, :, j], rec[:, :, j]):
            not_uniform.append(lbl)
        if str(kinds[j]) == "api":
            families.add(_family(str(apis[j]), str(nodes[j])))
    n_entries = int(mask.sum())
    fams = tuple(sorted(families))
    low_run = low = high = None
    if len(pairs) == 1:
        low_run, low, high = next(iter(pairs))
    reasons = []
    if other:
        reasons.append(f"dtypes that are not a lower-precision float: {', '.join(other[:3])}")
    if len(pairs) > 1:
        reasons.append(f"both directions / several lower dtypes: {sorted(pairs)}")
    if not_uniform:
        reasons.append(f"not at every step and rank ({len(not_uniform)} tensor(s), e.g. {not_uniform[0]})")
    if len(fams) < min_families:
        reasons.append(f"{len(fams)} API famil{'y' if len(fams) == 1 else 'ies'} ({', '.join(fams) or 'none'})")
    systematic = not reasons and low is not None
    if systematic:
        short = LOW_PRECISION[low]  # type: ignore[index]
        reason = (f"{low_run} computes in {short} on {len(cols)} tensor(s) of {len(fams)} API families "
                  f"({', '.join(fams[:6])}{', …' if len(fams) > 6 else ''}) at every step and rank: "
                  f"systematic lower precision")
    else:
        reason = ("dtype differs on " + f"{len(cols)} tensor(s): an isolated change, kept as a difference ("
                  + "; ".join(reasons) + ")")
    return PrecisionContext(systematic=systematic, low_run=low_run, low_dtype=low, high_dtype=high,
                            families=fams, tensors=len(cols), entries=n_entries, reason=reason)


def mixed_precision_tolerance(tol: Tolerance, low_dtype: str, *,
                              factor: float = MIXED_PRECISION_FACTOR) -> Tolerance:
    """*tol* with every float dtype's rtol raised to ``factor × rtol(low_dtype)``.

    An explicit one-for-all ``tol.rtol`` is the user's choice and is kept; calibrated
    ``per_tensor`` tolerances still apply (the larger wins). Integer and bool tensors stay exact.

    Examples
    --------
    >>> t = mixed_precision_tolerance(Tolerance(), "bfloat16")
    >>> t.rtol_for("torch.float32") == 8 * 2 ** -8, t.rtol_for("torch.int64")
    (True, 0.0)
    """
    if tol.rtol is not None:
        return tol
    floor = factor * DTYPE_RTOL.get(normalise_dtype(low_dtype), DTYPE_RTOL["bfloat16"])
    by_dtype = dict(tol.by_dtype)
    for d in ("bfloat16", "float16", "half", "float32", "float", "float64", "double"):
        by_dtype[d] = max(by_dtype.get(d, DTYPE_RTOL[d]), floor)
    return dataclasses.replace(tol, by_dtype=by_dtype)


def apply_precision(tol: Tolerance, dtype_differs: xr.DataArray, dtype_changed: dict[str, tuple[str, str]],
                    both: xr.DataArray, names: Sequence[str]
                    ) -> tuple[PrecisionContext | None, Tolerance, xr.DataArray, dict[str, tuple[str, str]]]:
    """The comparison hook: detect, and when systematic, widen *tol* and clear the dtype differences.

    Returns
    -------
    (context or None, tolerance, dtype_differs, dtype_changed)
        Unchanged inputs when the change is not systematic.
    """
    ctx = detect_precision(dtype_differs, dtype_changed, both, names=names)
    if ctx is None or not ctx.systematic or ctx.low_dtype is None:
        return ctx, tol, dtype_differs, dtype_changed
    return ctx, mixed_precision_tolerance(tol, ctx.low_dtype), xr.zeros_like(dtype_differs), {}
