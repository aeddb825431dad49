"""Find the readable input inside a folder that wraps it (``run/monitor_output/``, ``run/dump/``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["resolve"]

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
    from precnb.errors import NotADumpError
    from precnb.io.api import detect_format

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

