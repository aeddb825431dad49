"""Which entries of a label name the same call: a label's meaning at each step.

msprobe numbers API calls per step, so a label can name another op at another step: Megatron's rotary embedding
computes its frequencies at the first step only, and from step 1 on every ``Tensor.__add__`` counter shifts by one.
The reader keeps one coordinate per label (the first entry's) and notes every entry whose module, parent or shape
differs (``meta_changes``, ``shape_changes``). A rule that pools a label's entries over steps (a tensor replicated
at most steps must be replicated) pools only the entries that name the same call.

Examples
--------
>>> from precnb.schema import empty_dataset
>>> label_meanings(empty_dataset()).shape
(0, 0)
>>> step_groups(empty_dataset())
[]
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import xarray as xr

from precnb.schema import entry_changes, meta_changes

__all__ = ["label_meanings", "rebased", "step_groups"]


def label_meanings(ds: xr.Dataset) -> np.ndarray:
    """Each entry's call as a (step, tensor) int: 0 for the call its label's coordinates describe.

    Any other call gets a number of its own (the same number at the steps where it names the same other call).
    A label is read at a step through its entries' exceptions on any rank (a step where one rank's entry
    names another call counts as that other call).
    """
    n_s = ds.sizes.get("step", 0)
    n_t = ds.sizes.get("tensor", 0)
    out = np.zeros((n_s, n_t), np.int64)
    if not n_s or not n_t:
        return out
    meta = meta_changes(ds)
    tables = {**meta, "shape": {**meta.get("shape", {}), **entry_changes(ds, "shape_changes")}}
    per: dict[tuple[str, int], set[tuple[Any, ...]]] = defaultdict(set)
    for field, by_tensor in tables.items():
        for tensor, where in by_tensor.items():
            for (s, r), value in where.items():
                per[(tensor, int(s))].add((field, r, value))
    if not per:
        return out
    col = {str(t): j for j, t in enumerate(ds["tensor"].values.tolist())}
    row = {int(s): i for i, s in enumerate(ds["step"].values.tolist())}
    ids: dict[frozenset[tuple[Any, ...]], int] = {}
    for (tensor, s), what in per.items():
        if tensor in col and s in row:
            out[row[s], col[tensor]] = ids.setdefault(frozenset((f, v) for f, _r, v in what), len(ids) + 1)
    return out


def step_groups(ds: xr.Dataset) -> list[np.ndarray]:
    """Indices of *ds*'s steps grouped by the labels that change meaning there (steps with the same set).

    A step where some labels name other calls than at another step has other call counters altogether (a call
    made at one step only shifts every later counter of its API, also where module, parent and shape stay the
    same, e.g. backward calls): rules that pool a label over steps pool one group.
    """
    m = label_meanings(ds)
    groups: dict[bytes, list[int]] = {}
    for i in range(m.shape[0]):
        groups.setdefault(m[i].tobytes(), []).append(i)
    return [np.asarray(g, np.int64) for g in groups.values()]


def rebased(ds: xr.Dataset, steps: np.ndarray) -> xr.Dataset:
    """*ds* at *steps* (indices), its labels' module, parent and shape coordinates those steps' own.

    Where every entry of a label at those steps is an exception (none holds the coordinate's value), the
    coordinate takes the first entry's (in step, then rank order), as the reader sets it on those steps read
    alone: one other call's value, or one rank's where the entries differ by rank (an expert's tokens on each
    rank: ``[3, 32]`` and ``[2, 32]``, while the coordinate, the first step's, says ``[5, 32]``). Exceptions for
    other steps, and the other entries', stay exceptions.
    """
    part = ds.isel(step=steps)
    wanted = {int(s) for s in part["step"].values}
    meta = meta_changes(ds)
    tables = {**meta, "shape": {**meta.get("shape", {}), **entry_changes(ds, "shape_changes")}}
    col = {str(t): j for j, t in enumerate(part["tensor"].values.tolist())}
    present = np.asarray(part["present"].values, bool)
    row = {int(s): i for i, s in enumerate(part["step"].values.tolist())}
    rank_of = {int(r): i for i, r in enumerate(part["rank"].values.tolist())}
    new: dict[str, np.ndarray] = {}
    for field, by_tensor in tables.items():
        if field not in part.coords:
            continue
        for tensor, where in by_tensor.items():
            j = col.get(tensor)
            if j is None:
                continue
            at = {(s, r): v for (s, r), v in where.items() if s in wanted}
            held = sorted((s, r) for s in wanted for r, ri in rank_of.items() if present[row[s], ri, j])
            if held and set(held) <= set(at):  # every entry there is an exception: the first one's value
                arr = new.setdefault(field, part[field].values.copy())
                arr[j] = at[held[0]]
    return part.assign_coords({f: ("tensor", a) for f, a in new.items()}) if new else part
