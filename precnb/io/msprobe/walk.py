"""The walk of msprobe node records: tensor leaves, their labels and the per-node coordinates.

The walk names tensors as msprobe's compare does (``{node}.input.0``, ``{node}.output.0.1``,
``{node}.parameters.weight``, ``{node}.{param}`` for ``parameters_grad`` records); a leaf is an
object whose ``type`` is a string other than a non-tensor type and which has ``dtype`` and
``shape``. :class:`Walk` collects the leaves of many records (their values are read by
:class:`~precnb.io.msprobe.values.Columns`); :func:`node_columns` turns the nodes that had leaves
into per-tensor coordinates (node, module, api, kind, direction, parent, call, micro step) once
per file, with the node names split by :func:`name_parts` (:class:`NodeParts`, batch by batch).

Examples
--------
>>> w = Walk()
>>> leaf = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]}
>>> w.node("Module.fc.Linear.forward.0", {"input_args": [leaf, {"type": "int", "value": 1}],
...                                        "output": [[leaf, None]], "parameters": {"weight": leaf}})
>>> list(zip(w.labels, w.roles))  # doctest: +NORMALIZE_WHITESPACE
[('Module.fc.Linear.forward.0.input.0', 'input'), ('Module.fc.Linear.forward.0.parameters.weight', 'parameter'),
 ('Module.fc.Linear.forward.0.output.0.0', 'output')]
>>> name_parts("Functional.linear.3.forward"), name_parts("Module.fc.Linear.backward.2")
(('api', 'Functional.linear', '', 'forward', 3), ('module', 'Linear', 'fc', 'backward', 2))
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from precnb.io.msprobe.values import MAX_COUNTER
from precnb.naming import parse_node

__all__ = ["MAX_DEPTH", "NODE_COLUMNS", "NodeParts", "TooDeepError", "Walk", "leaves_of", "name_parts", "node_columns",
           "node_kind"]

#: values nested deeper than this below a node record make the file unreadable
MAX_DEPTH = 64
_NON_TENSOR_TYPES = frozenset({"slice", "ellipsis", "torch.Size", "torch.dtype", "torch.device", "mindspore.dtype"})
#: the record keys msprobe has written tensors under, by release: key -> (label part, role, phase). The
#: sections of a record are read in phase order (in file order within a phase): 0 the inputs and parameters
#: (parameters are inputs of the forward: they come before the outputs in execution order), 1 the outputs,
#: 2 any other key, which keeps its own name (``{node}.{key}.0``) and no role. ``grad_input`` /
#: ``grad_output`` are the backward sections of 1.0.x (the hook's names: gradients w.r.t. the forward's inputs /
#: outputs), which later releases call ``output`` / ``input``; MindSpore cell dumps write ``input_args`` on
#: backward records and ``input`` on forward ones.
SECTIONS: dict[str, tuple[str, str, int]] = {
    "input_args": (".input", "input", 0), "input_kwargs": (".input", "input", 0), "input": (".input", "input", 0),
    "grad_output": (".input", "input", 0), "parameters": (".parameters", "parameter", 0),
    "output": (".output", "output", 1), "grad_input": (".output", "output", 1),
    "parameters_grad": (".parameters_grad", "grad", 2),
}
_ORDER = tuple((key, section, role) for key, (section, role, _) in sorted(SECTIONS.items(), key=lambda kv: kv[1][2]))
_TENSOR_KEYS = ("dtype", "shape", "Max", "Min", "Mean", "Norm", "md5", "data_name")
_ABSENT = object()
_INDEX = tuple(f".{i}" for i in range(256))  # ".0", ".1", ...: list positions in labels
#: the per-tensor coordinates :func:`node_columns` returns, in this order
NODE_COLUMNS = ("node", "module", "api", "kind", "direction", "parent", "call", "micro_step")


class TooDeepError(Exception):
    """Values nested more than :data:`MAX_DEPTH` levels below a node record (at :attr:`where`)."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


def name_parts(node: str) -> tuple[str, str, str, str, int]:
    """(kind, api, module, direction, call) of a node name: :func:`precnb.naming.parse_node` without the node.

    The common spellings, ``{api}.{call}.{forward|backward}``,
    ``Module|Cell.{path}.{Class}.{forward|backward}.{call}`` and
    ``Module|Cell.{path}.{Class}.parameters_grad[.{call}]`` with ASCII names and counters of
    fewer than 19 digits, are split with string methods (what the regular expressions of
    :mod:`precnb.naming` match there: ``tests/test_parse_reference.py`` compares both); anything else
    goes through ``parse_node``, with call counters beyond 2**62 (or 4300 digits) read as -1.

    Examples
    --------
    >>> name_parts("Module.fc.Linear.parameters_grad")
    ('param_grad', 'Linear', 'fc', 'backward', -1)
    """
    if "parameters_grad" in node:
        if node.isascii() and "\n" not in node:  # Module|Cell.{path}.{Class}.parameters_grad[.{call}]
            head, sep, last = node.rpartition(".")
            number = -1
            if last != "parameters_grad" and last.isdigit() and len(last) < 19 and head.endswith(".parameters_grad"):
                head, number = head[:-16], int(last)
            elif last != "parameters_grad":
                head = ""
            pre, sep, body = head.partition(".")
            if sep and body and (pre == "Module" or pre == "Cell"):
                path, _, cls = body.rpartition(".")
                return ("param_grad", cls, path, "backward", number)
    elif node.isascii() and "\n" not in node:
        head, sep, last = node.rpartition(".")
        if last == "forward" or last == "backward":
            api, sep, call = head.rpartition(".")
            if sep and api and call.isdigit() and len(call) < 19:
                return ("api", api, "", last, int(call))
        elif sep and last.isdigit() and len(last) < 19:
            body, sep, direction = head.rpartition(".")
            if sep and (direction == "forward" or direction == "backward"):
                pre, sep, body = body.partition(".")
                if sep and body and (pre == "Module" or pre == "Cell"):
                    path, _, cls = body.rpartition(".")
                    return ("module", cls, path, direction, int(last))
    try:
        nn = parse_node(node)
    except ValueError:  # a counter of more than 4300 digits
        return ("api", node, "", "", -1)
    return (nn.kind, nn.api, nn.module, nn.direction, nn.call if -1 <= nn.call <= MAX_COUNTER else -1)


def node_kind(node: str) -> str:
    """``"api"``, ``"module"`` or ``"param_grad"`` (:func:`name_parts`' first part).

    Examples
    --------
    >>> node_kind("Module.fc.Linear.parameters_grad"), node_kind("Tensor.add.0.forward")
    ('param_grad', 'api')
    """
    return name_parts(node)[0]


def _module_of(parent: str) -> str:
    """:func:`precnb.naming.module_path_of` with :func:`name_parts`' string methods ("" when unreadable)."""
    if not parent:
        return ""
    kind, _, module, _, _ = name_parts(parent)
    if kind == "module" or kind == "param_grad":
        return module
    return parent if parent in ("optimizer", "clip_grad") else ""


class Walk:
    """The tensor leaves of node records, in file order: leaf objects, labels, roles; and what could not be read.

    Every key of a record whose value holds tensor leaves is a section (:data:`SECTIONS` names and
    orders the known ones; any other key keeps its own name and gets no role). Scalars beside the
    sections (``is_recompute``, ``is_nan``) are record flags, not data. What looks like data but
    cannot be read — a section that is not a list or an object, an object with tensor fields but no
    ``type``/``dtype``/``shape`` — goes to :attr:`unread` as ``(record, where, why)``; the tensors of
    unknown sections of forward/backward records are counted by key in :attr:`unknown`.
    """

    __slots__ = ("_rec", "labels", "leaves", "roles", "unknown", "unread")

    def __init__(self) -> None:
        self.leaves: list[dict[str, Any]] = []
        self.labels: list[str] = []
        self.roles: list[str] = []
        self.unread: list[tuple[str, str, str]] = []
        self.unknown: dict[str, int] = {}
        self._rec = ""

    def node(self, node: str, record: dict[str, Any], kind: str | None = None) -> None:  # noqa: C901
        """Add the leaves of one record (*kind* as :func:`node_kind` gives it; found when None)."""
        self._rec = node
        if "parameters_grad" in node and (kind or node_kind(node)) == "param_grad":
            for pname, val in record.items():
                leaf = val[0] if val.__class__ is list and len(val) == 1 else val
                if leaf.__class__ is dict or leaf.__class__ is list:
                    self.value(leaf, f"{node}.{pname}", "grad", 1)
                elif leaf is not None:
                    self.unread.append((node, str(pname), f"a JSON {_json_kind(leaf)}, not a tensor"))
            return
        leaves, labels, roles = self.leaves, self.labels, self.roles
        found, n_keys = 0, len(record)
        get = record.get
        for key, section, role in _ORDER:  # the known sections, in reading order (a miss costs one lookup)
            if found == n_keys:
                break  # every key of the record read (most records: the later lookups are not made)
            v = get(key, _ABSENT)
            if v is _ABSENT:
                continue
            found += 1
            # the usual sections, a list or a dict of leaves and scalars, read in line (the hot loop of a
            # load); any other item goes through children(), which is what value() would do with it
            if v.__class__ is list:
                if not v:
                    continue
                prefix = node + section
                for k, x in enumerate(v):
                    if x.__class__ is dict:
                        t = x.get("type")
                        if t.__class__ is str and "dtype" in x and "shape" in x and t not in _NON_TENSOR_TYPES:
                            leaves.append(x)
                            labels.append(prefix + _INDEX[k] if k < 256 else f"{prefix}.{k}")
                            roles.append(role)
                            continue
                        if len(x) == 2 and "value" in x and x["value"].__class__ not in (dict, list) \
                                and t.__class__ is not dict and t.__class__ is not list:
                            continue  # a scalar argument: nothing below it
                    elif x.__class__ is not list:
                        continue  # None, a number, a string: no tensor
                    self.children(((k, x),), prefix, role, 1)
            elif v.__class__ is dict:
                if not v:
                    continue  # an empty section (most input_kwargs): no tensor, nothing to name
                prefix = node + section
                t = v.get("type")
                if t.__class__ is str and "dtype" in v and "shape" in v and t not in _NON_TENSOR_TYPES:
                    leaves.append(v)  # the section is itself a tensor
                    labels.append(prefix)
                    roles.append(role)
                    continue
                if (t is not None or "shape" in v) and _tensor_like(v, t):
                    self._cannot(prefix, v)
                    continue
                dot = prefix + "."
                for k, x in v.items():
                    if x.__class__ is dict:
                        t = x.get("type")
                        if t.__class__ is str and "dtype" in x and "shape" in x and t not in _NON_TENSOR_TYPES:
                            leaves.append(x)
                            labels.append(dot + k)
                            roles.append(role)
                            continue
                        if len(x) == 2 and "value" in x and x["value"].__class__ not in (dict, list) \
                                and t.__class__ is not dict and t.__class__ is not list:
                            continue
                    elif x.__class__ is not list:
                        continue
                    self.children(((k, x),), prefix, role, 1)
            elif v is not None:
                self.unread.append((node, key, f"a JSON {_json_kind(v)}, not a list or object of tensors"))
        if found != n_keys:
            self._other_keys(node, record, found)

    def _other_keys(self, node: str, record: dict[str, Any], found: int) -> None:
        """The keys of a record that :data:`SECTIONS` does not name: sections of their own name, or record flags."""
        if not found and (_is_leaf(record) or _tensor_like(record, record.get("type"))):
            self.value(record, node, "", 0)  # the record is itself a tensor (debug.json)
            return
        leaves = self.leaves
        for key, v in record.items():
            if key in SECTIONS or not (v.__class__ is dict or v.__class__ is list) or not v:
                continue  # a known section, or a scalar beside the sections: a record flag (is_recompute)
            n0 = len(leaves)
            self.value(v, f"{node}.{key}", "", 1)
            if len(leaves) > n0 and (".forward" in node or ".backward" in node):
                self.unknown[key] = self.unknown.get(key, 0) + len(leaves) - n0

    def value(self, v: Any, prefix: str, role: str, depth: int) -> None:
        """The reference walk of one value at *depth* (a leaf, or a container walked by :meth:`children`)."""
        if v.__class__ is dict:
            if depth > MAX_DEPTH:
                raise TooDeepError(prefix)
            t = v.get("type")
            if t.__class__ is str and "dtype" in v and "shape" in v and t not in _NON_TENSOR_TYPES:
                self.leaves.append(v)
                self.labels.append(prefix)
                self.roles.append(role)
            elif _tensor_like(v, t):
                self._cannot(prefix, v)
            else:
                self.children(v.items(), prefix, role, depth)
        elif v.__class__ is list:
            if depth > MAX_DEPTH:
                raise TooDeepError(prefix)
            self.children(enumerate(v), prefix, role, depth)

    def children(self, items: Iterable[tuple[Any, Any]], prefix: str, role: str, depth: int) -> None:
        """The reference walk of a container's items, with the common leaf read in line."""
        leaves, labels, roles = self.leaves, self.labels, self.roles
        d1 = depth + 1
        for k, v in items:
            cls = v.__class__
            if cls is dict:
                if d1 > MAX_DEPTH:
                    raise TooDeepError(f"{prefix}.{k}")
                t = v.get("type")
                if t.__class__ is str and "dtype" in v and "shape" in v and t not in _NON_TENSOR_TYPES:
                    leaves.append(v)
                    labels.append(f"{prefix}.{k}")
                    roles.append(role)
                elif len(v) == 2 and "value" in v and v["value"].__class__ not in (dict, list) \
                        and t.__class__ is not dict and t.__class__ is not list:
                    continue  # a scalar argument: nothing below it
                elif _tensor_like(v, t):
                    self._cannot(f"{prefix}.{k}", v)
                elif v:
                    self.children(v.items(), f"{prefix}.{k}", role, d1)
            elif cls is list:
                if d1 > MAX_DEPTH:
                    raise TooDeepError(f"{prefix}.{k}")
                if v:
                    self.children(enumerate(v), f"{prefix}.{k}", role, d1)

    def _cannot(self, where: str, v: dict[str, Any]) -> None:
        """A tensor-like object that is not a readable leaf: into :attr:`unread`."""
        node = self._rec
        rel = where[len(node) + 1:] if where.startswith(node + ".") else where
        missing = [k for k in ("type", "dtype", "shape") if k not in v]
        why = (f"tensor fields without {', '.join(repr(k) for k in missing)}" if missing else
               f"tensor fields with a {_json_kind(v.get('type'))} 'type'")
        self.unread.append((node, rel, why))


def _json_kind(v: Any) -> str:
    """The JSON kind of a decoded value, for messages ("string", "number", "boolean", ...)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _is_leaf(v: dict[str, Any]) -> bool:
    t = v.get("type")
    return t.__class__ is str and "dtype" in v and "shape" in v and t not in _NON_TENSOR_TYPES


def _tensor_like(v: dict[str, Any], t: Any) -> bool:
    """An object that holds tensor fields but is not a readable leaf (read only off the hot path)."""
    if t.__class__ is str:
        if t in _NON_TENSOR_TYPES:
            return False
        return "Tensor" in t or any(k in v for k in _TENSOR_KEYS)
    return v.get("dtype").__class__ is str and v.get("shape").__class__ is list  # a leaf without a string type


def leaves_of(node: str, record: Any, kind: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, role, leaf) of every tensor leaf of one node record, in file order.

    Examples
    --------
    >>> rec = {"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]}],
    ...        "output": [[{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]}]]}
    >>> [(label, role) for label, role, _ in leaves_of("Functional.relu.0.forward", rec)]
    [('Functional.relu.0.forward.input.0', 'input'), ('Functional.relu.0.forward.output.0.0', 'output')]
    """
    if not isinstance(record, dict):
        return []
    w = Walk()
    w.node(node, record, kind)
    return list(zip(w.labels, w.roles, w.leaves, strict=True))


class NodeParts:
    """(kinds, apis, modules, directions, calls) of node names, added batch by batch (:func:`name_parts` of each).

    An API's module is its parent's (cached per parent); the common ``{api}.{call}.{direction}``
    spelling (the bulk of the nodes) is split in line. Splitting each batch's nodes while they
    are fresh in the processor's caches is faster than one pass over a file's millions at the end.

    Examples
    --------
    >>> parts = NodeParts()
    >>> parts.add(["Functional.relu.0.forward", "Module.act.ReLU.forward.0"], ["Module.act.ReLU.forward.0", ""])
    >>> parts.kinds, parts.modules, parts.calls
    (['api', 'module'], ['act', 'act'], [0, 0])
    """

    __slots__ = ("_names", "_of_parent", "apis", "calls", "dirs", "kinds", "modules", "parents")

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.apis: list[str] = []
        self.modules: list[str] = []
        self.dirs: list[str] = []
        self.calls: list[int] = []
        self.parents: list[str] = []  # the parents given, one object per distinct text
        self._of_parent: dict[str, tuple[str, str]] = {}  # parent -> (that parent, its module path)
        self._names: dict[str, str] = {}  # API names and module paths, one object per distinct text

    def add(self, nodes: Iterable[str], parents: Iterable[str]) -> None:
        """Split *nodes* (their parents aligned: ``""`` when unknown) and append their parts.

        Equal texts are kept as one object (a file's millions of tensor coordinates then point at a
        few thousand strings, which is faster to copy into the coordinate arrays and smaller).
        """
        kinds, apis, modules, dirs, calls = self.kinds, self.apis, self.modules, self.dirs, self.calls
        out = self.parents
        of_parent, one = self._of_parent, self._names.setdefault
        for node, parent in zip(nodes, parents, strict=True):
            hit = of_parent.get(parent)
            if hit is None:
                hit = of_parent[parent] = (parent, _module_of(parent))
            parent, of = hit
            out.append(parent)
            if "parameters_grad" not in node and node.isascii() and "\n" not in node:  # name_parts' cases, in line
                head, sep, last = node.rpartition(".")
                if last == "forward" or last == "backward":  # {api}.{call}.{direction}
                    api, sep, call = head.rpartition(".")
                    if sep and api and call.isdigit() and len(call) < 19:
                        kinds.append("api")
                        apis.append(one(api, api))
                        modules.append(of)  # an API's module is its parent's
                        dirs.append("forward" if last == "forward" else "backward")
                        calls.append(int(call))
                        continue
                elif sep and last.isdigit() and len(last) < 19:  # Module|Cell.{path}.{Class}.{direction}.{call}
                    body, sep, direction = head.rpartition(".")
                    if sep and (direction == "forward" or direction == "backward"):
                        pre, sep, body = body.partition(".")
                        if sep and body and (pre == "Module" or pre == "Cell"):
                            path, _, cls = body.rpartition(".")
                            kinds.append("module")
                            apis.append(one(cls, cls))
                            modules.append(one(path, path))
                            dirs.append("forward" if direction == "forward" else "backward")
                            calls.append(int(last))
                            continue
            kind, api, module, direction, number = name_parts(node)
            kinds.append(kind)
            apis.append(one(api, api))
            modules.append(of if kind == "api" else one(module, module))
            dirs.append(direction)
            calls.append(number)


def node_columns(nodes: Sequence[str], parents: Sequence[str], counts: Sequence[int], micro: Mapping[str, int],
                 n: int, parts: NodeParts | None = None, *, consume: bool = False) -> dict[str, np.ndarray]:
    """The per-tensor coordinates of :data:`NODE_COLUMNS` (one array each, *n* tensors).

    *nodes* are the node records that had tensors (in file order), *parents* their parents in
    construct.json (``""`` when unknown), *counts* their numbers of tensors; *micro* maps nodes to
    their Megatron micro step (checked values; -1 when absent). An API's module is its parent's.
    *parts*: the :class:`NodeParts` of *nodes* when the caller split them already; ``consume=True``
    empties its lists as they are read (the caller has no more use for them).

    Examples
    --------
    >>> cols = node_columns(["Functional.relu.0.forward"], ["Module.act.ReLU.forward.0"], [2], {}, 2)
    >>> cols["module"].tolist(), cols["call"].tolist(), cols["micro_step"].tolist()
    (['act', 'act'], [0, 0], [-1, -1])
    """
    if parts is None:
        parts = NodeParts()
        parts.add(nodes, parents)
    n_nodes = len(nodes)
    at = np.repeat(np.arange(n_nodes), np.asarray(counts, np.int64)) if n else np.zeros(0, np.intp)
    # tensor -> its node: a take is several times faster than np.repeat on object arrays. One column at a
    # time, each list let go once read when the caller gave up *parts* (consume): a large file's peak
    out: dict[str, np.ndarray] = {}
    for name, texts in zip(NODE_COLUMNS, (nodes, parts.modules, parts.apis, parts.kinds, parts.dirs,
                                          parts.parents, parts.calls, None), strict=True):
        if name == "micro_step":
            per = np.full(n_nodes, -1, np.int64) if not micro else \
                np.fromiter(map(micro.get, nodes, itertools.repeat(-1)), np.int64, n_nodes)
        elif name == "call":
            per = np.asarray(texts, np.int64)
        else:
            per = np.empty(n_nodes, object)
            per[:] = texts
        if consume and texts is not None and texts is not nodes:
            texts.clear()
        out[name] = per[at]
        del per
    return out
