"""Folders (zarr stores): built in a locked ``.NAME.precnb-partial`` sibling, published complete or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from precnb._atomic import lock_nowait
from precnb._marks import is_precnb_output
from precnb._write._check import _publish, check_output
from precnb._write._protect import _FULL, _PARTIAL, _SENTINEL, PathLike, _write_failed
from precnb.errors import OutputRefusedError


def _claim(partial: Path, target: str) -> int:
    """Create (or reclaim a stale) partial folder and hold its lock; returns the locked fd."""
    busy = OutputRefusedError(target, f"another precnb process is writing it now (its partial output is "
                                      f"{partial}); wait for it, or remove that folder if no precnb runs")
    try:
        os.mkdir(partial)
        fresh = True
    except FileExistsError:
        fresh = False
    st = os.lstat(partial)
    if not stat.S_ISDIR(st.st_mode):
        raise OutputRefusedError(target, f"{partial} exists and is not precnb's partial output folder")
    fd = os.open(partial, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
    if not lock_nowait(fd):
        os.close(fd)
        raise busy
    if not fresh:
        names = os.listdir(partial)  # empty: a writer that has not locked it yet lost the race to us
        if names and _SENTINEL not in names and not is_precnb_output(partial):
            os.close(fd)
            raise OutputRefusedError(target, f"{partial} exists and was not left by precnb; remove it")
        for name in names:  # a stale partial output of a writer that was killed
            child = partial / name
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    (partial / _SENTINEL).write_text(str(os.getpid()), encoding="ascii")
    return fd


@contextlib.contextmanager
def writing_folder(path: PathLike, *, inputs: Iterable[PathLike | None] = (),
                   overwrite: bool = False) -> Iterator[Path]:
    """An empty locked temporary folder to fill; published as *path* when the block ends.

    The folder must be marked before the block ends (a zarr store's ``precnb_output``
    attribute, or :func:`precnb._marks.mark_folder`). On error it is removed and *path* is
    untouched.

    Examples
    --------
    >>> with writing_folder("run.zarr", inputs=["dump/"]) as tmp:  # doctest: +SKIP
    ...     ds.to_zarr(tmp)                                   # then mark it
    """
    target = check_output(path, inputs=inputs, overwrite=overwrite, folder=True)
    partial = target.with_name(f".{target.name}{_PARTIAL}")
    fd = _claim(partial, str(path))
    try:
        yield partial
        with contextlib.suppress(FileNotFoundError):
            (partial / _SENTINEL).unlink()
        if not is_precnb_output(partial):
            raise ValueError(f"{target}: the folder written is not marked as a precnb output (see precnb._marks)")
        _publish(partial, target, overwrite, folder=True)
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        full = _full_disk(exc)
        if full is not None:
            raise _write_failed(str(path), full) from None
        raise
    finally:
        os.close(fd)


def _full_disk(exc: BaseException) -> OSError | None:
    """The "disk full" OSError behind *exc* (zarr and dask wrap it), or None."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 8:
        if isinstance(cur, OSError) and cur.errno in _FULL:
            return cur
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None
