"""Filesystem questions the readers ask, answered without raising (one copy for every reader).

A dump may sit behind a folder the user cannot list, a name that is too long or a broken
symlink: discovery must report those, not crash on them, so every check here turns an
``OSError`` into the answer "no".

Every reader opens its files with :func:`open_regular` (from :mod:`precnb._files`, re-exported
here): regular files only; a FIFO or a device is refused without being opened. Side inputs
(:data:`SIDE_INPUTS`) read whole files with :func:`read_input` / :func:`read_text_input` /
:func:`read_json_input`: a size bound, UTF-8 named by line and column, a nesting bound.

Examples
--------
>>> is_file("/nonexistent"), is_dir("/"), is_link("/nonexistent")
(False, True, False)
"""

from __future__ import annotations

from pathlib import Path

from precnb._files import (
    MAX_INPUT_DEPTH,
    NotRegularFileError,
    byte_position,
    check_depth,
    decode_input,
    open_regular,
    read_input,
    read_json_input,
    read_regular,
    read_text_input,
)

__all__ = ["MAX_INPUT_DEPTH", "SIDE_INPUTS", "NotRegularFileError", "byte_position", "check_depth", "decode_input",
           "is_dir", "is_file", "is_link", "list_dir", "open_regular", "os_reason", "read_input", "read_json_input",
           "read_regular", "read_text_input"]

#: the side inputs read beside a run, "module:function" (path) -> parsed: each reads through the input-safety
#: layer of :mod:`precnb._files` (tests/test_input_safety.py feeds every one, and every reader, a FIFO,
#: /dev/zero, a deep document and invalid UTF-8). A new side input is listed here.
SIDE_INPUTS: dict[str, str] = {
    "rank table": "precnb.io.rank_table:read_rank_table",
    "loss log": "precnb.io.losslog:read_loss_log",
    "TensorBoard event file": "precnb.io._tfevents:read_event_scalars",
    "mapping file": "precnb.mapping:load_mapping",
}


def is_file(p: str | Path) -> bool:
    """Whether *p* is a regular file (links followed); False when it cannot be checked."""
    try:
        return Path(p).is_file()
    except OSError:  # permission denied on a parent, name too long, ...
        return False


def is_dir(p: str | Path) -> bool:
    """Whether *p* is a folder (links followed); False when it cannot be checked."""
    try:
        return Path(p).is_dir()
    except OSError:
        return False


def is_link(p: str | Path) -> bool:
    """Whether *p* is a symbolic link (broken or not); False when it cannot be checked."""
    try:
        return Path(p).is_symlink()
    except OSError:
        return False


def list_dir(p: Path) -> list[Path]:
    """Children of *p* sorted by name; raises OSError when *p* cannot be listed."""
    return sorted(p.iterdir(), key=lambda c: c.name)


def os_reason(exc: OSError) -> str:
    """The short reason of an OSError (``"Permission denied"``) for messages.

    Examples
    --------
    >>> os_reason(PermissionError(13, "Permission denied"))
    'Permission denied'
    """
    return exc.strerror or type(exc).__name__
