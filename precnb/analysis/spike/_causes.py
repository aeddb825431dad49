"""The four causes of a loss spike, each a test on what the dump and the monitor hold.

Every test returns candidates (dicts): ``cause``, ``certain``, ``text``, the origin (``step``,
``rank`` — None when every rank shows it —, ``node``, ``tensor``, ``module``), ``strength``
(log10 of the departure, to rank uncertain candidates), ``series`` (what decided it, in words)
and ``records`` (``(view, step, rank, tensor)`` the explorer colours).

* **data** (at the spike step ``S``): the ranks whose own loss departs while others do not, and
  the batch inputs (integer forward inputs such as token ids and labels; a monitor's first module
  input) that stand out against every other (step, rank) of the same tensor;
* **optimizer** (at ``S - 1``, ``S - 2``): an optimizer argument (``lr``, SGD's ``alpha``,
  ``addcdiv_``'s ``value``) that jumps ``>= 3x`` against its other steps, or a parameter's update
  (the weight change of the step: the largest change of Max / Min / Norm between monitor
  ``param_origin`` and ``param_updated``, or a dumped in-place update's input and output) that
  jumps ``>= 10x`` its history while the gradient stays within 2x of its own;
* **hardware** (gradient, at ``S - 1``, ``S - 2``; at ``S`` on the gradient-norm proxy): one rank's
  gradient of a parameter before the reduce ``>= 10x`` the other DP ranks' and its own history,
  while its module's inputs (forward input, gradient of its output) are within 2x of the other
  ranks'; after the reduce every rank carries it;
* **numerics** (at ``S - 1``, and ``S`` before the loss op): a new overflow (an element at ±inf:
  Max or Min, not a Norm alone — msprobe takes a float16 tensor's Norm in float16), a
  float16/bfloat16 value within 2x of the dtype's largest, a tensor that underflows to zero, or a
  loss-scale change (every gradient of a rank scaled by one factor ``>= 10x`` while its forward
  is ordinary).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from precnb.analysis.spike._records import Param, View
from precnb.analysis.spike._vec import masked_median, median_without_each, ratios, row_medians

__all__ = ["DEPART", "data_causes", "hardware_causes", "numerics_causes", "optimizer_causes"]

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


def _fmt_vals(vals: list[Any]) -> str:
    return ", ".join(f"{float(x):.6g}" for x in vals[:4]) + (" …" if len(vals) > 4 else "")


# -- numerics -----------------------------------------------------------------------------------
def _low_max(dtype: str) -> float | None:
    d = dtype.lower().replace("torch.", "").replace("mindspore.", "")
    return _LOW.get(d)


def _numerics_masks(v: View, si: int, t: int, spike_step: int, loss_j: int | None, inf_el: np.ndarray,
                    tops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, tensor) masks at step position *si*: a new overflow, a saturating value, an underflow to zero.

    Only records that precede the loss at the spike step are judged (a monitor's forward
    activations there); an overflow is new when no earlier step holds one in that record.
    """
    mx, mn, nm = v.stats["max"], v.stats["min"], v.stats.get("norm")
    n_ranks = len(v.ranks)
    earlier = inf_el[:si].any(axis=0) if si else np.zeros(inf_el.shape[1:], bool)
    limit = np.full(n_ranks, math.inf)
    if spike_step == t:
        if loss_j is not None:
            ls = v.seq[si, :, loss_j]
            limit = np.where(ls >= 0, ls.astype(float), -math.inf if v.monitor else math.inf)
        elif v.monitor:
            limit = np.full(n_ranks, -math.inf)  # a monitor's step: only its forward activations precede the loss
    fwd_only = v.monitor and spike_step == t
    ok = v.present[si] & ((v.seq[si] < limit[:, None]) | (fwd_only & (v.api == "actv"))[None, :])
    new = inf_el[si] & ~earlier & ok
    with np.errstate(invalid="ignore"):
        peaks = np.fmax(np.abs(mx[si]), np.abs(mn[si]))
        near = ok & ~inf_el[si] & np.isfinite(peaks) & (peaks >= tops / 2)
    zero = np.zeros_like(ok)
    if nm is not None:
        hist = np.delete(nm, si, axis=0)
        histmin = np.delete(mn, si, axis=0)
        fin = np.isfinite(hist)
        nonzero_hist = (fin.sum(axis=0) >= 2) & np.all(np.where(fin, hist > 0, True), axis=0)
        fin_min = np.isfinite(histmin)
        pos_hist = (fin_min.sum(axis=0) >= 2) & np.all(np.where(fin_min, histmin > 0, True), axis=0)
        zero = ok & (((nm[si] == 0) & nonzero_hist) | ((mn[si] == 0) & pos_hist)) & ~inf_el[si]
    return new, near, zero


def numerics_causes(views: list[View], steps: list[int], spike_step: int, loss_label: str | None
                    ) -> list[dict[str, Any]]:
    """Numerics: a new overflow, a saturating float16/bfloat16 value, an underflow to zero, a loss-scale change."""
    out: list[dict[str, Any]] = []
    for v in views:
        mx, mn, nm = v.stats.get("max"), v.stats.get("min"), v.stats.get("norm")
        if mx is None or mn is None:
            continue
        inf_el = np.isinf(mx) | np.isinf(mn)
        tops = np.asarray([_low_max(d) or np.nan for d in v.dtype], dtype=float)  # float16 / bfloat16 largest
        loss_j = v.index.get(loss_label) if loss_label else None
        for t in steps:
            si = v.step_index(t)
            if si is None:
                continue
            new_m, near_m, zero_m = _numerics_masks(v, si, t, spike_step, loss_j, inf_el, tops)
            for ri in np.flatnonzero(new_m.any(axis=1) | near_m.any(axis=1) | zero_m.any(axis=1)):
                r = v.ranks[ri]
                for j in np.flatnonzero(new_m[ri]):
                    rec = v.record(int(j))
                    val = mx[si, ri, j] if np.isinf(mx[si, ri, j]) else mn[si, ri, j]
                    dt = v.dtype[j].replace("torch.", "")
                    text = (f"overflow at step {t}: {rec['tensor']} holds {'+' if val > 0 else '-'}inf ({dt}"
                            + (f", largest finite {_low_max(v.dtype[j]):.6g}" if _low_max(v.dtype[j]) else "")
                            + ") where earlier steps are finite")
                    out.append(_cand("numerics", True, text, t, r, rec, 3.0, [f"{v.name} {rec['tensor']} Max/Min"],
                                     [(v, t, r, rec["tensor"])], seq=float(v.seq[si, ri, j]), kind="overflow"))
                peaks = np.fmax(np.abs(mx[si, ri]), np.abs(mn[si, ri]))
                for j in np.flatnonzero(near_m[ri]):
                    top, peak = float(tops[j]), float(peaks[j])
                    rec = v.record(int(j))
                    out.append(_cand("numerics", False, f"{rec['tensor']} reaches {peak:.6g} at step {t}, within "
                                     f"2x of {v.dtype[j].replace('torch.', '')}'s largest value {top:.6g} "
                                     "(saturating)", t, r, rec, 1.0, [f"{v.name} {rec['tensor']} Max/Min"],
                                     [(v, t, r, rec["tensor"])], seq=float(v.seq[si, ri, j]), kind="saturation"))
                for j in np.flatnonzero(zero_m[ri]):
                    rec = v.record(int(j))
                    out.append(_cand("numerics", False, f"underflow to zero at step {t}: {rec['tensor']} "
                                     f"{'is all zero' if nm is not None and nm[si, ri, j] == 0 else 'reaches 0'} "
                                     "where every other step is non-zero", t, int(r), rec, 0.8,
                                     [f"{v.name} {rec['tensor']} Min/Norm"], [(v, t, r, rec["tensor"])],
                                     seq=float(v.seq[si, ri, j]), kind="underflow"))
            out += _loss_scale(v, t)
    return _earliest_numerics(out)


def _loss_scale(v: View, t: int) -> list[dict[str, Any]]:
    deps = _grad_departures(v, t)
    scaled = _uniform_scales(v, t)
    out = []
    for ri, r in enumerate(v.ranks):
        k = scaled.get(ri)
        if k is None:
            continue
        first = min((d for d in deps if d[1] == ri), key=lambda d: _seq(v, d[0].pre, t, ri))
        j0 = first[0].pre
        incoming = _first_backward(v, t, ri, k)  # the loss's gradient as it enters the model, when recorded
        if incoming is not None:
            j0 = incoming
        rec = v.record(j0)
        out.append(_cand("numerics", False, f"every gradient of rank {r} is {k:.3g}x the other ranks' at step {t} "
                         "while its forward is ordinary: a loss-scale change (the loss scaled before backward and not "
                         "unscaled, or a scaler out of step on this rank)", t, r, rec, math.log10(max(k, 1 / k)),
                         [f"{v.name} gradients before the reduce, rank {r} against the others"],
                         [(v, t, r, v.labels[j0]), *((v, t, r, v.labels[d[0].pre]) for d in deps if d[1] == ri)],
                         seq=_seq(v, j0, t, ri),
                         kind="loss_scale", scale=k))
    return out


def _first_backward(v: View, step: int, ri: int, scale: float) -> int | None:
    """The first backward activation gradient at (step, rank) when it departs from the other ranks by *scale*."""
    si = v.step_index(step)
    if si is None or len(v.ranks) < 2:
        return None
    grads = (v.kind == "param_grad") | (v.api == "grad_unreduced") | (v.api == "grad_reduced")
    cols = [j for j in np.flatnonzero((v.direction == "backward") & ~grads)
            if v.present[si, ri, j] and v.seq[si, ri, j] >= 0]
    if not cols:
        return None
    j = min(cols, key=lambda c: v.seq[si, ri, c])
    q = _ratio(float(v.at(int(j), step)[ri]), float(_others(v, int(j), step)[ri]))
    return int(j) if np.isfinite(q) and abs(math.log(q) - math.log(scale)) <= math.log(ORDINARY) else None


def _earliest_numerics(cands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The earliest numerics event per kind; an event on every rank at the same place is rank None."""
    out = []
    for kind in ("overflow", "loss_scale", "saturation", "underflow"):
        mine = [c for c in cands if c.get("kind") == kind]
        if not mine:
            continue
        first = min(mine, key=lambda c: (c["step"], c["records"][0][0].monitor, c["seq"], c["rank"]))
        same = {c["rank"] for c in mine if c["step"] == first["step"] and c["tensor"] == first["tensor"]}
        ranks = set(first["records"][0][0].ranks)
        if kind != "loss_scale" and len(ranks) > 1 and same >= ranks:
            first = {**first, "rank": None,
                     "records": [(first["records"][0][0], first["step"], r, first["tensor"]) for r in sorted(ranks)]}
        out.append(first)
    return out
