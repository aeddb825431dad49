"""Fast, strict-enough JSON loading for msprobe files.

msprobe writes JSON with Python's ``json.dump`` and ``allow_nan=True``, so files may hold
the bare tokens ``NaN``, ``Infinity`` and ``-Infinity``. ``orjson`` (when installed) is
tried first because it is several times faster; it rejects those tokens, and the standard
library parser (which accepts them) is used then. Errors name the file and the position.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from precnb.errors import DumpFormatError

try:  # optional speed-up
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised when the extra is missing
    _orjson = None

__all__ = ["load_json", "loads_json"]


def _position(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line} column {col} (char {pos})"


def loads_json(raw: bytes, path: str | Path = "<bytes>") -> Any:
    """Parse *raw* JSON bytes, accepting NaN/Infinity tokens.

    Parameters
    ----------
    raw : bytes
    path : str or Path
        Used in error messages only.

    Returns
    -------
    object

    Raises
    ------
    DumpFormatError
        With the position of the first error.

    Examples
    --------
    >>> loads_json(b'{"a": NaN, "b": -Infinity}')
    {'a': nan, 'b': -inf}
    """
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass  # NaN tokens, or truly broken: let json decide and explain
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        text = raw.decode("utf-8", errors="replace")
        # Non-UTF-8 bytes inside strings are kept as U+FFFD; numbers are unaffected.
        if exc.start < len(raw) and not _inside_string(raw, exc.start):
            raise DumpFormatError(path, f"invalid UTF-8 byte at char {exc.start}") from None
    if not text.strip():
        raise DumpFormatError(path, "file is empty (the job may have died before writing it)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        hint = " (truncated file?)" if exc.pos >= len(text.rstrip()) - 1 else ""
        raise DumpFormatError(
            path, f"invalid JSON at {_position(text, exc.pos)}: {exc.msg}{hint}"
        ) from None
    except RecursionError:
        raise DumpFormatError(path, "JSON nested too deeply") from None


def _inside_string(raw: bytes, pos: int) -> bool:
    # cheap heuristic: an odd number of unescaped quotes before pos on the same line
    line_start = raw.rfind(b"\n", 0, pos) + 1
    seg = raw[line_start:pos].replace(b'\\"', b"")
    return seg.count(b'"') % 2 == 1


def load_json(path: str | Path) -> Any:
    """Read and parse a JSON file (opened read-only).

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    object

    Raises
    ------
    DumpFormatError
        When the file cannot be read or parsed.
    """
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise DumpFormatError(p, f"cannot read: {exc.strerror or exc}") from None
    return loads_json(raw, p)
