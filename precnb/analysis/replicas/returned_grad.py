"""A rank's own record of a returned parameter's gradient: which copy of a replicated gradient departs.

A module that returns one of its parameters (Megatron's ``skip_bias_add`` linear layers return their bias
for a fused bias-dropout-add) receives that parameter's gradient as the gradient of the returned tensor: msprobe
records it in the module's backward record (``backward.K.input.I``, one per micro-batch) and, accumulated, in
``parameters_grad``. The mean is linear, so on every healthy rank the accumulated gradient's Mean equals the sum
of the per-call Means up to rounding. When two replicas' copies of such a gradient differ and nothing else can
say which side is wrong (a pair, no clean run recording it), the copy that breaks this identity on its own rank
is the one that departs.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import xarray as xr

__all__ = ["returned_grad_departures"]

_GRAD = re.compile(r"^(?P<prefix>.+)\.parameters_grad\.(?P<k>\d+)\.(?P<param>[^.]+)$")
#: relative to the sum of the terms' magnitudes (float32 sums of a few micro-batches are good to ~1e-7)
RTOL = 1e-5


def _cols(ds: xr.Dataset, pattern: str) -> dict[tuple[int, ...], int]:
    """Columns of the labels matching *pattern*, keyed by its integer groups."""
    rx = re.compile(pattern)
    out: dict[tuple[int, ...], int] = {}
    for j, t in enumerate(ds["tensor"].values):
        m = rx.match(str(t))
        if m:
            out[tuple(int(g) for g in m.groups())] = j
    return out


def _stats(ds: xr.Dataset, si: int, ri: int, j: int) -> tuple[float, ...] | None:
    if not bool(ds["present"].values[si, ri, j]):
        return None
    return tuple(float(ds[v].values[si, ri, j]) for v in ("max", "min", "mean", "norm"))


def returned_grad_departures(ds: xr.Dataset, tensor: str, *, step: int, ranks: list[int],
                             rtol: float = RTOL) -> dict[str, Any] | None:
    """Which of *ranks* record a gradient of a returned parameter that disagrees with their own backward records.

    *tensor*: a ``…parameters_grad.K.PARAM`` label of *ds* (the run as dumped). Returns ``{"rank": r, "why": …}``
    when exactly one rank (of two or more checked) breaks the identity while the others keep it, else None (the
    parameter is not returned by its module, a record is missing, or the identity does not single out a rank).

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> returned_grad_departures(empty_dataset(), "M.parameters_grad.0.bias", step=0, ranks=[0, 1]) is None
    True
    """
    m = _GRAD.match(tensor)
    if m is None or step not in ds.indexes["step"] or len(ranks) < 2:
        return None
    prefix, param = re.escape(m["prefix"]), re.escape(m["param"])
    si = int(ds.indexes["step"].get_loc(step))
    rank_ix = ds.indexes["rank"]
    if any(r not in rank_ix for r in ranks):
        return None
    params = _cols(ds, rf"^{prefix}\.forward\.(\d+)\.parameters\.{param}$")
    outputs = _cols(ds, rf"^{prefix}\.forward\.(\d+)\.output\.(\d+)$")
    grads = _cols(ds, rf"^{prefix}\.backward\.(\d+)\.input\.(\d+)$")
    accum = _cols(ds, rf"^{prefix}\.parameters_grad\.(\d+)\.{param}$")
    if not params or not outputs or not grads or not accum:
        return None
    broken: list[int] = []
    kept: list[int] = []
    for r in ranks:
        ri = int(rank_ix.get_loc(r))
        # the output index that *is* the parameter (bit-identical statistics on every forward call that has it)
        index: set[int] = set()
        for (call,), jp in params.items():
            p = _stats(ds, si, ri, jp)
            if p is None:
                continue
            same = {i for (c, i), jo in outputs.items() if c == call and _stats(ds, si, ri, jo) == p}
            index = same if not index else index & same
        if len(index) != 1:
            return None
        (i,) = index
        terms = [_stats(ds, si, ri, j) for (c, k), j in grads.items() if k == i]
        present = [t for t in terms if t is not None]
        last = max((k for (k,), j in accum.items() if _stats(ds, si, ri, j) is not None), default=None)
        if not present or last is None:
            return None
        total = _stats(ds, si, ri, accum[(last,)])
        assert total is not None
        n = float(ds["numel"].values[si, ri, accum[(last,)]]) if "numel" in ds.data_vars else 1.0
        root = float(np.sqrt(max(n, 1.0)))
        summed = sum(t[2] for t in present)
        scale = sum(abs(t[2]) + abs(t[3]) / root for t in present) + abs(total[2])
        if not np.isfinite(summed) or not np.isfinite(total[2]) or scale == 0:
            return None
        (broken if abs(total[2] - summed) > rtol * scale else kept).append(r)
    if len(broken) == 1 and kept:
        return {"rank": broken[0],
                "why": (f"on rank {broken[0]}, the accumulated gradient of {m['param']} (returned by its module) is "
                        "not the sum of the gradients its module's backward calls received for it, while on rank(s) "
                        f"{', '.join(map(str, kept))} it is")}
    return None
