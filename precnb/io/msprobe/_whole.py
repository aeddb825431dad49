"""Pieces of the dump.json parser that read whole objects: the whole-file parse, a leaf's framework, ProcessGroups.

:mod:`precnb.io.msprobe.parse` uses them; they are here to keep that module to one concern (the batch walk).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from precnb.errors import DumpFormatError
from precnb.io._jsonio import load_json
from precnb.io.msprobe.discover import RankDir
from precnb.io.msprobe.nodes import name_parts
from precnb.io.msprobe.sides import json_type

__all__ = ["find_groups", "framework_of_leaf", "whole_doc", "wrap_bare_data"]

_MAX_INDEX = 2**31 - 1


def framework_of_leaf(leaf_type: str) -> str:
    """The framework a tensor leaf's ``type`` names (``"unknown"`` when it names none).

    Examples
    --------
    >>> framework_of_leaf("mindspore.Tensor"), framework_of_leaf("torch.Tensor"), framework_of_leaf("")
    ('mindspore', 'pytorch', 'unknown')
    """
    if leaf_type.startswith("mindspore"):
        return "mindspore"
    if leaf_type.startswith("mindtorch"):
        return "mindtorch"
    return "pytorch" if leaf_type.startswith("torch") else "unknown"


def find_groups(value: Any, depth: int = 0) -> Iterable[list[int]]:
    """``group_ranks`` of ProcessGroup leaves (communication records); ranks in 0..2**31."""
    if depth > 6:
        return
    if isinstance(value, dict):
        g = value.get("group_ranks")
        if isinstance(g, list) and g and all(x.__class__ is int and 0 <= x <= _MAX_INDEX for x in g):
            yield [int(x) for x in g]
            return
        for v in value.values():
            if isinstance(v, (dict, list)):
                yield from find_groups(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            if isinstance(v, (dict, list)):
                yield from find_groups(v, depth + 1)


def wrap_bare_data(doc: Any) -> Any:
    if isinstance(doc, dict) and "data" not in doc and doc and all(
            isinstance(v, dict) and name_parts(k)[3] for k, v in doc.items()):
        return {"data": doc}  # a bare data object (e.g. an api_accuracy_checker forward.json)
    return doc


def whole_doc(rd: RankDir, notes: list[str]) -> dict[str, Any]:
    """The whole-file parse (standard library rules); checks that it is an msprobe dump."""
    doc = wrap_bare_data(load_json(rd.dump_file, notes))
    if not isinstance(doc, dict):
        raise DumpFormatError(rd.dump_file, f"not an msprobe dump.json: holds a JSON {json_type(doc)}, "
                                            "expected an object with a 'data' object")
    if "data" not in doc:
        raise DumpFormatError(rd.dump_file, "not an msprobe dump.json (no 'data' object)")
    if not isinstance(doc["data"], dict):
        raise DumpFormatError(rd.dump_file, f"not an msprobe dump.json: 'data' is a JSON "
                                            f"{json_type(doc['data'])}, expected an object of node records")
    return doc
