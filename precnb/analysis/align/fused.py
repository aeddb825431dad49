"""Fused projections against separate ones: combined like shards, so that one codebase's call pairs the other's.

Megatron-Core computes a layer's query, key and value in one ``linear_qkv`` and SwiGLU's gate and up
in one ``linear_fc1``; Hugging Face models have ``q_proj`` / ``k_proj`` / ``v_proj`` and
``gate_proj`` / ``up_proj``. Sibling linear modules that read the same input in one call each are a
fused projection split in parts: their outputs, weights, biases and the gradients of those are the
fused module's, cut along the last (output) dimension, so their statistics combine like TP shards
(max of maxima, min of minima, element-weighted mean, root of the summed squared norms), whatever the
order of the rows (Megatron interleaves the heads). :func:`fuse_projections` adds that combined call
as a synthetic module ``<parent>.<a>+<b>+…`` next to the parts, only where the other run has a module
call of the combined shape, so the aligner can pair it by value; the parts stay, marked as
organisation (``attrs["fused_projections"]``: part node → fused node).

The gradient of the shared input is the *sum* of the parts' input gradients: statistics cannot give it,
so the fused backward call has no ``output`` record (absent, not NaN).

Examples
--------
>>> from precnb.schema import empty_dataset
>>> fuse_projections(empty_dataset(), empty_dataset()).sizes["tensor"]
0
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np
import xarray as xr

from precnb.naming import parse_node

__all__ = ["fuse_pair", "fuse_projections", "fused_parts"]

_STATS = ("max", "min", "mean", "norm")
#: how a part's record becomes the fused call's: combined along the output dim, or copied (the shared input)
_FORWARD = {"input.0": "copy", "output.0": "concat", "parameters.weight": "concat", "parameters.bias": "concat"}
_BACKWARD = {"input.0": "concat"}  # the gradient of the output; the input's gradient is a sum: not recorded
_PGRAD = {"weight": "concat", "bias": "concat"}


def fused_parts(ds: xr.Dataset) -> dict[str, str]:
    """Part node → the synthetic fused node it is combined into (empty when nothing was fused)."""
    try:
        return dict(json.loads(ds.attrs.get("fused_projections") or "{}"))
    except (TypeError, ValueError):
        return {}


def _shape(text: Any) -> list[int] | None:
    try:
        v = json.loads(str(text))
    except (TypeError, ValueError):
        return None
    return [int(x) for x in v] if isinstance(v, list) and all(isinstance(x, int) for x in v) else None


def _sibling_groups(ds: xr.Dataset) -> list[tuple[str, str, str, int, list[str]]]:
    """(prefix, parent path, class, call, [leaf paths]) of >= 2 sibling forward module calls reading one input."""
    labels = ds["tensor"].values
    nodes = ds["node"].values
    by_key: dict[tuple[str, str, str, int], list[str]] = defaultdict(list)
    idx = {str(lbl): j for j, lbl in enumerate(labels)}
    for n in dict.fromkeys(str(x) for x in nodes):
        p = parse_node(n)
        if p.kind != "module" or p.direction != "forward" or "." not in p.module or f"{n}.input.0" not in idx:
            continue
        parent, _, leaf = p.module.rpartition(".")
        by_key[(n.split(".", 1)[0], parent, p.api, p.call)].append(leaf)
    out: list[tuple[str, str, str, int, list[str]]] = []
    pres = ds["present"].values
    for (prefix, parent, cls, call), leaves in by_key.items():
        if len(leaves) < 2:
            continue
        by_input: dict[bytes, list[str]] = defaultdict(list)  # leaves whose input is bit-identical everywhere
        for leaf in leaves:
            j = idx[f"{prefix}.{parent}.{leaf}.{cls}.forward.{call}.input.0"]
            if not pres[:, :, j].any():
                continue
            sig = pres[:, :, j].tobytes() + b"".join(np.nan_to_num(ds[s].values[:, :, j], nan=np.inf).tobytes()
                                                     for s in _STATS)
            by_input[sig].append(leaf)
        out.extend((prefix, parent, cls, call, group) for group in by_input.values() if len(group) >= 2)
    return out


def _first_stats(ds: xr.Dataset, j: int) -> np.ndarray | None:
    """max, min, mean, norm of tensor column *j* at its first present (step, rank)."""
    where = np.argwhere(ds["present"].values[:, :, j])
    if not len(where):
        return None
    s, r = where[0]
    return np.asarray([ds[x].values[s, r, j] for x in _STATS], np.float64)


def _wanted(other: xr.Dataset) -> dict[tuple[int, int], list[np.ndarray]]:
    """(input numel, output last dim) → the input statistics of the other run's forward module calls."""
    out: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)
    shapes = other["shape"].values
    idx = {str(lbl): j for j, lbl in enumerate(other["tensor"].values)}
    for lbl, j in idx.items():
        if ".forward." not in lbl or not lbl.startswith(("Module.", "Cell.")) or not lbl.endswith(".output.0"):
            continue
        s_out = _shape(shapes[j])
        k = idx.get(lbl[: -len("output.0")] + "input.0")
        s_in = _shape(shapes[k]) if k is not None else None
        st = _first_stats(other, k) if k is not None else None
        if s_out and s_in and st is not None:
            out[(int(np.prod(s_in)), s_out[-1])].append(st)
    return out


def _matches(ours: np.ndarray | None, theirs: list[np.ndarray], rtol: float = 1e-2) -> bool:
    """The other run has a call of that signature reading the same input (statistics close)."""
    if ours is None:
        return False
    scale = np.maximum(np.abs(ours), abs(ours[3]) * 1e-3 + 1e-12)  # a mean near 0: on the norm's scale
    return any(bool(np.all(np.abs(t - ours) <= rtol * scale)) for t in theirs)


def fuse_projections(ds: xr.Dataset, other: xr.Dataset) -> xr.Dataset:
    """*ds* with a synthetic fused call for every set of sibling projections the *other* run computes fused.

    Parameters
    ----------
    ds : xr.Dataset
        The run with separate projections (e.g. a Hugging Face model).
    other : xr.Dataset
        The run it is compared with (e.g. Megatron-Core, whose ``linear_qkv`` / ``linear_fc1`` are fused).

    Returns
    -------
    xr.Dataset
        *ds* unchanged when there is nothing to fuse (or it was fused before), else with the fused calls'
        records appended and ``attrs["fused_projections"]``.
    """
    if "fused_projections" in ds.attrs or not ds.sizes.get("tensor") or not other.sizes.get("tensor"):
        return ds
    wanted = _wanted(other)
    idx = {str(lbl): j for j, lbl in enumerate(ds["tensor"].values)}
    shapes = ds["shape"].values
    new_labels: list[str] = []
    parts_of: list[list[int]] = []
    how_of: list[str] = []
    fused: dict[str, str] = {}
    for prefix, parent, cls, call, leaves in _sibling_groups(ds):
        first = f"{prefix}.{parent}.{leaves[0]}.{cls}.forward.{call}"
        s_in = _shape(shapes[idx[f"{first}.input.0"]])
        outs = [_shape(shapes[idx[f"{prefix}.{parent}.{leaf}.{cls}.forward.{call}.output.0"]])
                if f"{prefix}.{parent}.{leaf}.{cls}.forward.{call}.output.0" in idx else None for leaf in leaves]
        if not s_in or any(o is None for o in outs):
            continue
        # only where the other run computes them fused: a call of the combined width reading the same input
        theirs = wanted.get((int(np.prod(s_in)), sum(o[-1] for o in outs if o)))
        if not theirs or not _matches(_first_stats(ds, idx[f"{first}.input.0"]), theirs):
            continue
        path = f"{parent}.{'+'.join(leaves)}"
        for kind, table in (("forward", _FORWARD), ("backward", _BACKWARD), ("parameters_grad", _PGRAD)):
            src = [f"{prefix}.{parent}.{leaf}.{cls}.{kind}.{call}" for leaf in leaves]
            dst = f"{prefix}.{path}.{cls}.{kind}.{call}"
            for suffix, how in table.items():
                cols = [idx.get(f"{s}.{suffix}") for s in src]
                if any(c is None for c in cols):
                    continue
                new_labels.append(f"{dst}.{suffix}")
                parts_of.append([int(c) for c in cols if c is not None])
                how_of.append(how)
            for s in src:
                fused[s] = dst
    if not new_labels:
        return ds
    return _append(ds, new_labels, parts_of, how_of, fused)


def _append(ds: xr.Dataset, labels: list[str], parts: list[list[int]], how: list[str], fused: dict[str, str]
            ) -> xr.Dataset:
    """*ds* with the combined records *labels* (each from the columns *parts*) appended."""
    first = [p[0] for p in parts]
    new = ds.isel(tensor=first).copy(deep=True)
    concat = np.asarray([h == "concat" for h in how])
    cols = np.asarray([p + [p[-1]] * (max(map(len, parts)) - len(p)) for p in parts])  # padded: repeats change nothing
    width = np.asarray([len(p) for p in parts])
    pres = ds["present"].values[:, :, cols]  # (step, rank, new, part)
    real = np.arange(cols.shape[1])[None, :] < width[:, None]
    allp = pres.all(axis=3)
    numel = np.where(pres, ds["numel"].values[:, :, cols], 0).astype(np.float64)
    numel = np.where(real[None, None], numel, 0.0)
    v = {s: ds[s].values[:, :, cols] for s in _STATS}
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        comb = {"max": v["max"].max(axis=3), "min": v["min"].min(axis=3),
                "mean": (v["mean"] * numel).sum(axis=3) / numel.sum(axis=3),
                "norm": np.sqrt(np.where(real[None, None], v["norm"] ** 2, 0.0).sum(axis=3))}
    for s in _STATS:
        new[s].values[:] = np.where(allp & concat[None, None], comb[s], new[s].values)
        new[s].values[:] = np.where(allp, new[s].values, np.nan)
    new["present"].values[:] = allp
    new["numel"].values[:] = np.where(allp & concat[None, None], numel.sum(axis=3).astype(np.int64),
                                      np.where(allp, new["numel"].values, -1))
    new["null_stats"].values[:] = np.where(allp, np.bitwise_or.reduce(ds["null_stats"].values[:, :, cols], axis=3), 0)
    seq = ds["seq"].values[:, :, cols]
    new["seq"].values[:] = np.where(allp, np.where(seq >= 0, seq, np.iinfo(np.int32).max).min(axis=3), -1)
    node, module, shape = [], [], []
    for lbl, p, h in zip(labels, parts, how, strict=True):
        n = lbl.rsplit(".", 2)[0] if lbl.endswith((".input.0", ".output.0")) else lbl.rsplit(".", 1)[0]
        if ".parameters." in lbl:
            n = lbl.split(".parameters.")[0]
        node.append(n)
        module.append(parse_node(n).module)
        shp = [_shape(ds["shape"].values[c]) or [] for c in p]
        if h == "concat" and all(shp) and len({len(s) for s in shp}) == 1:
            last = len(shp[0]) - 1 if lbl.endswith(("input.0", "output.0")) else 0  # weights: rows
            merged = list(shp[0])
            merged[last] = sum(s[last] for s in shp)
            shape.append(json.dumps(merged))
        else:
            shape.append(str(ds["shape"].values[p[0]]))
    new = new.assign_coords(tensor=np.asarray(labels, dtype=object), node=("tensor", np.asarray(node, object)),
                            module=("tensor", np.asarray(module, object)), shape=("tensor", np.asarray(shape, object)))
    out = xr.concat([ds, new], dim="tensor", data_vars="all", coords="different", compat="equals",
                    combine_attrs="override")
    out.attrs["fused_projections"] = json.dumps(fused)
    return out


def fuse_pair(baseline: xr.Dataset, target: xr.Dataset) -> tuple[xr.Dataset, xr.Dataset]:
    """Both runs with each other's fused projections combined (unchanged when their names are the same)."""
    if baseline.indexes["tensor"].equals(target.indexes["tensor"]):
        return baseline, target
    if set(np.unique(baseline["module"].values).tolist()) == set(np.unique(target["module"].values).tolist()):
        return baseline, target  # the same modules on both sides (one codebase): nothing fused on one only
    return fuse_projections(baseline, target), fuse_projections(target, baseline)
