"""Comparing runs of two frameworks: their noise floor and the differences they only record differently.

A PyTorch model and its MindSpore port agree to float noise, not bit for bit: :func:`noise_floor`
calibrates the tolerance from how well the aligned pair agrees before any real difference, and
:func:`_drop_isolated` sets aside backward differences that the next records agree on again (what
the frameworks record at one op, not what they compute). :func:`searched_differences` is what the
first-divergence search counts, for the explorer's colouring.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.compare import Comparison
from precnb.analysis.compare.tolerance import Tolerance
from precnb.analysis.divergence.versions import late_inplace_inputs, releases_of

__all__ = ["ISOLATION_WINDOW", "MAX_ISOLATED", "NOISE_FACTOR", "noise_floor", "searched_differences",
           "two_frameworks"]


def two_frameworks(alignment: Any) -> bool:
    """Whether *alignment* pairs runs of two frameworks (their noise floor and recording differences apply)."""
    return alignment is not None and not alignment.identical and len(set(alignment.frameworks)) > 1


def searched_differences(cmp: Comparison, *, alignment: Any = None, crc: str = "report") -> xr.DataArray:
    """The records :func:`first_divergence` counts as value differences in *cmp* (step, rank, tensor).

    Beyond tolerance (CRC differences too with ``crc="strict"``); for two frameworks
    (:func:`two_frameworks`) without the isolated backward differences the search sets aside
    (what the frameworks record differently at one op, :func:`_drop_isolated`).
    """
    diff = cmp.differs | cmp.crc_differs if crc == "strict" else cmp.differs
    late, _ = late_inplace_inputs(cmp, diff, releases=(releases_of(cmp.base), releases_of(cmp.targ)))
    diff = diff & ~late  # in-place inputs one run's msprobe release records after the op: a version difference
    if not two_frameworks(alignment):
        return diff
    b, t = cmp.ds.isel(run=0), cmp.ds.isel(run=1)
    return _drop_isolated(diff, b["seq"].where(b["seq"] >= 0, t["seq"]), cmp)[0]


MAX_ISOLATED = 50
ISOLATION_WINDOW = 6


def _drop_isolated(diff: xr.DataArray, seq: xr.DataArray, cmp: Comparison
                   ) -> tuple[xr.DataArray, list[dict[str, Any]]]:
    """Differences that their consumers do not show: the records right after them agree again.

    Used for two frameworks only, on backward records only. A real divergence propagates: the
    gradient an op produced is the input of the next backward ops, which record it again. A
    backward difference whose next :data:`ISOLATION_WINDOW` compared records on its rank and step
    all agree is what the two frameworks *record* at one op (e.g. a composite loss whose backward
    one framework hooks at an inner step), not what they compute. Such entries are taken out (and
    returned), in execution order, until the first difference that propagates. Forward records,
    and a difference with fewer later records than the window, are never taken out.
    """
    d = np.array(diff.values, copy=True)
    sq = np.asarray(seq.values).astype(np.int64)
    both = np.asarray(cmp.both.values, bool)
    steps = [int(x) for x in cmp.ds["step"].values]
    ranks = [int(x) for x in cmp.ds["rank"].values]
    labels = cmp.ds["tensor"].values
    direction = cmp.ds["direction"].values
    out: list[dict[str, Any]] = []
    for _ in range(MAX_ISOLATED):
        hit = np.argwhere(d)
        if not len(hit):
            break
        si = int(hit[:, 0].min())
        cand = hit[hit[:, 0] == si]
        keys = [sq[si, ri, j] if sq[si, ri, j] >= 0 else 1 << 40 for _, ri, j in cand]
        _, ri, j = cand[int(np.argmin(keys))]
        here = int(sq[si, ri, j])
        if str(direction[j]) != "backward":
            break
        later = np.flatnonzero(both[si, ri] & (sq[si, ri] > here))
        later = later[np.argsort(sq[si, ri, later])][:ISOLATION_WINDOW]
        if here < 0 or len(later) < ISOLATION_WINDOW or d[si, ri, later].any():
            break
        d[si, ri, j] = False
        out.append({"step": steps[si], "rank": ranks[ri], "tensor": str(labels[j])})
    return diff.copy(deep=False, data=d), out


NOISE_FACTOR = 20.0
"""A calibrated cross-framework tolerance is this many times the noise floor of the aligned pair."""


def noise_floor(cmp: Comparison) -> tuple[float | None, Tolerance | None]:
    """Noise floor of two frameworks' agreement, and a raised tolerance when the dtype defaults are too tight.

    The floor is the 99th percentile of the relative differences of the first step's forward
    records that come before any record exceeding the default tolerance (the earlier modules, where
    the two runs still compute the same thing). When ``NOISE_FACTOR`` × floor exceeds a dtype's
    default, that dtype's tolerance is raised to it; otherwise None (the defaults hold).
    """
    from precnb.analysis.compare.tolerance import DTYPE_RTOL, _dtype_key

    rel = cmp.rel.values[0]  # (rank, tensor) at the first compared step
    both = cmp.both.values[0]
    over = cmp.differs.values[0]
    fwd = cmp.ds["direction"].values == "forward"
    seq = cmp.ds["seq"].isel(run=1).values[0].astype(np.int64)
    vals: list[float] = []
    for r in range(rel.shape[0]):
        ok = both[r] & fwd & (seq[r] >= 0)
        if not ok.any():
            continue
        first_bad = seq[r][over[r] & ok].min() if (over[r] & ok).any() else np.iinfo(np.int64).max
        take = ok & (seq[r] < first_bad) & np.isfinite(rel[r])
        vals.extend(rel[r][take].tolist())
    if len(vals) < 20:
        return None, None
    floor = float(np.quantile(np.asarray(vals), 0.99))
    dtypes = {_dtype_key(str(d)) for d in cmp.ds["dtype"].values}
    raise_to = {d: NOISE_FACTOR * floor for d in dtypes if d in DTYPE_RTOL and NOISE_FACTOR * floor > DTYPE_RTOL[d]}
    return floor, (Tolerance(by_dtype=raise_to) if raise_to else None)
