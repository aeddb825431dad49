"""Error created, not carried: differences an op's own inputs explain are not a first divergence.

Two healthy runs laid out differently (TP partial sums, another reduction order, a thread count) differ by
rounding noise, and after a few optimizer steps that noise grows through the layers until some tensor crosses
the relative tolerance — which would make an ordinary op the "first divergence". A fault *creates* error: its
op's output differs far more than its inputs do. So a difference is **carried** (not searched as an origin)
when

- an op's output differs by at most :data:`CARRY` times the largest difference of the same call's inputs, or
  its absolute difference is at most :data:`CARRY` times the sum of its inputs' (an addition of noisy addends
  that cancel has a large relative error but no new error);
- an op's input differs by at most :data:`CARRY` times the op output that produced it (the latest earlier
  output on the same step and rank with the same target statistics: :mod:`precnb.analysis.causal.dataflow`'s
  rule), which was itself not an origin.

Between two runs that agree bit for bit before a fault nothing is carried (every input difference is 0), so a
fault of any size above the tolerance is still found at the op that makes it.

Examples
--------
>>> CARRY
8.0
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

__all__ = ["CARRY", "carried_differences", "created_rule"]

CARRY = 8.0


def _scale(ds: Any, si: int, ri: int) -> np.ndarray:
    """Each tensor's magnitude at one entry: max |x| (0 where unknown)."""
    with np.errstate(invalid="ignore"):
        m = np.fmax(np.abs(ds["max"].values[si, ri]), np.abs(ds["min"].values[si, ri]))
    return np.where(np.isfinite(m), m, 0.0)


def carried_differences(j: Any, factor: float = CARRY) -> np.ndarray:
    """(step, rank, tensor) mask of the differences of the judged pair *j* that their inputs explain.

    *j* is a :class:`~precnb.analysis.divergence.judged.Judged` pair (its ``diff``, its comparison's ``rel``,
    the baseline and target in the target's names, execution order ``seq``).
    """
    diff = np.asarray(j.diff.values, bool)
    if j.cmp.replicas_differ is not None:  # copies that disagree: a difference whatever the first copy's values
        diff = diff & ~np.asarray(j.cmp.replicas_differ.values, bool)
    rel = np.asarray(j.cmp.rel.values, np.float64)
    # only value differences beyond tolerance are weighed (a dtype or checksum difference is never carried)
    diff = diff & (rel > np.asarray(j.cmp.rtol.values, np.float64)[None, None, :])
    out = np.zeros(diff.shape, bool)
    if not diff.any():
        return out
    b, t = j.b, j.t
    roles = b["role"].values
    nodes = b["node"].values
    inputs_of: dict[Any, list[int]] = defaultdict(list)
    for c in np.flatnonzero(roles == "input").tolist():
        inputs_of[nodes[c]].append(c)
    outputs = np.flatnonzero(roles == "output")
    both = np.asarray(j.cmp.both.values, bool)
    seq = np.asarray(j.seq.values)
    stats = np.stack([np.asarray(t[s].values) for s in ("max", "min", "mean", "norm")], axis=-1)
    for si, ri in {(int(a), int(r)) for a, r, _ in np.argwhere(diff)}:
        cols = np.flatnonzero(diff[si, ri])
        scale = np.fmax(_scale(b, si, ri), _scale(t, si, ri))
        err = rel[si, ri] * scale  # the absolute difference, roughly
        producers: dict[bytes, list[tuple[int, int]]] | None = None
        for c in cols.tolist():
            role = roles[c]
            if role == "output":
                ins = [i for i in inputs_of.get(nodes[c], ()) if both[si, ri, i]]
                worst = rel[si, ri, ins].max() if ins else 0.0
                if worst > 0 and (rel[si, ri, c] <= factor * worst or err[c] <= factor * err[ins].sum()):
                    out[si, ri, c] = True
            elif role == "input":
                if producers is None:
                    producers = defaultdict(list)
                    for p in outputs[both[si, ri, outputs]].tolist():
                        producers[stats[si, ri, p].tobytes()].append((int(seq[si, ri, p]), p))
                own = int(seq[si, ri, c])
                cands = [p for q, p in producers.get(stats[si, ri, c].tobytes(), ()) if q <= own
                         and nodes[p] != nodes[c]]
                finite = bool(np.isfinite(stats[si, ri, c]).any())
                made = rel[si, ri, cands].max() if cands else 0.0
                if finite and made > 0 and rel[si, ri, c] <= factor * made:
                    out[si, ri, c] = True
    return out


def created_rule(j: Any, si: int, ri: int, col: int, factor: float = CARRY) -> str | None:
    """Which rule makes the origin entry an origin: what its inputs explain, in words (None for other roles)."""
    roles, nodes = j.b["role"].values, j.b["node"].values
    rel = np.asarray(j.cmp.rel.values, np.float64)
    rd = j.cmp.replicas_differ
    if rd is not None and bool(rd.values[si, ri, col]):
        return "replica check: the copies of a tensor that must be replicated differ across the group"
    if roles[col] != "output":
        return None
    both = np.asarray(j.cmp.both.values, bool)
    ins = [i for i in np.flatnonzero((roles == "input") & (nodes == nodes[col])).tolist() if both[si, ri, i]]
    if not ins:
        return f"relative difference {rel[si, ri, col]:.3g} beyond tolerance (no recorded input)"
    worst = float(rel[si, ri, ins].max())
    return (f"error created here: output differs by {rel[si, ri, col]:.3g} (relative), its inputs by at most "
            f"{worst:.3g}: more than {factor:g}x what the inputs explain")
