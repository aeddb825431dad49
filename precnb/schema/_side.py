"""Side tables (``construct``, ``stacks``): one JSON text attribute each, written and read back."""

from __future__ import annotations

import itertools
import json
from typing import Any

import xarray as xr

from precnb.schema._core import empty_dataset  # noqa: F401  (the docstring examples use it)

__all__ = ["side_table", "side_text"]


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
