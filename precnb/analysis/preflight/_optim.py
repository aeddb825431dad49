"""The hyper-parameters check: what the dumps say about the optimizer, read or inferred.

Three sources, strongest first:

1. **Read** — the optimizer ops' scalar arguments (``attrs["scalar_args"]``): the keywords of a
   fused optimizer (``Torch._fused_adamw_``: ``lr``, ``beta1``, ``beta2``, ``eps``, ``weight_decay``)
   name the hyper-parameter itself.
2. **Inferred from arguments** — torch's single-tensor AdamW records per parameter
   ``param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1^t))`` and ``exp_avg.lerp_(grad, 1 - beta1)``:
   at the same step t and beta1 (equal ``lerp_`` weights and bias corrections) the ratio of the
   ``addcdiv_`` values is the learning-rate ratio; SGD's ``param.add_(grad, alpha=-lr)`` likewise.
3. **Inferred from the weights** — the first update of each parameter, from the change of its mean
   between the first two common steps (the mean is linear in the update). Starting from identical
   weights with identical gradients, SGD and Adam-family updates scale with the learning rate, so
   the median ratio over parameters estimates it; confidence drops when the runs start apart or
   their gradients differ (then updates that follow the gradients are not a hyper-parameter).

A msprobe config_check pack adds its ``hyperparameters/*.json`` (read).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.preflight._common import Param, check, fmt, names_list, param_stats, worst
from precnb.schema import side_table

__all__ = ["check_hyperparameters", "update_ratio"]

_TITLE = "Optimizer hyper-parameters"
_SAME = math.log(1.05)  # ratios within 5% of 1 count as equal
_LR_ARGS = {("addcdiv_", "value"), ("_foreach_addcdiv_", "3"), ("add_", "alpha"), ("_foreach_add_", "alpha")}


def _short(api: str) -> str:
    return api.rsplit(".", 1)[-1]


def meaning(api: str, path: str) -> str:
    """What an optimizer argument is (``Tensor.lerp_`` argument 2 → ``1 - beta1``).

    Examples
    --------
    >>> meaning("Torch._fused_adamw_", "lr"), meaning("Tensor.addcdiv_", "value")
    ('lr', 'Adam step size -lr/(1-beta1^t)')
    """
    short = _short(api)
    if "_fused_" in short:
        return path
    table = {("addcdiv_", "value"): "Adam step size -lr/(1-beta1^t)", ("_foreach_addcdiv_", "3"):
             "Adam step size -lr/(1-beta1^t)", ("add_", "alpha"): "SGD step -lr", ("_foreach_add_", "alpha"):
             "SGD step -lr", ("lerp_", "2"): "1-beta1", ("_foreach_lerp_", "2"): "1-beta1",
             ("addcmul_", "value"): "1-beta2", ("mul_", "1"): "beta2 or 1-lr*weight_decay",
             ("add_", "1"): "eps", ("__truediv__", "1"): "bias correction sqrt(1-beta2^t)",
             ("__iadd__", "1"): "step increment"}
    return table.get((short, path), f"argument {path}")


def _vals(v: Any) -> list[Any]:
    return sorted((x for x in v), key=lambda x: (type(x).__name__, str(x)))


def _num(vals: list[Any]) -> float | None:
    return float(vals[0]) if len(vals) == 1 and isinstance(vals[0], (int, float)) and not isinstance(
        vals[0], bool) else None


def _scalar_diffs(sb: dict[str, Any], st: dict[str, Any], off: int) -> tuple[list[dict[str, Any]], int]:
    """Differing (api, argument, step) between the runs, and how many were compared."""
    diffs: list[dict[str, Any]] = []
    compared = 0
    for api in [a for a in sb if a in st]:
        for path in [p for p in sb[api] if p in st[api]]:
            for s_text, vb in sb[api][path].items():
                vt = st[api][path].get(str(int(s_text) + off))
                if vt is None:
                    continue
                compared += 1
                if _vals(vb) != _vals(vt):
                    diffs.append({"api": api, "argument": path, "meaning": meaning(api, path), "step": int(s_text),
                                  "baseline": _vals(vb), "target": _vals(vt)})
    return diffs, compared


def _lr_from_args(diffs: list[dict[str, Any]], sb: dict[str, Any], st: dict[str, Any]) -> dict[str, Any] | None:
    """The learning-rate ratio the argument differences show (read or inferred), or None."""
    firsts: dict[tuple[str, str], dict[str, Any]] = {}
    for d in diffs:
        firsts.setdefault((d["api"], d["argument"]), d)
    for (api, path), d in firsts.items():
        b, t = _num(d["baseline"]), _num(d["target"])
        if b is None or t is None or b == 0:
            continue
        if "_fused_" in _short(api) and path == "lr":
            return {"ratio": t / b, "basis": "read", "confidence": "high", "api": api, "argument": path,
                    "step": d["step"], "baseline": b, "target": t,
                    "how": f"read from the {api} keyword lr"}
        if (_short(api), path) in _LR_ARGS:
            same_beta = not any(_short(x["api"]) in ("lerp_", "_foreach_lerp_", "__truediv__") for x in diffs)
            return {"ratio": t / b, "basis": "inferred", "confidence": "high" if same_beta else "medium",
                    "api": api, "argument": path, "step": d["step"], "baseline": b, "target": t,
                    "how": f"inferred from {api} {path} ({meaning(api, path)})"
                    + ("; beta1 and the step count agree" if same_beta else "; beta1 or the step count differ too")}
    return None


def update_ratio(base: xr.Dataset, target: xr.Dataset, pb: dict[str, Param], pt: dict[str, Param],
                 off: int, skip: set[str]) -> dict[str, Any] | None:
    """Median ratio (target / baseline) of the parameters' first update, from their means; None when unknown."""
    tsteps = {int(s) for s in target["step"].values}
    steps = [int(s) for s in base["step"].values if int(s) + off in tsteps]
    if len(steps) < 2:
        return None
    s0, s1 = steps[0], steps[1]
    bsteps, tstep_list = list(base["step"].values), list(target["step"].values)
    rb, rt = list(base["rank"].values), list(target["rank"].values)
    ranks = [r for r in rb if r in rt]
    if not ranks:
        return None
    r = ranks[0]
    ratios, grads, start_same = [], [], True
    for n in [n for n in pb if n in pt and n not in skip and pb[n].label and pt[n].label
              and (not pb[n].shape or pb[n].shape == pt[n].shape)]:
        a, b = param_stats(base, str(pb[n].label)), param_stats(target, str(pt[n].label))
        a0, a1 = a[bsteps.index(s0), rb.index(r)], a[bsteps.index(s1), rb.index(r)]
        b0, b1 = b[tstep_list.index(s0 + off), rt.index(r)], b[tstep_list.index(s1 + off), rt.index(r)]
        if np.isnan(np.r_[a0, a1, b0, b1]).any():
            continue
        rms = a0[3] / math.sqrt(pb[n].numel) if pb[n].numel > 0 else max(abs(a0[0]), abs(a0[1]))
        da, db = a1[2] - a0[2], b1[2] - b0[2]
        if abs(da) <= 1e-5 * max(rms, 1e-30):
            continue
        if not np.allclose(a0, b0, rtol=2.0 ** -8, atol=0.0):
            start_same = False
        ratios.append(db / da)
        grad_b, grad_t = pb[n].grad, pt[n].grad
        if grad_b and grad_t:
            ga, gb = param_stats(base, grad_b), param_stats(target, grad_t)
            na, nb = ga[bsteps.index(s0), rb.index(r), 3], gb[tstep_list.index(s0 + off), rt.index(r), 3]
            if na > 0 and np.isfinite(na) and np.isfinite(nb):
                grads.append(nb / na)
    if not ratios:
        return None
    arr = np.asarray(ratios)
    q1, med, q3 = (float(x) for x in np.quantile(arr, [0.25, 0.5, 0.75]))
    g = float(np.median(grads)) if grads else None
    return {"ratio": med, "q1": q1, "q3": q3, "min": float(arr.min()), "max": float(arr.max()),
            "parameters": len(ratios), "steps": [s0, s1], "rank": int(r), "start_identical": start_same,
            "grad_ratio": g}


def _pack_hparams(base: xr.Dataset, target: xr.Dataset) -> list[dict[str, Any]] | None:
    pb = side_table(base, "config_check").get("hyperparameters") if base.attrs.get("config_check") else None
    pt = side_table(target, "config_check").get("hyperparameters") if target.attrs.get("config_check") else None
    if not pb and not pt:
        return None
    out = []
    for kind in sorted(set(pb or {}) | set(pt or {})):
        a, b = (pb or {}).get(kind) or {}, (pt or {}).get(kind) or {}
        norm_a = {str(k).split(".")[-1].replace("-", "_").lower(): (k, v) for k, v in a.items()}
        norm_b = {str(k).split(".")[-1].replace("-", "_").lower(): (k, v) for k, v in b.items()}
        for key in sorted(set(norm_a) | set(norm_b)):
            va, vb = norm_a.get(key, (None, None))[1], norm_b.get(key, (None, None))[1]
            if key not in norm_a or key not in norm_b or str(va) != str(vb):
                out.append({"file": f"hyperparameters_{kind}.json", "name": key, "baseline": va, "target": vb,
                            "only_in": "baseline" if key not in norm_b else ("target" if key not in norm_a else None)})
    return out


def check_hyperparameters(base: xr.Dataset | None, target: xr.Dataset, pb: dict[str, Param] | None,
                          pt: dict[str, Param], off: int, names: tuple[str, str]) -> dict[str, Any]:
    """The hyper-parameters check (see the module docstring)."""
    st = side_table(target, "scalar_args") if target.attrs.get("scalar_args") else {}
    if base is None or pb is None:
        read = [f"{api} {k}={v['0' if '0' in v else next(iter(v))][0]}" for api, args in st.items()
                if "_fused_" in api for k, v in args.items()]
        return check("hyperparameters", _TITLE, "skip", "one run: nothing to compare"
                     + (f"; read {names_list(read, 8)}" if read else ""), basis="read" if read else None)
    bn, tn = names
    sb = side_table(base, "scalar_args") if base.attrs.get("scalar_args") else {}
    parts: list[tuple[str, str]] = []  # (status, text)
    details: dict[str, Any] = {}
    inferred: list[dict[str, Any]] = []
    conf = "high"
    if sb and st:
        diffs, compared = _scalar_diffs(sb, st, off)
        details["argument_differences"] = diffs[:50]
        only = sorted(set(sb) ^ set(st))
        if only:
            parts.append(("warn", "optimizer ops recorded in one run only: " + names_list(
                [f"{a} ({bn if a in sb else tn})" for a in only]) + " (another optimizer implementation?)"))
        lr = _lr_from_args(diffs, sb, st)
        if lr is not None:
            inferred.append({"what": "learning-rate ratio (target / baseline)", **lr})
            conf = lr["confidence"]
            parts.append(("fail", f"learning rate x{fmt(lr['ratio'])} in the {tn}: {meaning(lr['api'], lr['argument'])}"
                          f" {fmt(lr['baseline'])} ({bn}) vs {fmt(lr['target'])} ({tn}) at step {lr['step']} "
                          f"({lr['how']})"))
        other = [d for d in diffs if lr is None or (d["api"], d["argument"]) != (lr["api"], lr["argument"])]
        firsts: dict[tuple[str, str], dict[str, Any]] = {}
        for d in other:
            firsts.setdefault((d["api"], d["argument"]), d)
        follows = [d for d in firsts.values() if lr is not None and _follows_lr(d, lr["ratio"])]
        rest = [d for d in firsts.values() if d not in follows]
        if follows:
            parts.append(("fail", "as the learning rate implies (1-lr*weight_decay): " + names_list(
                [f"{d['api']} {d['argument']} {_list(d['baseline'])} vs {_list(d['target'])}" for d in follows], 4)))
        if rest:
            parts.append(("fail", "optimizer arguments differ: " + names_list(
                [f"{d['api']} {d['argument']} ({d['meaning']}) {_list(d['baseline'])} vs {_list(d['target'])} "
                 f"from step {d['step']}" for d in rest], 4)))
        if not diffs and not only:
            parts.append(("pass", f"the optimizer's arguments agree ({compared} compared: "
                          + names_list(_read_names(st), 6) + ")"))
    elif sb or st:
        parts.append(("skip", f"optimizer arguments recorded in the {bn if sb else tn} only"))
    frozen = {n for n in pt if n in pb and (pt[n].requires_grad is False or pb[n].requires_grad is False)}
    up = update_ratio(base, target, pb, pt, off, frozen)
    if up is not None:
        details["update_ratio"] = up
        parts.append(_update_part(up, names, inferred))
        if parts[-1][0] == "warn" and conf == "high":
            conf = "medium"
    hp = _pack_hparams(base, target)
    if hp:
        details["pack_differences"] = hp
        bad = [d for d in hp if d["only_in"] is None]
        if bad:
            parts.append(("fail", "config_check hyper-parameters differ: " + names_list(
                [f"{d['name']} {d['baseline']} vs {d['target']} ({d['file']})" for d in bad])))
        lone = [d for d in hp if d["only_in"] is not None]
        if lone:
            parts.append(("warn", "in one pack only: " + names_list([f"{d['name']} ({d['only_in']})" for d in lone])))
    elif hp is not None:
        parts.append(("pass", "config_check hyper-parameters agree"))
    if not parts:
        return check("hyperparameters", _TITLE, "skip", "no optimizer argument recorded and no parameter update "
                     "measurable (the weights do not change over the common steps)", **details)
    status = worst(s for s, _ in parts)
    shown = [t for s, t in parts if s == status] + [t for s, t in parts if s != status]
    basis = "read" if any(i.get("basis") == "read" for i in inferred) or (sb and st) else "inferred"
    return check("hyperparameters", _TITLE, status, "; ".join(shown), confidence=conf, basis=basis,
                 inferred=inferred, **details)


def _follows_lr(d: dict[str, Any], ratio: float) -> bool:
    """A ``mul_`` factor 1 - lr*wd of the baseline becomes 1 - ratio*lr*wd in the target (the rest equal)."""
    if _short(d["api"]) not in ("mul_", "_foreach_mul_"):
        return False
    b = [float(x) for x in d["baseline"] if isinstance(x, (int, float)) and not isinstance(x, bool)]
    t = [float(x) for x in d["target"] if isinstance(x, (int, float)) and not isinstance(x, bool)]
    if not b or not t:
        return False
    cand = set(b) | {1 - (1 - x) * ratio for x in b}
    return all(any(math.isclose(y, c, rel_tol=1e-9, abs_tol=1e-12) for c in cand) for y in t)


def _list(vals: list[Any]) -> str:
    return ", ".join(fmt(v) for v in vals) if len(vals) != 1 else fmt(vals[0])


def _read_names(st: dict[str, Any]) -> list[str]:
    out = []
    for api, args in st.items():
        for path, steps in args.items():
            first = steps[min(steps, key=int)]
            out.append(f"{_short(api)} {meaning(api, path)}={_list(first)}")
    return out


def _update_part(up: dict[str, Any], names: tuple[str, str], inferred: list[dict[str, Any]]) -> tuple[str, str]:
    bn, tn = names
    r, g = up["ratio"], up["grad_ratio"]
    span = f"median over {up['parameters']} parameters, quartiles {fmt(up['q1'])}-{fmt(up['q3'])}"
    where = f"steps {up['steps'][0]}->{up['steps'][1]}"
    if r <= 0:
        return ("warn", f"the first parameter updates go the other way ({tn}/{bn} ratio {fmt(r)}, {span}, {where})")
    if abs(math.log(r)) <= _SAME:
        return ("pass", f"first parameter updates agree ({tn}/{bn} x{fmt(r)}, {span}, {where})")
    if g is not None and g > 0 and abs(math.log(g)) > _SAME and abs(math.log(g) - math.log(r)) <= _SAME:
        return ("warn", f"the first updates are x{fmt(r)} ({span}) and follow the gradients (x{fmt(g)}): not a "
                        "hyper-parameter; see the first divergence")
    tight = up["q1"] > 0 and math.log(up["q3"] / up["q1"]) <= math.log(1.2)
    grads_same = g is None or (g > 0 and abs(math.log(g)) <= _SAME)
    sure = up["start_identical"] and tight and grads_same
    inferred.append({"what": "learning-rate ratio from the first updates (target / baseline)", "ratio": r,
                     "basis": "inferred", "confidence": "high" if sure else "low",
                     "how": f"change of each parameter's mean over {where}, {span}"
                     + (("; identical start and gradients" if g is not None else "; identical start") if sure
                        else "")})
    text = (f"the first parameter updates are x{fmt(r)} in the {tn} ({span}, {where}; inferred from the change of "
            f"the parameters' means"
            + (f"; identical start weights{' and gradients' if g is not None else ''}: the learning rate (or its "
               "schedule) differs by this factor)" if sure else
               "; the runs' start or gradients differ: low confidence)"))
    return ("fail" if sure else "warn", text)
