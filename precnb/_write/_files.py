"""Files: written to a temporary sibling, flushed, then renamed over the target."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from precnb._marks import content_kind, has_marker, sidecar_json, sidecar_path, suffix_problem
from precnb._write._check import _publish, check_output
from precnb._write._protect import _FULL, PathLike, _write_failed
from precnb.errors import OutputRefusedError


def _temp_file(target: Path) -> tuple[Path, int]:
    for _ in range(100):
        tmp = target.with_name(f".{target.name}.precnb-tmp-{secrets.token_hex(4)}{target.suffix}")  # same suffix
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
    raise OutputRefusedError(str(target), "cannot create a temporary file beside it")


def _check_sidecar(target: Path, shown: str) -> Path:
    side = sidecar_path(target)
    try:
        st = os.lstat(side)
    except FileNotFoundError:
        return side
    except OSError as exc:
        raise OutputRefusedError(shown, f"cannot access {side}: {exc.strerror or exc}") from None
    raw = b""
    if stat.S_ISREG(st.st_mode) and st.st_size < 1 << 20:
        with contextlib.suppress(OSError), open(side, "rb") as fh:
            raw = fh.read()
    if not raw.startswith(b'{"precnb_output": {"writer": "precnb"'):
        raise OutputRefusedError(shown, f"{side} (the marker file precnb writes beside a table) exists and is "
                                        "not precnb's; it is left alone")
    return side


def _write_temp(target: Path, data: bytes) -> Path:
    tmp, fd = _temp_file(target)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def write_bytes(path: PathLike, data: bytes, *, inputs: Iterable[PathLike | None] = (),
                overwrite: bool = False, sidecar: str | None = None) -> Path:
    """Write *data* to *path* atomically under the rules above; returns the path written.

    Parameters
    ----------
    sidecar : str, optional
        A table (CSV) that cannot hold a marker line: marked instead by a sidecar
        ``.NAME.precnb_output`` of this kind, describing the file's size and sha256.

    Raises
    ------
    OutputRefusedError
        See :func:`check_output`; also when the name does not fit the content (a ``.json``
        name for an HTML page) and when the write fails (a full disk), naming the path.
    ValueError
        *data* carries no precnb marker (a writer bug: a later ``--overwrite`` could not
        recognise the file).
    """
    target = check_output(path, inputs=inputs, overwrite=overwrite)
    shown = str(path)
    side = _check_sidecar(target, shown) if sidecar else None
    if side is None and not has_marker(target, data):
        kind = content_kind(data)
        problem = suffix_problem(target, kind) if kind else None
        if problem:
            raise OutputRefusedError(shown, problem)
        raise ValueError(f"{target}: the content carries no precnb marker (see precnb._marks)")
    tmp = None
    try:
        tmp = _write_temp(target, data)
        _publish(tmp, target, overwrite, folder=False)
        tmp = None
        if side is not None and sidecar is not None:
            side_tmp = _write_temp(side, sidecar_json(target, data, sidecar).encode())
            os.replace(side_tmp, side)
    except OSError as exc:
        if isinstance(exc, FileExistsError) or exc.errno not in _FULL | {errno.EIO, errno.EROFS}:
            raise
        raise _write_failed(shown, exc) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return target


def write_text(path: PathLike, text: str, *, inputs: Iterable[PathLike | None] = (), overwrite: bool = False,
               encoding: str = "utf-8", sidecar: str | None = None) -> Path:
    """:func:`write_bytes` of *text* encoded with *encoding* (UTF-8)."""
    return write_bytes(path, text.encode(encoding), inputs=inputs, overwrite=overwrite, sidecar=sidecar)


@contextlib.contextmanager
def writing_file(path: PathLike, *, inputs: Iterable[PathLike | None] = (),
                 overwrite: bool = False) -> Iterator[Path]:
    """A temporary sibling path to write; published over *path* when the block ends without error.

    Examples
    --------
    >>> with writing_file("nb.ipynb", inputs=["dump/"]) as tmp:  # doctest: +SKIP
    ...     nbformat.write(nb, tmp)   # nb.metadata["precnb_output"] = marker("notebook")
    """
    target = check_output(path, inputs=inputs, overwrite=overwrite)
    tmp, fd = _temp_file(target)
    os.close(fd)
    try:
        yield tmp
        raw = tmp.read_bytes() if tmp.stat().st_size <= 512 * 1024 * 1024 else b""
        if not has_marker(target, raw):
            kind = content_kind(raw)
            problem = suffix_problem(target, kind) if kind else None
            if problem:
                raise OutputRefusedError(str(path), problem)
            raise ValueError(f"{target}: the content carries no precnb marker (see precnb._marks)")
        _publish(tmp, target, overwrite, folder=False)
    except OSError as exc:
        if exc.errno not in _FULL:
            raise
        raise _write_failed(str(path), exc) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
