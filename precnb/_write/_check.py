"""Checks of an output path before anything is written, and the final publish (a rename, never over someone else's)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from precnb._atomic import rename_noreplace
from precnb._marks import is_precnb_output, suffix_problem
from precnb._write._protect import PathLike, _ident, _ids, _real, protected_roots
from precnb.errors import OutputExistsError, OutputRefusedError


def check_output(path: PathLike, *, inputs: Iterable[PathLike | None] = (), overwrite: bool = False,  # noqa: C901
                 folder: bool = False, content: str | None = None) -> Path:
    """Validate an output path before writing; return it absolute (symlinks of parents kept).

    Parameters
    ----------
    path : path-like
        The output to write.
    inputs : iterable of path-like
        What the command reads (protected with their dumps, see :func:`protected_roots`).
    overwrite : bool
        Allow replacing an existing precnb output of the same shape.
    folder : bool
        The output is a folder (a zarr store); else a file.
    content : {"json", "html", "ipynb", "text"}, optional
        What the file will hold: a name that does not fit it (``report -o r.json``) is refused
        at once (:func:`precnb._marks.suffix_problem`).

    Returns
    -------
    pathlib.Path

    Raises
    ------
    OutputRefusedError
        With the reason: inside / equal to / holding an input, exists (without *overwrite*),
        not a precnb output, a symlink, a missing or unwritable parent folder, ...
    """
    text = os.fspath(path)
    if not text.strip():
        raise OutputRefusedError(repr(text), "empty output path")
    if not folder and text.endswith(("/", os.sep)):
        raise OutputRefusedError(text, "names a folder (ends with '/'); give a file name")
    if "\0" in text:
        raise OutputRefusedError(repr(text), "the path holds a NUL character")
    p = Path(os.path.abspath(Path(text).expanduser()))
    if p.name in ("", ".", ".."):
        raise OutputRefusedError(text, "names a folder, not an output name")
    parent = p.parent
    try:
        pst = os.stat(parent)
    except FileNotFoundError:
        raise OutputRefusedError(text, f"folder {parent} does not exist (precnb does not create folders; "
                                       "create it first)") from None
    except OSError as exc:
        raise OutputRefusedError(text, f"cannot access folder {parent}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(pst.st_mode):
        raise OutputRefusedError(text, f"{parent} is not a folder")
    real = _real(parent) / p.name
    chain = _ids(real)
    own = _ident(real)
    for root in protected_roots(inputs):
        rid = _ident(root)
        if rid is None:
            continue
        if own == rid:
            raise OutputRefusedError(text, f"it is the input {root} (precnb never writes over its inputs)")
        if rid in chain:
            raise OutputRefusedError(text, f"it is inside the input {root} (dumps are read-only; write "
                                           "somewhere else)")
        if own is not None and own in _ids(root):
            raise OutputRefusedError(text, f"the input {root} is inside it")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputRefusedError(text, f"cannot access it: {exc.strerror or exc}") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise OutputRefusedError(text, "it is a symbolic link (precnb does not write through links; "
                                           "give the real path)")
        if folder and not stat.S_ISDIR(st.st_mode):
            raise OutputRefusedError(text, "it exists and is not a folder")
        if not folder and stat.S_ISDIR(st.st_mode):
            raise OutputRefusedError(text, "it is a folder; give a file name")
        if not folder and not stat.S_ISREG(st.st_mode):
            raise OutputRefusedError(text, "it exists and is not a regular file")
        ours = is_precnb_output(p)
        if not ours:
            what = "folder" if folder else "file"
            raise OutputRefusedError(text, f"it exists and is not a precnb output (precnb replaces only "
                                           f"what it wrote; this {what} is left alone)")
    if content is not None and not folder:
        problem = suffix_problem(p, content)
        if problem:
            raise OutputRefusedError(text, problem)
    if st is not None and not overwrite:
        raise OutputExistsError(text, "it exists (pass --overwrite to replace it)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputRefusedError(text, f"cannot write in folder {parent} (permission denied)")
    return p


def _publish(tmp: Path, target: Path, overwrite: bool, folder: bool) -> None:
    shown = str(target)
    if os.path.lexists(target):
        if not overwrite:
            raise OutputExistsError(shown, "it was created by someone else while precnb was writing it")
        if os.path.islink(target) or not is_precnb_output(target):
            raise OutputRefusedError(shown, "it was replaced by something that is not a precnb output "
                                            "while precnb was writing it")
        if not folder:
            os.replace(tmp, target)
            return
        old = target.with_name(f".{target.name}.precnb-old-{secrets.token_hex(4)}")
        os.rename(target, old)
        try:
            rename_noreplace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rename(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        try:
            rename_noreplace(tmp, target)
        except FileExistsError:
            raise OutputExistsError(shown, "it was created by another writer while precnb was writing "
                                           "it (nothing was replaced)") from None
    with contextlib.suppress(OSError):  # make the rename durable
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
