"""Which reader reads a path: :func:`detect_format`, and :func:`resolve` for a folder that wraps the input.

Detection asks the registry's readers (:mod:`precnb.io.readers`) in their detection order.
"""

from __future__ import annotations

from pathlib import Path

from precnb.errors import NotADumpError
from precnb.io import _why
from precnb.io._fs import open_regular
from precnb.io.readers import describe, readers

__all__ = ["detect_format", "resolve"]


def detect_format(path: str | Path) -> str:
    """Guess which reader handles *path*.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    str
        The reader's name (see :func:`precnb.io.readers.reader_names`).

    Raises
    ------
    NotADumpError
        When no reader recognises the path.

    Examples
    --------
    >>> detect_format("/nonexistent")
    Traceback (most recent call last):
    ...
    precnb.errors.NotADumpError: /nonexistent: no such file or directory
    """
    p = Path(path)
    try:
        if not p.exists():
            raise NotADumpError(f"{p}: {_why.missing_reason(p)}")
    except OSError as exc:
        raise NotADumpError(f"{p}: cannot access: {exc.strerror or exc}") from None
    kind = _why.kind_of(p)
    if kind is not None and kind != "a folder":  # a FIFO, a device: never opened
        raise NotADumpError(f"{p}: {_why.not_a_file_reason(p, 'it')}; precnb reads dump folders and files")
    for reader in readers():
        if reader.detects(p):
            return reader.name
    if kind is None:
        bad_zip = _zip_reason(p)
        if bad_zip:  # e.g. a config_check pack cut short by a copy: say so rather than "not recognised"
            raise NotADumpError(f"{p}: {bad_zip}")
    if kind is None and p.suffix.lower() in (".csv", ".json"):
        bad = _why.utf8_reason(p)
        if bad:  # e.g. a GBK-encoded compare result: say so rather than "not recognised"
            raise NotADumpError(f"{p}: {bad}")
    raise NotADumpError(f"{p}: not a recognised input (expected {describe()})")


def _zip_reason(p: Path) -> str | None:
    """Why *p*, a zip file by its name or its first bytes, cannot be read as one (``None`` if it can, or is none).

    Examples
    --------
    >>> _zip_reason(Path("/nonexistent.zip")) is None
    True
    """
    import zipfile

    try:
        with open_regular(p) as fh:
            head = fh.read(4)
    except OSError:
        return None
    if not (p.suffix.lower() == ".zip" or head in (b"PK\x03\x04", b"PK\x05\x06")):
        return None
    try:
        with zipfile.ZipFile(p) as zf:
            zf.infolist()
    except zipfile.BadZipFile:
        return ("a truncated or damaged zip file (its zip directory cannot be read); "
                "a config_check pack must be a complete zip")
    except (OSError, ValueError, RuntimeError, NotImplementedError, EOFError) as exc:
        return f"a damaged zip file, not readable ({type(exc).__name__}: {exc})"
    return None


_IGNORE = {"configs", "run_logs", "logs", "__pycache__", ".ipynb_checkpoints"}


def resolve(path: Path, format: str | None = None) -> tuple[Path, str]:
    """The input to read and its format, detected once.

    *path* itself when a reader recognises it (or *format* is forced), else its single
    recognisable sub-folder: a sample folder often holds the dump next to ``configs/`` and a
    ``ground_truth.json``, and the user should not have to know the inner folder's name.

    Raises
    ------
    NotADumpError
        When neither *path* nor exactly one sub-folder is recognised (the error is about *path*).
    """
    if format:
        return path, format
    try:
        return path, detect_format(path)
    except NotADumpError as exc:
        try:
            is_dir = path.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            raise
        error = exc
    found: list[tuple[Path, str]] = []
    try:
        children = sorted(c for c in path.iterdir() if c.is_dir() and c.name not in _IGNORE)
    except OSError:
        raise error from None
    for child in children:
        try:
            found.append((child, detect_format(child)))
        except NotADumpError:
            continue
    if len(found) == 1:
        return found[0]
    raise error

