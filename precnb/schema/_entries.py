"""Per-entry exceptions: what differs on some (step, rank) entries of a tensor (:mod:`precnb.schema`)."""

from __future__ import annotations

import functools
import json
from typing import Any

import xarray as xr

from precnb.schema._core import (
    ENTRY_CHANGE_ATTRS,
    META_FIELDS,
    empty_dataset,  # noqa: F401  (the docstring examples use it)
)


def entry_changes(ds: xr.Dataset, attr: str) -> dict[str, dict[tuple[int, int], str]]:
    """A per-entry exception table (``dtype_changes``, ``shape_changes``): tensor → {(step, rank): value}.

    Examples
    --------
    >>> entry_changes(empty_dataset(shape_changes='{"x": {"[2, 4]": [[0, 1]]}}'), "shape_changes")
    {'x': {(0, 1): '[2, 4]'}}
    """
    raw = ds.attrs.get(attr)
    if not raw:
        return {}
    table = json.loads(raw) if isinstance(raw, str) else raw
    return {t: {(int(s), int(r)): d for d, where in by_value.items() for s, r in where}
            for t, by_value in table.items()}


def encode_entry_changes(changes: dict[str, dict[tuple[int, int], str]]) -> str:
    """The attribute text of a per-entry exception table (the inverse of :func:`entry_changes`).

    Examples
    --------
    >>> encode_entry_changes({"x": {(1, 0): "[2]", (0, 1): "[2]"}})
    '{"x": {"[2]": [[0, 1], [1, 0]]}}'
    """
    table: dict[str, dict[str, list[list[int]]]] = {}
    for tensor, where in changes.items():
        for (step, rank), value in sorted(where.items()):
            table.setdefault(tensor, {}).setdefault(value, []).append([int(step), int(rank)])
    return json.dumps(table)


def dtype_changes(ds: xr.Dataset) -> dict[str, dict[tuple[int, int], str]]:
    """Entries whose dtype differs from their tensor's ``dtype`` coordinate.

    Returns
    -------
    dict
        tensor → {(step, rank): dtype}; empty when every entry has its tensor's dtype.

    Examples
    --------
    >>> dtype_changes(empty_dataset(dtype_changes='{"x": {"torch.bfloat16": [[1, 0]]}}'))
    {'x': {(1, 0): 'torch.bfloat16'}}
    """
    return entry_changes(ds, "dtype_changes")


def encode_undefined(pairs: dict[str, tuple[str, set[tuple[int, int]]]]) -> str:
    """The ``undefined`` attribute text: label → why and where (``steps`` × ``ranks``, else the ``at`` pairs).

    Examples
    --------
    >>> encode_undefined({"x.input.0": ("beta=0", {(0, 0), (0, 1)})})
    '{"x.input.0": {"why": "beta=0", "steps": [0], "ranks": [0, 1]}}'
    """
    out: dict[str, dict[str, Any]] = {}
    for label, (why, at) in sorted(pairs.items()):
        steps, ranks = sorted({s for s, _ in at}), sorted({r for _, r in at})
        out[label] = ({"why": why, "steps": steps, "ranks": ranks} if len(at) == len(steps) * len(ranks)
                      else {"why": why, "at": [list(x) for x in sorted(at)]})
    return json.dumps(out)


def undefined_table(ds: xr.Dataset) -> dict[str, tuple[str, set[tuple[int, int]]]]:
    """The ``undefined`` attribute read back: label → (why, {(step, rank), ...}).

    Examples
    --------
    >>> why, at = undefined_table(empty_dataset(undefined='{"x": {"why": "w", "steps": [0], "ranks": [0, 1]}}'))["x"]
    >>> why, sorted(at)
    ('w', [(0, 0), (0, 1)])
    """
    raw = ds.attrs.get("undefined")
    if not raw:
        return {}
    table = json.loads(raw) if isinstance(raw, str) else raw
    out: dict[str, tuple[str, set[tuple[int, int]]]] = {}
    for label, e in table.items():
        pairs = {(int(s), int(r)) for s, r in e["at"]} if "at" in e else {
            (int(s), int(r)) for s in e.get("steps", []) for r in e.get("ranks", [])}
        out[str(label)] = (str(e.get("why", "")), pairs)
    return out


def entry_dtype(ds: xr.Dataset, tensor: str, step: int, rank: int,
                changes: dict[str, dict[tuple[int, int], str]] | None = None) -> str:
    """The dtype of one (step, rank, tensor) entry (the coordinate unless it changed there).

    Parameters
    ----------
    ds : xarray.Dataset
        One run.
    tensor : str
    step, rank : int
    changes : dict, optional
        :func:`dtype_changes` of *ds*, when calling many times.

    Returns
    -------
    str

    Examples
    --------
    >>> ds = empty_dataset(dtype_changes='{"x": {"torch.bfloat16": [[1, 0]]}}')
    >>> entry_dtype(ds, "x", 1, 0)
    'torch.bfloat16'
    """
    table = dtype_changes(ds) if changes is None else changes
    hit = table.get(tensor, {}).get((int(step), int(rank)))
    if hit is not None:
        return hit
    if tensor in ds.indexes["tensor"]:
        return str(ds["dtype"].sel(tensor=tensor).values)
    return ""


def encode_dtype_changes(changes: dict[str, dict[tuple[int, int], str]]) -> str:
    """The ``dtype_changes`` attribute text for *changes* (the inverse of :func:`dtype_changes`).

    Examples
    --------
    >>> encode_dtype_changes({"x": {(1, 0): "torch.bfloat16"}})
    '{"x": {"torch.bfloat16": [[1, 0]]}}'
    """
    table: dict[str, dict[str, list[list[int]]]] = {}
    for tensor, where in changes.items():
        for (step, rank), dtype in sorted(where.items()):
            table.setdefault(tensor, {}).setdefault(dtype, []).append([int(step), int(rank)])
    return json.dumps(table)


@functools.lru_cache(maxsize=8)
def _decoded(raw: str) -> Any:
    return json.loads(raw)


def _attr_table(ds: xr.Dataset, name: str) -> Any:
    """A JSON attribute, decoded once per distinct text (shared: read it, never change it)."""
    raw = ds.attrs.get(name)
    if not raw:
        return {}
    return _decoded(raw) if isinstance(raw, str) else raw


def read_side_table(ds: xr.Dataset, name: str) -> dict[str, Any]:
    """:func:`side_table`, decoded once per distinct attribute text: shared, to read and never change.

    Examples
    --------
    >>> read_side_table(empty_dataset(stacks='{"n": ["File a"]}'), "stacks")
    {'n': ['File a']}
    """
    table: dict[str, Any] = _attr_table(ds, name)
    return table


def meta_changes(ds: xr.Dataset) -> dict[str, dict[str, dict[tuple[int, int], str]]]:
    """Entries whose ``module`` / ``parent`` / ``shape`` differ from their tensor's coordinate.

    Returns
    -------
    dict
        field → tensor → {(step, rank): value}; empty when every entry has its tensor's coordinates.

    Examples
    --------
    >>> meta_changes(empty_dataset(meta_changes='{"shape": {"x": {"[2]": [[1, 0]]}}}'))
    {'shape': {'x': {(1, 0): '[2]'}}}
    """
    table = _attr_table(ds, "meta_changes")
    return {f: {t: {(int(s), int(r)): v for v, where in by_value.items() for s, r in where}
                for t, by_value in by_tensor.items()} for f, by_tensor in table.items()}


def encode_meta_changes(changes: dict[str, dict[str, dict[tuple[int, int], str]]]) -> str:
    """The ``meta_changes`` attribute text for *changes* (the inverse of :func:`meta_changes`).

    Examples
    --------
    >>> encode_meta_changes({"shape": {"x": {(1, 0): "[2]"}}})
    '{"shape": {"x": {"[2]": [[1, 0]]}}}'
    """
    table: dict[str, dict[str, dict[str, list[list[int]]]]] = {}
    for f, by_tensor in changes.items():
        for tensor, where in by_tensor.items():
            for (step, rank), value in sorted(where.items()):
                table.setdefault(f, {}).setdefault(tensor, {}).setdefault(value, []).append([int(step), int(rank)])
    return json.dumps(table)


def stack_changes(ds: xr.Dataset) -> dict[str, dict[tuple[int, int], list[str]]]:
    """Entries whose node's stack frames differ from the ``stacks`` side table's.

    Returns
    -------
    dict
        node → {(step, rank): frames}.

    Examples
    --------
    >>> stack_changes(empty_dataset(stack_changes='{"n": [[["File a"], [[0, 1]]]]}'))
    {'n': {(0, 1): ['File a']}}
    """
    table = _attr_table(ds, "stack_changes")
    return {n: {(int(s), int(r)): list(frames) for frames, where in variants for s, r in where}
            for n, variants in table.items()}


def encode_stack_changes(changes: dict[str, dict[tuple[int, int], list[str]]]) -> str:
    """The ``stack_changes`` attribute text (the inverse of :func:`stack_changes`).

    Examples
    --------
    >>> encode_stack_changes({"n": {(0, 1): ["File a"]}})
    '{"n": [[["File a"], [[0, 1]]]]}'
    """
    table: dict[str, list[list[Any]]] = {}
    for node, where in changes.items():
        variants: dict[tuple[str, ...], list[list[int]]] = {}
        for (step, rank), frames in sorted(where.items()):
            variants.setdefault(tuple(str(f) for f in frames), []).append([int(step), int(rank)])
        table[node] = [[list(k), v] for k, v in variants.items()]
    return json.dumps(table)


def entry_meta(ds: xr.Dataset, tensor: str, step: int | None, rank: int | None,
               changes: dict[str, dict[str, dict[tuple[int, int], str]]] | None = None) -> dict[str, str]:
    """``module``, ``parent``, ``shape`` and ``dtype`` of one (step, rank, tensor) entry: that rank's own.

    The coordinates are the first record's; an entry whose rank recorded other values (a label
    that names another op there) has them in ``attrs["meta_changes"]`` / ``attrs["dtype_changes"]``.

    Parameters
    ----------
    ds : xarray.Dataset
        One run.
    tensor : str
    step, rank : int or None
        None: the tensor's coordinates.
    changes : dict, optional
        :func:`meta_changes` of *ds*, when calling many times.

    Returns
    -------
    dict
        Empty strings for a tensor the run does not hold.

    Examples
    --------
    >>> ds = empty_dataset(meta_changes='{"module": {"x": {"blocks.1": [[1, 0]]}}}')
    >>> entry_meta(ds, "x", 1, 0)["module"]
    'blocks.1'
    """
    out = {k: "" for k in (*META_FIELDS, "dtype")}
    if tensor in ds.indexes["tensor"]:
        j = int(ds.indexes["tensor"].get_loc(tensor))
        for k in out:
            if k in ds.coords:
                out[k] = str(ds.coords[k].values[j])
    if step is None or rank is None:
        return out
    key = (int(step), int(rank))
    if changes is not None:
        for k in META_FIELDS:
            hit = changes.get(k, {}).get(tensor, {}).get(key)
            if hit is not None:
                out[k] = hit
    else:
        raw = _attr_table(ds, "meta_changes")
        for k in META_FIELDS:
            for value, where in raw.get(k, {}).get(tensor, {}).items():
                if [key[0], key[1]] in where:
                    out[k] = value
    for dtype, where in _attr_table(ds, "dtype_changes").get(tensor, {}).items():
        if [key[0], key[1]] in where:
            out["dtype"] = dtype
    return out


def entry_stack(ds: xr.Dataset, node: str, step: int | None = None, rank: int | None = None) -> list[str]:
    """The stack frames of *node* as its (step, rank) recorded them (the ``stacks`` table otherwise).

    Examples
    --------
    >>> ds = empty_dataset(stacks='{"n": ["File b"]}', stack_changes='{"n": [[["File a"], [[0, 1]]]]}')
    >>> entry_stack(ds, "n", 0, 1), entry_stack(ds, "n", 0, 0)
    (['File a'], ['File b'])
    """
    if step is not None and rank is not None and ds.attrs.get("stack_changes"):
        for frames, where in _attr_table(ds, "stack_changes").get(node, []):
            if [int(step), int(rank)] in where:
                return list(frames)
    return list(_attr_table(ds, "stacks").get(node, []))  # (parsed once per distinct text)


def shift_entry_changes(attrs: dict[str, Any], offset: int) -> dict[str, Any]:
    """*attrs* with the (step, rank) keys of :data:`ENTRY_CHANGE_ATTRS` moved by ``step - offset``.

    Examples
    --------
    >>> shift_entry_changes({"dtype_changes": '{"x": {"torch.bfloat16": [[5, 0]]}}'}, 5)["dtype_changes"]
    '{"x": {"torch.bfloat16": [[0, 0]]}}'
    """
    if not offset:
        return attrs
    out = dict(attrs)

    def move(where: list[list[int]]) -> list[list[int]]:
        return [[int(s) - offset, int(r)] for s, r in where]

    for name in ENTRY_CHANGE_ATTRS:
        raw = attrs.get(name)
        if not raw:
            continue
        table = json.loads(raw) if isinstance(raw, str) else raw
        if name == "dtype_changes":
            moved: Any = {t: {d: move(w) for d, w in by.items()} for t, by in table.items()}
        elif name == "meta_changes":
            moved = {f: {t: {v: move(w) for v, w in by.items()} for t, by in bt.items()} for f, bt in table.items()}
        else:
            moved = {n: [[frames, move(w)] for frames, w in variants] for n, variants in table.items()}
        out[name] = json.dumps(moved)
    return out
