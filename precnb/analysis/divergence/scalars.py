"""Scalar arguments of a node record, and the ones that differ between two runs.

msprobe records an op's non-tensor arguments beside its tensors: ``{"type": "float", "value":
1e-06}`` in ``input_args`` (by position) or ``input_kwargs`` (by name). The statistics never show
them, yet they are the commonest cause of "inputs agree, output differs" in a port: an ``eps``,
a scale, a ``keepdim`` or a rounding mode that the two frameworks' defaults (or the port) set
differently. The pipeline reads the culprit's records from both dumps on demand
(:func:`precnb.io.node_records`) and hands them here.

Examples
--------
>>> t = {"input_args": [{"type": "torch.Tensor", "shape": [2]}, {"type": "float", "value": 0.01}]}
>>> b = {"input_args": [{"type": "torch.Tensor", "shape": [2]}, {"type": "float", "value": 1e-06}]}
>>> scalar_arguments(t)
{'input_args.1': 0.01}
>>> [d["argument"] for d in differing_arguments(t, b)]
['input_args.1']
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["argument_cause", "differing_arguments", "format_argument", "scalar_arguments"]

_SECTIONS = ("input_args", "input_kwargs")
_MAX_DEPTH = 6
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
#: relative difference below which two numbers are the same argument (a float32 round trip of a
#: float64 constant, as MindSpore records some, differs by ~1e-8)
ARG_RTOL = 1e-6


def _value(leaf: Mapping[str, Any]) -> tuple[bool, Any]:
    """(is a scalar argument, its value) of one msprobe leaf dict."""
    if "value" not in leaf or "shape" in leaf:
        return False, None
    v = leaf["value"]
    if isinstance(v, str) and leaf.get("type") != "str" and v in _NONFINITE:
        return True, _NONFINITE[v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return True, v
    return False, None


def _walk(v: Any, path: str, out: dict[str, Any], depth: int) -> None:
    if depth > _MAX_DEPTH:
        return
    if isinstance(v, dict):
        if isinstance(v.get("type"), str):
            ok, val = _value(v)
            if ok:
                out[path] = val
            return
        for k, x in v.items():
            _walk(x, f"{path}.{k}", out, depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _walk(x, f"{path}.{i}", out, depth + 1)


def scalar_arguments(record: Any) -> dict[str, Any]:
    """The scalar arguments of one node record: ``{"input_args.1": 1e-06, "input_kwargs.dim": -1}``.

    Positional arguments are named by index, keyword arguments by name, elements of a list
    argument by a further index (``input_args.2.0``). Bare ``NaN``/``Infinity`` values are floats.

    Examples
    --------
    >>> scalar_arguments({"input_kwargs": {"dim": {"type": "int", "value": -1},
    ...                                    "keepdim": {"type": "bool", "value": True}}})
    {'input_kwargs.dim': -1, 'input_kwargs.keepdim': True}
    >>> scalar_arguments({"input_args": [{"type": "int", "value": [1, 2]}]})  # not a scalar: skipped
    {}
    """
    out: dict[str, Any] = {}
    if not isinstance(record, dict):
        return out
    for section in _SECTIONS:
        v = record.get(section)
        if isinstance(v, list):
            for i, x in enumerate(v):
                _walk(x, f"{section}.{i}", out, 1)
        elif isinstance(v, dict):
            for k, x in v.items():
                _walk(x, f"{section}.{k}", out, 1)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b or (type(a) is type(b) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return abs(a - b) <= ARG_RTOL * max(abs(a), abs(b))
    return bool(a == b)


def differing_arguments(target: Any, baseline: Any) -> list[dict[str, Any]]:
    """The scalar arguments both records hold with different values (file order of the target).

    Numbers compare with a relative tolerance of :data:`ARG_RTOL` (``1`` and ``1.0`` are the
    same; ``1e-06`` and its float32 rounding too); booleans, strings and ``None`` exactly.
    Arguments only one record holds are not reported (ports name and order optional
    arguments differently).

    Examples
    --------
    >>> differing_arguments({"input_kwargs": {"eps": {"type": "float", "value": 1e-5}}},
    ...                     {"input_kwargs": {"eps": {"type": "float", "value": 1e-5}}})
    []
    >>> differing_arguments({"input_args": [{"type": "float", "value": 0.5}]},
    ...                     {"input_args": [{"type": "float", "value": 1.0}]})
    [{'argument': 'input_args.0', 'target': 0.5, 'baseline': 1.0}]
    """
    ta, ba = scalar_arguments(target), scalar_arguments(baseline)
    return [{"argument": k, "target": v, "baseline": ba[k]} for k, v in ta.items()
            if k in ba and not _same(v, ba[k])]


def format_argument(v: Any) -> str:
    """An argument's value as printed (floats to 6 significant digits).

    Examples
    --------
    >>> format_argument(1e-06), format_argument(True), format_argument("floor")
    ('1e-06', 'True', "'floor'")
    """
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v) if isinstance(v, str) else str(v)


def argument_cause(node: str, diffs: list[dict[str, Any]], *, baseline_node: str | None = None,
                   names: tuple[str, str] = ("baseline", "target")) -> dict[str, Any]:
    """The finding cause for *node*'s differing scalar arguments (see :attr:`Finding.causes`).

    Examples
    --------
    >>> c = argument_cause("Tensor.__add__.6.forward",
    ...                    [{"argument": "input_args.1", "target": 0.01, "baseline": 1e-06}])
    >>> c["cause"], c["arguments"][0]["argument"]
    ('scalar_argument', 'input_args.1')
    >>> c["text"][:92]
    'Tensor.__add__.6.forward ran with a different scalar argument: input_args.1 = 0.01 in target'

    """
    parts = ", ".join(f"{d['argument']} = {format_argument(d['target'])} in {names[1]}, "
                      f"{format_argument(d['baseline'])} in {names[0]}" for d in diffs[:4])
    more = f" (+{len(diffs) - 4} more)" if len(diffs) > 4 else ""
    plural = "s" if len(diffs) > 1 else ""
    return {"cause": "scalar_argument", "certain": True, "node": node, "baseline_node": baseline_node or node,
            "arguments": diffs,
            "text": f"{node} ran with {'different scalar arguments' if plural else 'a different scalar argument'}: "
                    f"{parts}{more} (an op constant such as eps or a scale set differently)"}
