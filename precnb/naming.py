"""Parsing of msprobe node names.

msprobe names API records ``{Prefix}.{api}.{call}.{forward|backward}``, module records
``Module.{path}.{Class}.{forward|backward}.{call}`` (``Cell`` for MindSpore), and
parameter-gradient records ``Module.{path}.{Class}.parameters_grad[.{n}]``. This module is
shared by the readers and the analysis functions (it depends on nothing but ``re`` and :mod:`precnb.dtypes`).

Examples
--------
>>> parse_node("Functional.linear.3.forward")[1:]
('api', 'Functional.linear', '', 'forward', 3)
>>> parse_node("Module.blocks.1.attn.Attention.backward.0").module
'blocks.1.attn'
>>> parse_node("Module.fc.Linear.parameters_grad").kind
'param_grad'
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

from precnb.dtypes import canonical_dtype  # re-exported: the one dtype table is precnb.dtypes

__all__ = [
    "COMM_PREFIXES",
    "NodeName",
    "canonical_dtype",
    "is_communication",
    "module_path_of",
    "op_key",
    "parse_node",
]

_API = re.compile(r"^(?P<api>.+?)\.(?P<call>\d+)\.(?P<dir>forward|backward)$")
_MODULE = re.compile(r"^(?P<pre>Module|Cell)\.(?P<body>.+)\.(?P<dir>forward|backward)\.(?P<call>\d+)$")
_PGRAD = re.compile(r"^(?P<pre>Module|Cell)\.(?P<body>.+)\.parameters_grad(?:\.(?P<call>\d+))?$")
_DEBUG = re.compile(r"^(?P<var>.+)\.(?P<call>\d+)\.debug$")

COMM_PREFIXES = ("Distributed.", "MintDistributed.")
_COMM_NAMES = re.compile(
    r"(all_reduce|all_gather|reduce_scatter|broadcast|all_to_all|send|recv|isend|irecv|"
    r"batch_isend_irecv|reduce|gather|scatter|barrier)"
)


class NodeName(NamedTuple):
    """The parts of an msprobe node name."""

    node: str
    kind: str  # "api" | "module" | "param_grad"
    api: str  # API name (Functional.linear) or module class (Linear)
    module: str  # module path for module / param_grad nodes, "" for APIs
    direction: str  # "forward" | "backward" | ""
    call: int


@lru_cache(maxsize=65536)
def parse_node(node: str) -> NodeName:
    """Split an msprobe node name into its parts.

    Parameters
    ----------
    node : str
        A key of dump.json's ``data`` object.

    Returns
    -------
    NodeName
        Unknown shapes come back as kind ``"api"`` with the whole name as ``api``.

    Examples
    --------
    >>> parse_node("Module.0.conv1.Conv2d.forward.0").module
    '0.conv1'
    >>> parse_node("Tensor.__add__.0.forward").api
    'Tensor.__add__'
    """
    m = _PGRAD.match(node)
    if m:
        path, _, cls = m["body"].rpartition(".")
        call = int(m["call"]) if m["call"] is not None else -1
        return NodeName(node, "param_grad", cls, path, "backward", call)
    m = _MODULE.match(node)
    if m:
        path, _, cls = m["body"].rpartition(".")
        return NodeName(node, "module", cls, path, m["dir"], int(m["call"]))
    m = _API.match(node)
    if m:
        return NodeName(node, "api", m["api"], "", m["dir"], int(m["call"]))
    m = _DEBUG.match(node)
    if m:
        return NodeName(node, "api", m["var"], "", "", int(m["call"]))
    return NodeName(node, "api", node, "", "", -1)


def module_path_of(parent: str | None) -> str:
    """Return the module path of a construct.json parent node (``""`` for roots).

    Examples
    --------
    >>> module_path_of("Module.blocks.0.attn.Attention.forward.0")
    'blocks.0.attn'
    >>> module_path_of(None)
    ''
    """
    if not parent:
        return ""
    p = parse_node(parent)
    if p.kind in ("module", "param_grad"):
        return p.module
    return parent if parent in ("optimizer", "clip_grad") else ""


def is_communication(node: str) -> bool:
    """Whether *node* is a communication (collective or point-to-point) call.

    Examples
    --------
    >>> is_communication("Distributed.all_reduce.0.forward")
    True
    >>> is_communication("Functional.linear.0.forward")
    False
    """
    if not node.startswith(COMM_PREFIXES):
        return False
    return bool(_COMM_NAMES.search(node))


_BINARY = frozenset({"add", "sub", "mul", "truediv", "div", "floordiv", "mod", "pow", "matmul", "and", "or", "xor",
                     "lshift", "rshift"})
_OP_PREFIXES = ("Functional.", "Torch.", "Tensor.", "NPU.", "VF.", "Aten.", "Distributed.", "MindSpeed.",
                "Triton.", "MintFunctional.", "MintDistributed.", "Mint.", "Jit.")


@lru_cache(maxsize=65536)
def op_key(api: str) -> str:
    """The framework-neutral name of an API (prefix, dunders, ``npu_`` and underscores dropped, lowercase).

    ``Primitive.<attr>.<Class>`` (MindSpore primitives) is keyed by its class.

    Examples
    --------
    >>> op_key("Tensor.__add__"), op_key("Torch.add"), op_key("Mint.add")
    ('add', 'add', 'add')
    >>> op_key("Primitive.matmul.MatMul"), op_key("NPU.npu_rms_norm"), op_key("Primitive.norm.RmsNorm")
    ('matmul', 'rmsnorm', 'rmsnorm')
    >>> op_key("Tensor.add_"), op_key("Tensor.__iadd__"), op_key("Tensor.__radd__")
    ('add_', 'add_', 'add')
    """
    a = str(api)
    if a.startswith("Primitive."):
        a = a.split(".")[-1]
    else:
        for pre in _OP_PREFIXES:
            if a.startswith(pre):
                a = a[len(pre):]
                break
    inplace = False
    if a.startswith("__") and a.endswith("__") and len(a) > 4:
        a = a[2:-2]
        if a.startswith("r") and a[1:] in _BINARY:
            a = a[1:]  # __radd__ is add with the operands swapped
        elif a.startswith("i") and a[1:] in _BINARY:
            a, inplace = a[1:], True  # __iadd__ is the in-place add_
    else:
        inplace = a.endswith("_")
        a = a.strip("_")
    a = a.lower().replace("npu_", "").replace("_", "")
    return a + ("_" if inplace else "")
