"""The *optimizer* cause of a loss spike: an optimizer argument or a parameter's update jumps without its gradient."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from precnb.analysis.spike._common import (
    DEPART,
    ORDINARY,
    _cand,
    _first_per_rank,
    _fmt_vals,
    _histories,
    _median,
    _ratio,
)
from precnb.analysis.spike._records import Param, View
from precnb.analysis.spike._vec import masked_median, ratios


def _update_sizes(v: View, p: Param) -> np.ndarray:
    """Weight change of each step (step, rank): the largest change of max / min / norm between before and after.

    NaN where the parameter before or after the update is not recorded (memoised on the view).
    """
    key = ("update_sizes", p.pre)
    got = v.memo.get(key)
    if got is not None:
        return got
    shape = (len(v.steps), len(v.ranks))
    if p.before is None or p.after is None:
        got = np.full(shape, np.nan)
    else:
        got = np.zeros(shape)
        for s in ("max", "min", "norm"):
            if s in v.stats:
                got = np.fmax(got, np.abs(v.stats[s][:, :, p.after] - v.stats[s][:, :, p.before]))
        if "norm" in v.stats:
            ok = np.isfinite(v.stats["norm"][:, :, p.after]) & np.isfinite(v.stats["norm"][:, :, p.before])
        else:
            ok = np.zeros(shape, bool)
        got = np.where(ok, got, np.nan)
    v.memo[key] = got
    return got


def _update_size(v: View, p: Param, step: int) -> np.ndarray:
    """Weight change of the step per rank (NaN where not recorded; see :func:`_update_sizes`)."""
    si = v.step_index(step)
    return _update_sizes(v, p)[si] if si is not None else np.full(len(v.ranks), np.nan)


def _update_history(v: View, p: Param, step: int) -> np.ndarray:
    """Median update size per rank over the steps before *step* (all other steps when fewer than 2)."""
    sizes = _update_sizes(v, p)
    before = v.steps < step
    use = before if int(np.isfinite(sizes[before]).all(axis=1).sum()) >= 2 else v.steps != step
    return masked_median(sizes, use[:, None] & np.isfinite(sizes))


def _argument_jumps(v: View, step: int) -> list[dict[str, Any]]:
    from precnb.schema import side_table

    out = []
    table = side_table(v.ds, "scalar_args") if v.ds.attrs.get("scalar_args") else {}
    for api, args in table.items():
        for arg, by_step in args.items():
            vals = {int(s): [x for x in xs if isinstance(x, (int, float)) and not isinstance(x, bool)]
                    for s, xs in by_step.items()}
            mag = {s: max(abs(float(x)) for x in xs) for s, xs in vals.items() if xs}
            if step not in mag or len(mag) < 2:
                continue
            ref = _median(np.asarray([m for s, m in mag.items() if s != step]))
            q = _ratio(mag[step], ref)
            if np.isfinite(q) and (q >= 3.0 or q <= 1 / 3.0):
                out.append({"api": api, "argument": arg, "value": vals[step], "reference": ref, "ratio": q,
                            "by_step": {str(s): vals[s] for s in sorted(vals)}})
    return out


def _first_node(v: View, api: str, step: int) -> int | None:
    """The first record (in execution order, lowest rank) of an optimizer op of *api* at *step*."""
    si = v.step_index(step)
    if si is None:
        return None
    cols = np.flatnonzero((v.api == api) & (v.module == "optimizer"))
    if not len(cols):
        cols = np.flatnonzero(v.api == api)
    seqs = [(float(v.seq[si, 0, j]) if v.seq[si, 0, j] >= 0 else math.inf, j) for j in cols]
    seqs = [x for x in seqs if np.isfinite(x[0])]
    if not seqs:
        return None
    first = min(seqs)[1]
    out = v.first_output(str(v.node[first]))
    return out if out is not None else int(first)


def optimizer_causes(views: list[View], steps: list[int], spike_step: int) -> list[dict[str, Any]]:
    """Optimizer: an update (or an argument such as the learning rate) jumps without a gradient jump."""
    out: list[dict[str, Any]] = []
    for v in views:
        for t in steps:
            jumped: list[dict[str, Any]] = []
            for p in v.params():
                ru = ratios(_update_size(v, p, t), _update_history(v, p, t))
                if not (np.isfinite(ru) & (ru >= DEPART)).any():
                    continue
                grad = p.post if p.post is not None else p.pre
                rg = ratios(v.at(grad, t), _histories(v, grad, t))
                for ri in np.flatnonzero(np.isfinite(ru) & (ru >= DEPART) & ~(np.isfinite(rg) & (rg > ORDINARY))):
                    jumped.append({"param": p, "ri": int(ri), "update": float(ru[ri]), "grad": float(rg[ri])})
            args = _argument_jumps(v, t)
            if not jumped and not args:
                continue
            names = sorted({j["param"].name for j in jumped} | {
                p.name for p in v.params() for a in args if p.after is not None and v.api[p.after] == a["api"]})
            follows = spike_step == t + 1
            parts = []
            rec: dict[str, Any] = {"node": None, "tensor": None, "module": None}
            recs: list[tuple[View, int, int | None, str]] = []
            series = []
            if args:
                a = args[0]
                j0 = _first_node(v, a["api"], t)
                if j0 is not None:
                    rec = v.record(j0)
                    recs += [(v, t, r, v.labels[j0]) for r in v.ranks]
                parts.append(f"{a['api']} {a['argument']} is {_fmt_vals(a['value'])} at step {t} against "
                             f"{a['reference']:.6g} at the other dumped steps ({a['ratio']:.3g}x)")
                series.append(f"{v.name} {a['api']} argument {a['argument']} by step")
            if jumped:
                best = max(jumped, key=lambda j: j["update"])
                p = best["param"]
                if rec["node"] is None and p.after is not None:
                    rec = v.record(p.after)
                recs += [(v, t, r, v.labels[p.after]) for r in v.ranks if p.after is not None]
                gtxt = f"{best['grad']:.3g}x" if np.isfinite(best["grad"]) else "not recorded"
                parts.append(f"the update of {len(names)} parameter(s) ({', '.join(names[:6])}"
                             f"{' …' if len(names) > 6 else ''}) jumps up to {best['update']:.3g}x its history "
                             f"({p.name}) while the gradient is {gtxt} its own")
                how = "param_updated - param_origin" if v.monitor else "optimizer update input/output"
                series.append(f"{v.name} weight change of the step ({how})")
            text = ("; ".join(parts) + (": the loss follows one step later" if follows else "")
                    + " — the optimizer (learning rate, schedule, optimizer state) made the step")
            strength = max([math.log10(j["update"]) for j in jumped] + [math.log10(max(a["ratio"], 1 / a["ratio"]))
                                                                        for a in args])
            out.append(_cand("optimizer", follows and bool(args or jumped), text, t, None, rec, strength, series, recs,
                             seq=-1.0, parameters=names, arguments=[{k: a[k] for k in ("api", "argument", "value",
                                                                                       "reference", "ratio")}
                                                                    for a in args]))
    return _first_per_rank(out)
