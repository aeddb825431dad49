"""Reading a msprobe config_check pack (a zip) safely: entry names, links, encryption and sizes checked first.

A zip bomb, a huge pack, an unsafe entry name (absolute, ``..``, a backslash) or a symbolic link is refused with
an error naming the pack and the entry, before anything is decompressed; :func:`_entries` returns the known
entries' bytes. Used by :mod:`precnb.io.config_check`.
"""

from __future__ import annotations

import os
import re
import stat
import zipfile
from pathlib import Path, PurePosixPath

from precnb.errors import DumpFormatError
from precnb.io._fs import open_regular

__all__ = ["Limits", "is_config_check"]

_TOP = ("env", "pip")
_DIRS = ("dataset/", "weights/", "hyperparameters/", "random/")


class Limits:
    """Bounds on what a pack may hold (a zip bomb or a huge pack is refused, not read).

    Attributes
    ----------
    entries : int
        Most entries (100,000).
    entry_bytes : int
        Largest uncompressed entry (256 MiB).
    total_bytes : int
        Largest uncompressed total (2 GiB).
    ratio : int
        Largest compression ratio of an entry above 1 MiB (200).
    """

    entries = 100_000
    entry_bytes = 256 * 2**20
    total_bytes = 2 * 2**30
    ratio = 200


def _bad(path: Path, entry: str, why: str) -> DumpFormatError:
    return DumpFormatError(path, f"config_check pack entry {entry!r}: {why}")


def _known(name: str) -> bool:
    return name in _TOP or name.startswith(_DIRS)


def is_config_check(path: str | os.PathLike[str]) -> bool:
    """Whether *path* is a zip file holding msprobe config_check entries (cheap: reads the directory only)."""
    p = Path(path)
    try:
        if not p.is_file() or not zipfile.is_zipfile(p):
            return False
        with zipfile.ZipFile(p) as zf:
            names = zf.namelist()
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError, NotImplementedError):
        return False
    return bool(names) and any(_known(n) for n in names)


def _check_name(path: Path, info: zipfile.ZipInfo) -> None:
    name = info.filename
    parts = PurePosixPath(name).parts
    if (not name or "\x00" in name or "\\" in name or name.startswith("/") or re.match(r"^[A-Za-z]:", name)
            or ".." in parts):
        raise _bad(path, name, "unsafe entry name (absolute, '..' or a backslash): refused")
    mode = info.external_attr >> 16
    if mode and stat.S_ISLNK(mode):
        raise _bad(path, name, "a symbolic link: refused")
    if info.flag_bits & 0x1:
        raise _bad(path, name, "encrypted: cannot be read")


def _entries(path: Path, limits: type[Limits], skipped: list[tuple[str, str]] | None = None) -> dict[str, bytes]:
    """Every known entry's bytes, read in memory with the size checks of *limits*.

    An entry name that appears twice is read once (the first); the others go to *skipped*.
    """
    try:
        fh = open_regular(path)
    except OSError as exc:
        raise DumpFormatError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        zf = zipfile.ZipFile(fh)
    except zipfile.BadZipFile as exc:
        fh.close()
        raise DumpFormatError(path, f"not a readable zip file: damaged or truncated ({exc})") from None
    except OSError as exc:
        fh.close()
        raise DumpFormatError(path, f"cannot read: {exc.strerror or exc}") from None
    out: dict[str, bytes] = {}
    with fh, zf:
        infos = zf.infolist()
        if len(infos) > limits.entries:
            raise DumpFormatError(path, f"config_check pack has {len(infos)} entries (more than {limits.entries})")
        total = 0
        for info in infos:
            _check_name(path, info)
            if info.is_dir() or not _known(info.filename):
                continue
            if info.filename in out:  # a second entry of the same name: never merged
                if skipped is not None:
                    skipped.append((f"{path} [{info.filename}]", f"not loaded: the pack holds entry "
                                    f"{info.filename!r} more than once (the first is loaded); the copies would "
                                    "replace each other"))
                continue
            if info.file_size > limits.entry_bytes:
                raise _bad(path, info.filename, f"{info.file_size} bytes uncompressed (limit {limits.entry_bytes})")
            if info.file_size > 2**20 and info.file_size > limits.ratio * max(info.compress_size, 1):
                raise _bad(path, info.filename, f"compression ratio above {limits.ratio}: refused (zip bomb?)")
            try:
                with zf.open(info) as fh:  # the header's size is not trusted: read at most one byte more
                    raw = fh.read(limits.entry_bytes + 1)
            except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, NotImplementedError, ValueError) as exc:
                raise _bad(path, info.filename, f"cannot be read ({type(exc).__name__}: {exc})") from None
            if len(raw) > limits.entry_bytes:
                raise _bad(path, info.filename, f"more than {limits.entry_bytes} bytes uncompressed")
            total += len(raw)
            if total > limits.total_bytes:
                raise DumpFormatError(path, f"config_check pack holds more than {limits.total_bytes} bytes")
            out[info.filename] = raw
    if not out:
        raise DumpFormatError(path, "zip file holds no config_check entry (env, pip, dataset/, weights/, "
                                    "hyperparameters/, random/)")
    return out
