"""What a tensor file may hold, checked before anything is materialised (issue 23, item 4).

A 629-byte ``.pt`` can claim 12 GB (a stride-0 view of one element) and a 3 MB zip member can
expand to gigabytes; reading either used to end the whole command ("out of memory"). Every tensor
file is now checked first against what its dump record says (:class:`Expected`: the element
count and dtype of the record; a saved slice may hold fewer elements, never more) and against
itself (a view never holds more elements than its storage; a compressed member expands at most
:data:`MAX_RATIO` times; a ``.npy`` holds the bytes its header claims). A file that fails is
refused with :class:`TensorRefusedError` — one unreadable tensor, named, never the end of the
command.

Examples
--------
>>> Expected(numel=256, dtype="torch.float32").check("x.pt", numel=256, dtype="torch.float32")
>>> Expected(numel=256).check("x.pt", numel=3_000_000_000, dtype="torch.float32")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
precnb.io._expect.TensorRefusedError: x.pt: holds 3000000000 elements, its dump record says 256; refused ...
>>> dtype_key("Float32"), dtype_key("torch.float"), dtype_key("bool_")
('float32', 'float32', 'bool')
"""

from __future__ import annotations

import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from precnb.errors import DumpFormatError

__all__ = ["MAX_RATIO", "Expected", "TensorRefusedError", "check_archive", "check_npy", "dtype_key"]

MAX_RATIO = 64  # a compressed zip member may expand this much at most (torch.save stores them uncompressed)
_ALIASES = {"float": "float32", "half": "float16", "double": "float64", "long": "int64", "int": "int32",
            "short": "int16", "bool_": "bool", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32",
            "cfloat": "complex64", "cdouble": "complex128", "byte": "uint8", "char": "int8"}
# a record dtype numpy cannot hold is saved widened (bf16 -> fp32 .npy): compatible
_WIDENED = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "hifloat8"})


class TensorRefusedError(DumpFormatError):
    """A tensor file larger than its record (or than itself) allows: refused before it is read."""


def dtype_key(name: Any) -> str:
    """A dtype name in one spelling: ``torch.float32``, ``Float32``, ``float32``, ``float`` -> ``float32``."""
    s = str(name or "").strip().lower()
    for prefix in ("torch.", "mindspore.", "numpy.", "np."):
        if s.startswith(prefix):
            s = s[len(prefix):]
    return _ALIASES.get(s, s)


@dataclass(frozen=True, slots=True)
class Expected:
    """What a tensor file's dump record says it holds (None: not known)."""

    numel: int | None = None
    dtype: str | None = None

    @classmethod
    def of(cls, numel: Any = None, dtype: Any = None) -> Expected:
        """From dataset values (``numel`` -1 or NaN and dtype ``""`` are unknown)."""
        try:
            n = int(numel) if numel is not None and not (isinstance(numel, float) and math.isnan(numel)) else None
        except (TypeError, ValueError, OverflowError):
            n = None
        d = str(dtype) if dtype is not None and str(dtype).strip() not in ("", "nan", "None", "?") else None
        return cls(n if n is not None and n >= 0 else None, d)

    def check(self, path: str | Path, *, numel: int, dtype: str | None = None) -> None:
        """Refuse a tensor of *numel* elements of *dtype* that its record does not allow."""
        if self.numel is not None and numel > self.numel:
            raise TensorRefusedError(path, f"holds {numel} elements, its dump record says {self.numel}; refused "
                                           "before reading it")
        if dtype is not None and self.dtype is not None:
            saved, rec = dtype_key(dtype), dtype_key(self.dtype)
            if saved != rec and not (rec in _WIDENED and saved == "float32"):
                raise TensorRefusedError(path, f"holds {dtype}, its dump record says {self.dtype}; refused")

    def max_bytes(self, itemsize: int) -> int | None:
        """The most bytes a storage of *itemsize* elements may hold (None: unknown)."""
        return None if self.numel is None else max(self.numel, 1) * int(itemsize)


def check_archive(path: str | Path, zf: zipfile.ZipFile, expected: Expected | None = None) -> None:
    """Refuse a zip whose members expand beyond :data:`MAX_RATIO` or, in all, beyond what the record allows."""
    total = 0
    for info in zf.infolist():
        if info.compress_type != zipfile.ZIP_STORED and info.file_size > MAX_RATIO * max(info.compress_size, 1024):
            raise TensorRefusedError(path, f"zip member {info.filename[:80]} expands {info.compress_size} bytes to "
                                           f"{info.file_size} (a zip bomb?); refused")
        total += info.file_size
    # the storages, plus the small pickle and metadata members torch writes (16 bytes per element at most)
    limit = None if expected is None or expected.numel is None else 16 * max(expected.numel, 1) + (1 << 20)
    if limit is not None and total > limit:
        raise TensorRefusedError(path, f"the archive expands to {total} bytes, more than a tensor of "
                                       f"{expected.numel if expected else '?'} elements needs; refused")


def check_npy(path: str | Path, fh: IO[bytes], expected: Expected | None = None) -> None:
    """Check a ``.npy`` header (from *fh*, left at the start) against the file size and the record."""
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise DumpFormatError(path, f"not a valid .npy file: {exc}") from None
    finally:
        header_end = fh.tell()
        fh.seek(0)
    numel = math.prod(int(x) for x in shape)
    if not dtype.hasobject:
        size = os.fstat(fh.fileno()).st_size
        need = header_end + numel * dtype.itemsize
        if size < need:
            raise TensorRefusedError(path, f"the header claims {numel} x {dtype} ({need} bytes), the file holds "
                                           f"{size}: truncated; refused")
    if expected is not None:
        expected.check(path, numel=numel, dtype=dtype.name)
