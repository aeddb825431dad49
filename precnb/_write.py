r"""Every file or folder precnb writes goes through here: nothing a user owns is ever lost.

Rules (each refusal raises :class:`~precnb.errors.OutputRefusedError`, one line naming the
path and why; the CLI prints it and exits 1):

* **Inputs are read-only.** An output inside an input, equal to it, or holding it is refused.
  An input is protected with the dump it belongs to: ``RUN/step0/rank0/dump.json`` protects
  ``RUN`` (the folder above its ``step*``/``rank*``/``proc*`` folders). Paths are compared
  after resolving symlinks and by (device, inode), so links, ``..``, trailing slashes,
  relative paths and case-insensitive file systems do not get around it.
* **Nothing is replaced that precnb did not create.** An existing output is refused unless
  ``overwrite`` is given, and even then only a precnb output (:mod:`precnb._marks`) of the same
  shape (file or folder) is replaced. A symlink is never written through.
* **No folder is created.** A missing parent folder is an error (create it first).
* **Atomic.** A file is written to a temporary sibling, flushed, then renamed over the target
  (never over something that appeared meanwhile). A folder (zarr store) is built in the sibling
  ``.NAME.precnb-partial`` that one writer at a time holds locked: a second concurrent writer
  fails at once ("another precnb process is writing it"); the store appears complete or not at
  all. A partial folder left by a killed writer is reclaimed by the next one.

API for writers (all take ``inputs=``: the paths the command reads; ``overwrite=``):

* :func:`check_output` — validate early (before long work), returns the absolute path;
* :func:`write_text` / :func:`write_bytes` — write a whole file (its content must carry a
  marker: :func:`~precnb._marks.html_marker`, :func:`~precnb._marks.text_marker`, or
  ``{"precnb_output": marker(kind)}`` in JSON / notebook metadata);
* :func:`writing_file` — a temporary path for a tool that writes the file itself, published
  when the ``with`` block ends;
* :func:`writing_folder` — a temporary folder, published when the ``with`` block ends
  (mark it: zarr attribute ``precnb_output``, or :func:`~precnb._marks.mark_folder`).

Examples
--------
>>> import tempfile, pathlib
>>> from precnb._marks import text_marker
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> out = write_text(d / "plan.txt", text_marker("dump-plan") + "\nstep 3\n", inputs=[])
>>> out.read_text().splitlines()[1]
'step 3'
>>> write_text(d / "plan.txt", "x", inputs=[])
Traceback (most recent call last):
...
precnb.errors.OutputExistsError: refusing to write .../plan.txt: it exists (pass --overwrite to replace it)
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from precnb._atomic import lock_nowait, rename_noreplace
from precnb._marks import content_kind, has_marker, is_precnb_output, sidecar_json, sidecar_path, suffix_problem
from precnb.errors import OutputExistsError, OutputRefusedError

__all__ = ["STORE_ATTR", "check_output", "dataset_inputs", "protected_roots", "write_bytes", "write_text",
           "writing_file", "writing_folder"]

#: the key under which a dataset opened from a zarr store records that store (an input as well), in
#: ``ds.encoding`` (kept by selections; never written); a combined dataset keeps it per run in ``run_attrs``
STORE_ATTR = "precnb_store"

PathLike = str | os.PathLike[str]
# folder names that are part of a dump's structure: an input inside one protects the dump root
_DUMP_PART = re.compile(r"^(step[0-9]+|rank[0-9]*|rank_[0-9]+|proc[0-9]+|.*-rank[0-9]+-[0-9A-Za-z]+)$")
_SIDE_FILES = ("dump.json", "debug.json", "construct.json", "stack.json", "statistic.csv")
_PARTIAL = ".precnb-partial"
_SENTINEL = ".precnb-writing"
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # the output's file system cannot take it


def _write_failed(shown: str, exc: OSError) -> OutputRefusedError:
    """An OSError while writing an output, as one line naming the output (nothing was published)."""
    why = exc.strerror or type(exc).__name__
    if exc.errno in _FULL:
        why += ": the file system holding it is full (free some space, or write elsewhere)"
    return OutputRefusedError(shown, f"cannot write it: {why}; nothing was written")


# ----------------------------------------------------------------------------- what to protect
def _real(p: Path) -> Path:
    return Path(os.path.realpath(p))


def protected_roots(inputs: Iterable[PathLike | None]) -> list[Path]:
    """The folders and files an output must stay out of, for the given inputs (resolved paths).

    Examples
    --------
    >>> [p.name for p in protected_roots(["/data/RUN/step0/rank0/dump.json"])]
    ['RUN']
    >>> [p.name for p in protected_roots(["/data/results/compare_result.csv"])]
    ['compare_result.csv']
    """
    out: list[Path] = []
    for given in inputs:
        if given is None or str(given) == "":
            continue
        p = _real(Path(given).expanduser())
        try:
            is_file = not stat.S_ISDIR(os.stat(p).st_mode)
        except OSError:
            is_file = p.suffix != ""
        here = p.parent if is_file else p
        inside_dump = is_file and p.name in _SIDE_FILES
        if is_file and p.name == "statistic.csv" and here.name.isdigit() and here.parent.name.isdigit():
            here = here.parent.parent.parent  # a kernel dump: rank_<id>/<net>/<graph>/<iteration>/
        while here.parent != here and _DUMP_PART.match(here.name):
            inside_dump = True
            here = here.parent
        root = here if inside_dump else p
        if root not in out:
            out.append(root)
    return out


def dataset_inputs(ds: Any) -> list[str]:
    """The source paths recorded in a dataset's attributes (``source``, per-run sources, zarr stores).

    A dataset reopened from a zarr store names the dump it was converted from as its ``source``;
    the store it was read from (:data:`STORE_ATTR`) is an input too. A :class:`precnb.Triage`
    gives those of the runs it holds.
    """
    import json

    if ds is None:
        return []
    if not hasattr(ds, "attrs"):  # a precnb.Triage (or alike): the runs it holds
        return [p for name in ("raw_target", "raw_baseline", "target", "baseline")
                for p in dataset_inputs(getattr(ds, name, None))]
    attrs = getattr(ds, "attrs", {}) or {}
    out = [str(attrs[k]) for k in ("source", STORE_ATTR) if attrs.get(k)]
    store = (getattr(ds, "encoding", None) or {}).get(STORE_ATTR)
    if store:
        out.append(str(store))
    raw = attrs.get("run_attrs")
    try:
        runs = json.loads(raw) if isinstance(raw, str) else (raw or {})
    except ValueError:
        runs = {}
    for own in runs.values() if isinstance(runs, dict) else ():
        if isinstance(own, dict):
            out += [str(own[k]) for k in ("source", STORE_ATTR) if own.get(k)]
    return [s for s in out if not s.startswith("(")]


def _ids(p: Path) -> list[tuple[int, int]]:
    """(device, inode) of *p* (when it exists) and of every ancestor."""
    out = []
    cur = p
    while True:
        with contextlib.suppress(OSError):
            st = os.stat(cur)
            out.append((st.st_dev, st.st_ino))
        if cur.parent == cur:
            return out
        cur = cur.parent


def _ident(p: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(p)
    except OSError:
        return None
    return st.st_dev, st.st_ino


# ----------------------------------------------------------------------------- checks
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


# ----------------------------------------------------------------------------- files
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


# ----------------------------------------------------------------------------- folders
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
