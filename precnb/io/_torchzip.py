"""Read a tensor saved by ``torch.save`` (zip format) into numpy, without torch and without executing code.

A torch zip archive holds ``<prefix>/data.pkl`` (a small pickle that describes the tensor) and one
raw little- or big-endian buffer per storage (``<prefix>/data/<key>``). The pickle is read with an
allow-list: the only globals it may name are ``torch._utils._rebuild_tensor_v2`` /
``_rebuild_tensor`` / ``_rebuild_parameter``, the typed storage classes (``torch.FloatStorage``
...) and ``collections.OrderedDict``, and each of them resolves to a function of this module
(never to torch's own). Anything else — any other global, a pickle that rebuilds something other
than one tensor — raises :class:`UnsupportedArchiveError` before it is called, so a malicious file can
at most be refused. The tensor's geometry (offset, sizes, strides) is checked against its storage
and against what its dump record says (:class:`precnb.io._expect.Expected`) before numpy views or
copies anything: a view never holds more elements than its storage, a storage never more than its
record, and a compressed member expands at most ``MAX_RATIO`` times.

bfloat16 (and float8) tensors are returned as float32 with the same values (bf16 → fp32 is exact),
which is also what ``msprobe compare`` computes on.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from precnb.io._expect import Expected, TensorRefusedError, check_archive
from precnb.io._fs import open_regular

__all__ = ["MAX_PICKLE_BYTES", "UnsupportedArchiveError", "read_torch_zip"]

MAX_PICKLE_BYTES = 1 << 20  # a single-tensor data.pkl is ~200 bytes

# storage class -> (numpy dtype of the raw buffer, torch dtype name)
_STORAGES: dict[str, tuple[str, str]] = {
    "FloatStorage": ("<f4", "torch.float32"),
    "DoubleStorage": ("<f8", "torch.float64"),
    "HalfStorage": ("<f2", "torch.float16"),
    "BFloat16Storage": ("<u2", "torch.bfloat16"),
    "LongStorage": ("<i8", "torch.int64"),
    "IntStorage": ("<i4", "torch.int32"),
    "ShortStorage": ("<i2", "torch.int16"),
    "CharStorage": ("<i1", "torch.int8"),
    "ByteStorage": ("<u1", "torch.uint8"),
    "BoolStorage": ("<b1", "torch.bool"),
    "ComplexFloatStorage": ("<c8", "torch.complex64"),
    "ComplexDoubleStorage": ("<c16", "torch.complex128"),
}


_TORCH_DTYPES = frozenset(d for _, d in _STORAGES.values())


class UnsupportedArchiveError(Exception):
    """The archive is not a plain single tensor this reader understands (torch may still load it)."""


@dataclass(frozen=True, slots=True)
class _StorageType:
    name: str


@dataclass(frozen=True, slots=True)
class _Storage:
    array: np.ndarray  # 1-D, the whole storage
    torch_dtype: str


@dataclass(frozen=True, slots=True)
class _Tensor:
    storage: _Storage
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def torch_dtype(self) -> str:
        return self.storage.torch_dtype

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=object)) if self.shape else 1


def _rebuild_tensor_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                       backward_hooks: Any = None, metadata: Any = None) -> _Tensor:
    """The tensor's geometry, checked against its storage (nothing is materialised here)."""
    if not isinstance(storage, _Storage):
        raise UnsupportedArchiveError("tensor without a storage")
    shape = tuple(size) if isinstance(size, tuple | list) else None
    strides = tuple(stride) if isinstance(stride, tuple | list) else None
    if shape is None or strides is None or len(shape) != len(strides):
        raise UnsupportedArchiveError(f"bad tensor geometry: size {size!r}, stride {stride!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (*shape, *strides, storage_offset)):
        raise UnsupportedArchiveError(f"bad tensor geometry: offset {storage_offset!r}, size {shape}, stride {strides}")
    t = _Tensor(storage, storage_offset, shape, strides)
    n = storage.array.size
    if t.numel:
        last = storage_offset + sum((s - 1) * st for s, st in zip(shape, strides, strict=True))
        if last >= n:
            raise UnsupportedArchiveError(f"tensor reaches element {last} of a storage of {n}")
    return t


def _materialise(t: _Tensor) -> np.ndarray:
    base, shape, strides, offset = t.storage.array, t.shape, t.strides, t.offset
    numel = t.numel
    contiguous = tuple(int(x) for x in np.cumprod((1, *shape[:0:-1]))[::-1]) if shape else ()
    if numel == 0:
        return np.empty(shape, dtype=base.dtype)
    if strides == contiguous or numel == 1:  # a plain slice of the storage: no copy (read-only)
        return base[offset:offset + numel].reshape(shape)
    view = np.lib.stride_tricks.as_strided(base[offset:], shape=shape,  # a strided view: copy into C order
                                           strides=tuple(st * base.itemsize for st in strides), writeable=False)
    return np.array(view, order="C")


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any) -> _Tensor:
    return _rebuild_tensor_v2(storage, storage_offset, size, stride)


def _rebuild_parameter(data: Any, requires_grad: Any = False, backward_hooks: Any = None) -> _Tensor:
    if not isinstance(data, _Tensor):
        raise UnsupportedArchiveError("parameter without tensor data")
    return data


_FUNCTIONS = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
}


class _AllowListUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, zf: zipfile.ZipFile, prefix: str, byteorder: str, path: str,
                 expected: Expected | None) -> None:
        super().__init__(io.BytesIO(data))
        self._zf = zf
        self._prefix = prefix
        self._order = "<" if byteorder == "little" else ">"
        self._loaded: dict[str, _Storage] = {}
        self._path = path
        self._expected = expected

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _FUNCTIONS:
            return _FUNCTIONS[(module, name)]
        if module == "torch" and name in _STORAGES:
            return _StorageType(name)
        raise UnsupportedArchiveError(f"the pickle names {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise UnsupportedArchiveError(f"unknown persistent id {str(pid)[:80]}")
        _, stype, key, _location, numel = pid
        if not isinstance(stype, _StorageType) or not isinstance(key, str) or not isinstance(numel, int):
            raise UnsupportedArchiveError(f"unknown storage record {str(pid)[:80]}")
        if key in self._loaded:
            return self._loaded[key]
        code, torch_dtype = _STORAGES[stype.name]
        dtype = np.dtype(self._order + code[1:]) if code[0] == "<" and code[1] != "b" else np.dtype(code)
        name = f"{self._prefix}data/{key}"
        try:
            info = self._zf.getinfo(name)
        except KeyError:
            raise UnsupportedArchiveError(f"storage {name} missing from the archive") from None
        if info.file_size != numel * dtype.itemsize:
            raise UnsupportedArchiveError(f"storage {name}: {info.file_size} bytes for {numel} x {dtype}")
        limit = self._expected.max_bytes(dtype.itemsize) if self._expected is not None else None
        if limit is not None and info.file_size > limit:  # the storage of a record's tensor (or of a slice of it)
            raise TensorRefusedError(self._path, f"a storage of {numel} elements, its dump record says "
                                                 f"{self._expected.numel if self._expected else '?'}; refused "
                                                 "before reading it")
        raw = self._zf.read(info)
        arr = np.frombuffer(raw, dtype=dtype)
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        storage = _Storage(arr, torch_dtype)
        self._loaded[key] = storage
        return storage


def _widen(array: np.ndarray, torch_dtype: str) -> np.ndarray:
    if torch_dtype == "torch.bfloat16":  # exact: the bf16 bits are the top half of the fp32 bits
        wide = array.astype(np.uint32)
        wide <<= 16  # in place, so a 0-d array stays an array
        return wide.view(np.float32)
    return array


def read_torch_zip(path: str | Path, expected: Expected | None = None) -> tuple[np.ndarray, str]:
    """Read a one-tensor torch zip archive.

    Parameters
    ----------
    path : str or Path
        A ``.pt`` file written by ``torch.save`` (zip format, the default since torch 1.6).
    expected : Expected, optional
        What the tensor's dump record says (element count, dtype): checked before any storage
        is read or any view materialised.

    Returns
    -------
    array : numpy.ndarray
        C-contiguous; bfloat16 widened to float32.
    dtype : str
        The tensor's torch dtype, e.g. ``"torch.bfloat16"``.

    Raises
    ------
    UnsupportedArchiveError
        For anything but a plain tensor (other globals, several storages of unknown layout,
        a damaged archive): nothing it names is ever called.
    TensorRefusedError
        The archive or the tensor is larger than its record allows, a view holds more elements
        than its storage (a stride-0 expansion), or a member expands beyond :data:`MAX_RATIO`:
        refused before it is materialised (torch must not be tried on it either).
    """
    shown = str(path)
    try:
        with open_regular(path) as fh, zipfile.ZipFile(fh) as zf:
            check_archive(shown, zf, expected)
            names = zf.namelist()
            pkl = [n for n in names if n.endswith("data.pkl") and n.count("/") == 1]
            if len(pkl) != 1:
                raise UnsupportedArchiveError(f"expected one <prefix>/data.pkl, found {pkl[:3]}")
            prefix = pkl[0][: -len("data.pkl")]
            info = zf.getinfo(pkl[0])
            if info.file_size > MAX_PICKLE_BYTES:
                raise UnsupportedArchiveError(f"data.pkl of {info.file_size} bytes")
            order = "little"
            if f"{prefix}byteorder" in names:
                order = zf.read(f"{prefix}byteorder")[:16].decode("ascii", "replace").strip()
            if order not in ("little", "big"):
                raise UnsupportedArchiveError(f"byteorder {order!r}")
            obj = _AllowListUnpickler(zf.read(info), zf, prefix, order, shown, expected).load()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, pickle.UnpicklingError, KeyError, TypeError,
            IndexError, AttributeError, RecursionError) as exc:
        raise UnsupportedArchiveError(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(obj, _Tensor) or obj.torch_dtype not in _TORCH_DTYPES:
        raise UnsupportedArchiveError(f"the archive holds a {type(obj).__name__}, not one tensor")
    if expected is not None:
        expected.check(shown, numel=obj.numel, dtype=obj.torch_dtype)
    if obj.numel > obj.storage.array.size:  # overlapping strides: msprobe saves contiguous clones
        raise TensorRefusedError(shown, f"a view of {obj.numel} elements over a storage of {obj.storage.array.size} "
                                        f"(stride {list(obj.strides)}); refused before materialising it")
    return _widen(_materialise(obj), obj.torch_dtype), obj.torch_dtype
