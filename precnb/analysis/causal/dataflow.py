"""Data flow of one (step, rank) rebuilt from statistics: which captured op produced which input.

msprobe records no edges. A tensor an op reads is the tensor an earlier op wrote when both
records carry the same dtype, shape and statistics (Max, Min, Mean, Norm are exact copies of
the same bytes), so the producer of an input is the latest earlier forward output with the same
signature. An input with no such producer came from data, a parameter, a buffer, or an op
msprobe did not capture; an output no later input matches went into an op that was not captured
(or nowhere). Scalars and empty tensors are too ambiguous to match and are left out.

Examples
--------
>>> from precnb.analysis.causal.dataflow import module_of_node
>>> module_of_node("Module.blocks.1.attn.Attention.forward.0")
'blocks.1.attn'
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import xarray as xr

from precnb.naming import parse_node
from precnb.schema import META_FIELDS, dtype_changes, entry_meta, meta_changes, read_side_table

__all__ = ["StepFlow", "module_of_node", "scalar_only_nodes", "to_backward", "to_forward", "user_frame"]

_INTERNAL_FRAMES = ("/site-packages/torch/", "/site-packages/msprobe/", "/torch/nn/modules/", "/msprobe/")


def module_of_node(node: str) -> str:
    """Module path of a ``Module.*`` / ``Cell.*`` node name (``""`` for others)."""
    p = parse_node(node)
    return p.module if p.kind == "module" else ""


def to_forward(node: str) -> str:
    """The forward record of a backward node name (API ``.backward`` or module ``.backward.N``)."""
    if node.endswith(".backward"):
        return node[: -len(".backward")] + ".forward"
    return node.replace(".backward.", ".forward.")


def to_backward(node: str) -> str:
    """The backward record of a forward node name."""
    if node.endswith(".forward"):
        return node[: -len(".forward")] + ".backward"
    return node.replace(".forward.", ".backward.")


def scalar_only_nodes(ds: xr.Dataset) -> set[str]:
    """Forward API nodes that read no tensor (``torch.normal(0, 1, size)``), where the run records inputs.

    A node with outputs and no input record is scalar-only only when the run records the inputs
    of its other API calls (most of them): a dump of outputs alone (msprobe ``data_mode:
    ["output"]``) says nothing about inputs, and then none is.
    """
    from precnb.naming import is_communication

    nodes, roles, kinds = ds["node"].values, ds["role"].values, ds["kind"].values
    dirs = ds["direction"].values
    with_in: set[str] = set()
    with_out: set[str] = set()
    for n, r, k, d in zip(nodes.tolist(), roles.tolist(), kinds.tolist(), dirs.tolist(), strict=True):
        if k != "api" or d != "forward" or is_communication(n):
            continue
        (with_in if r == "input" else with_out if r == "output" else set()).add(n)
    if not with_out or 2 * len(with_in & with_out) < len(with_out):
        return set()
    return with_out - with_in


def user_frame(frames: list[str]) -> str | None:
    """The innermost stack frame in user code (not torch or msprobe internals)."""
    for fr in frames:
        text = str(fr)
        if not any(s in text for s in _INTERNAL_FRAMES):
            return " ".join(text.split())
    return None


@dataclass
class StepFlow:
    """Statistics, order and signatures of every tensor recorded at one (step, rank)."""

    ds: xr.Dataset
    step: int
    rank: int

    @cached_property
    def _e(self) -> xr.Dataset:
        return self.ds.sel(step=self.step, rank=self.rank)

    @cached_property
    def labels(self) -> list[str]:
        """Tensor labels."""
        return [str(x) for x in self.ds["tensor"].values]

    @cached_property
    def index(self) -> dict[str, int]:
        """Label → position."""
        return {t: j for j, t in enumerate(self.labels)}

    @cached_property
    def present(self) -> np.ndarray:
        """Recorded here."""
        return np.asarray(self._e["present"].values, bool)

    @cached_property
    def seq(self) -> np.ndarray:
        """Execution order."""
        return np.asarray(self._e["seq"].values, np.int64)

    @cached_property
    def stats(self) -> np.ndarray:
        """(tensor, 4) max, min, mean, norm."""
        return np.stack([np.asarray(self._e[s].values, float) for s in ("max", "min", "mean", "norm")], axis=-1)

    @cached_property
    def numel(self) -> np.ndarray:
        """Element counts (-1 unknown)."""
        if "numel" in self._e:
            return np.asarray(self._e["numel"].values, np.int64)
        return np.full(len(self.labels), -1, np.int64)

    def coord(self, name: str) -> np.ndarray:
        """A per-tensor coordinate as a str array, as this (step, rank) recorded it (:func:`entry_meta`)."""
        out = np.asarray([str(x) for x in self.ds[name].values])
        if name in META_FIELDS or name == "dtype":
            attr = "dtype_changes" if name == "dtype" else "meta_changes"
            if self.ds.attrs.get(attr):
                labels = [t for t in (meta_changes(self.ds).get(name, {}) if name != "dtype"
                                      else dtype_changes(self.ds)) if t in self.index]
                for t in labels:
                    out[self.index[t]] = entry_meta(self.ds, t, self.step, self.rank)[name]
        return out

    @cached_property
    def nodes(self) -> np.ndarray:
        """Node of each tensor."""
        return self.coord("node")

    @cached_property
    def roles(self) -> np.ndarray:
        """Role of each tensor."""
        return self.coord("role")

    @cached_property
    def kinds(self) -> np.ndarray:
        """Kind of each tensor."""
        return self.coord("kind")

    @cached_property
    def directions(self) -> np.ndarray:
        """Direction of each tensor."""
        return self.coord("direction")

    @cached_property
    def shapes(self) -> np.ndarray:
        """Shape text of each tensor."""
        return self.coord("shape")

    @cached_property
    def dtypes(self) -> np.ndarray:
        """Dtype of each tensor."""
        return self.coord("dtype")

    @cached_property
    def construct(self) -> dict[str, Any]:
        """construct.json (node → parent)."""
        return read_side_table(self.ds, "construct")

    @cached_property
    def stacks(self) -> dict[str, Any]:
        """stack.json (node → frames)."""
        return read_side_table(self.ds, "stacks")

    @cached_property
    def matchable(self) -> np.ndarray:
        """Tensors recorded here whose signature can identify them (finite-or-not, > 1 element)."""
        recorded = self.present & (self.numel != 0)
        scalar = (self.numel == 1) | (self.shapes == "[]")
        return recorded & ~scalar & ~np.isnan(self.stats).all(axis=1)

    @cached_property
    def _sig(self) -> list[bytes | None]:
        out: list[bytes | None] = []
        for j in range(len(self.labels)):
            if not self.matchable[j]:
                out.append(None)
                continue
            out.append(b"|".join([self.dtypes[j].encode(), self.shapes[j].encode(), self.stats[j].tobytes()]))
        return out

    def finite(self, j: int) -> bool:
        """All four statistics of tensor *j* are finite (null statistics count as finite)."""
        v = self.stats[j]
        return bool(np.all(np.isfinite(v) | np.isnan(v) & (self._null(j))))

    def _null(self, j: int) -> np.ndarray:
        null = int(self._e["null_stats"].values[j]) if "null_stats" in self._e else 0
        return np.array([bool(null & b) for b in (1, 2, 4, 8)])

    def forward_api(self, role: str) -> np.ndarray:
        """Mask of recorded forward API tensors of *role*."""
        return (self.present & (self.kinds == "api") & (self.directions == "forward") & (self.roles == role))

    def _by_sig(self, role: str) -> dict[bytes, tuple[np.ndarray, np.ndarray]]:
        """Forward API tensors of *role* grouped by signature: (seqs sorted, positions)."""
        groups: dict[bytes, list[tuple[int, int]]] = {}
        for k in np.flatnonzero(self.forward_api(role)):
            sig = self._sig[int(k)]
            if sig is not None:
                groups.setdefault(sig, []).append((int(self.seq[k]), int(k)))
        out = {}
        for sig, items in groups.items():
            items.sort()
            out[sig] = (np.asarray([a for a, _ in items]), np.asarray([b for _, b in items]))
        return out

    @cached_property
    def _outputs_by_sig(self) -> dict[bytes, tuple[np.ndarray, np.ndarray]]:
        return self._by_sig("output")

    @cached_property
    def _inputs_by_sig(self) -> dict[bytes, tuple[np.ndarray, np.ndarray]]:
        return self._by_sig("input")

    def producer(self, j: int) -> int | None:
        """The latest earlier forward API output with the signature of tensor *j* (None: not captured)."""
        sig = self._sig[j]
        if sig is None or sig not in self._outputs_by_sig:
            return None
        seqs, pos = self._outputs_by_sig[sig]
        i = int(np.searchsorted(seqs, self.seq[j], side="left"))
        return int(pos[i - 1]) if i > 0 else None

    @cached_property
    def _param_sigs(self) -> set[bytes]:
        par = np.flatnonzero(self.present & (self.roles == "parameter"))
        return {sig for k in par if (sig := self._sig[int(k)]) is not None}

    @cached_property
    def _first_read(self) -> dict[bytes, int]:
        """Signature → smallest seq at which any input (API or module) carries it."""
        out: dict[bytes, int] = {}
        for k in np.flatnonzero(self.present & (self.roles == "input")):
            sig = self._sig[int(k)]
            if sig is not None:
                out[sig] = min(out.get(sig, 1 << 62), int(self.seq[k]))
        return out

    def is_new_input(self, j: int) -> bool:
        """Input *j* came from outside the captured ops: no producer, not a parameter, not read before."""
        sig = self._sig[j]
        if sig is None or sig in self._param_sigs or self.producer(j) is not None:
            return False
        return self._first_read.get(sig, 1 << 62) >= int(self.seq[j])

    def consumers(self, j: int) -> list[int]:
        """Later forward API inputs with the signature of tensor *j*."""
        sig = self._sig[j]
        if sig is None or sig not in self._inputs_by_sig:
            return []
        seqs, pos = self._inputs_by_sig[sig]
        i = int(np.searchsorted(seqs, self.seq[j], side="right"))
        return [int(k) for k in pos[i:]]

    def grad_of_input(self, k: int) -> int | None:
        """The recorded gradient w.r.t. forward input *k*, matched by shape.

        It is a backward output of its node, or of a module that received the same tensor:
        msprobe lists only the gradients that exist, so positions do not line up with the
        forward inputs.
        """
        node = str(self.nodes[k])
        sig = self._sig[k]
        for owner in [node, *self.ancestors(node)]:
            if owner != node and not any(self._sig[i] == sig for i in self.tensors_of(owner, "input")):
                continue
            outs = [o for o in self.tensors_of(to_backward(owner), "output") if self.shapes[o] == self.shapes[k]]
            if outs:
                return min(outs, key=lambda o: self.seq[o])
            if owner != node:
                break
        return None

    def ancestors(self, node: str) -> list[str]:
        """Module nodes enclosing *node*, innermost first (from construct.json)."""
        chain: list[str] = []
        cur, seen = node, {node}
        while True:
            parent = self.construct.get(cur)
            if isinstance(parent, list):
                parent = parent[0] if parent else None
            if not parent or parent in seen:
                return chain
            chain.append(str(parent))
            seen.add(parent)
            cur = parent

    def common_module(self, nodes: list[str]) -> str | None:
        """The innermost module node enclosing every node of *nodes*."""
        chains = [self.ancestors(n) for n in nodes]
        if not chains or not all(chains):
            return None
        shared = set(chains[0]).intersection(*chains[1:])
        return next((m for m in chains[0] if m in shared), None)

    def tensors_of(self, node: str, role: str | None = None) -> list[int]:
        """Recorded tensors of *node* (of *role*), in label order."""
        mask = self.present & (self.nodes == node)
        if role is not None:
            mask &= self.roles == role
        return [int(k) for k in np.flatnonzero(mask)]

    def frame(self, node: str) -> str | None:
        """The user-code stack frame of *node*."""
        frames = self.stacks.get(node) or []
        return user_frame(list(frames)) if isinstance(frames, list) else None

    def describe(self, j: int) -> dict[str, Any]:
        """JSON-ready description of tensor *j* at this step and rank."""
        v = self.stats[j]
        return {"tensor": self.labels[j], "node": str(self.nodes[j]), "shape": self.shapes[j],
                "dtype": self.dtypes[j], "finite": self.finite(j),
                "max": float(v[0]), "min": float(v[1]), "mean": float(v[2]), "norm": float(v[3])}
