"""Whole-model shapes of tensor-parallel shards read from the run itself, when no reference run names them.

A TP merge needs each split tensor's whole shape: it names the merged record, and it tells a shard that
happens to equal the other ranks' (a bias still zero, an optimizer state at its first step) from a
replicated tensor. A reference run in the same names gives them (:func:`precnb.analysis.layout.merge.merge_shards`);
against another codebase (a Hugging Face model) or another layout there is none. The linear layers' own
calls say it, from what each rank records (*k* = the TP group's size):

* **column-parallel** (input identical on every rank of the group, weight ``[o, i]`` with ``i`` the
  input's last dim, output ``[..., o]`` whose shards differ, or whose weight's do): the weight is split
  along its rows, ``[k·o, i]``, and so are the bias ``[k·o]``, the output ``[..., k·o]`` (and a skipped
  bias ``output.1``), their gradients;
* **row-parallel** (input ``[..., i]`` whose shards differ, output ``[..., o]``): the weight is split along
  its columns, ``[o, k·i]``, the input is ``[..., k·i]``, as is its gradient; the bias is whole;
* **vocabulary-parallel lookup** (an integer input, a weight ``[v, h]`` whose shards differ): ``[k·v, h]``.

A call whose output does not keep its input's leading dims (sequence parallelism gathers or scatters the
sequence inside the layer) says nothing and is left out. Only split tensors are named: every other
tensor keeps the classification the statistics give.

Examples
--------
>>> from precnb.schema import empty_dataset
>>> split_shapes(empty_dataset(), [[0, 1]])
{}
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import xarray as xr

from precnb.dtypes import dtype_kind

__all__ = ["reference_shapes", "shape_table", "split_shapes"]

_STATS = ("max", "min", "mean", "norm")


def _shape(text: Any) -> list[int] | None:
    try:
        v = json.loads(str(text))
    except (TypeError, ValueError):
        return None
    return [int(x) for x in v] if isinstance(v, list) and v and all(isinstance(x, int) for x in v) else None


class _Run:
    """The columns of one run that the rules read: shapes, dtypes, whether a group's shards differ."""

    def __init__(self, ds: xr.Dataset, groups: list[list[int]]) -> None:
        self.ds = ds
        self.idx = {str(t): j for j, t in enumerate(ds["tensor"].values)}
        self.shapes, self.dtypes = ds["shape"].values, ds["dtype"].values
        ranks = [int(r) for r in ds["rank"].values]
        self.groups = [[ranks.index(r) for r in g] for g in groups if all(r in ranks for r in g)]
        self.k = len(groups[0]) if groups else 1
        self.present = ds["present"].values
        self.stats = [ds[s].values for s in _STATS]

    def shape(self, label: str) -> list[int] | None:
        j = self.idx.get(label)
        return _shape(self.shapes[j]) if j is not None else None

    def is_float(self, label: str) -> bool:
        j = self.idx.get(label)
        return j is not None and dtype_kind(str(self.dtypes[j])) == "float"

    def differ(self, label: str) -> bool:
        """Whether the shards of *label* differ somewhere (a step and group where every member recorded it)."""
        j = self.idx.get(label)
        if j is None or not self.groups:
            return False
        pres = self.present[:, :, j]
        for g in self.groups:
            allp = pres[:, g].all(axis=1)
            if not allp.any():
                continue
            for arr in self.stats:
                v = np.nan_to_num(arr[:, g, j][allp], nan=np.inf)
                if (v != v[:, :1]).any():
                    return True
        return False


def _call_rules(run: _Run, node: str, out: dict[str, list[int]]) -> None:
    """The whole shapes one module call (*node*, ``<path>.<Class>.forward.<n>``) shows, into *out*."""
    w, y = run.shape(f"{node}.parameters.weight"), run.shape(f"{node}.output.0")
    if not w or len(w) != 2 or not y:
        return
    o, i = w
    x = run.shape(f"{node}.input.0")
    head, call = node.rsplit(".forward.", 1)
    grads, back, k = f"{head}.parameters_grad.{call}", f"{head}.backward.{call}", run.k
    if not run.is_float(f"{node}.input.0"):
        if y[-1] == i and run.differ(f"{node}.parameters.weight"):  # an embedding lookup split by vocabulary
            for lbl in (f"{node}.parameters.weight", f"{grads}.weight"):
                out[lbl] = [k * o, i]
        return
    if not x or x[-1] != i or y[-1] != o or x[:-1] != y[:-1]:
        return  # not a linear layer's call, or one that gathers / scatters the sequence inside
    if not run.differ(f"{node}.input.0"):
        if run.differ(f"{node}.parameters.weight") or run.differ(f"{node}.output.0"):  # column-parallel
            whole = [*y[:-1], k * o]
            for lbl in (f"{node}.parameters.weight", f"{grads}.weight"):
                out[lbl] = [k * o, i]
            for lbl in (f"{node}.parameters.bias", f"{grads}.bias", f"{node}.output.1"):
                out[lbl] = [k * o]
            for lbl in (f"{node}.output.0", f"{back}.input.0"):
                out[lbl] = whole
        return
    whole_in = [*x[:-1], k * i]  # row-parallel
    for lbl in (f"{node}.parameters.weight", f"{grads}.weight"):
        out[lbl] = [o, k * i]
    for lbl in (f"{node}.input.0", f"{back}.output.0"):
        out[lbl] = whole_in


def shape_table(ds: xr.Dataset) -> dict[Any, Any]:
    """Tensor label → its ``shape`` coordinate (``ds["shape"].to_series().to_dict()``, without pandas)."""
    return dict(zip(ds["tensor"].values.tolist(), ds["shape"].values.tolist(), strict=True))


def split_shapes(ds: xr.Dataset, groups: list[list[int]], *, known: Any = ()) -> dict[str, str]:
    """Label → whole-model shape (JSON text) of the tensors the TP *groups* split, read from the linear layers.

    Only labels whose local shape has the whole shape's rank and 1/k of its elements are kept; calls
    whose weight is in *known* (a reference run names them) are not read.
    """
    if not ds.sizes.get("tensor") or not groups or len(groups[0]) < 2:
        return {}
    run = _Run(ds, groups)
    found: dict[str, list[int]] = {}
    suffix = ".parameters.weight"
    for lbl in run.idx:
        if lbl.endswith(suffix) and ".forward." in lbl and lbl not in known:
            _call_rules(run, lbl[: -len(suffix)], found)
    out: dict[str, str] = {}
    for lbl, whole in found.items():
        local = run.shape(lbl)
        if local and len(local) == len(whole) and int(np.prod(local)) * run.k == int(np.prod(whole)):
            out[lbl] = json.dumps(whole)
    return out


def reference_shapes(ds: xr.Dataset, groups: list[list[int]], reference: xr.Dataset | None) -> xr.Dataset | None:
    """*reference*, or a shapes-only stand-in, completed with :func:`split_shapes` for the labels it lacks.

    A reference run that names every split tensor comes back as it is; one in other names (another codebase)
    or none at all is completed by what the run's linear layers show.
    """
    ref = shape_table(reference) if reference is not None else {}
    extra = {lbl: s for lbl, s in split_shapes(ds, groups, known=ref).items() if lbl not in ref}
    if not extra:
        return reference
    labels = [*ref, *extra]
    shapes = [*ref.values(), *extra.values()]
    return xr.Dataset(coords={"tensor": np.asarray(labels, dtype=object),
                              "shape": ("tensor", np.asarray(shapes, dtype=object))})
