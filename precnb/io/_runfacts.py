"""Run facts a dump holds outside its tensor statistics: ``requires_grad`` and optimizer arguments.

The pre-flight checks (:mod:`precnb.analysis.preflight`) need two things the statistics do not
carry: whether each parameter requires a gradient (the module records' ``parameters`` leaves
hold ``requires_grad``) and the scalar arguments of the optimizer's ops (``lr``, ``beta1``,
``weight_decay`` of ``Torch._fused_adamw_``; the ``value`` of ``Tensor.addcdiv_``, ...). Both
msprobe parsers call :func:`file_facts` on the same parsed ``data`` object, so their records
stay identical; the assembler folds the files' facts into two JSON attributes with
:class:`FactsAccumulator` (see :mod:`precnb.schema`).

Examples
--------
>>> data = {"Torch._fused_adamw_.0.forward": {"input_args": [], "input_kwargs": {
...     "lr": {"type": "float", "value": 0.01}, "maximize": {"type": "bool", "value": False}}}}
>>> file_facts(data, {"Torch._fused_adamw_.0.forward": "optimizer"})
{'scalar_args': {'Torch._fused_adamw_': {'lr': [0.01], 'maximize': [False]}}}
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["FactsAccumulator", "file_facts", "is_optimizer_node", "merge_facts"]

#: API names that are optimizer updates wherever they are called (fused and foreach kernels)
_OPTIMIZER_MARKERS = ("_fused_adam", "_fused_sgd", "_fused_adagrad", "addcdiv_", "_foreach_lerp_")
_MARKERS = re.compile("|".join(re.escape(m) for m in _OPTIMIZER_MARKERS))
_API = re.compile(r"^(?P<api>.+?)\.(?:\d+\.(?:forward|backward)|(?:forward|backward)(?:\.\d+)?)$")
_MAX_VALUES = 64  # distinct values kept per (api, argument, step)
_MAX_DEPTH = 8
_NONFINITE = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}


def api_of(node: str) -> str:
    """The API name of a node record (``Tensor.addcdiv_.3.forward`` → ``Tensor.addcdiv_``).

    Examples
    --------
    >>> api_of("Torch._fused_adamw_.0.forward"), api_of("Module.fc.Linear.forward.0")
    ('Torch._fused_adamw_', 'Module.fc.Linear')
    """
    m = _API.match(node)
    return m.group("api") if m else node


def is_optimizer_node(node: str, parent: str) -> bool:
    """Whether *node* is an optimizer op: recorded under the ``optimizer`` scope, or a fused/foreach update.

    Examples
    --------
    >>> is_optimizer_node("Tensor.mul_.7.forward", "optimizer"), is_optimizer_node("Tensor.mul_.7.forward", "")
    (True, False)
    >>> is_optimizer_node("Tensor.addcdiv_.0.forward", "")
    True
    """
    if not node.endswith(".forward") and ".forward." not in node:
        return False
    if parent == "optimizer" or parent.startswith("optimizer."):
        return True
    if _MARKERS.search(node) is None:  # the API name is part of the node name
        return False
    api = api_of(node)
    return any(m in api for m in _OPTIMIZER_MARKERS)


def _plain(kind: str, v: Any) -> Any:
    """A JSON scalar of one argument (non-finite floats as ``"nan"``/``"inf"``/``"-inf"``), or None."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, str):
        if v in _NONFINITE and kind != "str":  # a bare NaN / Infinity token of a number
            return _NONFINITE[v]
        return v if len(v) <= 64 else None
    return None


def _scalars(value: Any, path: str, out: dict[str, list[Any]], depth: int, *, kwarg: bool) -> None:
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, dict):
        kind = value.get("type")
        if isinstance(kind, str):
            if "value" in value and "shape" not in value:
                v = _plain(kind, value["value"])
            elif kwarg and value.get("shape") == [] and "Max" in value:  # a 0-d tensor keyword (lr=tensor)
                v = _plain("float", value.get("Max"))
            else:
                return
            if v is not None:
                _add(out.setdefault(path, []), v)
            return
        for k, x in value.items():
            _scalars(x, f"{path}.{k}", out, depth + 1, kwarg=kwarg)
    elif isinstance(value, list):
        for x in value:  # the elements of one list argument share its path
            _scalars(x, path, out, depth + 1, kwarg=kwarg)


def _add(values: list[Any], v: Any) -> None:
    if len(values) < _MAX_VALUES and not any(type(v) is type(x) and v == x for x in values):
        values.append(v)


def file_facts(data: Mapping[str, Any], parents: Mapping[str, str]) -> dict[str, Any]:
    """The facts of one dump.json ``data`` object (empty dict when it holds none).

    Parameters
    ----------
    data : mapping
        Node name → record, as parsed.
    parents : mapping
        Node → parent module from construct.json (``""`` / missing when unknown).

    Returns
    -------
    dict
        ``requires_grad``: ``{tensor label: bool}`` of the parameters of module records
        (``Module.fc.Linear.forward.0.parameters.weight``); ``scalar_args``: ``{api: {argument:
        [distinct values]}}`` of the optimizer's ops, keyword arguments by name and positional
        ones by index (a list argument's elements share its index).
    """
    grads: dict[str, bool] = {}
    scalars: dict[str, dict[str, list[Any]]] = {}
    for node, record in data.items():
        if not isinstance(record, dict):
            continue
        params = record.get("parameters")
        if isinstance(params, dict):
            for pname, leaf in params.items():
                if isinstance(leaf, dict) and isinstance(leaf.get("requires_grad"), bool):
                    grads[f"{node}.parameters.{pname}"] = leaf["requires_grad"]
        parent = parents.get(node, "") or ""
        if not isinstance(parent, str) or not is_optimizer_node(node, parent):
            continue
        found: dict[str, list[Any]] = {}
        args, kwargs = record.get("input_args"), record.get("input_kwargs")
        if isinstance(args, list):
            for i, x in enumerate(args):
                _scalars(x, str(i), found, 1, kwarg=False)
        if isinstance(kwargs, dict):
            for k, x in kwargs.items():
                _scalars(x, str(k), found, 1, kwarg=True)
        if found:
            into = scalars.setdefault(api_of(node), {})
            for path, vals in found.items():
                have = into.setdefault(path, [])
                for v in vals:
                    _add(have, v)
    out: dict[str, Any] = {}
    if grads:
        out["requires_grad"] = grads
    if scalars:
        out["scalar_args"] = scalars
    return out


def merge_facts(into: dict[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    """Fold the :func:`file_facts` of a later part of the same file into *into* (as one call on both parts).

    Examples
    --------
    >>> merge_facts({"scalar_args": {"opt": {"lr": [0.1]}}}, {"scalar_args": {"opt": {"lr": [0.1, 0.2]}}})
    {'scalar_args': {'opt': {'lr': [0.1, 0.2]}}}
    """
    for label, rg in (more.get("requires_grad") or {}).items():
        into.setdefault("requires_grad", {})[label] = rg
    for api, args in (more.get("scalar_args") or {}).items():
        have_api = into.setdefault("scalar_args", {}).setdefault(api, {})
        for path, vals in args.items():
            have = have_api.setdefault(path, [])
            for v in vals:
                _add(have, v)
    return into


class FactsAccumulator:
    """Fold the facts of many (step, rank) files into the ``requires_grad`` / ``scalar_args`` attributes.

    Examples
    --------
    >>> acc = FactsAccumulator()
    >>> acc.add({"requires_grad": {"w": True}, "scalar_args": {"opt": {"lr": [0.1]}}}, step=0)
    >>> acc.add({"requires_grad": {"w": False}, "scalar_args": {"opt": {"lr": [0.1]}}}, step=1)
    >>> acc.attrs()
    {'requires_grad': '{"w": false}', 'scalar_args': '{"opt": {"lr": {"0": [0.1], "1": [0.1]}}}'}
    """

    def __init__(self) -> None:
        self.requires_grad: dict[str, bool] = {}
        self.scalar_args: dict[str, dict[str, dict[int, list[Any]]]] = {}

    def add(self, facts: Mapping[str, Any] | None, *, step: int) -> None:
        """Fold one file's :func:`file_facts` (a parameter is frozen when any file says so)."""
        if not facts:
            return
        for label, rg in (facts.get("requires_grad") or {}).items():
            self.requires_grad[label] = self.requires_grad.get(label, True) and bool(rg)
        for api, args in (facts.get("scalar_args") or {}).items():
            by_path = self.scalar_args.setdefault(api, {})
            for path, vals in args.items():
                have = by_path.setdefault(path, {}).setdefault(int(step), [])
                for v in vals:
                    _add(have, v)

    def attrs(self) -> dict[str, str]:
        """The dataset attributes (JSON text), only those that hold something."""
        out: dict[str, str] = {}
        if self.requires_grad:
            out["requires_grad"] = json.dumps(self.requires_grad)
        if self.scalar_args:
            table = {api: {path: {str(s): vals for s, vals in sorted(steps.items())}
                           for path, steps in args.items()} for api, args in self.scalar_args.items()}
            out["scalar_args"] = json.dumps(table, allow_nan=False)
        return out
