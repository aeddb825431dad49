"""The real reason a path cannot be read, for error messages (never opens anything that can block).

``Path.exists()`` says False for a symlink loop and a broken link alike, and ``is_file()`` says
False for a FIFO, a device and a folder: these helpers tell them apart with ``lstat``/``stat``
only (a FIFO is never opened), and find where a text file stops being UTF-8.

The path helpers live in :mod:`precnb._files` (re-exported here for the readers); this module adds
:func:`utf8_reason`.

Examples
--------
>>> utf8_reason("/dev/null") is None  # not a regular file: nothing to decode
True
"""

from __future__ import annotations

import os

from precnb._files import kind_of, missing_reason, not_a_file_reason, read_regular

__all__ = ["kind_of", "missing_reason", "not_a_file_reason", "utf8_reason"]


def utf8_reason(path: str | os.PathLike[str], limit: int = 1 << 20) -> str | None:
    """Where a regular file's first *limit* bytes stop being UTF-8 (``"not UTF-8 text: ..."``), or None."""
    if kind_of(path) is not None:
        return None
    try:
        raw = read_regular(path, limit)
    except OSError:
        return None
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start >= len(raw) - 3 and len(raw) == limit:  # a character cut at the read limit
            return None
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        return (f"not UTF-8 text: invalid byte 0x{raw[exc.start]:02x} at line {line} column {col} "
                f"(byte {exc.start}); re-save it as UTF-8 (e.g. iconv -f GBK -t UTF-8)")
    return None
