"""Torch-free helpers that pair nodes of two dumps whose names differ (ground truth only).

The samples of runs with different names (``renamed``, ``pp_local``) record which node of one
run corresponds to which node of the other. The correspondence of *modules* is known by
construction; these helpers derive the rest from the dumps (API calls inside paired modules, by
their order and kind) and measure how well the paired records agree. Like :mod:`._dumps` they do
not use ``precnb.io``: the ground truth must not come from the code it is meant to check.
"""

from __future__ import annotations

import math
from typing import Any

from . import _dumps as D  # noqa: N812


def parse_module_node(node: str) -> tuple[str, str, str, int] | None:
    """Split ``Module.<path>.<Class>.<kind>.<n>`` into ``(path, Class, kind, n)``.

    >>> parse_module_node("Module.model.layers.0.mlp.TinyLlamaMLP.forward.0")
    ('model.layers.0.mlp', 'TinyLlamaMLP', 'forward', 0)
    >>> parse_module_node("Functional.linear.3.forward") is None
    True
    """
    if not node.startswith("Module."):
        return None
    path, cls, kind, n = node[len("Module.") :].rsplit(".", 3)
    return path, cls, kind, int(n)


def api_kind(node: str) -> tuple[str, int, str] | None:
    """Split an API node ``<Prefix>.<api>.<n>.<forward|backward>`` into ``(prefix.api, n, dir)``.

    >>> api_kind("Tensor.__mul__.4.forward")
    ('Tensor.__mul__', 4, 'forward')
    >>> api_kind("Module.lm_head.Linear.forward.0") is None
    True
    """
    if node.startswith("Module."):
        return None
    head, n, direction = node.rsplit(".", 2)
    return head, int(n), direction


def module_nodes(data: dict[str, Any], kind: str = "forward") -> dict[str, str]:
    """``{module path: node}`` of the first call (``.0``) of every module's ``kind`` node."""
    out = {}
    for node in data:
        parsed = parse_module_node(node)
        if parsed and parsed[2] == kind and parsed[3] == 0:
            out[parsed[0]] = node
    return out


def api_children(
    data: dict[str, Any], construct: dict[str, Any], parent: str | None, direction: str = "forward"
) -> list[str]:
    """API nodes (dump order) of one direction whose construct.json parent is ``parent``."""
    out = []
    for node in data:
        kind = api_kind(node)
        if kind and kind[2] == direction and D.parent_of(construct, node) == parent:
            out.append(node)
    return out


def tensor_leaves(record: dict) -> dict[str, dict]:
    """The tensor leaves (those with a ``shape``) of a node record, by leaf path."""
    return {p: leaf for p, leaf in D.node_leaves(record).items() if "shape" in leaf}


def tensors_equal(a: dict, b: dict) -> bool:
    """Tell whether two records have the same tensor leaves, bit-identical (scalars ignored)."""
    ta, tb = tensor_leaves(a), tensor_leaves(b)
    return ta.keys() == tb.keys() and not any(D.leaf_differs(ta[p], tb[p]) for p in ta)


def differing_tensor_leaves(a: dict, b: dict) -> list[str]:
    """Paths of the tensor leaves that differ between two records (missing on one side too)."""
    ta, tb = tensor_leaves(a), tensor_leaves(b)
    out = [p for p in ta if p not in tb or D.leaf_differs(ta[p], tb[p])]
    return out + [p for p in tb if p not in ta]


def _stat_err(a: Any, b: Any, scale: float) -> float:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return 0.0 if a == b else math.inf
    if isinstance(a, bool) or isinstance(b, bool) or a == b:
        return 0.0 if a == b else math.inf
    if math.isnan(a) and math.isnan(b):
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b), scale, 1e-30)


def leaf_error(ref: dict, other: dict) -> float:
    """Scale-aware error of two tensor leaves (inf when their dtype or shape differ).

    The maximum over Max/Min/Mean/Norm of ``|a - b| / max(|a|, |b|, max(|Max|, |Min|) of ref)``.

    >>> leaf_error({"dtype": "f", "shape": [2], "Max": 2.0, "Min": -1.0, "Mean": 0.5, "Norm": 2.2},
    ...            {"dtype": "f", "shape": [2], "Max": 2.0, "Min": -1.0, "Mean": 0.5, "Norm": 2.2})
    0.0
    """
    if ref.get("dtype") != other.get("dtype") or ref.get("shape") != other.get("shape"):
        return math.inf
    finite = [
        abs(x)
        for x in (ref.get("Max"), ref.get("Min"))
        if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    ]
    scale = max(finite, default=0.0)
    keys = (*D.STAT_KEYS, "value")
    return max((_stat_err(ref.get(k), other.get(k), scale) for k in keys), default=0.0)


def record_error(ref: dict, other: dict, *, ignore: tuple[str, ...] = ()) -> float:
    """Max :func:`leaf_error` over the leaves of two records (inf if the leaf sets differ)."""
    la, lb = D.node_leaves(ref), D.node_leaves(other)
    la = {p: v for p, v in la.items() if not p.startswith(ignore)}
    lb = {p: v for p, v in lb.items() if not p.startswith(ignore)}
    if la.keys() != lb.keys():
        return math.inf
    return max((leaf_error(la[p], lb[p]) for p in la), default=0.0)


def pair_children(base: list[str], target: list[str]) -> list[tuple[str, str]]:
    """Pair two lists of API nodes by position; their API kinds must agree one to one.

    >>> pair_children(["Functional.linear.0.forward"], ["Functional.linear.4.forward"])
    [('Functional.linear.0.forward', 'Functional.linear.4.forward')]
    """
    kinds_b = [api_kind(n)[0] for n in base]  # type: ignore[index]
    kinds_t = [api_kind(n)[0] for n in target]  # type: ignore[index]
    if kinds_b != kinds_t:
        raise ValueError(f"API kinds differ: {kinds_b} vs {kinds_t}")
    return list(zip(base, target, strict=True))
