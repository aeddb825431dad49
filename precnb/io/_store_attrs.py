"""A store's attributes and index coordinates, checked like a dump's side files (issue #49 defect 6).

A store's attributes are JSON texts that precnb wrote (``construct``, ``stacks``, ``scalar_args`` …); edited by
hand they reached the analyses as they were, and a list ``construct``, a number in ``stacks``, a 5,000-deep
``scalar_args`` or a non-JSON text died there (``AttributeError``, ``RecursionError``, or a JSON error taken for a
usage error). Here each known attribute is decoded once — depth-bounded, strict JSON — and its shape checked
against :data:`SHAPES`; the ``step``, ``rank`` and ``tensor`` coordinates must be there and hold no duplicate.

A store that fails is refused naming the store and what is wrong (:class:`~precnb.errors.DumpFormatError`,
exit 1), or, for ``precnb info`` (``gaps="report"``), opened without the attribute and the attribute listed as
not read in its load report, as an unread record of a dump is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from precnb._files import MAX_INPUT_DEPTH, check_depth
from precnb.errors import DumpFormatError

__all__ = ["SHAPES", "check_coords", "check_store_attrs"]

# the shape of each JSON attribute precnb writes: "str", "bool", "int", "num", "any", ("dict", V) (string keys),
# ("list", V), ("or", A, B), ("opt", V) (None allowed)
_STEPS_AT = ("dict", ("list", ("list", "int")))
SHAPES: dict[str, Any] = {
    "construct": ("dict", ("opt", "str")),
    "stacks": ("dict", ("list", "str")),
    "requires_grad": ("dict", ("opt", "bool")),
    "scalar_args": ("dict", ("dict", ("dict", ("list", "any")))),
    "scalar_signatures": ("dict", ("dict", ("dict", "any"))),
    "rank_dirs": ("dict", "str"),
    "comm_groups": ("list", "any"),
    "load_report": ("dict", "any"),
    "msprobe_release_evidence": ("dict", "any"),
    "dtype_changes": ("dict", _STEPS_AT),
    "shape_changes": ("dict", _STEPS_AT),
    "meta_changes": ("dict", ("dict", _STEPS_AT)),
    "stack_changes": ("dict", ("list", ("list", "any"))),
}
_NAMES = {"str": "a string", "bool": "true/false", "int": "an integer", "num": "a number", "dict": "an object",
          "list": "a list"}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    return type(value).__name__


def _check(value: Any, shape: Any, where: str) -> str | None:
    """Why *value* does not have *shape* (with the JSON path), or None. Recursion bounded by the shape's depth."""
    if shape == "any":
        return None
    if isinstance(shape, tuple) and shape[0] == "opt":
        return None if value is None else _check(value, shape[1], where)
    if isinstance(shape, tuple) and shape[0] == "dict":
        if not isinstance(value, dict):
            return f"{where} is {_kind(value)}, expected an object"
        for k, v in value.items():
            why = _check(v, shape[1], f"{where}[{json.dumps(str(k)[:60])}]")
            if why:
                return why
        return None
    if isinstance(shape, tuple) and shape[0] == "list":
        if not isinstance(value, list):
            return f"{where} is {_kind(value)}, expected a list"
        for i, v in enumerate(value):
            why = _check(v, shape[1], f"{where}[{i}]")
            if why:
                return why
        return None
    ok = {"str": isinstance(value, str), "bool": isinstance(value, bool),
          "int": isinstance(value, int) and not isinstance(value, bool),
          "num": isinstance(value, int | float) and not isinstance(value, bool)}[shape]
    return None if ok else f"{where} is {_kind(value)}, expected {_NAMES[shape]}"


def _decoded(name: str, raw: Any) -> Any:
    """The attribute's value (JSON text decoded, depth-bounded); ValueError saying why not."""
    if isinstance(raw, str):
        text = raw
    else:  # a JSON object written into zarr.json by hand: bounded like a text
        try:
            text = json.dumps(raw, default=str)
        except (ValueError, TypeError, RecursionError) as exc:
            raise ValueError(f"is not JSON ({type(exc).__name__})") from None
    try:
        check_depth(text, name, MAX_INPUT_DEPTH)
    except DumpFormatError as exc:
        raise ValueError(f"is not what precnb writes: {exc.message}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"is not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"is not JSON ({exc})") from None


def _load_report_why(value: dict[str, Any]) -> str | None:
    from precnb.io.records import LoadReport

    try:
        LoadReport.from_dict(value)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return f"not a precnb load report ({type(exc).__name__}: {exc})"
    return None


def _attr_error(name: str, raw: Any) -> str | None:
    """Why attribute *name* is not what precnb writes, or None."""
    try:
        value = _decoded(name, raw)
    except ValueError as exc:
        return f"attribute {name} {exc}"
    why = _check(value, SHAPES[name], name)
    if why is None and name == "load_report":
        why = _load_report_why(value)
        return f"attribute {name} is {why}" if why else None
    return f"attribute {why}" if why else None


def check_store_attrs(ds: xr.Dataset, p: Path, *, report: bool = False) -> list[tuple[str, str]]:
    """Check (and normalise to JSON text) the known JSON attributes of *ds*, opened from the store *p*.

    Parameters
    ----------
    report : bool
        Drop a bad attribute and return it (``precnb info``) instead of raising.

    Returns
    -------
    list of (str, str)
        The attributes dropped and why (empty unless *report*).

    Raises
    ------
    precnb.errors.DumpFormatError
        The first attribute that is not what precnb writes, named (unless *report*).
    """
    dropped: list[tuple[str, str]] = []
    for name in SHAPES:
        if name not in ds.attrs or ds.attrs[name] in ("", None):
            continue
        why = _attr_error(name, ds.attrs[name])
        if why is None:
            if not isinstance(ds.attrs[name], str):  # a JSON object written by hand: the text precnb writes
                ds.attrs[name] = json.dumps(ds.attrs[name])
            continue
        if not report:
            raise DumpFormatError(p, f"{why} (a hand-edited store? re-convert the dump)")
        del ds.attrs[name]
        dropped.append((name, why))
    return dropped


def check_coords(ds: xr.Dataset, p: Path) -> None:
    """The ``step``, ``rank`` and ``tensor`` coordinates are there and each names a position once.

    Raises
    ------
    precnb.errors.DumpFormatError
    """
    for dim in ("step", "rank", "tensor"):
        if dim not in ds.dims:
            continue  # the schema names a missing dimension
        if dim not in ds.coords:
            raise DumpFormatError(p, f"the {dim!r} coordinate is missing from the store (a hand-edited store? "
                                     "re-convert the dump)")
        values = ds[dim].values
        uniq, counts = np.unique(values.astype(str) if values.dtype == object else values, return_counts=True)
        if uniq.size != values.size:
            twice = uniq[counts > 1]
            shown = ", ".join(repr(v.item() if hasattr(v, "item") else v)[:80] for v in twice[:3])
            more = f" and {twice.size - 3} more" if twice.size > 3 else ""
            raise DumpFormatError(p, f"the {dim!r} coordinate holds duplicate values ({shown}{more}): each "
                                     f"{dim} must be named once (a hand-edited store? re-convert the dump)")
