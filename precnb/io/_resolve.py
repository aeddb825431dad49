"""Find the readable input inside a folder that wraps it (``run/monitor_output/``, ``run/dump/``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["resolve_input"]

_IGNORE = {"configs", "run_logs", "logs", "__pycache__", ".ipynb_checkpoints"}


def resolve_input(path: Path) -> Path:
    """Return *path*, or its single recognisable sub-folder when *path* itself is not an input.

    A sample folder often holds the dump next to ``configs/`` and a ``ground_truth.json``; the
    user should not have to know the inner folder's name.
    """
    from precnb.errors import NotADumpError
    from precnb.io.api import detect_format

    try:
        detect_format(path)
        return path
    except NotADumpError:
        try:
            is_dir = path.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            raise
    found = []
    try:
        children = sorted(c for c in path.iterdir() if c.is_dir() and c.name not in _IGNORE)
    except OSError:
        return path
    for child in children:
        try:
            detect_format(child)
        except NotADumpError:
            continue
        found.append(child)
    return found[0] if len(found) == 1 else path
