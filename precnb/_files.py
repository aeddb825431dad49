"""Reading regular files only: the one helper every reader (and the mapping loader) opens files with.

A FIFO named ``*.npy`` or ``dump.json`` would block a reader forever, a device would stream
without end: :func:`open_regular` refuses anything but a regular file without opening it, and
the open itself never blocks (``O_NONBLOCK``, then ``fstat``) should the path be swapped in
between. :class:`NotRegularFileError` is an ``OSError`` whose ``strerror`` says what the path is.
The reason helpers tell a symlink loop, a broken link and a missing file apart (``Path.exists()``
says False for all three), with ``lstat``/``stat`` only.

Examples
--------
>>> missing_reason("/nonexistent")
'no such file or directory'
>>> kind_of("/dev/null")
'a character device'
>>> open_regular("/dev/null")
Traceback (most recent call last):
...
precnb._files.NotRegularFileError: [Errno 22] it is a character device, not a regular file: '/dev/null'
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Any

__all__ = ["NotRegularFileError", "kind_of", "missing_reason", "not_a_file_reason", "open_regular", "read_regular"]


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
