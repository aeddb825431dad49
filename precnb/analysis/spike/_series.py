"""The loss series a spike is judged on: per rank and for the whole run, from the best source at hand.

Sources, best first: a loss log (``step,loss[,rank]``, or TensorBoard scalars, read by
:func:`precnb.io.read_loss_log`), which covers every step; the dumped loss op (the output of the
first loss API, ``Functional.cross_entropy.0.forward.output.0``), which covers the dumped steps;
and, when neither exists (a monitor output alone), the total gradient norm as a proxy (monitor
``grad_unreduced`` per rank, else ``grad_reduced``; dump parameter gradients).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from precnb.analysis.anomalies.trends import LOSS_APIS

__all__ = ["LossSeries", "dump_loss_label", "gather_series"]


@dataclass
class LossSeries:
    """One signal over steps, per rank and for the run.

    Attributes
    ----------
    steps : ndarray of int
    ranks : list of int
        Ranks with a series of their own (empty: the run's series only).
    values : ndarray (step, rank)
        NaN where not recorded.
    total : ndarray (step,)
        The run's series: the log's global values, else the mean over ranks where every rank has one.
    signal : {"loss", "grad_norm"}
    source : str
        Where it was read, in words.
    label : str or None
        The dump / monitor tensor it was read from (None for a loss log).
    notes : list of str
    """

    steps: np.ndarray
    ranks: list[int]
    values: np.ndarray
    total: np.ndarray
    signal: str
    source: str
    label: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def proxy(self) -> bool:
        """True when the gradient norm stands in for the loss."""
        return self.signal == "grad_norm"

    def around(self, step: int, before: int = 3, after: int = 2) -> dict[str, Any]:
        """The values around *step*: ``steps``, ``rank{R}`` lists, ``all`` (the run's series)."""
        keep = (self.steps >= step - before) & (self.steps <= step + after)
        out: dict[str, Any] = {"steps": [int(s) for s in self.steps[keep]]}
        for j, r in enumerate(self.ranks):
            out[f"rank{r}"] = [float(v) for v in self.values[keep, j]]
        out["all"] = [float(v) for v in self.total[keep]]
        return out


def _mean_over_ranks(values: np.ndarray) -> np.ndarray:
    ok = np.isfinite(values).all(axis=1) if values.shape[1] else np.zeros(values.shape[0], bool)
    with np.errstate(invalid="ignore"):
        m = values.mean(axis=1) if values.shape[1] else np.full(values.shape[0], np.nan)
    return np.where(ok, m, np.nan)


def dump_loss_label(ds: xr.Dataset) -> str | None:
    """The tensor label of the dumped loss (the output of the first forward loss API), or None."""
    apis = ds["api"].values
    cand = np.flatnonzero((ds["role"].values == "output") & (ds["direction"].values == "forward"))
    for j in cand:  # in tensor order: the first forward output of a loss API
        if str(apis[j]).rsplit(".", 1)[-1] in LOSS_APIS:
            return str(ds["tensor"].values[j])
    return None


def _from_dump(ds: xr.Dataset) -> LossSeries | None:
    label = dump_loss_label(ds)
    if label is None:
        return None
    j = ds.indexes["tensor"].get_loc(label)
    vals = np.where(ds["present"].values[..., j], ds["mean"].values[..., j], np.nan).astype(float)
    return LossSeries(np.asarray(ds["step"].values, dtype=np.int64), [int(r) for r in ds["rank"].values], vals,
                      _mean_over_ranks(vals), "loss", f"dumped loss op {label}", label)


def _from_log(log: pd.DataFrame, source: str) -> LossSeries:
    step_col = [int(s) for s in log["step"]]
    steps = np.asarray(sorted(set(step_col)), dtype=np.int64)
    has_rank = "rank" in log and log["rank"].notna().any()
    rank_col = log["rank"].to_numpy(dtype=float, na_value=np.nan) if has_rank else np.full(len(log), np.nan)
    ranks = sorted({int(r) for r in rank_col[~np.isnan(rank_col)]}) if has_rank else []
    si = np.searchsorted(steps, np.asarray(step_col, dtype=np.int64))
    loss = log["loss"].to_numpy(dtype=float)
    values = np.full((len(steps), len(ranks)), np.nan)
    total = np.full(len(steps), np.nan)
    glob = np.isnan(rank_col)
    _put_last(total, (si[glob],), loss[glob])
    if ranks:
        rj = np.searchsorted(np.asarray(ranks, dtype=np.int64), rank_col[~glob].astype(np.int64))
        _put_last(values, (si[~glob], rj), loss[~glob])
        mean = _mean_over_ranks(values)
        total = np.where(np.isnan(total), mean, total)
    return LossSeries(steps, ranks, values, total, "loss", source)


def _put_last(out: np.ndarray, where: tuple[np.ndarray, ...], vals: np.ndarray) -> None:
    """``out[where] = vals`` where the last of repeated cells wins (a log that writes a step twice)."""
    flat = np.ravel_multi_index(where, out.shape) if len(where[0]) else np.zeros(0, np.int64)
    rev = flat[::-1]
    _, first = np.unique(rev, return_index=True)  # the first in reverse is the last written
    out.reshape(-1)[rev[first]] = vals[::-1][first]


def _grad_norm(ds: xr.Dataset) -> LossSeries | None:
    kinds = ds["kind"].values
    apis = ds["api"].values
    for fam in ("grad_unreduced", "grad_reduced", None):
        cols = np.flatnonzero((kinds == "monitor") & (apis == fam)) if fam else np.flatnonzero(kinds == "param_grad")
        if len(cols):
            break
    else:
        return None
    present = ds["present"].values[..., cols]
    norms = np.where(present, ds["norm"].values[..., cols], 0.0).astype(float)
    with np.errstate(invalid="ignore", over="ignore"):
        tot = np.sqrt(np.sum(norms ** 2, axis=-1))
    tot = np.where(present.any(axis=-1), tot, np.nan)
    what = f"monitor {fam}" if fam else "dumped parameter gradients"
    return LossSeries(np.asarray(ds["step"].values, dtype=np.int64), [int(r) for r in ds["rank"].values], tot,
                      _mean_over_ranks(tot), "grad_norm", f"total gradient norm, {what}")


def gather_series(dump: xr.Dataset | None, monitor: xr.Dataset | None, loss: pd.DataFrame | None,
                  loss_source: str = "loss log") -> LossSeries | None:
    """The series to judge: the loss log, else the dumped loss, else the gradient-norm proxy (None: nothing).

    Where both a loss log and a dumped loss exist, the dumped loss fills in the ranks the log
    does not split (a global log), and the notes say whether the two agree.
    """
    dumped = _from_dump(dump) if dump is not None else None
    if loss is not None and len(loss):
        s = _from_log(loss, loss_source)
        if dumped is not None:
            _check_agreement(s, dumped)
            if not s.ranks and dumped.ranks:  # a global log: the dump says which rank departs, where it covers
                s.ranks = dumped.ranks
                vals = np.full((len(s.steps), len(dumped.ranks)), np.nan)
                where = {int(t): i for i, t in enumerate(s.steps)}
                for i, t in enumerate(dumped.steps):
                    if int(t) in where:
                        vals[where[int(t)]] = dumped.values[i]
                s.values = vals
                s.notes.append("the loss log has no rank column: per-rank losses are the dump's (dumped steps only)")
        return s
    if dumped is not None:
        return dumped
    for ds in (monitor, dump):
        if ds is not None:
            g = _grad_norm(ds)
            if g is not None:
                return g
    return None


def _check_agreement(log: LossSeries, dumped: LossSeries) -> None:
    if not log.ranks:
        return
    diffs = []
    for i, t in enumerate(dumped.steps):
        hit = np.flatnonzero(log.steps == t)
        if not len(hit):
            continue
        for j, r in enumerate(dumped.ranks):
            if r in log.ranks:
                a, b = log.values[hit[0], log.ranks.index(r)], dumped.values[i, j]
                if np.isfinite(a) and np.isfinite(b) and abs(a - b) > 1e-3 * max(abs(a), abs(b), 1e-12):
                    diffs.append((int(t), r, float(a), float(b)))
    if diffs:
        t, r, a, b = diffs[0]
        log.notes.append(f"the loss log and the dumped loss disagree at {len(diffs)} (step, rank) cell(s), e.g. step "
                         f"{t} rank {r}: {a:.6g} vs {b:.6g} (is it the same run?)")
