"""Blocks of tensor pairs: each pair's files loaded only when its block is computed, one pair in memory at a time.

Used by :func:`precnb.tensor_compare.tensor_metrics` (eagerly on a thread pool, or one dask task per block).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from precnb.analysis.tensor.metrics import FLOAT_METRICS, pair_metrics
from precnb.errors import PrecnbError
from precnb.io._expect import Expected
from precnb.io.tensors import TensorFolder, load_array

__all__ = ["ENTRY_VARS"]

ENTRY_VARS = (*FLOAT_METRICS, "bitwise_equal", "status", "message", "target_dtype", "baseline_dtype")
_COPIED_COORDS = ("node", "module", "api", "kind", "direction", "role", "dtype", "shape")
_OBJECT_VARS = ("status", "message", "target_dtype", "baseline_dtype")


def _load(folder: TensorFolder | None, name: str, expected: Expected | None) -> tuple[np.ndarray, str]:
    if folder is None:
        raise PrecnbError("no dump folder known for this step and rank")
    path = folder.path(name)
    try:
        return load_array(path, expected)
    except MemoryError:  # one tensor too large for this machine: that tensor is unreadable, not the command
        raise PrecnbError(f"{path}: not enough memory to load it") from None


def _compute_block(tnames: list[str], bnames: list[str], tdir: Path | None, bdir: Path | None,
                   texp: list[Any] | None = None, bexp: list[Any] | None = None) -> dict[str, np.ndarray]:
    """Metrics of one block of pairs (one pair in memory at a time)."""
    tfolder = TensorFolder(tdir / "dump_tensor_data") if tdir is not None else None
    bfolder = TensorFolder(bdir / "dump_tensor_data") if bdir is not None else None
    k = len(tnames)
    out: dict[str, np.ndarray] = {m: np.full(k, np.nan) for m in FLOAT_METRICS}
    out["bitwise_equal"] = np.zeros(k, bool)
    for name in _OBJECT_VARS:
        out[name] = np.full(k, "", dtype=object)
    for j, (tn, bn) in enumerate(zip(tnames, bnames, strict=True)):
        if not tn or not bn:
            out["status"][j] = "no_data"
            out["message"][j] = "no tensor file in the " + ("target" if not tn else "baseline")
            continue
        try:
            tarr, tdt = _load(tfolder, tn, texp[j] if texp else None)
            barr, bdt = _load(bfolder, bn, bexp[j] if bexp else None)
        except PrecnbError as exc:  # one unreadable file does not stop the others
            out["status"][j] = "unreadable"
            out["message"][j] = " ".join(str(exc).split())[:300]
            continue
        res = pair_metrics(tarr, barr, target_dtype=tdt, baseline_dtype=bdt)
        del tarr, barr
        for m in FLOAT_METRICS:
            out[m][j] = res.values[m]
        out["bitwise_equal"][j] = res.bitwise_equal
        out["status"][j], out["message"][j] = res.status, res.message
        out["target_dtype"][j], out["baseline_dtype"][j] = tdt, bdt
    return out


def _var_dtype(v: str) -> Any:
    return object if v in _OBJECT_VARS else (bool if v == "bitwise_equal" else np.float64)


def _empty_vars(shape: tuple[int, int, int]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for v in ENTRY_VARS:
        dt = _var_dtype(v)
        out[v] = (np.full(shape, "", dtype=object) if dt is object else
                  np.zeros(shape, bool) if dt is bool else np.full(shape, np.nan))
    return out


def _workers(workers: int | None) -> int:
    if workers:
        return max(1, int(workers))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(8, cpus)


def _dask_vars(specs: list[tuple[int, int, int, int]], args: Callable[[Any], tuple[Any, ...]],
               shape: tuple[int, int, int]) -> dict[str, Any]:
    """Dask-backed variables: one delayed task per block (a selection computes only its blocks)."""
    import dask
    import dask.array as da

    nested: dict[str, list[list[list[Any]]]] = {
        v: [[[] for _ in range(shape[1])] for _ in range(shape[0])] for v in ENTRY_VARS}
    for spec in specs:
        s, r, k0, k1 = spec
        res = dask.delayed(_compute_block, pure=True)(*args(spec))
        for v in ENTRY_VARS:
            nested[v][s][r].append(da.from_delayed(res[v], shape=(k1 - k0,), dtype=_var_dtype(v))[None, None, :])
    out = {}
    for v in ENTRY_VARS:
        if shape[2] == 0:
            out[v] = (("step", "rank", "tensor"), da.zeros(shape, dtype=_var_dtype(v)))
        else:
            out[v] = (("step", "rank", "tensor"), da.block(nested[v]))
    return out
