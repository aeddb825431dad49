"""How one cell and one row name of an msprobe compare CSV are read (helpers of :mod:`precnb.io.compare_csv`).

Every cell is text: metrics may end in ``%`` or say ``unsupported`` (NaN), statistics may be device strings
(null), stacks and data names are Python literals read with :func:`ast.literal_eval` (never executed).

Examples
--------
>>> metric("12.5%"), metric("unsupported") != metric("unsupported")
(0.125, True)
>>> data_names("['a.pt', '-1']")
('a.pt', '')
"""

from __future__ import annotations

import ast
import json
import math
import re
import warnings
from typing import Any

from precnb.io._csvutil import parse_float

__all__ = ["NA", "data_names", "dotted", "err_text", "frames", "metric", "split_compare_name", "stat"]

NA = {"", "n/a", "none", "null", "nan"}
_LITERAL_ERRORS = (ValueError, SyntaxError, TypeError, MemoryError, RecursionError)
_FULL = re.compile(
    r"^(?P<node>.+\.(?:forward|backward)(?:\.\d+)?)\.(?P<sec>input|output|parameters|input_args|"
    r"input_kwargs)(?:\.(?P<rest>.+))?$")
_PGRAD = re.compile(r"^(?P<node>.+\.parameters_grad(?:\.\d+)?)\.(?P<rest>[^.]+)$")
_OLD = re.compile(r"^(?P<node>.+_(?:forward|backward))_(?P<sec>input|output)(?:\.(?P<rest>.+))?$")
_OLD_NODE = re.compile(r"^(?P<pre>[A-Za-z]+)_(?P<api>.+)_(?P<call>\d+)_(?P<dir>forward|backward)$")
_ROLES = {"input": "input", "input_args": "input", "input_kwargs": "input", "output": "output",
          "parameters": "parameter"}


def split_compare_name(name: str) -> tuple[str, str]:
    """Split a compare row name into ``(node, role)``.

    Strips ``.input.N`` / ``.output.N`` / ``.parameters.x`` / ``.parameters_grad[.n].x``
    suffixes (and the ptdbg ``_input.N`` / ``_output`` ones).

    Parameters
    ----------
    name : str

    Returns
    -------
    (str, str)
        The node name and the role (``input``, ``output``, ``parameter``, ``grad`` or ``""``).

    Examples
    --------
    >>> split_compare_name("Module.fc.Linear.parameters_grad.1.bias")
    ('Module.fc.Linear.parameters_grad.1', 'grad')
    >>> split_compare_name("Functional.conv2d.0.forward.input.3.0")
    ('Functional.conv2d.0.forward', 'input')
    """
    m = _PGRAD.match(name)
    if m:
        return m["node"], "grad"
    m = _FULL.match(name)
    if m:
        return m["node"], _ROLES[m["sec"]]
    m = _OLD.match(name)
    if m:
        return m["node"], _ROLES[m["sec"]]
    return name, ""


def dotted(node: str) -> str:
    m = _OLD_NODE.match(node)
    return f"{m['pre']}.{m['api']}.{m['call']}.{m['dir']}" if m else node


def metric(text: str) -> float:
    s = text.strip()
    if s.lower() in NA:
        return math.nan
    pct = s.endswith("%")
    if pct:
        s = s[:-1].strip()
    try:
        v = float(s)
    except ValueError:
        return math.nan  # "unsupported", "Diff", ... : not a number
    return v / 100.0 if pct else v


def stat(text: str) -> float | None:
    try:
        return parse_float(text)
    except ValueError:
        return None  # device strings and other non-numbers: recorded as null


def _literal(s: str) -> Any:
    """``ast.literal_eval`` of a cell holding a Python list or tuple (never executes code).

    Raises one of ``_LITERAL_ERRORS`` when the cell is not such a literal (or is too deep).
    """
    if s[:1] not in ("[", "("):
        raise ValueError(s)
    with warnings.catch_warnings():  # invalid escapes in frames: SyntaxWarning, not an error
        warnings.simplefilter("ignore")
        return ast.literal_eval(s)


def err_text(text: str) -> str:
    s = text.strip()
    if s.startswith("["):
        try:
            val = json.loads(s)
        except (ValueError, RecursionError):
            return s
        if isinstance(val, list):
            return "; ".join(str(v) for v in val)
    return s


def frames(text: str) -> list[str] | None:
    s = text.strip()
    if not s or s.upper() == "N/A":
        return None
    try:
        val = _literal(s)
    except _LITERAL_ERRORS:
        return [s]
    if isinstance(val, (list, tuple)):
        return [str(v) for v in val]
    return [str(val)]


def data_names(text: str) -> tuple[str, str]:
    s = text.strip()
    try:
        val = _literal(s)
    except _LITERAL_ERRORS:
        return "", ""
    if isinstance(val, (list, tuple)) and len(val) == 2:
        return tuple("" if str(v) in ("-1", "N/A") else str(v) for v in val)  # type: ignore[return-value]
    return "", ""
