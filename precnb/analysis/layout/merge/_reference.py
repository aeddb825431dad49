"""What a reference run's shapes (the same names, unsharded) say of a shard: its split dimension, a partial sum.

Used by :func:`precnb.analysis.layout.merge.classify.classify_shards`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import xarray as xr

from precnb.dtypes import is_index
from precnb.naming import is_communication


class _Reference:
    """What a reference run's shapes say of each tensor: a split dimension, a partial sum, replicas that differ."""

    def __init__(self, n_t: int) -> None:
        self.by_shape = np.zeros(n_t, bool)  # full shape, copies differ, reads no shard: replicas that differ
        self.shard_dim = np.zeros(n_t, np.int64)
        self.reason = np.full(n_t, "", dtype=object)
        self.same_shard: dict[int, int] = {}  # tensor -> split dim: identical on every rank, yet split in the ref
        self.local_index = np.zeros(n_t, bool)  # integer tensor identical on every rank, split in the ref: local ids

    def read(self, ds: xr.Dataset, groups: list[list[int]], ref_shape: dict[Any, Any], *, skip: np.ndarray,
             replicated: np.ndarray, partial: np.ndarray) -> None:
        """Compare each tensor's shape with the reference's (*replicated* and *partial* updated in place)."""
        from precnb.analysis.causal.dataflow import scalar_only_nodes

        scalar_only = scalar_only_nodes(ds)
        local = ds["shape"].values
        dtypes = ds["dtype"].values
        k = len(groups[0]) if groups else 1
        for j, lbl in enumerate(ds["tensor"].values):
            full = ref_shape.get(lbl)
            if not full or not local[j] or skip[j]:
                continue
            a, b = _shape(local[j]), _shape(full)
            if a is None or b is None or len(a) != len(b):
                continue
            split = _split_dim(a, b, k)
            if replicated[j]:
                if split is None:
                    if a == b and is_index(dtypes[j]) and _reads_a_shard(ds, j, ref_shape, scalar_only):
                        # counts over each rank's own part that happen to agree (max and min are all msprobe
                        # records of an integer tensor): an addend of the whole count, not a replica
                        replicated[j] = False
                        partial[j] = True
                        self.reason[j] = ("integer counts over each rank's part (equal max and min prove no "
                                          "replica): an addend of the whole, its op reads a shard")
                    continue
                replicated[j] = False  # equal shards (all zeros at first) of a split tensor: sharded
                if is_index(dtypes[j]):  # positions each rank numbers from 0 (its own tokens under sequence
                    self.local_index[j] = True  # parallelism, an MoE router's rows): no whole-model value
                    continue
                self.same_shard[j] = split
            if a == b and _reads_a_shard(ds, j, ref_shape, scalar_only):
                partial[j] = True
                self.reason[j] = "same shape as the reference but shards differ, and its op reads a shard"
            elif a == b:  # no sign of an addend: the copies of a whole tensor disagree (no value is invented)
                self.by_shape[j] = True
            elif split is not None:
                self.shard_dim[j] = split

    def sharded_reasons(self, kinds: np.ndarray, reasons: np.ndarray, k: int) -> None:
        """The reason of a sharded tensor whose split the reference shows."""
        for j in np.flatnonzero(kinds == "sharded").tolist():
            if self.shard_dim[j]:
                reasons[j] = f"shards differ; split along dim {self.shard_dim[j]} (reference shape)"
            if j in self.same_shard:
                reasons[j] = (f"identical on every rank of the group, although the reference is {k}x larger "
                              f"along dim {self.same_shard[j]}: the ranks hold the same shard (a rank loaded another "
                              "rank's shard, or the shards are still equal, e.g. zeros); merged as a split tensor")


def _split_dim(a: list[int], b: list[int], k: int) -> int | None:
    """The negative dim along which shape *a* is one of *k* equal shards of shape *b*, else None."""
    diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    if len(diff) == 1 and a[diff[0]] * k == b[diff[0]]:
        return diff[0] - len(a)
    return None


def _reads_a_shard(ds: xr.Dataset, j: int, ref_shape: dict[Any, Any], scalar_only: set[str]) -> bool:
    """Tensor *j* may be an addend: an API op's output one of whose inputs is a shard (not the reference's shape).

    An output whose op's inputs were not recorded (a dump of outputs alone) may be one too; an op
    that reads no tensor (*scalar_only*) is not.
    """
    roles, kinds, nodes = ds["role"].values, ds["kind"].values, ds["node"].values
    backward = kinds[j] == "module" and ".backward." in str(nodes[j])
    if kinds[j] == "param_grad" or backward:  # a module's backward records and parameter gradients are addends
        # when its forward call returns a shard of the whole output (sequence parallelism: each rank's part of the
        # sequence, a replicated norm weight's gradient summed over it); a row-parallel module whose output is
        # all-reduced returns the whole tensor: its differing copies are no partial sums
        fwd = str(nodes[j]).replace(".parameters_grad.", ".forward.").replace(".backward.", ".forward.")
        cols = np.flatnonzero((nodes == fwd) & (roles == "output"))
        labels, shapes = ds["tensor"].values, ds["shape"].values
        return any(ref_shape.get(labels[c]) and shapes[c] and shapes[c] != ref_shape.get(labels[c]) for c in cols)
    if roles[j] != "output" or kinds[j] != "api" or is_communication(str(nodes[j])):
        return False
    cols = np.flatnonzero((nodes == nodes[j]) & (roles == "input"))
    if not len(cols):
        return str(nodes[j]) not in scalar_only
    labels, shapes = ds["tensor"].values, ds["shape"].values
    return any(ref_shape.get(labels[c]) and shapes[c] and shapes[c] != ref_shape.get(labels[c]) for c in cols)


def _shape(text: Any) -> list[int] | None:
    got = _parsed_shape(str(text))
    return list(got) if got is not None else None


@lru_cache(maxsize=4096)
def _parsed_shape(text: str) -> tuple[int, ...] | None:
    try:
        import json

        v = json.loads(text)
        return tuple(int(x) for x in v) if isinstance(v, list) else None
    except (ValueError, TypeError):
        return None
