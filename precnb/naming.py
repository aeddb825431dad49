"""Parsing of msprobe node names.

msprobe names API records ``{Prefix}.{api}.{call}.{forward|backward}``, module records
``Module.{path}.{Class}.{forward|backward}.{call}`` (``Cell`` for MindSpore), and
parameter-gradient records ``Module.{path}.{Class}.parameters_grad[.{n}]``. This module is
shared by the readers and the analysis functions (it depends on nothing but ``re``).

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

__all__ = ["COMM_PREFIXES", "NodeName", "is_communication", "module_path_of", "parse_node"]

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
