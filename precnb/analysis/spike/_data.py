"""The *data* cause of a loss spike: ranks whose own loss departs alone, and batch inputs that stand out."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from precnb.analysis.spike._common import (
    _cand,
    _first_per_rank,
    _median,
    _seq,
)
from precnb.analysis.spike._records import View
from precnb.analysis.spike._vec import row_medians


def _outliers(v: View, j: int, step: int, z: float) -> list[tuple[float, str, float, float] | None]:
    """Per rank index: (score, stat, value, reference) of the most outstanding statistic of *j* at (step, rank).

    None for a rank where no statistic stands out (score above *z*). The reference of (step,
    rank) is the median of every other (step, rank) of the tensor, its scale the MAD of those
    (at least 5 % of the larger of the median and the tensor's typical spread).
    """
    n_ranks = len(v.ranks)
    si = v.step_index(step)
    if si is None:
        return [None] * n_ranks
    best_score = np.full(n_ranks, -np.inf)
    best: list[tuple[float, str, float, float] | None] = [None] * n_ranks
    typical = math.nan
    if "max" in v.stats and "min" in v.stats:
        typical = _median((v.stats["max"][..., j] - v.stats["min"][..., j]).reshape(-1))
    for stat, arr in v.stats.items():
        flat = arr[..., j].reshape(-1)
        vals = arr[si, :, j]
        fin = np.isfinite(flat)
        rows = np.flatnonzero(np.isfinite(vals))
        if fin.sum() - 1 < 2 or not len(rows):
            continue
        keep = np.broadcast_to(fin, (len(rows), len(flat))).copy()
        keep[np.arange(len(rows)), si * n_ranks + rows] = False  # (step, rank) itself is not its reference
        others = np.broadcast_to(flat, keep.shape)[keep].reshape(len(rows), -1)
        med = row_medians(others)
        mad = row_medians(np.abs(others - med[:, None]))
        floor = 0.05 * np.maximum(np.abs(med), typical if np.isfinite(typical) else 0.0)
        scale = np.maximum(np.maximum(1.4826 * mad, floor), 1e-12)
        score = np.abs(vals[rows] - med) / scale
        for k in np.flatnonzero((score > z) & (score > best_score[rows])):
            ri = int(rows[k])
            best_score[ri] = score[k]
            best[ri] = (float(score[k]), stat, float(vals[ri]), float(med[k]))
    return best


def data_causes(views: list[View], spike: dict[str, Any], *, z: float) -> list[dict[str, Any]]:
    """Data: the departing ranks' batch inputs at the spike step stand out (see the module docstring)."""
    sp = int(spike["step"])
    departing: list[int] = list(spike.get("ranks") or [])
    all_ranks: list[int] = list(spike.get("all_ranks") or [])
    local = bool(departing) and len(departing) < len(all_ranks)
    out: list[dict[str, Any]] = []
    found_ranks: set[int] = set()
    for v in views:
        for j in v.batch_inputs():
            hits = _outliers(v, j, sp, z)
            for ri, r in enumerate(v.ranks):
                hit = hits[ri]
                if hit is None:
                    continue
                score, stat, val, ref = hit
                on_departing = r in departing if departing else True
                if local and not on_departing:
                    continue
                rec = v.record(j)
                micro = int(v.micro[j])
                where = f", micro-batch {micro}" if micro >= 0 else ""
                text = (f"rank {r}'s batch at step {sp} stands out: {rec['tensor']} {stat} {val:.6g} against "
                        f"{ref:.6g} at every other step and rank{where}"
                        + (f"; rank {r}'s loss jumps while the other ranks' do not" if local else ""))
                out.append(_cand("data", local, text, sp, r, rec, math.log10(max(score, 1.0)),
                                 [f"{v.name} {rec['tensor']} {stat}", "loss per rank"], [(v, sp, r, rec["tensor"])],
                                 seq=_seq(v, j, sp, ri), micro_batch=micro if micro >= 0 else None))
                found_ranks.add(r)
    if local:
        for r in departing:
            if r not in found_ranks:
                out.append(_cand("data", False, f"rank {r}'s loss jumps at step {sp} while the other ranks' do not: "
                                 "its batch (or its loss computation); no batch input in the records stands out",
                                 sp, r, {"node": None, "tensor": None, "module": None}, 0.5, ["loss per rank"], [],
                                 seq=math.inf))
    return _first_per_rank(out)
