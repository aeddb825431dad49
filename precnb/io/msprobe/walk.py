"""The walk of msprobe node records: tensor leaves and their labels.

The walk names tensors as msprobe's compare does (``{node}.input.0``, ``{node}.output.0.1``,
``{node}.parameters.weight``, ``{node}.{param}`` for ``parameters_grad`` records); a leaf is an
object whose ``type`` is a string other than a non-tensor type and which has ``dtype`` and
``shape``. :class:`Walk` collects the leaves of many records (their values are read by
:class:`~precnb.io.msprobe.values.Columns`); :func:`~precnb.io.msprobe.nodes.node_columns` turns
the nodes that had leaves into per-tensor coordinates (:mod:`precnb.io.msprobe.nodes`).

Examples
--------
>>> w = Walk()
>>> leaf = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]}
>>> w.node("Module.fc.Linear.forward.0", {"input_args": [leaf, {"type": "int", "value": 1}],
...                                        "output": [[leaf, None]], "parameters": {"weight": leaf}})
>>> list(zip(w.labels, w.roles))  # doctest: +NORMALIZE_WHITESPACE
[('Module.fc.Linear.forward.0.input.0', 'input'), ('Module.fc.Linear.forward.0.parameters.weight', 'parameter'),
 ('Module.fc.Linear.forward.0.output.0.0', 'output')]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from precnb.io._cext import CRAW
from precnb.io._record_facts import UNDEFINED_PREFIXES
from precnb.io.msprobe.nodes import node_kind
from precnb.naming import COMM_PREFIXES

__all__ = ["MAX_DEPTH", "NO_SIGNATURE", "TooDeepError", "Walk", "leaves_of"]

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
#: without signatures, the API records the run facts still read: the collectives (reduce op, p2p peers)
NO_SIGNATURE = COMM_PREFIXES


class TooDeepError(Exception):
    """Values nested more than :data:`MAX_DEPTH` levels below a node record (at :attr:`where`)."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


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



if CRAW is not None:  # the same rules for the reader of a batch's bytes (precnb/io/_craw.c)
    from precnb.io.msprobe.values import _shape_info

    CRAW.configure(_NON_TENSOR_TYPES, _ORDER, UNDEFINED_PREFIXES, COMM_PREFIXES, node_kind, _shape_info)
