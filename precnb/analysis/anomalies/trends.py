"""Trend breaks: a statistic that leaves its own history gradually, and what is too noisy to judge.

A **drift** of one (rank, tensor, statistic) series over steps starts at the *onset* step ``o``
when, with ``ref`` the median of the steps before ``o`` and ``noise`` their largest step-to-step
change (at least ``rel_floor * |ref|``):

* ``x[o]`` is more than ``z * noise`` away from ``ref``;
* every later step is further away, in the same direction (a monotone departure, at least
  ``min_run`` steps long counting the onset);
* the last step is away by at least ``min_departure * |ref|`` (a 2x change by default), so the
  slow evolution of a healthy run is not a drift.

What is never judged (spikes included, see :func:`noise_dominated`):

* a **scalar** (one element) whose value changes sign or sits at zero — a near-zero loss term
  or a statistic a monitor computed: its ratio to its own history means nothing;
* the **mean of a centred tensor** (``|mean|`` small against ``max - min``): noise-dominated,
  while min, max and norm are not;
* **bookkeeping ops** (:func:`bookkeeping_nodes`): statistics a monitor computes inside module
  hooks while a dump runs in the same process; msprobe records them like model ops.

Modules are ranked by **lead time**: steps from their onset to the first change of the loss or
of the total gradient norm (:func:`reference_series`), earliest first.

Examples
--------
>>> import numpy as np
>>> drift_onset(np.array([-1.70, -1.71, -1.72, -2.17, -3.37, -8.77, -19.9]))
(3, -1.71, 'falls')
>>> drift_onset(np.array([1.0, 1.01, 1.02, 1.03, 1.04, 1.05])) is None
True
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from precnb.schema import read_side_table

__all__ = ["TrendRule", "bookkeeping_nodes", "drift_onset", "drift_table", "noise_dominated", "noise_mask",
           "reference_series", "trend_summary"]

_HOOK_FRAMES = ("hook_result = hook(", "args_kwargs_result = hook(", "result = hook(", "_engine_run_backward",
                "/msprobe/pytorch/monitor",
                "/msprobe/mindspore/monitor", "/msprobe/core/monitor")
OPTIMIZER_FAMILIES = ("exp_avg", "exp_avg_sq", "param_origin", "param_updated")
"""Monitor families that hold optimizer state or parameters (they evolve by design)."""
LOSS_APIS = ("cross_entropy", "nll_loss", "mse_loss", "l1_loss", "binary_cross_entropy", "smooth_l1_loss", "kl_div")


@dataclass(frozen=True)
class TrendRule:
    """Parameters of the drift test."""

    stats: tuple[str, ...] = ("min", "max", "norm", "mean")
    z: float = 3.0
    rel_floor: float = 0.05
    min_history: int = 2
    min_run: int = 3
    min_departure: float = 1.0
    centred: float = 0.05


def drift_onset(x: np.ndarray, rule: TrendRule | None = None) -> tuple[int, float, str] | None:
    """(onset index, reference, "rises"/"falls") of the first drift in *x* (NaN = not recorded), or None."""
    rule = rule or TrendRule()
    idx = np.flatnonzero(np.isfinite(x))
    v = x[idx]
    n = len(v)
    for o in range(rule.min_history, n - rule.min_run + 1):
        h = v[:o]
        ref = float(np.median(h))
        noise = max(float(np.max(np.abs(np.diff(h)))) if o > 1 else 0.0, rule.rel_floor * abs(ref), 1e-12)
        d = v[o:] - ref
        sign = np.sign(d[0])
        if sign == 0 or abs(d[0]) <= rule.z * noise:
            continue
        away = d * sign
        if np.any(np.diff(away) < -noise * 0.5) or np.any(away <= 0):
            continue
        if away[-1] < rule.min_departure * max(abs(ref), noise) or away[-1] < 3 * rule.z * noise:
            continue
        return int(idx[o]), ref, "rises" if sign > 0 else "falls"
    return None


def noise_dominated(stat: str, values: dict[str, np.ndarray], numel: np.ndarray, rule: TrendRule | None = None
                    ) -> bool:
    """Whether one series of *stat* is too noisy to judge against its own history.

    Parameters
    ----------
    stat : str
    values : dict
        ``{"max", "min", "mean", "norm"}`` series over steps (NaN = not recorded).
    numel : array
        Element counts over steps (-1 = unknown).
    """
    rule = rule or TrendRule()
    mean = values.get("mean")
    scalar = bool(np.any(numel == 1))
    if scalar:
        signed = values.get("max") if mean is None or not np.isfinite(mean).any() else mean
        s = np.sign(signed[np.isfinite(signed)]) if signed is not None else np.array([])
        if len(s) and (np.any(s == 0) or len(set(s.tolist())) > 1):
            return True
    if stat == "mean" and mean is not None:
        spread = values["max"] - values["min"]
        ok = np.isfinite(mean) & np.isfinite(spread)
        if not ok.any():
            return True
        if np.any(np.abs(mean[ok]) < rule.centred * np.abs(spread[ok])):
            return True
    if stat in ("min", "max", "mean"):
        x = values[stat]
        s = np.sign(x[np.isfinite(x)])
        if len(set(s.tolist())) > 1:  # crosses zero: relative departures mean nothing
            return True
    return False


def noise_mask(stat: str, stats: dict[str, np.ndarray], numel: np.ndarray, rule: TrendRule | None = None
               ) -> np.ndarray:
    """:func:`noise_dominated` for every (rank, tensor) series at once: arrays are (step, rank, tensor)."""
    rule = rule or TrendRule()
    with np.errstate(invalid="ignore"):
        mean = stats.get("mean")
        signed = mean if mean is not None else stats["max"]
        fin = np.isfinite(signed)
        pos = (fin & (signed > 0)).any(axis=0)
        neg = (fin & (signed < 0)).any(axis=0)
        zero = (fin & (signed == 0)).any(axis=0)
        scalar = (numel == 1).any(axis=0)
        out = scalar & ((pos & neg) | zero)
        if stat == "mean" and mean is not None:
            spread = np.abs(stats["max"] - stats["min"])
            ok = np.isfinite(mean) & np.isfinite(spread)
            centred = (ok & (np.abs(mean) < rule.centred * spread)).any(axis=0)
            out |= centred | ~ok.any(axis=0)
        if stat in ("min", "max", "mean"):
            x = stats[stat]
            f = np.isfinite(x)
            out |= (f & (x > 0)).any(axis=0) & (f & (x < 0)).any(axis=0)
    return out


def bookkeeping_nodes(ds: xr.Dataset) -> set[str]:
    """Forward API records a monitor made (its statistics ops), recognised from their stack frames.

    Frames are innermost first and msprobe leaves its own frames out, so a statistic TrainerMon
    computes shows only torch frames before the model's code: a module hook call
    (``hook_result = hook(...)``), a ``torch.no_grad``-decorated function whose own frame is
    missing (``_contextlib.py`` innermost), or the autograd engine running a gradient hook. A model
    op (also one run inside a custom ``backward``) shows the model's own frame first.
    """
    from precnb.naming import parse_node

    out: set[str] = set()
    for node, frames in read_side_table(ds, "stacks").items():
        p = parse_node(str(node))
        if not isinstance(frames, list) or not frames or p.kind != "api" or p.direction != "forward":
            continue  # module records are written from msprobe's own module hooks
        if "/torch/utils/_contextlib.py" in str(frames[0]):
            out.add(str(node))
            continue
        for fr in frames:
            text = str(fr)
            if any(h in text for h in _HOOK_FRAMES):
                out.add(str(node))
                break
            if "/site-packages/torch/" not in text and "/torch/utils/" not in text:
                break  # reached the caller's own code: a model op
    return out


def reference_series(ds: xr.Dataset) -> dict[str, np.ndarray]:
    """Loss and total gradient norm per (step, rank), where the run records them.

    ``loss``: the output of the first loss API (``cross_entropy``, ``nll_loss``, ...).
    ``grad_norm``: sqrt of the sum of squared parameter-gradient norms (dump ``param_grad``
    records, or monitor ``grad_reduced`` / ``grad_unreduced`` rows).
    """
    out: dict[str, np.ndarray] = {}
    apis = np.asarray([str(a) for a in ds["api"].values])
    roles = np.asarray([str(r) for r in ds["role"].values])
    dirs = np.asarray([str(d) for d in ds["direction"].values])
    loss = [j for j, a in enumerate(apis) if a.rsplit(".", 1)[-1] in LOSS_APIS and roles[j] == "output"
            and dirs[j] == "forward"]
    if loss:
        j = loss[0]
        out["loss"] = np.where(ds["present"].values[..., j], ds["mean"].values[..., j], np.nan)
    kinds = np.asarray([str(k) for k in ds["kind"].values])
    grads = kinds == "param_grad"
    if not grads.any():
        for fam in ("grad_reduced", "grad_unreduced"):
            grads = (kinds == "monitor") & (apis == fam)
            if grads.any():
                break
    if grads.any():
        nm = np.where(ds["present"].values[..., grads], ds["norm"].values[..., grads], 0.0)
        with np.errstate(invalid="ignore"):
            out["grad_norm"] = np.sqrt(np.sum(nm.astype(float) ** 2, axis=-1))
    return out


def _change_step(x: np.ndarray, steps: np.ndarray) -> int | None:
    """First step where a reference series leaves its history (a jump, a drift or a non-finite value)."""
    for i in range(2, len(x)):
        if not np.isfinite(x[i]):
            return int(steps[i])
        h = x[:i][np.isfinite(x[:i])]
        if len(h) < 2:
            continue
        ref = float(np.median(h))
        noise = max(float(np.max(np.abs(np.diff(h)))), 0.05 * abs(ref), 1e-12)
        if abs(x[i] - ref) > 4 * noise and abs(x[i] - ref) > 0.25 * abs(ref):
            return int(steps[i])
    return None


def drift_table(ds: xr.Dataset, *, rule: TrendRule | None = None, skip: set[str] | None = None) -> pd.DataFrame:
    """Every drift of one in-memory run: one row per (rank, tensor, stat) series that drifts.

    Columns ``type`` ("drift"), ``step`` (onset), ``rank``, ``tensor``, ``node``, ``module``,
    ``stat``, ``value`` (at the onset), ``reference`` (history median), ``score`` (last departure
    / |reference|), ``last_step``, ``last_value``, ``direction``, ``micro_step``, ``seq``.
    """
    rule = rule or TrendRule()
    skip = skip if skip is not None else bookkeeping_nodes(ds)
    steps = ds["step"].values
    nodes = np.asarray([str(n) for n in ds["node"].values])
    keep = ~np.isin(nodes, list(skip)) if skip else np.ones(len(nodes), bool)
    # optimizer states (Adam moments start at zero and grow by design) are not activations
    keep &= ~np.isin(np.asarray([str(d) for d in ds["direction"].values]), ["optimizer"])
    keep &= ~np.isin(np.asarray([str(m) for m in ds["module"].values]), ["optimizer", "clip_grad"])
    keep &= ~np.isin(np.asarray([str(a) for a in ds["api"].values]), list(OPTIMIZER_FAMILIES))
    present = ds["present"].values
    stats = {s: np.where(present, ds[s].values, np.nan) for s in ("max", "min", "mean", "norm") if s in ds}
    numel = ds["numel"].values if "numel" in ds else np.full(present.shape, -1)
    rows: list[dict[str, Any]] = []
    labels, modules = ds["tensor"].values, ds["module"].values
    micro, seq = ds["micro_step"].values, ds["seq"].values
    enough = present.sum(axis=0) >= rule.min_history + rule.min_run
    for stat in rule.stats:
        if stat not in stats:
            continue
        x = stats[stat]
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            first = np.nanmedian(np.where(np.isfinite(x), x, np.nan)[: rule.min_history + 1], axis=0) \
                if x.shape[0] > rule.min_history else np.full(x.shape[1:], np.nan)
            lo, hi = np.nanmin(np.where(np.isfinite(x), x, np.nan), axis=0), np.nanmax(
                np.where(np.isfinite(x), x, np.nan), axis=0)
            wide = np.maximum(np.abs(hi - first), np.abs(first - lo)) >= 0.5 * rule.min_departure * np.abs(first)
        cand = enough & keep[None, :] & wide & ~noise_mask(stat, stats, numel, rule)
        for ri, tj in np.argwhere(cand):
            hit = drift_onset(x[:, ri, tj], rule)
            if hit is None:
                continue
            o, ref, direction = hit
            xs = x[:, ri, tj]
            last = int(np.flatnonzero(np.isfinite(xs))[-1])
            rows.append({"type": "drift", "step": int(steps[o]), "rank": int(ds["rank"].values[ri]),
                         "tensor": str(labels[tj]), "node": str(nodes[tj]), "module": str(modules[tj]),
                         "stat": stat, "value": float(xs[o]), "reference": ref,
                         "score": float(abs(xs[last] - ref) / max(abs(ref), 1e-12)),
                         "last_step": int(steps[last]), "last_value": float(xs[last]), "direction": direction,
                         "micro_step": int(micro[tj]), "seq": int(seq[o, ri, tj])})
    cols = ["type", "step", "rank", "tensor", "node", "module", "stat", "value", "reference", "score",
            "last_step", "last_value", "direction", "micro_step", "seq"]
    df = pd.DataFrame(rows, columns=cols)
    if len(df):
        df = df.sort_values(["step", "seq", "rank"], kind="stable").reset_index(drop=True)
    return df


def trend_summary(ds: xr.Dataset, drifts: pd.DataFrame) -> dict[str, Any]:
    """Onset, modules ranked by lead time before a loss / grad-norm change, and the reference changes."""
    steps = ds["step"].values
    ref = reference_series(ds)
    changes: dict[str, int | None] = {}
    for name, arr in ref.items():
        per_rank = [_change_step(arr[:, ri], steps) for ri in range(arr.shape[1])]
        known = [c for c in per_rank if c is not None]
        changes[name] = min(known) if known else None
    known = [c for c in changes.values() if c is not None]
    change = min(known) if known else None
    modules: list[dict[str, Any]] = []
    seen: set[tuple[str, int]] = set()
    for r in drifts.to_dict("records"):
        key = (r["module"] or r["node"], r["rank"])
        if key in seen:
            continue
        seen.add(key)
        lead = (change - r["step"]) if change is not None else None
        modules.append({"module": r["module"] or None, "node": r["node"], "tensor": r["tensor"], "stat": r["stat"],
                        "rank": r["rank"], "onset_step": r["step"], "direction": r["direction"],
                        "reference": r["reference"], "last_value": r["last_value"], "last_step": r["last_step"],
                        "lead_steps": lead})
    modules.sort(key=lambda m: (-(m["lead_steps"] if m["lead_steps"] is not None else -m["onset_step"]),
                                m["onset_step"], m["module"] is None))
    return {"reference_change": changes, "first_reference_change": change, "modules": modules[:50]}
