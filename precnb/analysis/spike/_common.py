"""What the four cause tests of a loss spike share: thresholds, medians over ranks and steps, candidates.

See :mod:`precnb.analysis.spike._causes` for the tests themselves.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from precnb.analysis.spike._records import View
from precnb.analysis.spike._vec import masked_median, median_without_each

DEPART = 10.0
"""Orders of magnitude: a gradient / update departs when it is at least this many times its reference."""
ORDINARY = 2.0
"""Inputs are ordinary when within this factor of the other ranks'."""
_LOW = {"float16": 65504.0, "half": 65504.0, "bfloat16": 3.3895313892515355e38}


def _ratio(a: float, b: float) -> float:
    if not (np.isfinite(a) and np.isfinite(b)) or b <= 0:
        return math.nan
    return a / b


def _median(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else math.nan


def _histories(v: View, j: int, step: int, stat: str = "norm") -> np.ndarray:
    """Per rank index: the median of tensor *j* over the steps before *step* (all other steps when < 2).

    NaN for a rank with no other finite step. Memoised on the view (the tests ask for the same
    histories at the same steps).
    """
    key = ("history", j, int(step), stat)
    got = v.memo.get(key)
    if got is None:
        x = v.stats[stat][:, :, j]
        fin = np.isfinite(x)
        before = (v.steps < step)[:, None] & fin
        other = (v.steps != step)[:, None] & fin
        got = np.where(before.sum(axis=0) >= 2, masked_median(x, before), masked_median(x, other))
        v.memo[key] = got
    return got


def _others(v: View, j: int, step: int, stat: str = "norm") -> np.ndarray:
    """Per rank index: the median of the other ranks' *stat* of tensor *j* at *step* (memoised)."""
    key = ("others", j, int(step), stat)
    got = v.memo.get(key)
    if got is None:
        got = median_without_each(v.at(j, step, stat))
        v.memo[key] = got
    return got


def _cand(cause: str, certain: bool, text: str, step: int, rank: int | None, rec: dict[str, Any],
          strength: float, series: list[str], records: list[tuple[View, int, int | None, str]],
          **extra: Any) -> dict[str, Any]:
    return {"cause": cause, "certain": certain, "text": text, "step": int(step), "rank": rank, **rec,
            "strength": float(strength), "series": series, "records": records, **extra}


# -- data ---------------------------------------------------------------------------------------
def _seq(v: View, j: int, step: int, ri: int) -> float:
    si = v.step_index(step)
    if si is None:
        return math.inf
    s = float(v.seq[si, ri, j])
    return s if s >= 0 else math.inf


def _first_per_rank(cands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One candidate per (cause, rank): the earliest record in execution order (dump before monitor)."""
    best: dict[tuple[str, Any], dict[str, Any]] = {}
    for c in cands:
        key = (c["cause"], c["rank"])
        have = best.get(key)
        rank_key = (not c["certain"], c["records"][0][0].monitor if c["records"] else True, c.get("seq", math.inf))
        if have is None or rank_key < (not have["certain"], have["records"][0][0].monitor if have["records"]
                                       else True, have.get("seq", math.inf)):
            best[key] = c
    return list(best.values())


# -- hardware and the loss-scale pattern --------------------------------------------------------
def _fmt_vals(vals: list[Any]) -> str:
    return ", ".join(f"{float(x):.6g}" for x in vals[:4]) + (" …" if len(vals) > 4 else "")


# -- numerics -----------------------------------------------------------------------------------
