"""Safe loading of whole tensors saved by msprobe ``task=tensor`` dumps.

Tensor files are read only on request, and never with unrestricted unpickling:
``.npy`` with ``numpy.load(allow_pickle=False)`` and ``.pt`` with
``torch.load(weights_only=True)`` (torch is an optional dependency).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from precnb.errors import DumpFormatError, PrecnbError, UnsafeFileError

__all__ = ["load_tensor", "load_tensor_file", "tensor_file"]


def tensor_file(ds: xr.Dataset, tensor: str, *, step: int, rank: int) -> Path:
    """Return the path of the saved tensor file for one (tensor, step, rank).

    Raises
    ------
    PrecnbError
        When the dump did not save that tensor.
    """
    if "data_name" not in ds:
        raise PrecnbError("this dump has no saved tensors (task=tensor was not used)")
    sel = ds.sel(step=step, rank=rank, tensor=tensor)
    name = str(sel["data_name"].values)
    if not name:
        raise PrecnbError(f"{tensor} at step {step}, rank {rank} was not saved as a file")
    dirs = json.loads(ds.attrs.get("rank_dirs", "{}"))
    folder = dirs.get(f"{step},{rank}")
    if folder is None:
        raise PrecnbError(f"no dump folder known for step {step}, rank {rank}")
    base = Path(folder) / "dump_tensor_data"
    path = (base / name).resolve()
    if base.resolve() not in path.parents:  # a data_name must not escape the dump folder
        raise UnsafeFileError(f"{name!r} points outside {base}")
    return path


def load_tensor_file(path: str | Path) -> Any:
    """Load a ``.npy`` or ``.pt`` tensor file without executing code.

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
    """
    p = Path(path)
    if not p.is_file():
        raise DumpFormatError(p, "tensor file not found")
    if p.suffix == ".npy":
        try:
            return np.load(p, allow_pickle=False)
        except ValueError as exc:
            if "pickle" in str(exc).lower():
                raise UnsafeFileError(f"{p}: holds pickled objects; refused (allow_pickle=False)") from None
            raise DumpFormatError(p, f"not a valid .npy file: {exc}") from None
    if p.suffix == ".pt":
        if not zipfile.is_zipfile(p):
            raise UnsafeFileError(
                f"{p}: legacy (non-zip) torch file needs full unpickling; refused")
        try:
            import torch
        except ImportError:
            raise PrecnbError(f"{p}: loading .pt files needs torch (pip install torch)") from None
        try:
            return torch.load(p, weights_only=True, map_location="cpu")
        except Exception as exc:  # torch raises UnpicklingError for anything not allowlisted
            if "weights_only" in str(exc) or "Unpickl" in type(exc).__name__:
                raise UnsafeFileError(
                    f"{p}: contains objects that are not plain tensors; refused "
                    "(torch.load(weights_only=True))") from None
            raise DumpFormatError(p, f"cannot load tensor: {exc}") from None
    raise DumpFormatError(p, "unknown tensor file type (expected .npy or .pt)")


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
