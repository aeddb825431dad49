r"""Fast, strict-enough JSON loading for msprobe files.

msprobe writes JSON with Python's ``json.dump`` and ``allow_nan=True``, so files may hold
the bare tokens ``NaN``, ``Infinity`` and ``-Infinity``: the standard library's parser reads
them. Errors name the file and the position.

Robustness rules:

- a UTF-8 byte-order mark is ignored;
- a number beyond the float range (``1e400``) is ±inf, an integer beyond it stays an int
  (the readers turn it into ±inf); an integer literal of more than 4300 digits is an error;
- invalid UTF-8 bytes inside a string become U+FFFD (a note is added to *notes*); elsewhere
  they are an error naming the byte position; lone ``\udXXX`` surrogate escapes become U+FFFD;
- duplicate keys: the last one wins, as with msprobe's own ``json.load``;
- nesting deeper than the parser's limit is an error, never a crash.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from precnb.errors import DumpFormatError
from precnb.io._fs import byte_position, open_regular

__all__ = ["load_json", "loads_json"]

_BOM = b"\xef\xbb\xbf"
_JSON_START = frozenset(b'{["-0123456789tfnNI\"')
_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F][0-9a-fA-F]{2}")
_LONG_INT = re.compile(r"-?\d{4301,}")


def _position(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line} column {col} (char {pos})"


def loads_json(raw: bytes, path: str | Path = "<bytes>", notes: list[str] | None = None) -> Any:
    """Parse *raw* JSON bytes, accepting NaN/Infinity tokens.

    Parameters
    ----------
    raw : bytes
    path : str or Path
        Used in error messages only.
    notes : list of str, optional
        Receives a note when the content was repaired (invalid UTF-8 or lone surrogates
        inside strings replaced by U+FFFD).

    Returns
    -------
    object

    Raises
    ------
    DumpFormatError
        With the position of the first error.

    Examples
    --------
    >>> loads_json(b'{"a": NaN, "b": -Infinity, "c": 1e400}')
    {'a': nan, 'b': -inf, 'c': inf}
    >>> loads_json(b'{"a": [1, 2', "x.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    precnb.errors.DumpFormatError: x.json: invalid JSON at line 1 column 12 (char 11): ... (truncated file?)
    """
    if raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    first = raw.lstrip(b" \t\r\n")[:1]
    if first and first[0] not in _JSON_START:
        raise DumpFormatError(path, f"not a JSON text file (starts with byte 0x{first[0]:02x})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if not _inside_string(raw, exc.start):
            raise DumpFormatError(path, f"invalid UTF-8 byte 0x{raw[exc.start]:02x} at "
                                        f"{byte_position(raw, exc.start)} (not a text JSON file?)") from None
        # Non-UTF-8 bytes inside strings are kept as U+FFFD; numbers are unaffected.
        text = raw.decode("utf-8", errors="replace")
        if notes is not None:
            notes.append(f"{path}: invalid UTF-8 bytes inside strings (first: 0x{raw[exc.start]:02x} at "
                         f"{byte_position(raw, exc.start)}) replaced by U+FFFD")
    if not text.strip():
        raise DumpFormatError(path, "file is empty (the job may have died before writing it)")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = " (truncated file?)" if exc.pos >= len(text.rstrip()) - 1 else ""
        raise DumpFormatError(
            path, f"invalid JSON at {_position(text, exc.pos)}: {exc.msg}{hint}"
        ) from None
    except RecursionError:
        raise DumpFormatError(path, "JSON nested too deeply to be an msprobe file") from None
    except ValueError as exc:  # int literals beyond sys.get_int_max_str_digits()
        m = _LONG_INT.search(text)
        where = f" at {_position(text, m.start())}" if m else ""
        what = "an integer literal has more than 4300 digits" if m else str(exc)
        raise DumpFormatError(path, f"invalid JSON{where}: {what}") from None
    if _SURROGATE_ESCAPE.search(raw):
        doc, fixed = _replace_lone_surrogates(doc)
        if fixed and notes is not None:
            notes.append(f"{path}: {fixed} string(s) with lone surrogate escapes; replaced by U+FFFD")
    return doc


def _fix_str(s: str) -> str:
    return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _has_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _replace_lone_surrogates(doc: Any) -> tuple[Any, int]:
    """Replace lone surrogates in every key and string of *doc* (iteratively: no recursion limit)."""
    fixed = 0
    if isinstance(doc, str):
        return (_fix_str(doc), 1) if _has_surrogate(doc) else (doc, 0)
    stack = [doc]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            bad_keys = [k for k in obj if _has_surrogate(k)]
            if bad_keys:  # rebuild to keep the key order (dump order matters)
                items = [(_fix_str(k) if _has_surrogate(k) else k, v) for k, v in obj.items()]
                obj.clear()
                obj.update(items)
                fixed += len(bad_keys)
            for k, v in obj.items():
                if isinstance(v, str) and _has_surrogate(v):
                    obj[k] = _fix_str(v)
                    fixed += 1
                elif isinstance(v, (dict, list)):
                    stack.append(v)
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                if isinstance(v, str) and _has_surrogate(v):
                    obj[i] = _fix_str(v)
                    fixed += 1
                elif isinstance(v, (dict, list)):
                    stack.append(v)
    return doc, fixed


def _inside_string(raw: bytes, pos: int) -> bool:
    # cheap heuristic: an odd number of unescaped quotes before pos on the same line
    line_start = raw.rfind(b"\n", 0, pos) + 1
    seg = raw[line_start:pos].replace(b"\\\\", b"").replace(b'\\"', b"")
    return seg.count(b'"') % 2 == 1


def load_json(path: str | Path, notes: list[str] | None = None) -> Any:
    """Read and parse a JSON file (opened read-only).

    Parameters
    ----------
    path : str or Path
    notes : list of str, optional
        Receives notes about repaired content (see :func:`loads_json`).

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
        with open_regular(p) as fh:  # a FIFO named dump.json is refused, never opened
            raw = fh.read()
    except OSError as exc:
        raise DumpFormatError(p, f"cannot read: {exc.strerror or exc}") from None
    return loads_json(raw, p, notes)
