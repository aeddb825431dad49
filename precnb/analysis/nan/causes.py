"""Likely causes of a NaN/Inf at its origin, read from the statistics of the op's operands.

Statistics cannot prove where zeros sit inside a tensor, but they bound what is possible:
``min <= 0 <= max`` means a tensor *can* hold a zero, ``min == 0`` (or ``max == 0``) means it
*does*, and a monitor's ``zeros`` fraction counts them. The rules, each with its evidence:

* **0/0** — a division whose output became NaN while both operands hold zeros: "division by a
  zero count, e.g. an MoE expert that received no tokens"; **x/0** for an infinite quotient;
* **empty reduction** — a mean/softmax/norm over a tensor with no element;
* **log / sqrt / rsqrt / pow** of zero or negative values;
* **overflow** — ±inf from finite operands (``|max|`` against the dtype's largest value, ``exp``
  against its log), and in backward **the loss scale**;
* **inf − inf / 0 × inf** — NaN from operands that hold infinities;
* for a **backward** node: which forward op's gradient it is, and the forward operands.

Examples
--------
>>> division_cause({"min": 0.0, "max": 11.0}, {"min": 0.0, "max": 16.0}, nan=True)["cause"]
'0/0'
>>> division_cause({"min": 1.0, "max": 2.0}, {"min": 0.5, "max": 3.0}, nan=True) is None
True
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.causal.dataflow import StepFlow, to_forward
from precnb.dtypes import canonical_dtype

__all__ = ["DTYPE_MAX", "division_cause", "nan_causes"]

DTYPE_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
             "float64": 1.7976931348623157e308}
_DIV = {"div", "div_", "__truediv__", "__itruediv__", "true_divide", "true_divide_", "__div__", "__idiv__",
        "divide", "floor_divide", "__floordiv__", "RealDiv", "Div"}
_RDIV = {"__rtruediv__", "__rdiv__", "__rfloordiv__"}
_REDUCE = {"mean", "softmax", "log_softmax", "var", "std", "norm", "layer_norm", "rms_norm", "group_norm",
           "nanmean", "Softmax", "ReduceMean"}
_LOG = {"log", "log_", "log2", "log10", "log1p", "log2_", "log10_", "log1p_", "Log"}
_SQRT = {"sqrt", "sqrt_", "Sqrt"}
_RSQRT = {"rsqrt", "rsqrt_", "Rsqrt"}
_POW = {"pow", "pow_", "__pow__", "__rpow__", "float_power", "Pow"}
_EXP = {"exp", "exp_", "exp2", "expm1", "Exp"}
_ADD = {"add", "add_", "sub", "sub_", "__add__", "__sub__", "__radd__", "__rsub__", "__iadd__", "__isub__", "sum",
        "cumsum", "Add", "Sub", "ReduceSum", "matmul", "mm", "bmm", "linear", "addmm", "baddbmm"}
_MUL = {"mul", "mul_", "__mul__", "__rmul__", "__imul__", "Mul"}


def _short(api: str) -> str:
    return api.rsplit(".", 1)[-1]


def _dtype_key(dtype: str) -> str:
    return canonical_dtype(dtype)  # the one spelling (precnb.dtypes)


def _holds_zero(s: dict[str, float]) -> tuple[bool, bool]:
    """(can hold a zero, certainly holds one) from min/max (and a monitor ``zeros`` fraction)."""
    lo, hi = s.get("min", math.nan), s.get("max", math.nan)
    zeros = s.get("zeros")
    if zeros is not None and math.isfinite(zeros):
        return zeros > 0, zeros > 0
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return False, False
    return lo <= 0.0 <= hi, lo == 0.0 or hi == 0.0


def _fmt(s: dict[str, float]) -> str:
    parts = [f"{k} {s[k]:.4g}" for k in ("min", "max") if k in s and s[k] is not None]
    if s.get("zeros") is not None and math.isfinite(s["zeros"]):
        parts.append(f"zeros {s['zeros']:.3g}")
    return ", ".join(parts)


def division_cause(num: dict[str, float], den: dict[str, float], *, nan: bool) -> dict[str, Any] | None:
    """0/0 (or x/0) from the statistics of a division's numerator and denominator, or None."""
    d_can, d_sure = _holds_zero(den)
    if not d_can:
        return None
    n_can, n_sure = _holds_zero(num)
    count = all(isinstance(den.get(k), float) and math.isfinite(den[k]) and float(den[k]).is_integer()
                and den[k] >= 0 for k in ("min", "max"))
    what = "a zero count" if count else "a zero denominator"
    if nan and n_can:
        text = (f"0/0: division by {what} — e.g. an MoE expert that received no tokens: the denominator "
                f"({_fmt(den)}) {'holds' if d_sure else 'can hold'} a zero and so does the numerator "
                f"({_fmt(num)}) where the output became NaN")
        return {"cause": "0/0", "text": text, "certain": bool(d_sure and n_sure)}
    if not nan:
        return {"cause": "x/0", "text": f"x/0: division by {what} ({_fmt(den)}) gives ±inf",
                "certain": bool(d_sure)}
    return None


def _stats(flow: StepFlow, j: int) -> dict[str, float]:
    v = flow.stats[j]
    out = {"max": float(v[0]), "min": float(v[1]), "mean": float(v[2]), "norm": float(v[3])}
    if "zeros" in flow.ds:
        z = float(flow.ds["zeros"].sel(step=flow.step, rank=flow.rank).values[j])
        if math.isfinite(z):
            out["zeros"] = z
    return out


def _operands(flow: StepFlow, node: str) -> list[int]:
    ins = [k for k in flow.tensors_of(node, "input") if flow.present[k]]
    return sorted(ins, key=lambda k: _slot(flow.labels[k]))


def _slot(label: str) -> tuple[int, ...]:
    tail = label.rsplit("input", 1)[-1].strip("._:")
    return tuple(int(p) for p in tail.replace("_", ".").split(".") if p.isdigit())


def _op_causes(api: str, ops: list[dict[str, float]], out: dict[str, float], dtype: str,
               nan: bool) -> list[dict[str, Any]]:
    """Causes for one op from its operands' statistics (forward semantics)."""
    short = _short(api)
    causes: list[dict[str, Any]] = []
    finite_ops = all(math.isfinite(o["max"]) and math.isfinite(o["min"]) for o in ops if "max" in o)
    if short in _DIV | _RDIV and len(ops) >= 2:
        num, den = (ops[1], ops[0]) if short in _RDIV else (ops[0], ops[1])
        c = division_cause(num, den, nan=nan)
        if c:
            causes.append(c)
    if ops and short in _LOG and ops[0]["min"] <= (-1.0 if short.startswith("log1p") else 0.0):
        neg = ops[0]["min"] < (-1.0 if short.startswith("log1p") else 0.0)
        causes.append({"cause": "log_domain", "certain": True,
                       "text": f"{short} of {'negative values (NaN)' if neg else 'zero (-inf)'}: input min "
                               f"{ops[0]['min']:.4g}"})
    if ops and short in _SQRT | _RSQRT and ops[0]["min"] <= 0.0:
        neg = ops[0]["min"] < 0
        if neg or short in _RSQRT:
            causes.append({"cause": "sqrt_domain", "certain": True,
                           "text": f"{short} of {'negative values (NaN)' if neg else 'zero (inf)'}: input min "
                                   f"{ops[0]['min']:.4g}"})
    if ops and short in _POW and ops[0]["min"] <= 0.0:
        causes.append({"cause": "pow_domain", "certain": False,
                       "text": f"{short} of a base that holds negative values or zero (input min "
                               f"{ops[0]['min']:.4g}): NaN for a fractional exponent, inf for a negative one"})
    if not ops:
        return causes
    infs = [o for o in ops if not (math.isfinite(o["max"]) and math.isfinite(o["min"]))]
    if nan and infs:
        pos = any(o["max"] == math.inf for o in ops)
        neg = any(o["min"] == -math.inf for o in ops)
        if short in _MUL:
            causes.append({"cause": "zero_times_inf", "certain": False,
                           "text": "0 × inf: an operand holds ±inf and another can hold zero"})
        elif pos and neg:
            causes.append({"cause": "inf_minus_inf", "certain": short in _ADD,
                           "text": "inf − inf: the operands hold both +inf and -inf"})
        elif short in _REDUCE:
            causes.append({"cause": "all_masked", "certain": False,
                           "text": f"{short} over a row that is entirely ±inf (a fully masked row)"})
    if not nan and finite_ops:
        key = _dtype_key(dtype)
        top = DTYPE_MAX.get(key)
        big = max(max(abs(o["max"]), abs(o["min"])) for o in ops)
        if top is not None:
            if short in _EXP:
                causes.append({"cause": "overflow", "certain": big > math.log(top),
                               "text": f"exp overflow: input max {big:.4g} > ln({key} max) = {math.log(top):.4g}"})
            else:
                near = big >= top / 1e3
                causes.append({"cause": "overflow", "certain": near,
                               "text": f"overflow: ±inf from finite operands; their largest |value| {big:.4g} is "
                                       + ("near" if near else "far below") + f" {key}'s max {top:.4g}"
                                       + ("" if near else " (the op's accumulation or its own arithmetic "
                                          "overflowed)")})
    return causes


def _empty_input(flow: StepFlow, node: str, api: str, nan: bool) -> dict[str, Any] | None:
    for k in _operands(flow, node):
        empty = flow.numel[k] == 0 or "0" in flow.shapes[k].strip("[]").replace(" ", "").split(",")
        if empty and nan:
            return {"cause": "empty_reduction", "certain": True,
                        "text": f"{_short(api)} over an empty tensor ({flow.labels[k]} has shape {flow.shapes[k]}): "
                                "0/0 — e.g. an MoE expert that received no tokens"}
    return None


def _module_zero_inputs(flow: StepFlow, node: str, j: int, nan: bool) -> dict[str, Any] | None:
    """A module (or monitored module) whose output became NaN while two inputs hold zeros."""
    module = str(flow.ds["module"].values[j])
    fam = flow.labels[j].split("/", 1)[0] if "/" in flow.labels[j] else None
    cand = [k for k in np.flatnonzero(flow.present & (flow.roles == "input")) if
            (str(flow.nodes[k]) == node or (fam and str(flow.ds["module"].values[k]) == module
                                            and flow.labels[k].startswith(fam + "/")))]
    ops = [(int(k), _stats(flow, int(k))) for k in cand]
    ops = [(k, s) for k, s in ops if math.isfinite(s["max"]) and math.isfinite(s["min"])]
    zero = [(k, s) for k, s in ops if _holds_zero(s)[1]]
    if not nan or len(ops) < 2 or len(zero) < 2:
        return None
    listed = "; ".join(f"{flow.labels[k]} ({_fmt(s)})" for k, s in zero[:3])
    return {"cause": "0/0", "certain": False,
            "text": f"0/0 likely: the output became NaN from finite inputs of which {len(zero)} hold zeros "
                    f"({listed}) — a division by a zero count, e.g. an MoE expert that received no tokens"}


def nan_causes(ds: xr.Dataset, *, step: int, rank: int, tensor: str) -> list[dict[str, Any]]:
    """Likely causes of the non-finite *tensor* created at (*step*, *rank*), most certain first.

    Returns
    -------
    list of dict
        ``cause`` (``"0/0"``, ``"x/0"``, ``"empty_reduction"``, ``"log_domain"``, ``"sqrt_domain"``,
        ``"pow_domain"``, ``"overflow"``, ``"loss_scale"``, ``"inf_minus_inf"``, ``"zero_times_inf"``,
        ``"all_masked"``, ``"gradient_of"``), ``text`` (one sentence with the evidence) and
        ``certain`` (the statistics prove it, rather than allow it).
    """
    if tensor not in ds.indexes["tensor"]:
        return []
    flow = StepFlow(ds, step, rank)
    j = flow.index[tensor]
    node = str(flow.nodes[j])
    api = str(ds["api"].values[j])
    nan = bool(np.isnan(flow.stats[j]).any() and not flow.finite(j))
    dtype = flow.dtypes[j]
    causes: list[dict[str, Any]] = []
    direction = flow.directions[j]
    if flow.kinds[j] == "monitor" or flow.kinds[j] == "module":
        c = _module_zero_inputs(flow, node, j, nan)
        if c:
            causes.append(c)
    elif direction == "backward":
        fwd = to_forward(node)
        f_ops = [_stats(flow, k) for k in _operands(flow, fwd)]
        parents = flow.ancestors(fwd) or flow.ancestors(node)
        where = f" in {parents[0]}" if parents else ""
        causes.append({"cause": "gradient_of", "certain": True,
                       "text": f"this is the backward of {fwd}{where}: its outputs are the gradients w.r.t. that "
                               "op's forward inputs"
                               + (" (forward inputs finite)" if f_ops and all(
                                   math.isfinite(o["max"]) and math.isfinite(o["min"]) for o in f_ops) else "")})
        short = _short(api)
        if f_ops and short in _SQRT | _RSQRT | _LOG | _POW and f_ops[0]["min"] <= 0.0:
            causes.append({"cause": f"{short}_gradient_at_zero", "certain": f_ops[0]["min"] == 0.0,
                           "text": f"the derivative of {short} is infinite at 0: forward input min "
                                   f"{f_ops[0]['min']:.4g}"})
        if short in _DIV and len(f_ops) >= 2 and _holds_zero(f_ops[1])[0]:
            causes.append({"cause": "x/0", "certain": _holds_zero(f_ops[1])[1],
                           "text": f"the gradient of a division divides by the denominator ({_fmt(f_ops[1])}), "
                                   "which holds a zero"})
        ins = [_stats(flow, k) for k in _operands(flow, node)]
        top = DTYPE_MAX.get(_dtype_key(dtype))
        big = max((max(abs(o["max"]), abs(o["min"])) for o in ins if math.isfinite(o["max"])), default=0.0)
        if not nan or (top is not None and big >= top / 1e3):
            causes.append({"cause": "loss_scale", "certain": False,
                           "text": f"gradient overflow in {_dtype_key(dtype)}: check the loss scale (a dynamic "
                                   f"loss scaler skips such steps) and gradient clipping; incoming gradient "
                                   f"|max| {big:.4g}"})
    else:
        ops = [_stats(flow, k) for k in _operands(flow, node)]
        c = _empty_input(flow, node, api, nan)
        if c:
            causes.append(c)
        causes += _op_causes(api, ops, _stats(flow, j), dtype, nan)
    causes.sort(key=lambda c: (not c.get("certain"), c["cause"] == "gradient_of"))
    return causes
