"""The real reason a path cannot be read, for error messages (never opens anything that can block).

``Path.exists()`` says False for a symlink loop and a broken link alike, and ``is_file()`` says
False for a FIFO, a device and a folder: these helpers tell them apart with ``lstat``/``stat``
only (a FIFO is never opened), and find where a text file stops being UTF-8.

Examples
--------
>>> missing_reason("/nonexistent")
'no such file or directory'
>>> kind_of("/dev/null")
'a character device'
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["kind_of", "missing_reason", "not_a_file_reason", "utf8_reason"]


def missing_reason(path: str | os.PathLike[str]) -> str:
    """Why *path* does not exist: no such file, a broken link (to what), a symlink loop, ..."""
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symbolic link loop in the path (a link that points back to itself)"
        if exc.errno == errno.ENOENT:
            return "no such file or directory"
        return f"cannot access: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        try:
            os.stat(p)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"symbolic link loop ({p} -> {os.readlink(p)} leads back to itself)"
            if exc.errno == errno.ENOENT:
                return f"broken symbolic link (points to {os.readlink(p)}, which does not exist)"
            return f"cannot follow the symbolic link: {exc.strerror or exc}"
    return "cannot access it"


def kind_of(path: str | os.PathLike[str]) -> str | None:
    """``"a FIFO (named pipe)"``, ``"a character device"``, ... for what is not a regular file (links followed).

    None for a regular file or a path that cannot be stat'ed.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def not_a_file_reason(path: str | os.PathLike[str], subject: str | None = None) -> str | None:
    """``"dump.json is a FIFO (named pipe), not a regular file"`` (naming a link's target), or None.

    *subject* replaces the file name at the start (``"it"``).
    """
    kind = kind_of(path)
    if kind is None:
        return None
    p = Path(path)
    shown = subject or p.name
    if p.is_symlink():
        shown = f"{shown} (a link to {os.path.realpath(p)})"
    return f"{shown} is {kind}, not a regular file"


def utf8_reason(path: str | os.PathLike[str], limit: int = 1 << 20) -> str | None:
    """Where a regular file's first *limit* bytes stop being UTF-8 (``"not UTF-8 text: ..."``), or None."""
    if kind_of(path) is not None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # regular (checked above): never blocks
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(limit)
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
