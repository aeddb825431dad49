"""Reading regular files only: the one input-safety layer every reader and side input opens files with.

Four rules, one copy (issue #49): a regular file only (:func:`open_regular`), at most a size bound
(:func:`read_input`), UTF-8 text whose first invalid byte is named by line and column
(:func:`decode_input`), and JSON nested at most :data:`MAX_INPUT_DEPTH` levels (:func:`check_depth`,
:func:`read_json_input`). Every refusal is a :class:`~precnb.errors.DumpFormatError` naming the file.

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

__all__ = ["MAX_INPUT_DEPTH", "NotRegularFileError", "byte_position", "check_depth", "decode_input", "kind_of",
           "missing_reason", "not_a_file_reason", "open_regular", "read_input", "read_json_input", "read_regular",
           "read_text_input"]


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


#: JSON nesting a side input may have (a rank table, a mapping, a store attribute): far beyond any real one
MAX_INPUT_DEPTH = 64


def _size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


def read_input(path: str | os.PathLike[str], limit: int, *, what: str = "file") -> bytes:
    """The bytes of the regular file *path*, refused (naming it) above *limit* bytes.

    Never blocks on a FIFO, never streams a device (``/dev/zero``): the size is checked before the
    read and the read itself stops at ``limit + 1`` bytes (a file that grows, or lies about its size).

    Raises
    ------
    precnb.errors.DumpFormatError
        Not a regular file, missing, unreadable or larger than *limit* (the message names the file).

    Examples
    --------
    >>> read_input("/dev/zero", 10, what="rank table")
    Traceback (most recent call last):
    ...
    precnb.errors.DumpFormatError: /dev/zero: it is a character device, not a regular file
    """
    from precnb.errors import DumpFormatError

    p = os.fspath(path)
    try:
        with open_regular(p) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > limit:
                raise DumpFormatError(p, f"{_size_text(size)} is more than a {what} may hold ({_size_text(limit)})")
            raw = fh.read(limit + 1)
    except FileNotFoundError:
        raise DumpFormatError(p, missing_reason(p)) from None
    except OSError as exc:
        raise DumpFormatError(p, exc.strerror or str(exc)) from None
    if len(raw) > limit:
        raise DumpFormatError(p, f"more than a {what} may hold ({_size_text(limit)})")
    return raw


def byte_position(raw: bytes, pos: int) -> str:
    r"""``"line 3 column 7 (byte 40)"`` for the byte offset *pos* of *raw*.

    Examples
    --------
    >>> byte_position(b"ab\ncd", 4)
    'line 2 column 2 (byte 4)'
    """
    line = raw.count(b"\n", 0, pos) + 1
    col = pos - (raw.rfind(b"\n", 0, pos) + 1) + 1
    return f"line {line} column {col} (byte {pos})"


def decode_input(raw: bytes, path: str | os.PathLike[str]) -> str:
    r"""*raw* as strict UTF-8 (a byte-order mark dropped); the first invalid byte is named by line and column.

    Encoded surrogates (``ED A0 80``) are invalid UTF-8 too: never kept as a lone ``\ud800``.

    Examples
    --------
    >>> decode_input(b"a,b\n\xed\xa0\x80", "t.csv")
    Traceback (most recent call last):
    ...
    precnb.errors.DumpFormatError: t.csv: not UTF-8 text: invalid byte 0xed at line 2 column 1 (byte 4)
    """
    from precnb.errors import DumpFormatError

    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = exc.start + (3 if raw.startswith(b"\xef\xbb\xbf") else 0)
        raise DumpFormatError(os.fspath(path), f"not UTF-8 text: invalid byte 0x{raw[start]:02x} at "
                                               f"{byte_position(raw, start)}") from None


def read_text_input(path: str | os.PathLike[str], limit: int, *, what: str = "file") -> str:
    """:func:`read_input`, then :func:`decode_input`."""
    return decode_input(read_input(path, limit, what=what), path)


_JSON_STRING = None


def check_depth(text: str, path: str | os.PathLike[str], limit: int = MAX_INPUT_DEPTH) -> None:
    """Refuse JSON *text* nested more than *limit* levels (brackets inside strings do not count).

    Linear, and no recursion: a 100,000-deep document is named, never a ``RecursionError``.

    Examples
    --------
    >>> check_depth('{"a": "[[[[", "b": [[1]]}', "x.json", 2)
    Traceback (most recent call last):
    ...
    precnb.errors.DumpFormatError: x.json: JSON nested more than 2 levels at line 1 column 21 (char 20)
    """
    import re

    from precnb.errors import DumpFormatError

    if text.count("[") + text.count("{") <= limit:
        return
    global _JSON_STRING
    if _JSON_STRING is None:
        _JSON_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
    depth = 0
    last = 0
    for m in re.finditer(r'[\[\]{}"]', text):
        i = m.start()
        if i < last:
            continue
        ch = text[i]
        if ch == '"':
            s = _JSON_STRING.match(text, i)
            last = s.end() if s is not None else len(text)
            continue
        if ch in "[{":
            depth += 1
            if depth > limit:
                line = text.count("\n", 0, i) + 1
                col = i - (text.rfind("\n", 0, i) + 1) + 1
                raise DumpFormatError(os.fspath(path), f"JSON nested more than {limit} levels at line {line} "
                                                       f"column {col} (char {i})")
        else:
            depth -= 1


def read_json_input(path: str | os.PathLike[str], limit: int, *, what: str = "file",
                    depth: int = MAX_INPUT_DEPTH) -> Any:
    """A JSON side input through every rule: regular file, *limit* bytes, UTF-8, *depth* levels.

    ``NaN`` / ``Infinity`` tokens are read as floats (Python's ``json``); an error names the line and column.
    """
    import json

    from precnb.errors import DumpFormatError

    text = read_text_input(path, limit, what=what)
    check_depth(text, path, depth)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DumpFormatError(os.fspath(path), f"invalid JSON at line {exc.lineno} column {exc.colno}: "
                                               f"{exc.msg}") from None
    except (ValueError, RecursionError) as exc:  # an integer of more than 4300 digits
        raise DumpFormatError(os.fspath(path), f"invalid JSON: {exc}") from None
