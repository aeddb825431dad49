"""The *hardware* cause of a loss spike: one rank's gradient before the reduce departs while its inputs are ordinary."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from precnb.analysis.spike._common import (
    DEPART,
    ORDINARY,
    _cand,
    _first_per_rank,
    _histories,
    _others,
    _ratio,
    _seq,
)
from precnb.analysis.spike._records import Param, View
from precnb.analysis.spike._vec import ratios


def _grad_departures(v: View, step: int) -> list[tuple[Param, int, float, float]]:
    """(param, rank index, ratio to the other ranks' median, ratio to its own history) of pre-reduce gradients.

    Only the finite ratios to the other ranks, in parameter then rank order; memoised on the view
    (the hardware test and the loss-scale test both ask).
    """
    key = ("grad_departures", int(step))
    got = v.memo.get(key)
    if got is not None:
        return got
    out: list[tuple[Param, int, float, float]] = []
    if len(v.ranks) >= 2:
        for p in v.params():
            g = v.at(p.pre, step)
            rho = ratios(g, _others(v, p.pre, step))
            keep = np.flatnonzero(np.isfinite(rho))
            if not len(keep):
                continue
            own = ratios(g, _histories(v, p.pre, step))
            out += [(p, int(ri), float(rho[ri]), float(own[ri])) for ri in keep]
    v.memo[key] = out
    return out


def _departs_alike(d: tuple[Param, int, float, float]) -> bool:
    """A gradient departs against the other ranks and against its own history (either way)."""
    up = d[2] >= DEPART and not (np.isfinite(d[3]) and d[3] < DEPART)
    down = d[2] <= 1 / DEPART and not (np.isfinite(d[3]) and d[3] > 1 / DEPART)
    return up or down


def _uniform_scales(v: View, step: int) -> dict[int, float]:
    """Rank index → the common factor, for the ranks where (nearly) every gradient departs by one factor.

    Memoised on the view. A rank is listed when at least 80 % of the parameters (and at least
    two) depart against the other ranks and their own history, within 4x of each other.
    """
    key = ("uniform_scales", int(step))
    got = v.memo.get(key)
    if got is not None:
        return got
    n_params = len(v.params())
    by_rank: dict[int, list[float]] = {}
    for d in _grad_departures(v, step):
        if _departs_alike(d):
            by_rank.setdefault(d[1], []).append(d[2])
    got = {}
    for ri, rho in by_rank.items():
        if n_params < 2 or len(rho) < max(2, math.ceil(0.8 * n_params)):
            continue
        logs = np.log(np.asarray(rho))
        if float(np.max(logs) - np.min(logs)) > math.log(ORDINARY * 2):
            continue
        got[ri] = float(np.exp(np.median(logs)))
    v.memo[key] = got
    return got


def hardware_causes(views: list[View], steps: list[int]) -> list[dict[str, Any]]:
    """Hardware: one rank's gradient of a parameter departs before the reduce while its inputs are ordinary."""
    out: list[dict[str, Any]] = []
    for v in views:
        for t in steps:
            deps = _grad_departures(v, t)
            scaled = _uniform_scales(v, t)
            for p, ri, rho, own in deps:
                if rho < DEPART or (np.isfinite(own) and own < DEPART):
                    continue
                if ri in scaled:
                    continue  # every gradient of the rank: the loss-scale pattern (numerics), not one device
                r = v.ranks[ri]
                ins = []
                for k in p.inputs:
                    x = v.at(k, t)
                    ins.append((v.labels[k], _ratio(float(x[ri]), float(_others(v, k, t)[ri]))))
                known = [q for _, q in ins if np.isfinite(q)]
                if any(q > ORDINARY or q < 1 / ORDINARY for q in known):
                    continue  # its inputs depart too: upstream (data, loss), not this gradient
                post = v.at(p.post, t) if p.post is not None else None
                carried = post is not None and np.isfinite(post).all() and float(np.ptp(post)) <= 1e-6 * float(
                    np.max(np.abs(post)))
                rec = v.record(p.pre)
                inputs_txt = ("its inputs are ordinary (" + ", ".join(f"{lab} {q:.3g}x" for lab, q in ins
                                                                     if np.isfinite(q)) + ")") if known \
                    else "its inputs are not recorded"
                text = (f"rank {r}'s gradient of {p.name} before the reduce is {rho:.3g}x the other ranks' at step {t}"
                        + (f" ({own:.3g}x its own history)" if np.isfinite(own) else "") + f" while {inputs_txt}"
                        + ("; after the reduce every rank carries it" if carried else "")
                        + ": a device that computed this gradient wrongly (or a kernel fault)")
                recs: list[tuple[View, int, int | None, str]] = [(v, t, r, rec["tensor"])]
                if p.post is not None:
                    recs += [(v, t, rr, v.labels[p.post]) for rr in v.ranks]
                series = [f"{v.name} {rec['tensor']} (before the reduce)"]
                if p.post is not None:
                    series.append(f"{v.name} {v.labels[p.post]} (after the reduce)")
                out.append(_cand("hardware", bool(known), text, t, r, rec, math.log10(rho), series, recs,
                                 seq=_seq(v, p.pre, t, ri), parameter=p.name,
                                 values={"before_reduce": [float(x) for x in v.at(p.pre, t)],
                                         "after_reduce": [float(x) for x in post] if post is not None else None,
                                         "ratio": rho}))
    return _first_per_rank(out)


# -- optimizer ----------------------------------------------------------------------------------
