"""Safe loading of whole tensors saved by msprobe ``task=tensor`` dumps.

Tensor files are read only on request, and never with unrestricted unpickling:
``.npy`` with ``numpy.load(allow_pickle=False)`` and ``.pt`` with
``torch.load(weights_only=True)`` (torch is an optional dependency).
"""

from __future__ import annotations

import json
import pickle  # only for its exception type: nothing is unpickled with it
import zipfile
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np
import xarray as xr

from precnb.errors import DumpFormatError, PrecnbError, UnsafeFileError

__all__ = ["load_tensor", "load_tensor_file", "safe_join", "tensor_file"]


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
    try:
        dirs = json.loads(ds.attrs.get("rank_dirs", "{}"))
    except ValueError:
        dirs = {}
    folder = dirs.get(f"{step},{rank}") if isinstance(dirs, dict) else None
    if not isinstance(folder, str):
        raise PrecnbError(f"no dump folder known for step {step}, rank {rank}")
    base = Path(folder) / "dump_tensor_data"
    return safe_join(base, name)


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


def load_tensor_file(path: str | Path) -> Any:
    """Load a ``.npy`` or ``.pt`` tensor file without executing code.

    ``.npy`` files are read with ``numpy.load(allow_pickle=False)``; ``.pt`` files only when
    they are torch's zip format, with ``torch.load(weights_only=True)`` (which no environment
    variable can override when passed explicitly). A pickle in disguise, an object array or a
    pickled object that is not a tensor is refused before anything is unpickled.

    Parameters
    ----------
    path : str or Path

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
    try:
        is_file = p.is_file()
    except OSError as exc:
        raise DumpFormatError(p, f"cannot access: {exc.strerror or exc}") from None
    if not is_file:
        raise DumpFormatError(p, "tensor file not found")
    try:
        with p.open("rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise DumpFormatError(p, f"cannot read: {exc.strerror or exc}") from None
    suffix = p.suffix.lower()
    if suffix == ".npy":
        return _load_npy(p, head)
    if suffix == ".pt":
        return _load_pt(p, head)
    raise DumpFormatError(p, "unknown tensor file type (expected .npy or .pt)")


def _load_npy(p: Path, head: bytes) -> Any:
    if not head.startswith(_NPY_MAGIC):
        if _looks_pickled(head):
            raise UnsafeFileError(f"{p}: a pickle, not a .npy array; refused (numpy.load(allow_pickle=False))")
        raise DumpFormatError(p, "not a .npy file (no NUMPY header)")
    try:
        return np.load(p, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc).lower() or "object arrays" in str(exc).lower():
            raise UnsafeFileError(f"{p}: holds pickled Python objects; refused (numpy.load(allow_pickle=False))"
                                  ) from None
        raise DumpFormatError(p, f"not a valid .npy file: {exc}") from None
    except (OSError, EOFError, UnicodeError, MemoryError, SyntaxError, TypeError) as exc:
        raise DumpFormatError(p, f"not a valid .npy file: {type(exc).__name__}: {exc}") from None


def _load_pt(p: Path, head: bytes) -> Any:
    if not head.startswith(_ZIP_MAGIC) or not zipfile.is_zipfile(p):
        what = "a plain pickle or a legacy (non-zip) torch file" if _looks_pickled(head) else "not a torch zip file"
        raise UnsafeFileError(f"{p}: {what}; loading it would need full unpickling; refused")
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
