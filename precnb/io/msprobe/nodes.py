"""Node names split into their parts, and the per-tensor node coordinates of a file.

:func:`name_parts` splits a node name (kind, api, module, direction, call) as
:func:`precnb.naming.parse_node` does; :class:`NodeParts` splits a file's nodes batch by batch,
while they are fresh in the processor's caches, and :func:`node_columns` turns the nodes that had
tensor leaves (:class:`~precnb.io.msprobe.walk.Walk`) into per-tensor coordinates (node, module,
api, kind, direction, parent, call, micro step) once per file.

Examples
--------
>>> name_parts("Functional.linear.3.forward"), name_parts("Module.fc.Linear.backward.2")
(('api', 'Functional.linear', '', 'forward', 3), ('module', 'Linear', 'fc', 'backward', 2))
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from precnb.io._cext import craw
from precnb.io.msprobe.values import MAX_COUNTER
from precnb.naming import parse_node

__all__ = ["NODE_COLUMNS", "NodeParts", "name_parts", "node_columns", "node_kind"]



NODE_COLUMNS = ("node", "module", "api", "kind", "direction", "parent", "call", "micro_step")


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
        c = craw()
        if c is not None and nodes.__class__ is list and parents.__class__ is list:  # the same, in C (_craw_parts.c)
            c.parts_add(nodes, parents, kinds, apis, modules, dirs, calls, out, self._of_parent, self._names,
                        _module_of, name_parts)
            return
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
    lists: tuple[Sequence[Any], ...] = (nodes, parts.modules, parts.apis, parts.kinds, parts.dirs, parts.parents,
                                        parts.calls)
    for name, texts in zip(NODE_COLUMNS[:7], lists, strict=True):
        per = np.asarray(texts, np.int64) if name == "call" else np.empty(n_nodes, object)
        if name != "call":
            per[:] = texts
        if consume and texts is not nodes and isinstance(texts, list):
            texts.clear()
        out[name] = per[at]
        del per
    per = np.full(n_nodes, -1, np.int64) if not micro else \
        np.fromiter(map(micro.get, nodes, itertools.repeat(-1)), np.int64, n_nodes)
    out["micro_step"] = per[at]
    return out
