"""Small, torch-free helpers that read msprobe dumps to derive the samples' ground truth.

These helpers are intentionally independent of ``precnb.io`` (the readers under test): the
ground truth must not be computed by the code it is meant to check.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STAT_KEYS = ("Max", "Min", "Mean", "Norm")
_RANK_DIR = re.compile(r"^(rank\d*|proc\d+)$")
_STEP_DIR = re.compile(r"^step(\d+)$")


def load_json(path: str | Path) -> Any:
    """Load a JSON file; Python's json accepts the bare NaN/Infinity tokens msprobe writes."""
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def step_dirs(root: str | Path) -> list[tuple[int, Path]]:
    """Return ``(step, path)`` for every ``step<N>`` folder under a dump root, sorted by N."""
    out = []
    for p in Path(root).iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out)


def rank_dirs(step_dir: str | Path) -> list[Path]:
    """Return the ``rank<R>``/``proc<PID>`` folders of one step folder, sorted by name."""
    return sorted(p for p in Path(step_dir).iterdir() if p.is_dir() and _RANK_DIR.match(p.name))


def dump_data(path: str | Path) -> dict[str, Any]:
    """Return the ``data`` dict (node name -> record) of a dump.json, in dump order."""
    return load_json(path)["data"]


def iter_leaves(obj: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict]]:
    """Yield ``(path, leaf)`` for every leaf record (a dict with a string ``type``)."""
    if isinstance(obj, dict):
        if isinstance(obj.get("type"), str):
            yield path, obj
            return
        for key, value in obj.items():
            yield from iter_leaves(value, (*path, str(key)))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from iter_leaves(value, (*path, str(i)))


def node_leaves(record: dict) -> dict[str, dict]:
    """Flatten one node record into ``{"output.0": leaf, "input_args.1": leaf, ...}``."""
    return {".".join(p): leaf for p, leaf in iter_leaves(record)}


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def leaf_has_nan(leaf: dict) -> bool:
    """Tell whether a tensor leaf has a NaN statistic, or a scalar leaf is NaN."""
    return any(_is_nan(leaf.get(k)) for k in (*STAT_KEYS, "value"))


def is_output_path(path: str) -> bool:
    """Tell whether a leaf path is an output (``output...``; param-grad values count too)."""
    head = path.split(".", 1)[0]
    return head == "output" or head not in {"input_args", "input_kwargs", "input", "parameters"}


def nan_sides(record: dict) -> tuple[bool, bool]:
    """Return ``(inputs_have_nan, outputs_have_nan)`` for one node record."""
    ins = outs = False
    for path, leaf in node_leaves(record).items():
        if leaf_has_nan(leaf):
            if is_output_path(path):
                outs = True
            else:
                ins = True
    return ins, outs


def nan_leaf_paths(record: dict) -> list[str]:
    """Paths of the leaves of a node record that hold NaN."""
    return [p for p, leaf in node_leaves(record).items() if leaf_has_nan(leaf)]


def first_nan_node(data: dict[str, Any]) -> str | None:
    """First node in dump order with any NaN leaf."""
    for name, record in data.items():
        if any(leaf_has_nan(leaf) for _, leaf in iter_leaves(record)):
            return name
    return None


def first_nan_origin(data: dict[str, Any]) -> str | None:
    """First node in dump order whose outputs hold NaN while all of its inputs are NaN-free."""
    for name, record in data.items():
        ins, outs = nan_sides(record)
        if outs and not ins:
            return name
    return None


def _same(a: Any, b: Any) -> bool:
    if _is_nan(a) and _is_nan(b):
        return True
    return a == b


def leaf_differs(a: dict, b: dict) -> bool:
    """Tell whether two leaves differ in dtype, shape, a statistic or scalar value (bit-exact)."""
    return any(not _same(a.get(k), b.get(k)) for k in ("dtype", "shape", *STAT_KEYS, "value"))


def differing_leaves(rec_a: dict, rec_b: dict) -> list[str]:
    """Paths of leaves that differ between two records of the same node (missing = differs)."""
    la, lb = node_leaves(rec_a), node_leaves(rec_b)
    out = [p for p in la if p not in lb or leaf_differs(la[p], lb[p])]
    out += [p for p in lb if p not in la]
    return out


def first_differing_node(base: dict[str, Any], target: dict[str, Any]) -> str | None:
    """First node, in the target's dump order, present in both dumps with differing stats."""
    for name, record in target.items():
        if name in base and differing_leaves(base[name], record):
            return name
    return None


def parent_of(construct: dict[str, Any], node: str) -> str | None:
    """Parent module of a node from construct.json (handles the ``[parent, micro_step]`` form)."""
    parent = construct.get(node)
    if isinstance(parent, list):
        parent = parent[0] if parent else None
    return parent or None
