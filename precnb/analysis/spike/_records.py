"""A read-only view of one run (a dump or a monitor output) for the cause tests.

Statistics are taken once as NumPy arrays (absent = NaN); parameters are found with their
gradient before the reduce (dump ``parameters_grad`` / monitor ``grad_unreduced``), after it
(the ``all_reduce`` whose input is that gradient / monitor ``grad_reduced``) and the inputs of
their module (forward input, and the gradient of its output in backward).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import xarray as xr

__all__ = ["Param", "View"]

_STATS = ("max", "min", "mean", "norm")
_REDUCE_APIS = ("all_reduce", "reduce_scatter", "all_reduce_coalesced")


@dataclass
class Param:
    """One parameter as a run records it (tensor indices into its :class:`View`)."""

    name: str
    module: str
    pre: int
    post: int | None = None
    inputs: list[int] = field(default_factory=list)
    before: int | None = None  # the parameter before an optimizer update (dump: update input / monitor: origin)
    after: int | None = None
    update_grad: int | None = None


class View:
    """Arrays and coordinates of one run, for the cause tests.

    Each array is taken from the dataset the first time a test asks for it (a plan that needs
    the names only converts no statistics); the tests' shared results live in :attr:`memo`.
    """

    def __init__(self, ds: xr.Dataset, name: str) -> None:
        self.ds = ds
        self.name = name
        self.steps = np.asarray(ds["step"].values, dtype=np.int64)
        self.ranks = [int(r) for r in ds["rank"].values]
        self._params: list[Param] | None = None
        self._outputs: dict[str, int] | None = None
        self._step_pos: dict[int, int] = {}
        for i, t in enumerate(self.steps.tolist()):
            self._step_pos.setdefault(int(t), i)
        self.memo: dict[Any, Any] = {}
        """Results the cause tests share within one diagnosis (e.g. the pre-reduce gradient departures of a step)."""

    # -- arrays, taken on first use -----------------------------------------------------------
    @cached_property
    def present(self) -> np.ndarray:
        """(step, rank, tensor): recorded."""
        return np.asarray(self.ds["present"].values, bool)

    @cached_property
    def stats(self) -> dict[str, np.ndarray]:
        """Max / Min / Mean / Norm as (step, rank, tensor) floats, NaN where not recorded."""
        return {s: np.where(self.present, np.asarray(self.ds[s].values, dtype=float), np.nan) for s in _STATS
                if s in self.ds}

    @cached_property
    def seq(self) -> np.ndarray:
        """(step, rank, tensor): execution order (negative: not recorded)."""
        return np.asarray(self.ds["seq"].values)

    @cached_property
    def labels(self) -> list[str]:
        """Tensor labels."""
        return [str(t) for t in self.ds["tensor"].values]

    @cached_property
    def index(self) -> dict[str, int]:
        """Tensor label → position."""
        return {t: j for j, t in enumerate(self.labels)}

    def _column(self, c: str) -> np.ndarray:
        return np.asarray([str(v) for v in self.ds[c].values])

    @cached_property
    def node(self) -> np.ndarray:
        """Node of each tensor."""
        return self._column("node")

    @cached_property
    def module(self) -> np.ndarray:
        """Module of each tensor ("" when none)."""
        return self._column("module")

    @cached_property
    def api(self) -> np.ndarray:
        """API of each tensor."""
        return self._column("api")

    @cached_property
    def kind(self) -> np.ndarray:
        """Record kind of each tensor (``module``, ``param_grad``, ``monitor``, ...)."""
        return self._column("kind")

    @cached_property
    def role(self) -> np.ndarray:
        """Role of each tensor (``input``, ``output``, ``parameter``)."""
        return self._column("role")

    @cached_property
    def direction(self) -> np.ndarray:
        """Direction of each tensor (``forward`` / ``backward``)."""
        return self._column("direction")

    @cached_property
    def dtype(self) -> np.ndarray:
        """Data type of each tensor."""
        return self._column("dtype")

    @cached_property
    def micro(self) -> np.ndarray:
        """Micro step of each tensor (-1 when not recorded)."""
        return np.asarray(self.ds["micro_step"].values) if "micro_step" in self.ds else np.full(len(self.labels), -1)

    @cached_property
    def monitor(self) -> bool:
        """True for a monitor output (every record of kind ``monitor``)."""
        return bool(len(self.kind)) and bool(np.all(self.kind == "monitor"))

    # -- values -------------------------------------------------------------------------------
    def step_index(self, step: int) -> int | None:
        """Position of *step* (None when not recorded)."""
        return self._step_pos.get(int(step))

    def at(self, j: int, step: int, stat: str = "norm") -> np.ndarray:
        """*stat* of tensor *j* at *step* over ranks (NaN when absent)."""
        i = self.step_index(step)
        if i is None or stat not in self.stats:
            return np.full(len(self.ranks), np.nan)
        return self.stats[stat][i, :, j]

    def series(self, j: int, rank_index: int, stat: str = "norm") -> np.ndarray:
        """*stat* of tensor *j* on one rank over steps."""
        return self.stats[stat][:, rank_index, j]

    def record(self, j: int) -> dict[str, Any]:
        """Node, tensor and module names of tensor *j* (module None when it has none)."""
        return {"node": str(self.node[j]), "tensor": self.labels[j], "module": str(self.module[j]) or None}

    def first_output(self, node: str) -> int | None:
        """The first output tensor of *node* (None when it records none)."""
        if self._outputs is None:
            self._outputs = {}
            for j in np.flatnonzero(self.role == "output"):
                self._outputs.setdefault(str(self.node[j]), int(j))
        return self._outputs.get(node)

    # -- structure ----------------------------------------------------------------------------
    def params(self) -> list[Param]:
        """Parameters with their gradient before / after the reduce and their module's inputs (cached)."""
        if self._params is None:
            self._params = self._monitor_params() if self.monitor else self._dump_params()
        return self._params

    def _monitor_params(self) -> list[Param]:
        out: list[Param] = []
        by = {lab: j for j, lab in enumerate(self.labels)}
        for j in np.flatnonzero(self.api == "grad_unreduced"):
            name = self.labels[j].split("/", 1)[1]
            mod = str(self.module[j])
            p = Param(name, mod, int(j), post=by.get(f"grad_reduced/{name}"))
            p.inputs = [k for k in (by.get(f"actv/{mod}.input"), by.get(f"actv_grad/{mod}.output")) if k is not None]
            p.before, p.after = by.get(f"param_origin/{name}"), by.get(f"param_updated/{name}")
            out.append(p)
        if not out:  # grad_reduced only
            for j in np.flatnonzero(self.api == "grad_reduced"):
                name = self.labels[j].split("/", 1)[1]
                mod = str(self.module[j])
                p = Param(name, mod, int(j), post=int(j))
                p.inputs = [k for k in (by.get(f"actv/{mod}.input"), by.get(f"actv_grad/{mod}.output"))
                            if k is not None]
                p.before, p.after = by.get(f"param_origin/{name}"), by.get(f"param_updated/{name}")
                out.append(p)
        return out

    def _dump_params(self) -> list[Param]:
        out: list[Param] = []
        reduce_in = {self._signature(j): j for j in range(len(self.labels))
                     if self.api[j].rsplit(".", 1)[-1] in _REDUCE_APIS and self.role[j] == "input"}
        first_input: dict[tuple[str, str], int] = {}  # (module, direction) -> its first module-record input
        for k in np.flatnonzero((self.kind == "module") & (self.role == "input")):
            first_input.setdefault((str(self.module[k]), str(self.direction[k])), int(k))
        for j in np.flatnonzero(self.kind == "param_grad"):
            node = str(self.node[j])
            pname = self.labels[j][len(node) + 1:] if self.labels[j].startswith(node + ".") else self.labels[j]
            mod = str(self.module[j])
            p = Param(f"{mod}.{pname}" if mod else pname, mod, int(j))
            p.inputs = [k for k in (first_input.get((mod, "forward")), first_input.get((mod, "backward")))
                        if k is not None]
            p.post = self._reduced(int(j), reduce_in)
            out.append(p)
        self._optimizer_updates(out)
        return out

    def _signature(self, j: int) -> bytes:
        """The norms of tensor *j* over (step, rank) as bytes: two records of one tensor share it exactly."""
        return np.ascontiguousarray(self.stats["norm"][..., j]).tobytes()

    def _reduced(self, grad: int, reduce_in: dict[bytes, int]) -> int | None:
        """The output of the collective whose input is gradient *grad* (its value after the reduce)."""
        k = reduce_in.get(self._signature(grad))
        if k is None:
            return None
        return self.first_output(str(self.node[k]))

    def _optimizer_updates(self, params: list[Param]) -> None:
        """Optimizer ops that update a parameter in place: the parameter before (input 0) and after (output 0).

        The op's first input is the parameter its module's forward record holds at the same step
        (the same tensor, so the same statistics).
        """
        by_key = {(p.module, p.name[len(p.module) + 1:] if p.module else p.name): p for p in params}
        by_sig: dict[bytes, Param] = {}
        for f in np.flatnonzero((self.role == "parameter") & (self.direction == "forward")):
            pname = self.labels[f].rsplit(".parameters.", 1)[-1]
            p = by_key.get((str(self.module[f]), pname))
            if p is not None:
                by_sig.setdefault(self._signature(int(f)), p)
        nodes: dict[str, list[int]] = {}
        for j in np.flatnonzero((self.module == "optimizer") & (self.role == "input")):
            nodes.setdefault(str(self.node[j]), []).append(int(j))
        for node, ins in nodes.items():
            target = by_sig.get(self._signature(ins[0]))
            out = self.first_output(node)
            if target is None or target.before is not None or out is None:
                continue
            target.before, target.after = ins[0], out
            target.update_grad = ins[1] if len(ins) > 1 else None

    def batch_inputs(self) -> list[int]:
        """Tensors that hold the batch: integer forward inputs (token ids, labels); a monitor's first module input."""
        ints: list[int] = [j for j in range(len(self.labels)) if self.role[j] == "input"
                           and self.direction[j] == "forward" and "int" in self.dtype[j].lower() and not self.monitor]
        if self.monitor:
            actv = [j for j in np.flatnonzero(self.api == "actv") if self.labels[j].endswith(".input")]
            if actv:
                seq = self.seq
                first = min(actv, key=lambda j: np.nanmin(np.where(seq[..., j] >= 0, seq[..., j], np.inf)))
                ints = [int(first)] + [int(j) for j in actv if "int" in self.dtype[j].lower() and j != first]
        return ints
