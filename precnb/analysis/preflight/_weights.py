"""The initial-weights check: the runs start from the same weights (parameter statistics at the first common step)."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.preflight._common import Param, check, fmt, names_list, param_stats

__all__ = ["check_initial_weights"]

_RTOL = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


def _rtol(*dtypes: str) -> float:
    return max([_RTOL.get(d.replace("torch.", "").lower(), 2.0 ** -14) for d in dtypes] or [2.0 ** -14])


def check_initial_weights(base: xr.Dataset, target: xr.Dataset, pb: dict[str, Param], pt: dict[str, Param],
                          step_offset: int, names: tuple[str, str]) -> dict[str, Any]:
    """The runs start from the same weights: parameter statistics at the first common step."""
    title = "Initial weights"
    common = [n for n in pb if n in pt and pb[n].label and pt[n].label and (
        not pb[n].shape or not pt[n].shape or pb[n].shape == pt[n].shape)]
    tsteps = set(int(s) for s in target["step"].values)
    steps = [int(s) for s in base["step"].values if int(s) + step_offset in tsteps]
    ranks = sorted(set(int(r) for r in base["rank"].values) & set(int(r) for r in target["rank"].values))
    if not common or not steps or not ranks:
        return check("initial_weights", title, "skip", "no parameter recorded at a step and rank both runs hold")
    s0 = steps[0]
    bi = int(np.flatnonzero(base["step"].values == s0)[0])
    ti = int(np.flatnonzero(target["step"].values == s0 + step_offset)[0])
    differ: list[dict[str, Any]] = []
    # every common parameter at every common rank at once: (parameter, rank, 4)
    b_ranks = [list(base["rank"].values).index(r) for r in ranks]
    t_ranks = [list(target["rank"].values).index(r) for r in ranks]
    a_all = np.stack([param_stats(base, str(pb[n].label))[bi][b_ranks] for n in common])
    b_all = np.stack([param_stats(target, str(pt[n].label))[ti][t_ranks] for n in common])
    used = ~(np.isnan(a_all).all(axis=-1) | np.isnan(b_all).all(axis=-1))  # (parameter, rank)
    compared = int(used.sum())
    with np.errstate(invalid="ignore", all="ignore"):  # max/min/mean relative to the weights' range
        ext = np.abs(np.concatenate([a_all[..., :2], b_all[..., :2]], axis=-1))
        scale = np.maximum(np.where(np.isnan(ext), -np.inf, ext).max(axis=-1, keepdims=True), 1e-30)
        rel = np.abs(a_all - b_all) / np.maximum(np.maximum(np.abs(a_all), np.abs(b_all)), scale)
    rel = np.where(np.isnan(a_all) & np.isnan(b_all), 0.0, rel)  # NaN in both: the same
    tol = np.asarray([_rtol(pb[n].dtype, pt[n].dtype) for n in common])[:, None, None]
    with np.errstate(invalid="ignore"):
        bad = used & ~np.all(rel <= tol, axis=-1)  # (parameter, rank); NaN in one: differs
    for p in np.flatnonzero(bad.any(axis=1)).tolist():  # in parameter order, its first differing rank
        k_r = int(np.flatnonzero(bad[p])[0])
        a, b, rr = a_all[p, k_r], b_all[p, k_r], rel[p, k_r]
        k = int(np.nanargmax(np.where(np.isnan(rr), np.inf, rr)))
        zero = [side for side, v in ((names[0], a), (names[1], b)) if v[0] == 0 and v[1] == 0]
        differ.append({"name": common[p], "rank": ranks[k_r], "stat": ("max", "min", "mean", "norm")[k],
                       "baseline": float(a[k]), "target": float(b[k]), "rel_diff": float(rr[k]),
                       "all_zero_in": zero[0] if len(zero) == 1 else None})
    if not compared:
        return check("initial_weights", title, "skip", f"no parameter recorded on both runs at step {s0}")
    where = f"step {s0}" + (f" (target step {s0 + step_offset})" if step_offset else "")
    if differ:
        names_d = [d["name"] for d in differ]
        first = differ[0]
        zeroed = [d for d in differ if d["all_zero_in"]]
        lead = ""
        if zeroed:  # all zeros in one run only: a weight the checkpoint did not load, the likely root cause
            z = zeroed[0]
            lead = (f"{names_list([d['name'] for d in zeroed])} {'is' if len(zeroed) == 1 else 'are'} all zeros in "
                    f"{z['all_zero_in']} only (max = min = 0 at {where}): a weight that was not loaded (checkpoint "
                    "loading), the likely root cause; ")
        # a warning, not a failure: the runs' first common step need not be where training started
        return check("initial_weights", title, "warn", f"{lead}{len(differ)} of {len(common)} parameters differ at "
                     f"{where}: {names_list(names_d)}; e.g. {first['name']} {first['stat']} {fmt(first['baseline'])} "
                     f"vs {fmt(first['target'])} (rel. {fmt(first['rel_diff'])}, rank {first['rank']}): the runs do "
                     "not start from the same weights (another checkpoint or initialisation, or the dumps begin after "
                     "they diverged)", confidence="high", basis="compared", step=s0, differ=differ,
                     root_cause=bool(zeroed))
    return check("initial_weights", title, "pass", f"all {len(common)} common parameters agree at {where} "
                 f"(within dtype tolerance, {len(ranks)} rank(s))", confidence="high", basis="compared", step=s0)
