"""Hints that turn numbers into likely causes."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.findings.enrich import integer_ratio_hint  # (lives below: findings.enrich uses it too)
from precnb.naming import is_communication

__all__ = ["divergence_hints", "grad_ratio_hint", "integer_ratio_hint", "structural_hints",
           "zero_parameter_hints"]


def grad_ratio_hint(b: xr.Dataset, t: xr.Dataset, both: xr.DataArray, world_size: int,
                    names: tuple[str, str]) -> str | None:
    """Target/baseline gradient-norm ratio equal to an integer (e.g. the DP world size)."""
    kinds = b["kind"].values
    roles = b["role"].values
    is_grad = (kinds == "param_grad") | np.isin(b["api"].values, ["grad_reduced"])
    if not is_grad.any():
        is_grad = roles == "grad"
    if not is_grad.any():
        return None
    nb = b["norm"].values[..., is_grad]
    nt = t["norm"].values[..., is_grad]
    ok = both.values[..., is_grad] & np.isfinite(nb) & np.isfinite(nt) & (np.abs(nb) > 0)
    if ok.sum() < 3:
        return None
    ratio = nt[ok] / nb[ok]
    med = float(np.median(ratio))
    for label, value in (("", med), ("1/", 1 / med if med else 0.0)):
        k = round(value)
        if k < 2 or abs(value - k) > 0.02 * k:
            continue
        with np.errstate(divide="ignore"):  # a zero target norm: its inverse ratio is inf, never near k
            near = np.abs((ratio if not label else 1 / ratio) - k) <= 0.05 * k
        if near.mean() < 0.8:
            continue
        who = names[1] if not label else names[0]
        other = names[0] if not label else names[1]
        if k == world_size:
            return (f"gradient norms in {who} are {k}× those in {other} (median ratio {value:.4g}) and "
                    f"{k} is the data-parallel world size: gradients were summed, not averaged "
                    "(missing division by world size after the all-reduce)")
        return (f"gradient norms in {who} are {k}× those in {other} (median ratio {value:.4g}): "
                "a scaling factor (loss scale, gradient accumulation or DP averaging) differs")
    return None


def ratio_hint(b: xr.Dataset, t: xr.Dataset, differs: xr.DataArray, world_size: int,
               names: tuple[str, str]) -> str | None:
    """Differing tensors whose target/baseline norm ratio is one integer (e.g. the DP world size)."""
    return integer_ratio_hint(b["norm"].values[differs.values], t["norm"].values[differs.values], world_size,
                              names, min_count=3)


def zero_parameter_hints(b: xr.Dataset, t: xr.Dataset, both: xr.DataArray, names: tuple[str, str],
                         limit: int = 3) -> list[str]:
    """Parameters whose statistics are exactly zero in one run only (weights not loaded)."""
    params = b["role"].values == "parameter"
    if not params.any():
        return []
    out: list[str] = []
    labels = b["tensor"].values[params]

    def zero(ds: xr.Dataset) -> np.ndarray:
        mx, mn, nm = (ds[s].values[..., params] for s in ("max", "min", "norm"))
        return (mx == 0) & (mn == 0) & ((nm == 0) | np.isnan(nm))

    zb, zt = zero(b), zero(t)
    bo = both.values[..., params]
    # kernel inputs that read a parameter (MindSpore kernel dumps): label -> parameter name
    read = _json_attr(b, "kernel_parameters")
    for z, other_z, name in ((zt, zb, names[1]), (zb, zt, names[0])):
        hit = (z & ~other_z & bo).any(axis=tuple(range(z.ndim - 1)))
        seen: set[str] = set()
        for lbl in (str(x) for x in labels[hit]):
            param = read.get(lbl, lbl)
            # biases (and BatchNorm shifts) are legitimately zero at initialisation
            if param.endswith(("bias", "beta")) or param in seen:
                continue
            seen.add(param)
            via = f" (read by kernel input {lbl})" if param != lbl else ""
            out.append(f"parameter {param}{via} is exactly zero in {name} but not in the other run: "
                       "weights not loaded (checkpoint loading problem?)")
            if len(seen) >= limit:
                break
    return out


def _json_attr(ds: xr.Dataset, key: str) -> dict[str, str]:
    raw = ds.attrs.get(key)
    if not raw:
        return {}
    try:
        val = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in val.items()} if isinstance(val, dict) else {}


def structural_hints(structural: list[dict[str, Any]], names: tuple[str, str]) -> list[str]:
    """Summarise nodes that exist in one run only, by API."""
    hints: list[str] = []
    for run in names:
        apis = Counter(_api_of(s["node"]) for s in structural if s["only_in"] == run)
        if not apis:
            continue
        top = ", ".join(f"{n}× {a}" for a, n in apis.most_common(4))
        other = names[0] if run == names[1] else names[1]
        hint = f"nodes present only in {run}: {top}"
        if any(a.endswith(("div_", "__truediv__", "__itruediv__", "div")) for a in apis) and any(
                is_communication(s["node"]) for s in structural) is False:
            hint += f" (e.g. an averaging step that {other} skips)"
        hints.append(hint)
    return hints


def _api_of(node: str) -> str:
    from precnb.naming import parse_node

    return parse_node(node).api


def divergence_hints(
    *,
    origin_node: str,
    origin_tensor: str,
    origin_role: str,
    origin_seq: int,
    first_step: int,
    steps: list[int],
    dtype_changed: dict[str, tuple[str, str]],
    shape_changed: dict[str, tuple[str, str]] | None = None,
    names: tuple[str, str],
    structural_before: list[str] | None = None,
) -> list[str]:
    """Hints about the divergence point itself."""
    hints: list[str] = []
    shape_changed = shape_changed or {}
    if origin_tensor in shape_changed:
        a, b = shape_changed[origin_tensor]
        hints.append(f"shape differs at this tensor: {a} in {names[0]} vs {b} in {names[1]}: "
                     "probably a tensor-parallel shard; merge shards with a layout "
                     "(--target-layout tp=N) before comparing")
    elif len(shape_changed) > 3:
        hints.append(f"{len(shape_changed)} tensors change shape between the runs: the parallel "
                     "layouts differ; merge shards with a layout before comparing")
    if is_communication(origin_node):
        hints.append(f"the divergence starts at a communication op ({origin_node}): check the "
                     "collective (group, reduce op, dtype) and the other ranks' inputs")
    if origin_tensor in dtype_changed:
        a, b = dtype_changed[origin_tensor]
        hints.append(f"dtype differs at this tensor: {a} in {names[0]} vs {b} in {names[1]}"
                     + (f"; every entry agrees in dtype before step {first_step}: a cast or autocast "
                        "region (or mixed-precision setting) that differs between the runs from that step"
                        if first_step != min(steps) else ""))
    elif dtype_changed:
        some = next(iter(dtype_changed.items()))
        hints.append(f"{len(dtype_changed)} tensor(s) change dtype between the runs, e.g. {some[0]}: "
                     f"{some[1][0]} → {some[1][1]}")
    if origin_role == "input" and origin_seq == 0:
        hints.append("the very first input of the step differs: the input batch differs "
                     "(data order, shuffling seed or preprocessing)")
    elif origin_role == "input" and structural_before:
        hints.append(f"ops present in one run only ran before this point on this rank "
                     f"({', '.join(structural_before[:3])}{'…' if len(structural_before) > 3 else ''}): "
                     "they explain why this input differs")
    elif origin_role == "input":
        hints.append("this input differs although no earlier recorded op differs: it was produced by "
                     "an op that was not dumped (msprobe's scope/list/risk level, e.g. dtype casts "
                     "such as Tensor.to, or code outside hooked APIs)")
    elif origin_role == "parameter":
        if first_step != min(steps):
            hints.append(f"parameters agree before step {first_step} but not at it: the optimizer "
                         f"update of the previous step diverged")
        else:
            hints.append("parameters differ at the first compared step: different initial or "
                         "loaded weights (checkpoint) or a resumed run at another step "
                         "(try step_offset='auto')")
    return hints
