"""The spike step: the first step whose loss departs from its own recent history.

One series (a rank's loss, or the run's) is judged step by step on ``y = ln(loss)`` (a relative
scale, so the rule does not depend on the model's loss level; a series with a value <= 0 is
judged on ``loss / median(|history|)`` instead). At step ``t``, with ``H`` the last ``window``
recorded values before ``t``:

* **enough history** (at least ``min_history`` step-to-step changes in ``H``): the loss's own
  trend and noise are estimated robustly from those changes ``d``: the prediction is
  ``H[-1] + median(d)`` (the recent typical change, so the steep fall of warm-up is followed,
  not taken for noise) and the noise ``sigma = max(1.4826 * MAD(d), floor)``. Step ``t``
  departs when ``y[t] - prediction > z * sigma`` **and** the loss rises: ``loss[t] > (1 +
  min_rise) * loss[t-1]`` (a loss that merely stops falling is not a spike);
* **short history** (the first steps of a run or of a dumped window: no noise estimate yet) and
  a **gradient-norm proxy** (no loss recorded: the total gradient norm stands in, and it is
  noisier than a loss): only a rise of more than ``jump`` x the previous value counts (10x,
  the factor of Megatron's ``check_for_spiky_loss``).

Non-finite values are neither judged nor history (a NaN loss is the NaN-origin search's). The
first ``warmup`` steps of the series are history only.

Examples
--------
>>> import numpy as np
>>> loss = np.array([4.38, 4.22, 3.87, 3.42, 2.86, 2.67, 2.59, 2.09, 1.83, 1.62])  # healthy: falls
>>> first_departure(loss, np.arange(10)) is None
True
>>> loss[6] = 4.40                                   # one step 1.6x the previous one
>>> first_departure(loss, np.arange(10))["step"]
6
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["LossSpikeRule", "first_departure", "first_departures"]


@dataclass(frozen=True)
class LossSpikeRule:
    """Parameters of the loss-spike test (see the module docstring).

    Attributes
    ----------
    window : int
        Recorded values before a step that form its history.
    min_history : int
        Step-to-step changes in the history needed to estimate the loss's own noise.
    z : float
        Departure from the predicted loss, in units of the robust noise.
    floor : float
        Smallest noise (in ln units: 0.02 is 2 % per step).
    min_rise : float
        The loss must also exceed its previous value by this fraction.
    jump : float
        With a short history, or judged on the gradient-norm proxy: the factor a rise must exceed.
    warmup : int
        Steps at the start of a series that are history only.
    """

    window: int = 8
    min_history: int = 3
    z: float = 6.0
    floor: float = 0.02
    min_rise: float = 0.10
    jump: float = 10.0
    warmup: int = 0

    def describe(self, *, proxy: bool = False) -> str:
        """The rule in words (what the finding states as its definition)."""
        if proxy:
            return (f"no loss recorded: the total gradient norm stands in, and a step departs when it rises more "
                    f"than {self.jump:g}x over the previous recorded step")
        return (f"a step departs when ln(loss) exceeds the recent trend (previous value + median step-to-step "
                f"change over the last {self.window} recorded steps) by more than {self.z:g} x the robust noise "
                f"(1.4826 x MAD of those changes, at least {self.floor:g}) and the loss rises more than "
                f"{self.min_rise:.0%} over the previous step; with fewer than {self.min_history} changes of history "
                f"(warm-up, the start of a window) only a rise of more than {self.jump:g}x counts")


def _transform(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """Ln of the series when every finite value is positive, else the raw values (relative judging)."""
    fin = np.isfinite(x)
    if fin.any() and np.all(x[fin] > 0):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(np.where(fin, x, np.nan)), True
    return np.where(fin, x, np.nan), False


def first_departure(x: np.ndarray, steps: np.ndarray, rule: LossSpikeRule | None = None, *,
                    proxy: bool = False) -> dict[str, Any] | None:
    """The first step at which the series *x* (over *steps*) departs, or None.

    Parameters
    ----------
    x : ndarray
        Values over steps (NaN / inf: not recorded or non-finite; not judged).
    steps : ndarray of int
        The step of each value.
    rule : LossSpikeRule, optional
    proxy : bool
        *x* is a gradient norm standing in for the loss (only the jump test applies).

    Returns
    -------
    dict or None
        ``step``, ``value``, ``previous`` (the previous recorded value), ``ratio`` (value /
        previous), ``z`` (departure in noise units, None for the jump test), ``test``
        (``"trend"`` or ``"jump"``), ``history`` (the number of earlier values judged against).
    """
    rule = rule or LossSpikeRule()
    x = np.asarray(x, dtype=float)
    y, logged = _transform(x)
    idx = np.flatnonzero(np.isfinite(y))
    for k in range(1, len(idx)):
        i = idx[k]
        if int(steps[i]) < int(steps[idx[0]]) + rule.warmup:
            continue
        hist = idx[max(0, k - rule.window):k]
        prev_v = float(x[hist[-1]])
        now = float(x[i])
        if logged:
            rise = float(y[i] - y[hist[-1]])
            ratio = now / prev_v
        else:
            level = float(np.median(np.abs(x[hist]))) or 1.0
            rise = (now - prev_v) / level
            ratio = now / prev_v if prev_v else math.inf
        z: float | None = None
        if len(hist) >= rule.min_history + 1 and not proxy:
            h = y[hist] if logged else x[hist] / (float(np.median(np.abs(x[hist]))) or 1.0)
            d = np.diff(h)
            med = float(np.median(d))
            sigma = max(1.4826 * float(np.median(np.abs(d - med))), rule.floor)
            cur = float(y[i]) if logged else now / (float(np.median(np.abs(x[hist]))) or 1.0)
            z = (cur - (float(h[-1]) + med)) / sigma
            grow = math.log1p(rule.min_rise) if logged else rule.min_rise
            hit = z > rule.z and rise > grow
            test = "trend"
        else:
            hit = rise > (math.log(rule.jump) if logged else rule.jump - 1.0)
            test = "jump"
        if hit:
            return {"step": int(steps[i]), "value": now, "previous": prev_v, "ratio": ratio, "z": z, "test": test,
                    "history": len(hist)}
    return None


def first_departures(xs: np.ndarray, steps: np.ndarray, rule: LossSpikeRule | None = None, *,
                     proxy: bool = False) -> list[dict[str, Any] | None]:
    """:func:`first_departure` of every column of *xs* (step, series), the same answers, many columns at once.

    Columns whose values are all positive (judged on ln(loss)) and recorded at the same steps are
    judged together, one step at a time over all of them (a loss log of 128 ranks: 10 NumPy
    steps instead of 1,290); any other column goes through :func:`first_departure` alone.
    """
    rule = rule or LossSpikeRule()
    xs = np.asarray(xs, dtype=float)
    out: list[dict[str, Any] | None] = [None] * xs.shape[1]
    groups: dict[bytes, list[int]] = {}
    for c in range(xs.shape[1]):
        x = xs[:, c]
        fin = np.isfinite(x)
        if fin.any() and bool(np.all(x[fin] > 0)):
            groups.setdefault(fin.tobytes(), []).append(c)
        else:
            out[c] = first_departure(x, steps, rule, proxy=proxy)
    for cols in groups.values():
        for c, d in zip(cols, _logged_departures(xs[:, cols], steps, rule, proxy), strict=True):
            out[c] = d
    return out


def _logged_departures(x: np.ndarray, steps: np.ndarray, rule: LossSpikeRule, proxy: bool
                       ) -> list[dict[str, Any] | None]:
    """:func:`first_departure` of columns of positive values, all recorded at the same steps.

    The steps with a full history (``window`` values before them) are judged a block of steps at a time
    (sliding windows of the step-to-step changes; the same medians, so the same answers): a loss log of
    1,000,000 steps took ~100 s one step at a time (issue #49 defect 8).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.log(np.where(np.isfinite(x), x, np.nan))
    idx = np.flatnonzero(np.isfinite(y[:, 0]))
    out: list[dict[str, Any] | None] = [None] * x.shape[1]
    todo = np.ones(x.shape[1], bool)
    grow = math.log1p(rule.min_rise)
    first = min(len(idx), max(rule.window, 1))
    for k in range(1, first):  # a short history: one step at a time
        if int(steps[idx[k]]) < int(steps[idx[0]]) + rule.warmup:
            continue
        hist = idx[max(0, k - rule.window):k]
        rise = y[idx[k]] - y[hist[-1]]
        z: np.ndarray | None = None
        if len(hist) >= rule.min_history + 1 and not proxy:
            z = _trend_z(y[hist], y[idx[k]], rule.floor)
            hit = (z > rule.z) & (rise > grow)
        else:
            hit = rise > math.log(rule.jump)
        _record(out, todo, hit, x, steps, idx[k], hist[-1], z, len(hist))
        if not todo.any():
            return out
    if len(idx) > first and todo.any():
        _logged_blocks(out, todo, x, y, steps, idx, first, rule, proxy)
    return out


def _trend_z(h: np.ndarray, now: np.ndarray, floor: float) -> np.ndarray:
    """Departure of *now* from the trend of the history rows *h* (axis 0), in robust-noise units."""
    d = np.diff(h, axis=0)
    med = np.median(d, axis=0)
    sigma = np.maximum(1.4826 * np.median(np.abs(d - med), axis=0), floor)
    return (now - (h[-1] + med)) / sigma


def _record(out: list[dict[str, Any] | None], todo: np.ndarray, hit: np.ndarray, x: np.ndarray, steps: np.ndarray,
            i: int, prev: int, z: np.ndarray | None, history: int) -> None:
    for c in np.flatnonzero(hit & todo):
        now, prev_v = float(x[i, c]), float(x[prev, c])
        out[c] = {"step": int(steps[i]), "value": now, "previous": prev_v, "ratio": now / prev_v,
                  "z": float(z[c]) if z is not None else None, "test": "trend" if z is not None else "jump",
                  "history": history}
        todo[c] = False


def _logged_blocks(out: list[dict[str, Any] | None], todo: np.ndarray, x: np.ndarray, y: np.ndarray,
                   steps: np.ndarray, idx: np.ndarray, first: int, rule: LossSpikeRule, proxy: bool) -> None:
    """Steps ``idx[first:]`` (each with a full window of history), judged a block of steps at a time."""
    w = max(rule.window, 1)
    yy = y[idx]
    trend = w >= rule.min_history + 1 and not proxy
    warm = steps[idx].astype(np.int64) >= int(steps[idx[0]]) + rule.warmup
    grow = math.log1p(rule.min_rise)
    cols = np.flatnonzero(todo)
    block = max(1, (1 << 22) // max(1, len(cols) * w))
    for k0 in range(first, len(idx), block):
        k1 = min(len(idx), k0 + block)
        cur, last = yy[k0:k1][:, cols], yy[k0 - 1:k1 - 1][:, cols]
        rise = cur - last
        z: np.ndarray | None = None
        if trend:
            hist = np.lib.stride_tricks.sliding_window_view(yy[k0 - w:k1 - 1][:, cols], w, axis=0)  # (B, C, w)
            d = np.diff(hist, axis=-1)
            med = np.median(d, axis=-1)
            sigma = np.maximum(1.4826 * np.median(np.abs(d - med[..., None]), axis=-1), rule.floor)
            z = (cur - (last + med)) / sigma
            hit = (z > rule.z) & (rise > grow)
        else:
            hit = rise > math.log(rule.jump)
        hit &= warm[k0:k1, None]
        for j in np.flatnonzero(hit.any(axis=0)):
            if not todo[cols[j]]:
                continue
            r = int(np.argmax(hit[:, j]))
            zc = np.full(x.shape[1], np.nan)
            if z is not None:
                zc[cols[j]] = z[r, j]
            one = np.zeros(x.shape[1], bool)
            one[cols[j]] = True
            _record(out, todo, one, x, steps, int(idx[k0 + r]), int(idx[k0 + r - 1]), zc if z is not None else None, w)
        if not todo.any():
            return
