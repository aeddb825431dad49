"""What one run looks like to the aligner: its module tree, its nodes and their tensors, one value each.

:func:`run_tree` reads a canonical dataset once (the coordinates, the module tree of
construct.json and the statistics of one reference step and rank per tensor) into plain
Python objects, so pairing never touches xarray again. The tree is the union over steps and
ranks: runs are aligned once per module tree, not per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import xarray as xr

from precnb.dtypes import canonical_dtype
from precnb.naming import parse_node
from precnb.schema import side_table

__all__ = ["ModuleInfo", "NodeInfo", "RunTree", "TensorInfo", "run_tree"]

ROOT = ""
SCOPES = ("optimizer", "clip_grad")


@dataclass
class TensorInfo:
    """One tensor label of a node, with its reference statistics."""

    label: str
    slot: str  # the label after the node name: "input.0", "output.0", "parameters.weight", "weight"
    role: str
    shape: str
    numel: int
    dtype: str  # canonical (float32, bfloat16, int64, bool, ...)
    stats: tuple[float, float, float, float]  # max, min, mean, norm at the reference entry (NaN where null)
    seq: int

    @cached_property
    def group(self) -> str:
        """``input`` / ``output`` / ``parameters`` / ``kwargs`` / ``grad`` (parameter gradients)."""
        head = self.slot.split(".", 1)[0]
        return head if head in ("input", "output", "parameters", "kwargs") else "grad"

    @property
    def is_float(self) -> bool:
        """True for floating-point (and complex) tensors."""
        return self.dtype.startswith(("float", "bfloat", "complex", "half", "double"))


@dataclass
class NodeInfo:
    """One msprobe node (API call, module call or parameter-gradient record)."""

    name: str
    kind: str  # "api" | "module" | "param_grad"
    api: str  # API name, or module class
    module: str  # module path (for APIs: the innermost module around the call)
    direction: str
    call: int
    parent: str  # parent node from construct.json ("" for roots)
    seq: int  # first position in execution order (large when never recorded)
    tensors: list[TensorInfo] = field(default_factory=list)

    def group(self, name: str) -> list[TensorInfo]:
        """Tensors of one group, in slot order."""
        return [t for t in self.tensors if t.group == name]

    @property
    def outputs(self) -> list[TensorInfo]:
        """Output tensors."""
        return self.group("output")

    @property
    def inputs(self) -> list[TensorInfo]:
        """Input tensors (positional and keyword)."""
        return [t for t in self.tensors if t.group in ("input", "kwargs")]


@dataclass
class ModuleInfo:
    """One module path (a called module, or a container that is never called, like ``blocks``)."""

    path: str
    cls: str | None  # None for a container that has no node of its own
    children: list[str] = field(default_factory=list)  # child paths, in execution order
    forward: list[str] = field(default_factory=list)  # forward call nodes, by call index
    backward: list[str] = field(default_factory=list)  # backward call nodes, by call index
    param_grads: list[str] = field(default_factory=list)  # parameters_grad nodes, in order
    seq: int = 1 << 40  # first execution position of anything inside it
    n_params: int = 0  # parameter tensors in its subtree (fingerprint of size)
    param_numels: tuple[int, ...] = ()  # sorted numels of the parameters in its subtree

    @property
    def virtual(self) -> bool:
        """A container (never called itself)."""
        return self.cls is None

    @property
    def name(self) -> str:
        """The last path segment (``q_proj``; ``0`` for a list item)."""
        return self.path.rsplit(".", 1)[-1] if self.path else ""


@dataclass
class RunTree:
    """The aligner's view of one run."""

    framework: str
    modules: dict[str, ModuleInfo]
    nodes: dict[str, NodeInfo]
    # node -> API child nodes in execution order (the calls made directly inside a module call)
    calls_in: dict[str, list[str]]
    labels: list[str]
    coords: dict[str, np.ndarray]  # the dataset's tensor coordinates (node, module, api, kind, ...)
    parallel: str = ""  # the layout its shards were merged with / its stages stitched with, if any
    glue: dict[str, str] = field(default_factory=dict)  # node -> why it is tensor-parallel glue (merged run)
    lists_renamed: bool = False  # its optimizer list entries carry the other run's labels for their parameters


def _ref_values(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per tensor: the statistics (n, 4), seq and numel at its first recorded (step, rank)."""
    n = ds.sizes["tensor"]
    stats = np.full((n, 4), np.nan)
    seq = np.full(n, 1 << 40, np.int64)
    numel = np.full(n, -1, np.int64)
    if n == 0 or ds.sizes["step"] == 0 or ds.sizes["rank"] == 0:
        return stats, seq, numel
    todo = np.ones(n, bool)
    for si in range(ds.sizes["step"]):  # usually the first step settles every tensor
        one = ds.isel(step=si)
        pres = np.asarray(one["present"].values, bool)  # (rank, tensor)
        if not pres.any():
            continue
        first_rank = np.where(pres.any(axis=0), np.argmax(pres, axis=0), -1)
        take = todo & (first_rank >= 0)
        if not take.any():
            continue
        cols = np.flatnonzero(take)
        rows = first_rank[cols]
        for k, name in enumerate(("max", "min", "mean", "norm")):
            vals = np.asarray(one[name].values, np.float64)
            stats[cols, k] = vals[rows, cols]
        seq[cols] = np.asarray(one["seq"].values)[rows, cols]
        numel[cols] = np.asarray(one["numel"].values)[rows, cols]
        if "null_stats" in one:
            nulls = np.asarray(one["null_stats"].values)[rows, cols]
            for k, bit in enumerate((1, 2, 4, 8)):
                stats[cols[(nulls & bit) != 0], k] = np.nan
        todo &= ~take
        if not todo.any():
            break
    # seq is per (step, rank): only the order within the reference entry is meaningful; keep it
    for coord in ds.coords:  # a data-parallel replica's own value (merged): not the whole batch's, no evidence
        if str(coord).startswith("shard_kind_"):
            stats[np.asarray(ds[coord].values == "dp_local", bool)] = np.nan
    return stats, seq, numel


def run_tree(ds: xr.Dataset) -> RunTree:
    """Read one run (a single-run canonical dataset) into a :class:`RunTree`.

    Parameters
    ----------
    ds : xarray.Dataset

    Returns
    -------
    RunTree
    """
    recorded = np.asarray(ds["present"].any(["step", "rank"]).values, bool)
    if not recorded.all():  # one run of a combined dataset: only what this run recorded
        ds = ds.isel(tensor=np.flatnonzero(recorded))
    labels = [str(t) for t in ds["tensor"].values]
    coords = {name: np.asarray(ds.coords[name].values) for name in
              ("node", "module", "api", "kind", "direction", "role", "parent", "call", "micro_step", "dtype",
               "shape") if name in ds.coords}
    stats, seq, numel = _ref_values(ds)
    construct = _own_construct(side_table(ds, "construct"), {str(n) for n in ds["node"].values})
    nodes: dict[str, NodeInfo] = {}
    node_col, role_col, shape_col, dtype_col = coords["node"], coords["role"], coords["shape"], coords["dtype"]
    for j, lbl in enumerate(labels):
        node = str(node_col[j])
        info = nodes.get(node)
        if info is None:
            p = parse_node(node)
            kind = str(coords["kind"][j])
            module = str(coords["module"][j]) if p.kind == "api" else p.module
            info = NodeInfo(node, p.kind if kind in ("api", "module", "param_grad") else kind, p.api, module,
                            p.direction or str(coords["direction"][j]), p.call, str(coords["parent"][j] or ""),
                            int(seq[j]))
            nodes[node] = info
        slot = lbl[len(node) + 1:] if lbl.startswith(node + ".") else lbl
        info.tensors.append(TensorInfo(lbl, slot, str(role_col[j]), str(shape_col[j]), int(numel[j]),
                                       canonical_dtype(str(dtype_col[j])),
                                       (float(stats[j, 0]), float(stats[j, 1]), float(stats[j, 2]), float(stats[j, 3])),
                                       int(seq[j])))
        info.seq = min(info.seq, int(seq[j]))
    # nodes known only from construct.json (modules are recorded there even when never dumped)
    for child, parent in construct.items():
        for n in (child, parent):
            if not n or n in nodes or n in SCOPES or not isinstance(n, str):
                continue
            p = parse_node(n)
            if p.kind == "module":
                nodes[n] = NodeInfo(n, "module", p.api, p.module, p.direction, p.call, "", 1 << 40)
        if child in nodes and isinstance(parent, str) and not nodes[child].parent:
            nodes[child].parent = parent or ""
    for info in nodes.values():
        info.tensors.sort(key=lambda t: (t.group, _slot_key(t.slot)))
        if not info.parent and info.name in construct:
            par = construct.get(info.name)
            info.parent = par if isinstance(par, str) else ""
    _drop_stale_parents(nodes)
    _infer_parents(nodes)
    modules = _modules(nodes)
    calls_in: dict[str, list[str]] = {}
    for n, info in nodes.items():
        if info.kind == "api":
            calls_in.setdefault(info.parent or ROOT, []).append(n)
    for k in calls_in:
        calls_in[k].sort(key=lambda n: (nodes[n].seq, n))
    framework = str(ds.attrs.get("framework", "") or "")
    if not framework or framework == "unknown":
        framework = "mindspore" if any(n.startswith(("Cell.", "Primitive.", "Mint.")) for n in nodes) else "pytorch"
    parallel = str(ds.attrs.get("merged_layout", "") or ds.attrs.get("pipeline_stitched", "") or "")
    from precnb.analysis.align.fused import fused_parts
    from precnb.analysis.layout.rank_args import glue_labels

    glue: dict[str, str] = {part: f"part of the fused projection {whole} (compared combined with its siblings)"
                            for part, whole in fused_parts(ds).items()}
    for lbl, why in glue_labels(ds).items():
        j = ds.indexes["tensor"].get_loc(lbl)
        glue.setdefault(str(node_col[j]), why)
    return RunTree(framework, modules, nodes, calls_in, labels, coords, parallel, glue,
                   lists_renamed=bool(ds.attrs.get("optimizer_lists_renamed")))


def _own_construct(construct: dict[str, Any], recorded: set[str]) -> dict[str, Any]:
    """The part of a module tree that belongs to this run: its recorded nodes and their ancestors.

    A combined dataset keeps the union of its runs' construct.json tables; another run's nodes
    must not appear in this run's tree.
    """
    if all(k in recorded for k in construct):
        return construct
    keep: dict[str, Any] = {}
    todo = [n for n in recorded if n in construct]
    while todo:
        n = todo.pop()
        if n in keep:
            continue
        keep[n] = construct[n]
        par = construct[n][0] if isinstance(construct[n], list) and construct[n] else construct[n]
        if isinstance(par, str) and par and par in construct and par not in keep:
            todo.append(par)
    return keep


def _drop_stale_parents(nodes: dict[str, NodeInfo]) -> None:
    """API calls whose recorded parent, a backward module, completed before them run outside it: top level.

    msprobe writes a backward module's record when its backward completes, after the calls made inside it; it also
    keeps the last module seen as the parent of the next calls made outside any module, e.g. Megatron's
    next micro-batch's loss and P2P calls, parented to a backward module of the previous micro-batch.
    """
    for info in nodes.values():
        par = nodes.get(info.parent) if info.kind == "api" and info.parent else None
        if par is not None and par.kind == "module" and par.direction == "backward" and par.seq < info.seq < 1 << 40:
            info.parent = ""


def _infer_parents(nodes: dict[str, NodeInfo]) -> None:
    """Module calls construct.json gives no parent: the call of the nearest enclosing module path.

    msprobe writes a module's parent when the module runs inside another hooked module; a module
    node that only appears as someone's parent (or whose parent was not hooked) has none. Its
    enclosing module (the longest proper path prefix that has calls of the same direction) is the
    parent; of its calls, the first one that completes after this node (records are written when
    a call completes), else its first.
    """
    by_path: dict[tuple[str, str], list[NodeInfo]] = {}
    for info in nodes.values():
        if info.kind == "module":
            by_path.setdefault((info.module, info.direction), []).append(info)
    for lst in by_path.values():
        lst.sort(key=lambda i: (i.seq, i.call))
    for info in nodes.values():
        if info.kind != "module" or info.parent or not info.module:
            continue
        path = info.module
        while "." in path:
            path = path.rsplit(".", 1)[0]
            cands = by_path.get((path, info.direction))
            if not cands:
                continue
            later = [c for c in cands if c.seq >= info.seq and c.seq < 1 << 40]
            info.parent = (later[0] if later else cands[0]).name
            break


def _slot_key(slot: str) -> tuple[Any, ...]:
    """Positional slots first, in numeric order (``input.2`` before ``input.10``), then keywords by name."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in slot.split("."))


def _modules(nodes: dict[str, NodeInfo]) -> dict[str, ModuleInfo]:
    mods: dict[str, ModuleInfo] = {ROOT: ModuleInfo(ROOT, None)}

    def ensure(path: str) -> ModuleInfo:
        m = mods.get(path)
        if m is None:
            m = mods[path] = ModuleInfo(path, None)
            parent = path.rsplit(".", 1)[0] if "." in path else ROOT
            ensure(parent).children.append(path)
        return m

    for info in nodes.values():
        if info.kind not in ("module", "param_grad") or not info.module:
            continue
        m = ensure(info.module)
        if info.kind == "module":
            if m.cls is None:
                m.cls = info.api
            (m.forward if info.direction == "forward" else m.backward).append(info.name)
        else:
            m.param_grads.append(info.name)
    for info in nodes.values():  # APIs outside any module record still place their module path
        if info.kind == "api" and info.module and info.module not in SCOPES:
            ensure(info.module)
    # first execution position, bottom-up; parameter fingerprints of each subtree
    for info in nodes.values():
        path = info.module if info.module not in SCOPES else ""
        if path in mods:
            m = mods[path]
            m.seq = min(m.seq, info.seq)
    own: dict[str, list[int]] = {}
    for info in nodes.values():
        if info.kind == "module" and info.direction == "forward" and info.call == 0:
            own[info.module] = [t.numel for t in info.group("parameters") if t.numel > 0]
    for path in sorted(mods, key=lambda p: -p.count(".") if p else 1):  # deepest first; root last
        m = mods[path]
        numels = list(own.get(path, []))
        for c in m.children:
            numels.extend(mods[c].param_numels)
            m.seq = min(m.seq, mods[c].seq)
        m.param_numels = tuple(sorted(numels))
        m.n_params = len(numels)
    for m in mods.values():
        m.children.sort(key=lambda c: (mods[c].seq, c))
        m.forward.sort(key=lambda n: nodes[n].call)
        m.backward.sort(key=lambda n: nodes[n].call)
        m.param_grads.sort(key=lambda n: (nodes[n].call, nodes[n].seq))
    return mods
