"""Shard classes over steps: a class decided on earlier steps kept for the later steps that name the same call.

msprobe numbers API calls per step, so a label can name another op at a later step (Megatron's rotary embedding
computes its frequencies at the first step only); a module record names the same call at every step. Used by
:func:`precnb.analysis.layout.merge.merge_group_dim` for step groups and for step batches merged one by one.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import xarray as xr

__all__ = ["keep_like", "keep_module_classes", "refined", "same_steps"]


def refined(parts: list[np.ndarray], ds: xr.Dataset, reference: xr.Dataset) -> list[np.ndarray]:
    """*ds*'s step groups (indices) split where the *reference*'s labels change meaning between steps.

    At level L1 a sharded run's label can name another call at a later step with the same local shape (a TP
    shard and a whole tensor of the same size), where the unsharded run's shapes show the change.

    >>> from precnb.schema import empty_dataset
    >>> refined([np.arange(2)], empty_dataset(), empty_dataset())
    [array([0, 1])]
    """
    from precnb.analysis.step_groups import step_groups

    if not reference.sizes.get("step") or not ds.sizes.get("step"):
        return parts
    ref_group = {int(s): g for g, idx in enumerate(step_groups(reference))
                 for s in reference["step"].values[idx].tolist()}
    steps = [int(s) for s in ds["step"].values]
    mine = parts or [np.arange(len(steps))]
    out: list[np.ndarray] = []
    for idx in mine:
        by: dict[int, list[int]] = {}
        for i in idx.tolist():
            by.setdefault(ref_group.get(steps[i], -1), []).append(i)
        out.extend(np.asarray(v, np.int64) for v in by.values())
    return out if len(out) > 1 else parts


def same_steps(reference: xr.Dataset | None, ds: xr.Dataset, steps: np.ndarray) -> xr.Dataset | None:
    """*reference* at the steps of *ds* numbered *steps*, with those steps' own label coordinates.

    The reference as it is when it lacks one of them.
    """
    if reference is None:
        return None
    from precnb.analysis.step_groups import rebased

    have = {int(s): i for i, s in enumerate(reference["step"].values.tolist())}
    at = [have.get(int(s)) for s in ds["step"].values[steps]]
    return reference if any(i is None for i in at) else rebased(reference, np.asarray(at, np.int64))


def keep_module_classes(ds: xr.Dataset, first_steps: np.ndarray, steps: np.ndarray,
                         first: tuple[np.ndarray, np.ndarray, np.ndarray],
                         now: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """Later steps' classes of module records (forward, backward, parameter gradients) set to the first steps'.

    An API call's counter shifts when another call of its API is made at one step only, so its classes are
    decided per group of steps; a module record is numbered by its module's own calls: where its module,
    parent and shape stay the same it names the same call, and a replicated tensor whose copies differ later
    (a fault on one rank from step 1) is a replica departure, not a shard (in place on *now*).
    """
    from precnb.analysis.step_groups import label_meanings

    meaning = label_meanings(ds)
    present = np.asarray(ds["present"].values[first_steps].any(axis=(0, 1)), bool)
    module = np.isin(ds["kind"].values, ("module", "param_grad"))
    keep = module & present & (meaning[first_steps[0]] == meaning[steps[0]])
    for a, b in zip(now, first, strict=True):
        a[keep] = b[keep]


def keep_like(ds: xr.Dataset, like: xr.Dataset, dim: str, kinds: np.ndarray, reasons: np.ndarray,
               shard_dim: np.ndarray, reference: xr.Dataset | None = None) -> None:
    """The classes of *like* (merged before) for the tensors it has, in place.

    A split class is not kept where the unsharded *reference* (at these steps) holds the label whole in the
    shape each rank holds it: the label names another call at these steps, one not split.
    """
    prev = {str(t): j for j, t in enumerate(like["tensor"].values)}
    pk, pr, pd = (like[f"shard_{x}_{dim}"].values for x in ("kind", "reason", "dim"))
    same = _same_call(ds, like)
    whole = _whole_here(ds, reference)
    # across TP/CP a class decided on zeros only (a bias or an optimizer moment before the first update: equal on
    # every rank whether split or replicated) says nothing: the later steps decide it themselves (data-parallel
    # replicas split no tensor of the model: equal zeros there are replicas)
    with np.errstate(invalid="ignore"):
        zero = ((like["max"].values == 0) & (like["min"].values == 0)) | ~like["present"].values.astype(bool)
    zeros_only = zero.all(axis=(0, 1)) & (dim != "dp")
    for j, lbl in enumerate(ds["tensor"].values.tolist()):
        k = prev.get(str(lbl))
        if k is not None and not zeros_only[k] and same(j, k, str(pk[k]), pd[k]) and not (
                pk[k] == "sharded" and j in whole):
            kinds[j], reasons[j], shard_dim[j] = pk[k], pr[k], pd[k]


def _whole_here(ds: xr.Dataset, reference: xr.Dataset | None) -> set[int]:
    """Labels of *ds* whose shape is the *reference*'s shape of that label at *ds*'s steps (exceptions applied)."""
    if reference is None or "step" not in reference.dims or "present" not in reference.data_vars:
        return set()
    ref = same_steps(reference, ds, np.arange(ds.sizes["step"]))
    if ref is None:
        return set()
    table = dict(zip(ref["tensor"].values.tolist(), ref["shape"].values.tolist(), strict=True))
    shapes = ds["shape"].values
    return {j for j, lbl in enumerate(ds["tensor"].values.tolist())
            if shapes[j] and table.get(lbl) and _dims(table[lbl]) == _dims(shapes[j])}


def _same_call(ds: xr.Dataset, like: xr.Dataset) -> Any:
    """``same(j, k, kind)``: label *j* of *ds* names the same call as label *k* of *like* (merged before).

    msprobe numbers API calls per step, so a label can name another op at a later step (Megatron's rotary
    embedding computes its frequencies at the first step only: every later ``Tensor.__add__`` counter shifts
    by one). A class is kept only where the label's module, parent call, role and dtype are the same, and, for a
    tensor that was not split, its shape too (a split tensor's merged shape is the whole tensor's: the same
    rank and sizes but along the split dim). At level L1 there is no module or parent to tell two calls apart:
    the shape is all there is.
    """
    keys = [c for c in ("module", "parent", "role", "dtype") if c in ds.coords and c in like.coords]
    mine = [ds[c].values for c in keys]
    theirs = [like[c].values for c in keys]
    shape_a, shape_b = ds["shape"].values, like["shape"].values

    def same(j: int, k: int, kind: str, split: Any = None) -> bool:
        if any(a[j] != b[k] for a, b in zip(mine, theirs, strict=True)):
            return False
        if kind != "sharded":
            return bool(shape_a[j] == shape_b[k])
        return _same_but_split(shape_a[j], shape_b[k], split)

    return same


def _dims(shape: Any) -> list[int] | None:
    """A shape as a list of sizes (the coordinate holds JSON text), None when it is not one."""
    if isinstance(shape, str):
        try:
            shape = json.loads(shape)
        except ValueError:
            return None
    if isinstance(shape, (list, tuple)) and all(isinstance(x, int) for x in shape):
        return list(shape)
    return None


def _same_but_split(part: Any, whole: Any, split: Any) -> bool:
    """Whether a shard's shape *part* fits the merged shape *whole*: equal but along the split dim.

    >>> _same_but_split([8, 1, 32], [8, 2, 32], -2), _same_but_split([32], [8, 2, 4, 8], -3)
    (True, False)
    >>> _same_but_split(None, [4], 0), _same_but_split("[8, 1]", "[8, 2]", -1)  # unknown shapes: nothing to say
    (True, True)
    """
    part, whole = _dims(part), _dims(whole)
    if part is None or whole is None:
        return True
    if len(part) != len(whole):
        return False
    try:  # the split dim is stored negative (0: none known)
        d = int(split) % len(whole) if split and len(whole) else None
    except (TypeError, ValueError):
        d = None
    return all(a == b for i, (a, b) in enumerate(zip(part, whole, strict=True)) if i != d)
