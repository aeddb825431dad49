"""Small CSV helpers shared by the monitor, kernel and compare readers.

All readers open files read-only, accept a UTF-8 byte-order mark, and report problems as
:class:`~precnb.errors.DumpFormatError` naming the file and the line.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path

from precnb.errors import DumpFormatError
from precnb.io._fs import open_regular

__all__ = ["iter_rows", "parse_float", "parse_shape", "read_header", "short_repr"]

_INTS = re.compile(r"[0-9]+")
# "[2, 3]", "(2,3)", "(2,)", "()", "torch.Size([2, 3])": non-negative integer dimensions only
# (matched after removing blanks; blanks between two digits make the cell invalid)
_SHAPE = re.compile(r"^(?:torch\.Size\()?[\[(]((?:[0-9]+,)*[0-9]*),?[\])]\)?$")
_SPLIT_DIGITS = re.compile(r"[0-9]\s+[0-9]")
_BLANKS = re.compile(r"\s+")
_MAX_NUMEL = 2**62
_BOOLS = {"true": 1.0, "false": 0.0}


def short_repr(text: str, limit: int = 40) -> str:
    """``repr(text)``, cut to about *limit* characters (for error messages about huge cells).

    Examples
    --------
    >>> short_repr("abc"), short_repr("x" * 100, 10)
    ("'abc'", "'xxxxxx...")
    """
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def read_header(path: str | Path) -> list[str] | None:
    """Return the stripped header cells of a CSV file, or None when unreadable.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    list of str or None

    Examples
    --------
    >>> read_header("/nonexistent.csv") is None
    True
    """
    try:  # decode the first line only: a non-UTF-8 byte further down is the parser's to report
        with open_regular(path) as fh:
            raw = fh.readline(65536)
        line = raw.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return None
    if not line:
        return None
    try:
        cells = next(csv.reader([line]))
    except (csv.Error, StopIteration):
        return None
    return [c.strip() for c in cells]


def iter_rows(path: str | Path) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(line_number, cells)`` for every non-blank row, header first.

    Parameters
    ----------
    path : str or Path

    Yields
    ------
    (int, list of str)
        The physical line number where the row starts (1-based) and its cells.

    Raises
    ------
    DumpFormatError
        When the file cannot be opened, is not UTF-8 text or is not valid CSV.
    """
    try:
        fh = open_regular(path, "r", encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise DumpFormatError(path, f"cannot open: {exc.strerror or exc}") from exc
    with fh:
        reader = csv.reader(fh)
        start = 1
        try:
            for row in reader:
                if row and any(c.strip() for c in row):
                    yield start, row
                start = reader.line_num + 1
        except csv.Error as exc:
            raise DumpFormatError(path, f"line {reader.line_num}: malformed CSV: {exc}") from exc
        except UnicodeDecodeError:
            raise DumpFormatError(path, f"not UTF-8 text: {bad_byte(path)}") from None
        except OSError as exc:  # a read error after the open (EIO, a vanished network file, ...)
            raise DumpFormatError(path, f"line {reader.line_num}: cannot read: {exc.strerror or exc}") from None


def bad_byte(path: str | Path) -> str:
    """Where the first invalid UTF-8 byte of *path* is (line, column, byte offset)."""
    try:
        with open_regular(path) as fh:
            raw = fh.read()
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        return f"invalid byte 0x{raw[exc.start]:02x} at line {line} column {col} (byte {exc.start})"
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    return "invalid byte"


def parse_float(text: str, *, bools: bool = True) -> float | None:
    """Parse one numeric CSV cell exactly as :func:`float` does.

    Parameters
    ----------
    text : str
        The cell. Surrounding blanks are ignored (compare CSVs write ``" inf"``).
    bools : bool
        Accept ``True``/``False`` as 1.0/0.0.

    Returns
    -------
    float or None
        None for empty, ``null``, ``None`` and ``N/A`` cells.

    Raises
    ------
    ValueError
        When the cell is not a number.

    Examples
    --------
    >>> parse_float(" inf"), parse_float("null"), parse_float("True")
    (inf, None, 1.0)
    """
    s = text.strip()
    if not s or s.lower() in ("null", "none", "n/a"):
        return None
    if bools and s.lower() in _BOOLS:
        return _BOOLS[s.lower()]
    return float(s)


def parse_shape(text: str) -> list[int] | None:
    """Parse a shape cell (``"[4, 16]"``, ``"(1,4096)"``, ``"()"``, ``"torch.Size([2])"``).

    Parameters
    ----------
    text : str

    Returns
    -------
    list of int or None
        None when the cell holds no shape (empty, ``nan``, ``N/A``) or not a plausible one:
        negative or fractional dimensions, or 2**62 elements or more. Never raises.

    Examples
    --------
    >>> parse_shape("(1,4096)"), parse_shape("()"), parse_shape("nan")
    ([1, 4096], [], None)
    >>> parse_shape("[-1, 2]"), parse_shape("[1e400]"), parse_shape("[" * 5000)
    (None, None, None)
    """
    s = text.strip()
    if not s or s.lower() in ("nan", "n/a", "none", "null"):
        return None
    if _SPLIT_DIGITS.search(s):
        return None
    m = _SHAPE.match(_BLANKS.sub("", s))
    if m is None:
        return None
    dims: list[int] = []
    n = 1
    for d in _INTS.findall(m.group(1)):
        if len(d) > 19:
            return None
        v = int(d)
        if v > _MAX_NUMEL:
            return None
        dims.append(v)
        n *= v
    return dims if n < _MAX_NUMEL else None
