"""Safe loading of whole tensors saved by msprobe ``task=tensor`` dumps.

Tensor files are read only on request, and never with unrestricted unpickling:
``.npy`` with ``numpy.load(allow_pickle=False)`` and ``.pt`` with
``torch.load(weights_only=True)`` (torch is an optional dependency). :func:`load_array`
reads a plain-tensor ``.pt`` without torch (:mod:`precnb.io._torchzip`, an allow-list reader of
torch's zip format) and returns numpy; :class:`TensorFolder` resolves many ``data_name`` values
of one folder cheaply, with the same refusals as :func:`safe_join`.
"""

from __future__ import annotations

import errno
import json
import os
import pickle  # only for its exception type: nothing is unpickled with it
import stat
import zipfile
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np
import xarray as xr

from precnb.errors import DumpFormatError, PrecnbError, UnsafeFileError
from precnb.io._expect import Expected, TensorRefusedError, check_archive, check_npy
from precnb.io._fs import NotRegularFileError, open_regular

__all__ = ["TensorFolder", "load_array", "load_tensor", "load_tensor_file", "rank_folders", "safe_join",
           "tensor_file"]


_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


def _looks_pickled(head: bytes) -> bool:
    """Pickle protocol 2+ starts with PROTO (0x80); protocols 0/1 start with an opcode such as ``(``/``]``/``}``."""
    return head[:1] == b"\x80" or head[:1] in (b"(", b"]", b"}", b"c")


def tensor_file(ds: xr.Dataset, tensor: str, *, step: int, rank: int) -> Path:
    """Return the path of the saved tensor file for one (tensor, step, rank).

    Parameters
    ----------
    ds : xarray.Dataset
        A dataset opened from a ``task=tensor`` dump.
    tensor : str
    step, rank : int

    Returns
    -------
    Path
        Inside the rank folder's ``dump_tensor_data/``.

    Raises
    ------
    UnsafeFileError
        When the recorded ``data_name`` would leave ``dump_tensor_data/`` (``..``, an
        absolute path, a symlink pointing elsewhere, a NUL byte).
    PrecnbError
        When the dump did not save that tensor.
    """
    if "data_name" not in ds:
        raise PrecnbError("this dump has no saved tensors (task=tensor was not used)")
    try:
        sel = ds.sel(step=step, rank=rank, tensor=tensor)
    except KeyError:
        raise PrecnbError(f"no tensor {tensor!r} at step {step}, rank {rank} in this dataset") from None
    name = str(sel["data_name"].values)
    if not name:
        raise PrecnbError(f"{tensor} at step {step}, rank {rank} was not saved as a file")
    folder = rank_folders(ds).get((step, rank))
    if folder is None:
        raise PrecnbError(f"no dump folder known for step {step}, rank {rank}")
    return safe_join(folder / "dump_tensor_data", name)


def rank_folders(ds: xr.Dataset) -> dict[tuple[int, int], Path]:
    """``{(step, rank): rank folder}`` of a dataset opened from a dump (``attrs["rank_dirs"]``).

    Parameters
    ----------
    ds : xarray.Dataset

    Returns
    -------
    dict
        Empty when the dataset does not say where it was read from.

    Examples
    --------
    >>> ds = xr.Dataset(attrs={"rank_dirs": '{"0,1": "/dump/step0/rank1"}'})
    >>> rank_folders(ds)
    {(0, 1): PosixPath('/dump/step0/rank1')}
    """
    try:
        dirs = json.loads(ds.attrs.get("rank_dirs", "{}"))
    except ValueError:
        return {}
    out: dict[tuple[int, int], Path] = {}
    if not isinstance(dirs, dict):
        return out
    for key, folder in dirs.items():
        try:
            step, rank = (int(x) for x in str(key).split(","))
        except ValueError:
            continue
        if isinstance(folder, str):
            out[(step, rank)] = Path(folder)
    return out


def safe_join(base: Path, name: str) -> Path:
    """``base / name``, refusing any *name* that resolves outside *base*.

    Parameters
    ----------
    base : Path
        The ``dump_tensor_data`` folder.
    name : str
        A ``data_name`` from dump.json.

    Returns
    -------
    Path
        The resolved path (symlinks followed).

    Raises
    ------
    UnsafeFileError
        For ``..`` components, absolute paths, NUL bytes and symlinks leading out of *base*.

    Examples
    --------
    >>> safe_join(Path("/dump/rank0/dump_tensor_data"), "../../../etc/passwd")
    Traceback (most recent call last):
    ...
    precnb.errors.UnsafeFileError: data_name '../../../etc/passwd' points outside /dump/rank0/dump_tensor_data; refused
    """
    refused = UnsafeFileError(f"data_name {name!r} points outside {base}; refused")
    if "\x00" in name or not name.strip():
        raise refused
    posix = PurePosixPath(name.replace("\\", "/"))
    if posix.is_absolute() or ".." in posix.parts or PureWindowsPath(name).drive:
        raise refused
    try:
        root = base.resolve()
        path = (base / name).resolve()
    except (OSError, RuntimeError, ValueError):
        raise refused from None
    if root not in path.parents:  # e.g. a symlink inside dump_tensor_data pointing elsewhere
        raise refused
    return path


class TensorFolder:
    """A ``dump_tensor_data`` folder resolved once, for many :meth:`path` look-ups.

    A plain file name (msprobe's ``data_name``: no separator) that is not a symlink costs one
    ``lstat``; anything else goes through :func:`safe_join`. The same names are refused.

    Parameters
    ----------
    base : Path
        The folder (``<rank folder>/dump_tensor_data``).

    Examples
    --------
    >>> TensorFolder(Path("/dump/rank0/dump_tensor_data")).path("../x.pt")
    Traceback (most recent call last):
    ...
    precnb.errors.UnsafeFileError: data_name '../x.pt' points outside /dump/rank0/dump_tensor_data; refused
    """

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        try:
            self._root: str | None = os.path.realpath(self.base)
        except (OSError, ValueError):
            self._root = None

    def path(self, name: str) -> Path:
        """The file for one ``data_name`` (see :func:`safe_join` for what is refused)."""
        plain = (self._root is not None and name and "/" not in name and "\\" not in name and "\x00" not in name
                 and name not in (".", "..") and name.strip() == name)
        if plain:
            candidate = os.path.join(self._root, name)  # type: ignore[arg-type]
            try:
                st = os.lstat(candidate)
            except OSError:
                return Path(candidate)  # missing: load_array names it
            if not stat.S_ISLNK(st.st_mode):
                return Path(candidate)
        return safe_join(self.base, name)


def load_tensor_file(path: str | Path, expected: Expected | None = None) -> Any:
    """Load a ``.npy`` or ``.pt`` tensor file without executing code.

    ``.npy`` files are read with ``numpy.load(allow_pickle=False)``; ``.pt`` files only when
    they are torch's zip format, with ``torch.load(weights_only=True)`` (which no environment
    variable can override when passed explicitly). A pickle in disguise, an object array or a
    pickled object that is not a tensor is refused before anything is unpickled.

    Parameters
    ----------
    path : str or Path
    expected : precnb.io._expect.Expected, optional
        What its dump record says (element count, dtype), checked before reading.

    Returns
    -------
    numpy.ndarray or torch.Tensor

    Raises
    ------
    UnsafeFileError
        When the file would need arbitrary unpickling.
    DumpFormatError
        When the file cannot be read.
    PrecnbError
        When a ``.pt`` file is asked for and torch is not installed.
    """
    p = Path(path)
    head = _head(p)
    suffix = p.suffix.lower()
    if suffix == ".npy":
        return _load_npy(p, head, expected)
    if suffix == ".pt":
        return _load_pt(p, head, expected)
    raise DumpFormatError(p, "unknown tensor file type (expected .npy or .pt)")


def _head(p: Path) -> bytes:
    """The first bytes of a tensor file (regular files only: a FIFO is refused, never opened)."""
    from precnb.io._why import missing_reason

    try:
        with open_regular(p) as fh:
            return fh.read(8)
    except FileNotFoundError:
        reason = missing_reason(p)
        raise DumpFormatError(p, "tensor file not found" if reason.startswith("no such") else reason) from None
    except NotRegularFileError as exc:
        raise DumpFormatError(p, str(exc.strerror)) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DumpFormatError(p, missing_reason(p)) from None
        raise DumpFormatError(p, f"cannot read: {exc.strerror or exc}") from None


def _load_npy(p: Path, head: bytes, expected: Expected | None = None) -> Any:
    if not head.startswith(_NPY_MAGIC):
        if _looks_pickled(head):
            raise UnsafeFileError(f"{p}: a pickle, not a .npy array; refused (numpy.load(allow_pickle=False))")
        raise DumpFormatError(p, "not a .npy file (no NUMPY header)")
    try:
        with open_regular(p) as fh:
            check_npy(p, fh, expected)  # shape and size from the header, before any allocation
            return np.load(fh, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc).lower() or "object arrays" in str(exc).lower():
            raise UnsafeFileError(f"{p}: holds pickled Python objects; refused (numpy.load(allow_pickle=False))"
                                  ) from None
        raise DumpFormatError(p, f"not a valid .npy file: {exc}") from None
    except (OSError, EOFError, UnicodeError, MemoryError, SyntaxError, TypeError) as exc:
        raise DumpFormatError(p, f"not a valid .npy file: {type(exc).__name__}: {exc}") from None


def _load_pt(p: Path, head: bytes, expected: Expected | None = None) -> Any:
    if not head.startswith(_ZIP_MAGIC):
        what = "a plain pickle or a legacy (non-zip) torch file" if _looks_pickled(head) else "not a torch zip file"
        raise UnsafeFileError(f"{p}: {what}; loading it would need full unpickling; refused")
    _check_zip(p, expected)
    try:
        import torch
    except (ImportError, OSError):
        raise PrecnbError(f"{p}: loading .pt files needs torch (pip install torch)") from None
    try:
        return torch.load(p, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:
        raise UnsafeFileError(
            f"{p}: contains objects that are not plain tensors; refused "
            "(torch.load(weights_only=True))") from None
    except Exception as exc:  # torch raises RuntimeError/ValueError/EOFError/... for broken archives
        raise DumpFormatError(p, f"cannot load tensor: {type(exc).__name__}: {str(exc)[:200]}") from None


def _check_zip(p: Path, expected: Expected | None) -> None:
    """A readable zip whose members expand no more than its record allows (before torch reads it)."""
    try:
        with open_regular(p) as fh, zipfile.ZipFile(fh) as zf:
            check_archive(p, zf, expected)
    except zipfile.BadZipFile as exc:
        raise DumpFormatError(p, f"a damaged or truncated zip archive ({exc})") from None
    except OSError as exc:
        raise DumpFormatError(p, f"cannot read: {exc.strerror or exc}") from None


def load_array(path: str | Path, expected: Expected | None = None) -> tuple[np.ndarray, str]:
    """Load a tensor file as a numpy array, with the dtype it was saved in.

    ``.pt`` files are read without torch when they hold one plain tensor (an allow-list reader
    of torch's zip format, see :mod:`precnb.io._torchzip`); anything else falls back to
    ``torch.load(weights_only=True)`` when torch is installed. bfloat16 and float8 become
    float32 with the same values — what ``msprobe compare`` computes on.

    Parameters
    ----------
    path : str or Path
    expected : precnb.io._expect.Expected, optional
        What the tensor's dump record says (element count, dtype): a file holding more, or
        another dtype, is refused before it is materialised.

    Returns
    -------
    array : numpy.ndarray
    dtype : str
        As saved: ``"torch.bfloat16"`` for a ``.pt``, the numpy dtype name (``"float32"``) for
        a ``.npy``.

    Raises
    ------
    UnsafeFileError, DumpFormatError, PrecnbError
        As :func:`load_tensor_file`.
    """
    from precnb.io._torchzip import UnsupportedArchiveError, read_torch_zip

    p = Path(path)
    if p.suffix.lower() == ".pt":
        head = _head(p)
        if head.startswith(_ZIP_MAGIC):
            _check_zip(p, expected)  # truncated, or members expanding beyond the record: named, refused
            try:
                return read_torch_zip(p, expected)
            except UnsupportedArchiveError as why:
                fallback = why  # torch may know it (weights_only)
            try:
                import torch  # noqa: F401
            except (ImportError, OSError):
                raise DumpFormatError(p, f"not a plain tensor archive ({fallback}); loading it needs torch"
                                      ) from None
    value = load_tensor_file(p, expected)
    if isinstance(value, np.ndarray):
        return value, str(value.dtype)
    return _torch_to_numpy(p, value, expected)


def _torch_to_numpy(p: Path, value: Any, expected: Expected | None = None) -> tuple[np.ndarray, str]:
    import torch

    if not isinstance(value, torch.Tensor):
        raise DumpFormatError(p, f"holds a {type(value).__name__}, not a tensor")
    storage = value.untyped_storage().nbytes() // max(value.element_size(), 1)
    if value.numel() > storage:  # a stride-0 expansion: torch holds it as a view, a copy would not fit
        raise TensorRefusedError(p, f"a view of {value.numel()} elements over a storage of {storage}; refused")
    if expected is not None:
        expected.check(p, numel=value.numel(), dtype=str(value.dtype))
    t = value.detach().cpu()
    dtype = str(t.dtype)
    if t.dtype == torch.bfloat16 or "float8" in dtype:
        t = t.to(torch.float32)
    return t.numpy(), dtype


def load_tensor(ds: xr.Dataset, tensor: str, *, step: int, rank: int) -> Any:
    """Load the whole saved tensor behind one dataset entry.

    Parameters
    ----------
    ds : xarray.Dataset
        A dataset opened from a ``task=tensor`` dump.
    tensor : str
        Tensor label, e.g. ``"Functional.linear.0.forward.output.0"``.
    step, rank : int

    Returns
    -------
    numpy.ndarray or torch.Tensor
    """
    return load_tensor_file(tensor_file(ds, tensor, step=step, rank=rank))
