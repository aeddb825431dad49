"""The canonical precnb dataset contract.

Every reader in :mod:`precnb.io` returns an :class:`xarray.Dataset` that passes
:func:`validate`; every analysis function in :mod:`precnb.analysis` may rely on it.

Dimensions
----------
``step`` (int64), ``rank`` (int64), ``tensor`` (str) and, when several runs are
combined by :func:`precnb.open_runs`, a leading ``run`` (str).

Coordinates along ``tensor``
----------------------------
``node``       node record name (``Functional.linear.0.forward``)
``module``     module path (``blocks.1.attn``), ``""`` when unknown
``api``        API name (``Functional.linear``) or module class (``Linear``)
``kind``       one of :data:`KINDS`
``direction``  one of :data:`DIRECTIONS`
``role``       one of :data:`ROLES`
``dtype``      dtype string as written by the producer (``torch.float32``)
``shape``      shape as JSON text (``"[4, 16, 32]"``), first seen
``parent``     parent node from construct.json (``""`` for roots / unknown)
``call``       call counter parsed from the node name (-1 when none)
``micro_step`` Megatron / monitor micro step (-1 when none)

Data variables over (step, rank, tensor)
----------------------------------------
``max``, ``min``, ``mean``, ``norm``  float64; NaN and ±inf exactly as in the file
``present``    bool; False where the tensor was not recorded at that (step, rank)
``null_stats`` uint8 bit mask of statistics that were recorded as ``null``
               (bit 0 max, 1 min, 2 mean, 3 norm); absent ≠ null ≠ NaN
``seq``        int32 position in execution (dump) order within (step, rank); -1 absent
``numel``      int64 element count from the shape; -1 absent
``crc``        str checksum (md5 mode), ``""`` where absent — only when recorded
``nans``, ``zeros``, ...  extra float64 monitor / kernel statistics where they exist

Attributes
----------
``precnb_schema`` (:data:`SCHEMA_VERSION`), ``source_format``, ``task``, ``level``,
``framework``, ``source`` (path), and JSON text side tables ``construct``
(node → parent) and ``stacks`` (node → list of frames). ``dtype_changes`` (JSON text, only
when some entry's dtype differs from its tensor's ``dtype`` coordinate, e.g. an op cast to
bfloat16 from step 1 on one rank): tensor → {dtype → [[step, rank], ...]}; read it with
:func:`entry_dtype` / :func:`dtype_changes`. ``meta_changes`` (JSON text, only when some entry's
``module``, ``parent`` or ``shape`` differs from its tensor's coordinate, e.g. a rank whose call
counters are shifted by one extra op, so that one label names another op there): field → tensor →
{value → [[step, rank], ...]}; ``stack_changes`` (JSON text, the same for stack.json): node →
[[frames, [[step, rank], ...]], ...]. Read them with :func:`entry_meta` / :func:`entry_stack`:
the metadata of one (step, rank, tensor) entry is that rank's own. MindSpore tensor-layout kernel dumps
(``source_format == "kernel_tensors"``) add ``kernel_order`` (how ``seq`` was ordered) and
``kernel_parameters`` (JSON text: tensor label of a kernel input → the parameter it reads).
Run facts outside the statistics, JSON text, only when the source holds them (read with
:func:`side_table`): ``requires_grad`` (parameter tensor label → bool; false when any file
records ``requires_grad: false``) and ``scalar_args`` (optimizer op API → argument (keyword
name or positional index) → step → distinct values, e.g. ``{"Torch._fused_adamw_": {"lr":
{"0": [0.01]}}}``; non-finite floats as ``"nan"``/``"inf"``/``"-inf"``). A ``config_check``
pack (:mod:`precnb.io.config_check`) adds ``config_check``: what the pack holds besides
tensors (environment, packages, hyper-parameters, random-call records).

Examples
--------
>>> from precnb.schema import empty_dataset, validate
>>> ds = empty_dataset()
>>> validate(ds) is ds
True
"""

from __future__ import annotations

import functools
import itertools
import json
from typing import Any, Final

import numpy as np
import xarray as xr

__all__ = [
    "DIRECTIONS",
    "ENTRY_CHANGE_ATTRS",
    "KINDS",
    "META_FIELDS",
    "NULL_BITS",
    "ROLES",
    "SCHEMA_VERSION",
    "STATS",
    "TENSOR_COORDS",
    "SchemaError",
    "dtype_changes",
    "empty_dataset",
    "encode_dtype_changes",
    "encode_entry_changes",
    "encode_meta_changes",
    "encode_stack_changes",
    "encode_undefined",
    "entry_changes",
    "entry_dtype",
    "entry_meta",
    "entry_stack",
    "meta_changes",
    "read_side_table",
    "shift_entry_changes",
    "side_table",
    "side_text",
    "stack_changes",
    "undefined_table",
    "validate",
]

SCHEMA_VERSION: Final = "1.0"
STATS: Final = ("max", "min", "mean", "norm")
NULL_BITS: Final = {"max": 1, "min": 2, "mean": 4, "norm": 8}
KINDS: Final = ("api", "module", "param_grad", "monitor", "kernel")
DIRECTIONS: Final = ("forward", "backward", "optimizer", "")
ROLES: Final = ("input", "output", "parameter", "grad", "state", "")
TENSOR_COORDS: Final = {
    "node": str,
    "module": str,
    "api": str,
    "kind": str,
    "direction": str,
    "role": str,
    "dtype": str,
    "shape": str,
    "parent": str,
    "call": np.int64,
    "micro_step": np.int64,
}
DIMS: Final = ("step", "rank", "tensor")
META_FIELDS: Final = ("module", "parent", "shape")
"""Per-tensor coordinates that may differ on some (step, rank) entries (``attrs["meta_changes"]``)."""
ENTRY_CHANGE_ATTRS: Final = ("dtype_changes", "meta_changes", "stack_changes")
"""Attributes keyed by (step, rank): run-specific, shifted with the steps (:func:`shift_entry_changes`)."""


class SchemaError(ValueError):
    """A dataset does not follow the canonical precnb contract."""


def _dims_of(ds: xr.Dataset) -> tuple[str, ...]:
    return ("run", *DIMS) if "run" in ds.dims else DIMS


def validate(ds: xr.Dataset) -> xr.Dataset:
    """Check that *ds* follows the canonical contract and return it unchanged.

    Parameters
    ----------
    ds : xarray.Dataset
        A dataset produced by a precnb reader.

    Returns
    -------
    xarray.Dataset
        The same object, so that readers can ``return validate(ds)``.

    Raises
    ------
    SchemaError
        Naming the first violated rule.

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> validate(empty_dataset()).attrs["precnb_schema"]
    '1.0'
    """
    errors: list[str] = []
    dims = _dims_of(ds)
    for d in DIMS:
        if d not in ds.dims:
            errors.append(f"missing dimension {d!r}")
    if errors:
        raise SchemaError("; ".join(errors))
    for name in ("step", "rank"):
        if not np.issubdtype(ds[name].dtype, np.integer):
            errors.append(f"coordinate {name!r} must be integer, got {ds[name].dtype}")
    for name, kind in TENSOR_COORDS.items():
        if name not in ds.coords:
            errors.append(f"missing tensor coordinate {name!r}")
        elif ds.coords[name].dims != ("tensor",):
            errors.append(f"coordinate {name!r} must be along 'tensor'")
        elif kind is not str and not np.issubdtype(ds.coords[name].dtype, np.integer):
            errors.append(f"coordinate {name!r} must be integer")
    required = {"present": np.bool_, "seq": np.integer, "numel": np.integer, "null_stats": np.integer}
    for name in (*STATS, *required):
        if name not in ds.data_vars:
            errors.append(f"missing data variable {name!r}")
            continue
        var = ds[name]
        if var.dims != dims:
            errors.append(f"variable {name!r} has dims {var.dims}, expected {dims}")
        want = required.get(name, np.floating)
        if not np.issubdtype(var.dtype, want):
            errors.append(f"variable {name!r} has dtype {var.dtype}")
    if ds.attrs.get("precnb_schema") != SCHEMA_VERSION:
        errors.append(f"attrs['precnb_schema'] must be {SCHEMA_VERSION!r}")
    if "kind" in ds.coords and ds.sizes.get("tensor", 0):
        bad = {str(k) for k in set(ds.coords["kind"].values)} - set(KINDS)  # no list of every tensor
        if bad:
            errors.append(f"unknown tensor kinds {sorted(bad)}")
    if errors:
        raise SchemaError("dataset does not follow the precnb schema: " + "; ".join(errors))
    return ds


def empty_dataset(**attrs: Any) -> xr.Dataset:
    """Return a valid dataset with no steps, ranks or tensors.

    Parameters
    ----------
    **attrs
        Extra attributes to set.

    Returns
    -------
    xarray.Dataset

    Examples
    --------
    >>> empty_dataset().sizes["tensor"]
    0
    """
    shape = (0, 0, 0)
    coords: dict[str, Any] = {
        "step": np.zeros(0, np.int64),
        "rank": np.zeros(0, np.int64),
        "tensor": np.zeros(0, object),
    }
    for name, kind in TENSOR_COORDS.items():
        coords[name] = ("tensor", np.zeros(0, object if kind is str else np.int64))
    data: dict[str, Any] = {s: (DIMS, np.zeros(shape)) for s in STATS}
    data["present"] = (DIMS, np.zeros(shape, bool))
    data["null_stats"] = (DIMS, np.zeros(shape, np.uint8))
    data["seq"] = (DIMS, np.zeros(shape, np.int32))
    data["numel"] = (DIMS, np.zeros(shape, np.int64))
    base = {"precnb_schema": SCHEMA_VERSION, "source_format": "", "construct": "{}", "stacks": "{}"}
    base.update(attrs)
    return xr.Dataset(data, coords=coords, attrs=base)


def side_text(table: dict[str, Any]) -> str:
    """The attribute text of a side table (``construct`` / ``stacks``): what :func:`side_table` reads back.

    Compact JSON with non-ASCII characters kept (orjson's text when it is installed, the same
    text from the standard library otherwise); a table whose strings cannot be written as UTF-8
    (lone surrogates) is written with ASCII escapes instead.

    Examples
    --------
    >>> side_text({"Functional.relu.0.forward": "Module.act.ReLU.forward.0", "Module.act.ReLU.forward.0": ""})
    '{"Functional.relu.0.forward":"Module.act.ReLU.forward.0","Module.act.ReLU.forward.0":""}'
    """
    try:
        import orjson
    except ImportError:
        text = _json_text(table, ensure_ascii=False)
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return _json_text(table, ensure_ascii=True)
        return text
    try:
        return orjson.dumps(table).decode()
    except TypeError:  # a lone surrogate, a key that is not a string
        return json.dumps(table, separators=(",", ":"))


def _json_text(table: dict[str, Any], *, ensure_ascii: bool, part: int = 32768) -> str:
    """``json.dumps(table, separators=(",", ":"))``, written *part* members at a time.

    The standard library's encoder holds a string per key, separator and value before it joins
    them: several times the text for a table of hundreds of thousands of nodes. Here only one
    part's are alive at a time, and the text is joined once from the parts.

    Examples
    --------
    >>> t = {str(i): "é" * (i % 3) for i in range(7)}
    >>> _json_text(t, ensure_ascii=False, part=3) == json.dumps(t, ensure_ascii=False, separators=(",", ":"))
    True
    """
    if len(table) <= part:
        return json.dumps(table, ensure_ascii=ensure_ascii, separators=(",", ":"))
    items = iter(table.items())
    pieces: list[str] = []
    while chunk := dict(itertools.islice(items, part)):
        pieces.append(json.dumps(chunk, ensure_ascii=ensure_ascii, separators=(",", ":"))[1:-1])
    pieces[0], pieces[-1] = "{" + pieces[0], pieces[-1] + "}"
    return ",".join(pieces)


def side_table(ds: xr.Dataset, name: str) -> dict[str, Any]:
    """Decode a JSON side table (``construct`` or ``stacks``) from the attributes.

    Parameters
    ----------
    ds : xarray.Dataset
    name : {"construct", "stacks"}

    Returns
    -------
    dict

    Examples
    --------
    >>> side_table(empty_dataset(), "stacks")
    {}
    """
    raw = ds.attrs.get(name, "{}")
    if isinstance(raw, dict):
        return raw
    return json.loads(raw or "{}")


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
