"""Shared pieces of the pre-flight checks: the check record, parameter tables, number formatting.

A check is a plain dict (the JSON contract of :func:`precnb.analysis.preflight.preflight`)::

    {"name": "parameters", "title": "Parameter inventory", "status": "pass" | "warn" | "fail" | "skip",
     "message": "...", "confidence": "high" | "medium" | "low" | None, "basis": "read" | "inferred" | ...,
     "details": {...}}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis._memo import DatasetMemo
from precnb.schema import side_table

__all__ = ["STATUS_ORDER", "Param", "check", "fmt", "names_list", "optimizer_tensors", "param_stats", "parameter_table",
           "worst"]

STATUS_ORDER = {"fail": 3, "warn": 2, "pass": 1, "skip": 0}
_STATS = ("max", "min", "mean", "norm")


def check(name: str, title: str, status: str, message: str, *, confidence: str | None = None,
          basis: str | None = None, **details: Any) -> dict[str, Any]:
    """One check record (see the module docstring)."""
    return {"name": name, "title": title, "status": status, "message": message, "confidence": confidence,
            "basis": basis, "details": details}


def worst(statuses: Any) -> str:
    """The most severe status (``skip`` < ``pass`` < ``warn`` < ``fail``)."""
    items = list(statuses)
    return max(items, key=lambda s: STATUS_ORDER[s]) if items else "skip"


def fmt(v: Any) -> str:
    """A figure for a message: 6 significant digits, ``×`` ratios kept short.

    Examples
    --------
    >>> fmt(0.1), fmt(10.000000000000002), fmt(float("nan")), fmt(4240)
    ('0.1', '10', 'nan', '4,240')
    """
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return "nan" if math.isnan(f) else (f"{f:.6g}" if math.isfinite(f) else ("inf" if f > 0 else "-inf"))
    return str(v)


def names_list(items: list[str], limit: int = 6) -> str:
    """``a, b, c`` (and ``… (N in all)`` past *limit*)."""
    shown = ", ".join(items[:limit])
    return shown + (f" … ({len(items)} in all)" if len(items) > limit else "")


@dataclass
class Param:
    """One model parameter of a run.

    Attributes
    ----------
    name : str
        ``module.param`` (``blocks.0.attn.q_proj.weight``).
    label : str or None
        Its forward record (``Module...forward.0.parameters.weight``, a config_check ``Weights.*``).
    grad : str or None
        Its gradient record (``Module...parameters_grad.0.weight``).
    shape, dtype : str
        As recorded (``""`` when unknown, e.g. in a config_check pack).
    numel : int
        Elements (-1 unknown).
    requires_grad : bool or None
        As recorded in the dump (None: not recorded).
    """

    name: str
    label: str | None = None
    grad: str | None = None
    shape: str = ""
    dtype: str = ""
    numel: int = -1
    requires_grad: bool | None = None


def _pname(label: str, module: str) -> str:
    last = label.split("#dup", 1)[0].rsplit(".", 1)[-1]
    return f"{module}.{last}" if module else last


_TABLES = DatasetMemo(size=4)


def parameter_table(ds: xr.Dataset) -> dict[str, Param]:
    """The parameters of *ds*, by name, from its parameter and gradient records (first call of each module).

    Read once per dataset (a rerun of the triage on the same target: an explorer's Match / Unmatch); each
    caller gets its own copy.
    """
    import copy

    return _TABLES.get([ds], "parameter_table", lambda: _parameter_table(ds),
                       copy=lambda t: {k: copy.copy(v) for k, v in t.items()}, holds=False)  # flat records


def _parameter_table(ds: xr.Dataset) -> dict[str, Param]:
    out: dict[str, Param] = {}
    if ds.sizes.get("tensor", 0) == 0:
        return out
    role = ds["role"].values
    kind = ds["kind"].values
    labels = ds["tensor"].values
    modules = ds["module"].values
    calls = ds["call"].values
    rg = side_table(ds, "requires_grad") if ds.attrs.get("requires_grad") else {}
    present = ds["present"].values.reshape(-1, ds.sizes["tensor"]).any(axis=0)
    numel = ds["numel"].values.reshape(-1, ds.sizes["tensor"])
    seen_call: dict[str, int] = {}
    from precnb.analysis.align.fused import fused_parts

    parts = set(fused_parts(ds))  # separate projections counted once, as the fused one they were combined into
    nodes = ds["node"].values if parts else None
    for i in np.flatnonzero(((role == "parameter") | (kind == "param_grad")) & present):
        if nodes is not None and str(nodes[i]) in parts:
            continue
        label, module = str(labels[i]), str(modules[i])
        name = _pname(label, module)
        p = out.setdefault(name, Param(name))
        if kind[i] == "param_grad":
            p.grad = p.grad or label
            continue
        call = int(calls[i])
        if p.label is not None and seen_call.get(name, call) <= call:
            continue
        seen_call[name] = call
        p.label = label
        p.shape, p.dtype = str(ds["shape"].values[i]), str(ds["dtype"].values[i])
        col = numel[:, i]
        p.numel = int(col[col >= 0][0]) if (col >= 0).any() else -1
        if label in rg:
            p.requires_grad = bool(rg[label])
    for p in out.values():  # a parameter seen only through its gradient
        if p.label is None and p.grad is not None:
            g = int(np.flatnonzero(labels == p.grad)[0])
            p.shape, p.dtype = str(ds["shape"].values[g]), str(ds["dtype"].values[g])
    return out


_CACHE: list[tuple[xr.Dataset, np.ndarray, dict[str, int]]] = []


def _stats_array(ds: xr.Dataset) -> tuple[np.ndarray, dict[str, int]]:
    """``(step, rank, tensor, 4)`` statistics of *ds* (NaN where absent) and the tensor positions, cached."""
    for held, arr, pos in _CACHE:
        if held is ds:
            return arr, pos
    arr = np.stack([np.asarray(ds[s].values, np.float64) for s in _STATS], axis=-1)
    arr[~np.asarray(ds["present"].values, bool)] = np.nan
    pos = {str(t): i for i, t in enumerate(ds["tensor"].values)}
    _CACHE.insert(0, (ds, arr, pos))
    del _CACHE[4:]
    return arr, pos


def clear_cache() -> None:
    """Drop the cached statistics arrays (:func:`precnb.analysis.preflight.preflight` does it when done)."""
    _CACHE.clear()


def param_stats(ds: xr.Dataset, label: str) -> np.ndarray:
    """``(step, rank, 4)`` statistics (max, min, mean, norm) of one tensor, NaN where absent."""
    arr, pos = _stats_array(ds)
    return arr[:, :, pos[label], :]


def same_stats(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equal statistics (NaN equal to NaN)."""
    return bool(np.array_equal(a, b, equal_nan=True))


def optimizer_tensors(ds: xr.Dataset) -> tuple[str, list[str]] | None:
    """``(how, shapes)`` of the parameter tensors the optimizer updates at the run's first step.

    From a fused optimizer's parameter list (``Torch._fused_adamw_`` input 0: one tensor per
    parameter) or from single-tensor Adam's per-parameter ``Tensor.addcdiv_`` calls; None when
    the dump holds neither (level L0, or another optimizer).
    """
    if ds.sizes.get("tensor", 0) == 0 or ds.sizes.get("step", 0) == 0:
        return None
    api = ds["api"].values.astype(str)
    labels = ds["tensor"].values.astype(str)
    present = ds["present"].values[0].any(axis=0)
    shapes = ds["shape"].values
    fused = np.flatnonzero(np.char.find(api, "_fused_") >= 0)
    if len(fused):
        first = str(ds["node"].values[fused[0]])
        mine = [i for i in fused if str(ds["node"].values[i]) == first and present[i]
                and labels[i].startswith(f"{first}.input.0.")]
        if mine:
            return f"{first} parameter list", [str(shapes[i]) for i in mine]
    single = np.flatnonzero((api == "Tensor.addcdiv_") & present & np.char.endswith(labels, ".input.0"))
    if len(single):
        return "Tensor.addcdiv_ calls (single-tensor Adam)", [str(shapes[i]) for i in single]
    return None
