"""Filesystem questions the readers ask, answered without raising (one copy for every reader).

A dump may sit behind a folder the user cannot list, a name that is too long or a broken
symlink: discovery must report those, not crash on them, so every check here turns an
``OSError`` into the answer "no".

Every reader opens its files with :func:`open_regular`: regular files only. A FIFO named
``*.npy`` or ``dump.json`` (or a device) is refused without being opened — and, should it be
swapped in between, the open itself never blocks (``O_NONBLOCK``, then ``fstat``) — with
:class:`NotRegularFileError`, an ``OSError`` whose reason says what the path is.

Examples
--------
>>> is_file("/nonexistent"), is_dir("/"), is_link("/nonexistent")
(False, True, False)
>>> open_regular("/dev/null")
Traceback (most recent call last):
...
precnb.io._fs.NotRegularFileError: [Errno 22] it is a character device, not a regular file: '/dev/null'
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Any

__all__ = ["NotRegularFileError", "is_dir", "is_file", "is_link", "list_dir", "open_regular", "os_reason",
           "read_regular"]


class NotRegularFileError(OSError):
    """A path that is a FIFO, a device, a socket or a folder where a file is read (``strerror`` says which)."""


def open_regular(path: str | os.PathLike[str], mode: str = "rb", *, encoding: str | None = None,
                 errors: str | None = None, newline: str | None = None) -> IO[Any]:
    """Open a regular file for reading; never opens (nor blocks on) a FIFO or a device.

    Parameters
    ----------
    path : path-like
    mode : {"rb", "r"}
    encoding, errors, newline
        As for :func:`open` (text mode).

    Raises
    ------
    NotRegularFileError
        *path* is not a regular file (the reason names what it is, a link's target included).
    OSError
        It cannot be opened (missing, permission denied, ...).
    """
    from precnb.io._why import not_a_file_reason

    if mode not in ("rb", "r"):
        raise ValueError(f"open_regular reads only ('rb' or 'r'), not {mode!r}")
    reason = not_a_file_reason(path, "it")
    if reason is not None:
        raise NotRegularFileError(errno.EINVAL, reason, os.fspath(path))
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped in after the check above
            raise NotRegularFileError(errno.EINVAL, "it is not a regular file", os.fspath(path))
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
        if mode == "rb":
            return os.fdopen(fd, "rb")
        return os.fdopen(fd, "r", encoding=encoding, errors=errors, newline=newline)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of a regular file (at most *limit*), by :func:`open_regular`'s rules."""
    with open_regular(path) as fh:
        return fh.read() if limit is None else fh.read(limit)


def is_file(p: str | Path) -> bool:
    """Whether *p* is a regular file (links followed); False when it cannot be checked."""
    try:
        return Path(p).is_file()
    except OSError:  # permission denied on a parent, name too long, ...
        return False


def is_dir(p: str | Path) -> bool:
    """Whether *p* is a folder (links followed); False when it cannot be checked."""
    try:
        return Path(p).is_dir()
    except OSError:
        return False


def is_link(p: str | Path) -> bool:
    """Whether *p* is a symbolic link (broken or not); False when it cannot be checked."""
    try:
        return Path(p).is_symlink()
    except OSError:
        return False


def list_dir(p: Path) -> list[Path]:
    """Children of *p* sorted by name; raises OSError when *p* cannot be listed."""
    return sorted(p.iterdir(), key=lambda c: c.name)


def os_reason(exc: OSError) -> str:
    """The short reason of an OSError (``"Permission denied"``) for messages.

    Examples
    --------
    >>> os_reason(PermissionError(13, "Permission denied"))
    'Permission denied'
    """
    return exc.strerror or type(exc).__name__
