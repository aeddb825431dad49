"""Refuse, before parsing, a load that cannot fit in memory (rather than die in the kernel's OOM killer).

The estimate is per reader: bytes of memory per byte of input for the dataset that stays, plus
the transient peak of parsing the largest file. Available memory is the kernel's
``MemAvailable`` and, inside a container, what its cgroup limit leaves. Set
``PRECNB_NO_MEMORY_CHECK=1`` to load anyway.

Examples
--------
>>> check_memory("run", [("run/a.json", 10)], per_byte=1.0, largest_per_byte=1.5)
>>> available_memory() is None or available_memory() > 0
True
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from precnb.errors import InsufficientMemoryError

__all__ = ["available_memory", "check_memory", "return_free_memory"]

_GIB = float(1 << 30)
_TRIM: list[Any] = []  # [glibc's malloc_trim or None], looked up on first use


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_available() -> int | None:
    try:
        with open("/proc/self/cgroup", encoding="ascii") as fh:
            rel = next((ln.split("::", 1)[1].strip() for ln in fh if ln.startswith("0::")), None)
        if rel is None:
            return None
        base = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text().strip()))
    except (OSError, ValueError):
        return None


def available_memory() -> int | None:
    """Bytes this process can still allocate without swapping (None when unknown)."""
    values = [v for v in (_meminfo_available(), _cgroup_available()) if v is not None]
    return min(values) if values else None


def check_memory(path: str | os.PathLike[str], sizes: Sequence[tuple[str, int]], per_byte: float,
                 largest_per_byte: float = 0.0, *, what: str = "input") -> None:
    """Raise :class:`~precnb.errors.InsufficientMemoryError` when loading *sizes* cannot fit.

    Parameters
    ----------
    path : path-like
        What the user asked to open (named in the message).
    sizes : sequence of (file, bytes)
        The files the load will parse.
    per_byte : float
        Memory per input byte that the loaded dataset keeps.
    largest_per_byte : float
        Transient memory per byte of the largest file while it is parsed.
    what : str
        The kind of file, for the message.
    """
    if not sizes or os.environ.get("PRECNB_NO_MEMORY_CHECK"):
        return
    total = sum(b for _, b in sizes)
    big_file, big = max(sizes, key=lambda s: s[1])
    need = per_byte * total + largest_per_byte * big
    avail = available_memory()
    if avail is None or need <= avail:
        return
    raise InsufficientMemoryError(
        f"{path}: loading {len(sizes)} {what} file(s) of {total / _GIB:.2f} GiB needs about "
        f"{need / _GIB:.1f} GiB of memory and {avail / _GIB:.1f} GiB is available (largest file: {big_file}, "
        f"{big / _GIB:.2f} GiB); load fewer steps or ranks (--steps / --ranks on the command line, "
        "steps= / ranks= in Python), or convert the dump to a zarr store step by step (precnb convert) "
        "and open that with lazy=True (PRECNB_NO_MEMORY_CHECK=1 loads anyway)")


def return_free_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing elsewhere).

    glibc keeps memory freed in the middle of its heap, and raises its threshold for serving large
    blocks from there once a large block is freed (a construct.json's text, say): after a parse
    step, tens of MB of freed columns and lists stay resident where the next step's Python
    objects, which come from their own memory maps, cannot use them. Returning them keeps them
    out of the peak RSS. It costs milliseconds; call it between the steps of a large load.
    """
    if not _TRIM:
        trim = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                trim = ctypes.CDLL(None).malloc_trim
                trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
            except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
                trim = None
        _TRIM.append(trim)
    if _TRIM[0] is not None:
        _TRIM[0](0)
