"""Atomic file-system primitives for :mod:`precnb._write` (Linux first, portable fallbacks).

* :func:`rename_noreplace` — rename that never replaces an existing target (``renameat2`` with
  ``RENAME_NOREPLACE`` on Linux; else ``link`` + ``unlink`` for files, check + rename for folders);
* :func:`lock_nowait` — a non-blocking exclusive ``flock`` (True when taken).
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

__all__ = ["lock_nowait", "rename_noreplace"]


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename *src* to *dst*, failing with FileExistsError when *dst* exists (Linux renameat2)."""
    if _renameat2(src, dst):
        return
    if os.path.lexists(dst):  # no renameat2: the window between check and rename is tiny
        raise FileExistsError(errno.EEXIST, "exists", str(dst))
    if src.is_dir():
        os.rename(src, dst)
        return
    try:
        os.link(src, dst)  # atomic exclusive create for a file
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links
        os.rename(src, dst)
        return
    os.unlink(src)


def _renameat2(src: Path, dst: Path) -> bool:
    """True when done; False when renameat2 is unavailable; raises FileExistsError when *dst* exists."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, noreplace = -100, 1
    rc = fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), noreplace)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EEXIST, errno.ENOTEMPTY):
        raise FileExistsError(err, os.strerror(err), str(dst))
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def lock_nowait(fd: int) -> bool:
    """Take an exclusive ``flock`` on *fd* without waiting; True when taken (always True without fcntl)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: mkdir alone keeps writers apart
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True
