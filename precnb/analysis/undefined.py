"""Entries with no defined value by construction, which every diagnosis sets aside.

Some recorded tensors hold whatever their memory held: an op that ignores one of its inputs
(``input`` of ``baddbmm`` / ``addbmm`` / ``addmm`` / ``addmv`` / ``addr`` with ``beta=0`` —
Megatron's attention passes an uninitialised ``torch.empty`` buffer there), the buffer a receive
overwrites, and an ``irecv`` tensor that msprobe records before the wait (inside
``Distributed.batch_isend_irecv``, Megatron's pipeline exchange). Their statistics are arbitrary —
NaN or not — and differ between identical runs, so none of them may be an origin, a divergence or a
replica mismatch. The reader lists them per (step, rank) (``attrs["undefined"]``, from each record's
scalar arguments and P2P op kinds: :func:`precnb.io._runfacts.undefined_leaves`); :func:`mark_undefined`
turns that into a data variable ``undefined`` (step, rank, tensor) and a ``undefined_why``
coordinate, which merging and pipeline stitching carry along; :func:`set_aside` says what was set aside
and why, for a finding's evidence.

Examples
--------
>>> import json, numpy as np
>>> from precnb.schema import empty_dataset
>>> ds = empty_dataset()
>>> undefined_mask(ds).shape
(0, 0, 0)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis._memo import DatasetMemo

__all__ = ["mark_undefined", "returned_parameter_grads", "set_aside", "summarise", "undefined_mask",
           "undefined_reasons"]

_VAR = "undefined"
_WHY = "undefined_why"
GLUE = "tensor-parallel glue"  # the prefix of precnb.analysis.layout.rank_args's reasons


def _from_attrs(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray] | None:
    from precnb.schema import undefined_table

    try:
        table = undefined_table(ds)
    except (TypeError, ValueError, KeyError):
        return None
    if not table:
        return None
    labels = {str(t): j for j, t in enumerate(ds["tensor"].values.tolist())}
    steps = {int(s): i for i, s in enumerate(ds["step"].values.tolist())}
    ranks = {int(r): i for i, r in enumerate(ds["rank"].values.tolist())}
    mask = np.zeros((ds.sizes["step"], ds.sizes["rank"], ds.sizes["tensor"]), bool)
    why = np.full(ds.sizes["tensor"], "", dtype=object)
    for label, (reason, pairs) in table.items():
        j = labels.get(label)
        if j is None:
            continue
        hit = False
        for s, r in pairs:
            si, ri = steps.get(s), ranks.get(r)
            if si is not None and ri is not None:
                mask[si, ri, j] = True
                hit = True
        if hit:
            why[j] = reason
    return mask, why


def undefined_mask(ds: xr.Dataset) -> np.ndarray:
    """(step, rank, tensor) bool: entries with no defined value (all False when the run records none).

    Reads the ``undefined`` variable when the run has one (:func:`mark_undefined`), else the reader's
    ``attrs["undefined"]`` (valid for a run as read, before its ranks or labels are renamed).
    """
    if _VAR in ds.data_vars:
        return np.asarray(ds[_VAR].values, bool) & ds["present"].values
    got = _from_attrs(ds)
    shape = (ds.sizes["step"], ds.sizes["rank"], ds.sizes["tensor"])
    return got[0] & ds["present"].values if got is not None else np.zeros(shape, bool)


def mark_undefined(ds: xr.Dataset) -> xr.Dataset:
    """*ds* with the ``undefined`` variable and ``undefined_why`` coordinate (unchanged when none or done)."""
    if _VAR in ds.data_vars or "run" in ds.dims:
        return ds
    got = _from_attrs(ds)
    if got is None or not got[0].any():
        return ds
    mask, why = got
    return ds.assign({_VAR: (("step", "rank", "tensor"), mask & ds["present"].values)}).assign_coords(
        {_WHY: ("tensor", why)})


def undefined_reasons(ds: xr.Dataset) -> dict[str, str]:
    """Tensor label → why it has no defined value (only the labels that have an undefined entry)."""
    if _WHY in ds.coords:
        return {str(t): str(w) for t, w in zip(ds["tensor"].values.tolist(), ds[_WHY].values.tolist(), strict=True)
                if w}
    got = _from_attrs(ds)
    if got is None:
        return {}
    return {str(t): str(w) for t, w in zip(ds["tensor"].values.tolist(), got[1].tolist(), strict=True) if w}


def summarise(mask: np.ndarray, steps: Any, ranks: Any, tensors: Any, why: dict[str, str], *,
              examples: int = 3) -> list[dict[str, Any]]:
    """One entry per reason of the True entries of a (step, rank, tensor) *mask* (see :func:`set_aside`)."""
    out: dict[str, dict[str, Any]] = {}
    for si, ri, j in np.argwhere(mask):
        label = str(tensors[j])
        full = why.get(label) or "no defined value"
        key = full.split(": ", 1)[0] if full.startswith(GLUE) else full  # glue: one entry, its calls as examples
        entry = out.setdefault(key, {"entries": 0, "tensors": set(), "examples": []})
        entry["entries"] += 1
        entry["tensors"].add(label)
        if len(entry["examples"]) < examples:
            ex = {"step": int(steps[si]), "rank": int(ranks[ri]), "tensor": label}
            if key != full:
                ex["detail"] = full.split(": ", 1)[1]
            entry["examples"].append(ex)
    return [{"why": (f"{w}: computed with the rank's own constants (or from such a value) before a collective "
                     "combines the ranks' parts; no whole-model counterpart") if w == GLUE else w,
             "entries": e["entries"], "tensors": len(e["tensors"]), "examples": e["examples"]}
            for w, e in out.items()]


def set_aside(ds: xr.Dataset, mask: np.ndarray | None = None, *, only: np.ndarray | None = None,
              examples: int = 3) -> list[dict[str, Any]]:
    """What was set aside: one entry per reason, with the count of entries and a few examples.

    *only* (same shape as the mask) keeps the entries that mattered, e.g. the non-finite ones for a
    NaN search or those whose values differ for a comparison.

    Returns
    -------
    list of dict
        ``{"why", "entries", "tensors", "examples": [{"step", "rank", "tensor"}, ...]}``.
    """
    m = undefined_mask(ds) if mask is None else mask
    if only is not None:
        m = m & only
    if not m.any():
        return []
    return summarise(m, ds["step"].values, ds["rank"].values, ds["tensor"].values, undefined_reasons(ds),
                     examples=examples)


RETURNED = ("gradient of a parameter the module returns instead of using (Megatron's skip_bias_add): it is used, "
            "and its gradient made, outside the module, and msprobe records it at the module's backward, so "
            "its value depends on the schedule")


def returned_parameters(ds: xr.Dataset) -> dict[str, list[str]]:
    """Module node → the names of its parameters it returns as one of its outputs (statistics equal, exactly).

    ``RowParallelLinear(skip_bias_add=True)`` returns ``(output, bias)``; the bias is added in the caller's
    bias-dropout-add, so its gradient is recorded at another time, or not by the module's hook at all.
    Read once per dataset (a rerun, the comparison and the pre-flight checks ask of the same runs).
    """
    return _RETURNED.get([ds], "returned_parameters", lambda: _returned_parameters(ds))


_RETURNED = DatasetMemo(size=6)


def _returned_parameters(ds: xr.Dataset) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if ds.sizes.get("step", 0) == 0 or ds.sizes.get("rank", 0) == 0 or ds.sizes.get("tensor", 0) == 0:
        return out
    nodes, roles, labels = ds["node"].values, ds["role"].values, ds["tensor"].values
    present = ds["present"].values
    first = np.argmax(present.reshape(-1, ds.sizes["tensor"]), axis=0)
    flat = {s: ds[s].values.reshape(-1, ds.sizes["tensor"]) for s in ("max", "min", "mean", "norm", "numel")}
    cols = np.arange(ds.sizes["tensor"])
    sig = np.stack([flat[s][first, cols] for s in ("max", "min", "mean", "norm", "numel")], axis=1)
    by_node: dict[str, list[int]] = {}
    for j, n in enumerate(nodes.tolist()):
        if str(n).startswith(("Module.", "Cell.")):
            by_node.setdefault(str(n), []).append(j)
    for node, js in by_node.items():
        params = [j for j in js if roles[j] == "parameter"]
        outs = [j for j in js if roles[j] == "output"]
        for j in params:
            if np.isfinite(sig[j, :4]).all() and any(np.array_equal(sig[j], sig[o]) for o in outs):
                out.setdefault(node, []).append(str(labels[j]).rsplit(".", 1)[-1])
    return out


def returned_parameter_grads(ds: xr.Dataset) -> dict[str, str]:
    """Gradient labels (``…parameters_grad.N.bias``) of parameters a module returns as one of its outputs.

    See :func:`returned_parameters`.
    """
    from precnb.naming import parse_node

    out: dict[str, str] = {}
    returned = returned_parameters(ds)
    if not returned:
        return out
    grads = [str(t) for t in ds["tensor"].values.tolist() if ".parameters_grad." in str(t)]
    for node, names in returned.items():
        if parse_node(node).kind != "module":
            continue
        prefix = node.rsplit(".", 2)[0] + ".parameters_grad."
        for lbl in grads:
            if lbl.startswith(prefix) and lbl.rsplit(".", 1)[-1] in names:
                out[lbl] = RETURNED
    return out
