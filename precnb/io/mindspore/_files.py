"""The files of a MindSpore tensor-layout kernel dump: names, safe loading, float64 statistics.

Examples
--------
>>> parse_file_name("Mul.Default_net-Net_Mul-op1.0.0.17961.input.1.DefaultFormat.Float32.npy")["slot"]
1
>>> parse_file_name("statistic.csv") is None
True
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from precnb.errors import DumpFormatError
from precnb.io._fs import open_regular

__all__ = ["CHUNK", "EXTRA_STATS", "NAME", "load_npy", "mapping", "parse_file_name", "tensor_stats"]

CHUNK = 1 << 24
NAME = re.compile(r"^(?P<op_type>[^.]+)\.(?P<op_name>.+)\.(?P<task>\d+)\.(?P<stream>\d+)\.(?P<ts>\d+)\."
                   r"(?P<io>input|output)\.(?P<slot>\d+)\.(?P<format>[^.]+)(?:\.(?P<dtype>[^.]+))?\.npy$")
EXTRA_STATS = ("nan_count", "pos_inf_count", "neg_inf_count", "zero_count")


def parse_file_name(name: str) -> dict[str, Any] | None:
    """The fields of a tensor file name, or None when it is not one."""
    m = NAME.match(name)
    if not m:
        return None
    d: dict[str, Any] = m.groupdict()
    d["ts"], d["slot"], d["task"], d["stream"] = int(d["ts"]), int(d["slot"]), int(d["task"]), int(d["stream"])
    return d


def tensor_stats(a: np.ndarray) -> dict[str, float | None]:
    """max, min, mean, norm (and NaN/inf/zero counts) of an array, in float64.

    Examples
    --------
    >>> s = tensor_stats(np.array([1.0, -3.0, np.inf], np.float32))
    >>> s["max"], s["min"], s["norm"], s["pos_inf_count"]
    (inf, -3.0, inf, 1.0)
    >>> tensor_stats(np.zeros((0, 2)))["max"] is None
    True
    """
    if a.dtype.kind == "c":
        a = np.abs(a)
    flat = a.reshape(-1)
    n = flat.size
    if n == 0:
        return {"max": None, "min": None, "mean": None, "norm": None, **dict.fromkeys(EXTRA_STATS, 0.0)}
    if n <= CHUNK:
        x = flat.astype(np.float64)
        return {"max": float(x.max()), "min": float(x.min()), "mean": float(x.mean()),
                "norm": float(np.sqrt(np.sum(x * x))),
                "nan_count": float(np.count_nonzero(np.isnan(x))),
                "pos_inf_count": float(np.count_nonzero(x == np.inf)),
                "neg_inf_count": float(np.count_nonzero(x == -np.inf)),
                "zero_count": float(np.count_nonzero(x == 0))}
    parts = []  # per chunk: max, min, sum, sum of squares, counts (max/min propagate NaN as numpy does)
    for start in range(0, n, CHUNK):
        x = np.asarray(flat[start:start + CHUNK], dtype=np.float64)
        parts.append([x.max(), x.min(), np.sum(x), np.sum(x * x), np.count_nonzero(np.isnan(x)),
                      np.count_nonzero(x == np.inf), np.count_nonzero(x == -np.inf), np.count_nonzero(x == 0)])
    t = np.asarray(parts, dtype=np.float64)
    counts = t[:, 4:].sum(axis=0)
    return {"max": float(np.max(t[:, 0])), "min": float(np.min(t[:, 1])), "mean": float(np.sum(t[:, 2]) / n),
            "norm": float(np.sqrt(np.sum(t[:, 3]))), **{k: float(c) for k, c in zip(EXTRA_STATS, counts, strict=True)}}


def load_npy(path: Path) -> np.ndarray:
    """The array of one .npy file, never unpickling (memory-mapped when large); regular files only."""
    try:
        with open_regular(path) as fh:  # a FIFO or a device named *.npy is refused, never opened
            big = os.fstat(fh.fileno()).st_size > 64 * 1024 * 1024
            if not big:
                return np.load(fh, allow_pickle=False)
        return np.load(path, allow_pickle=False, mmap_mode="r")
    except ValueError as exc:  # object arrays ("allow_pickle=False"), bad headers, truncated data
        raise DumpFormatError(path, f"not a readable .npy: {exc}") from None
    except (OSError, EOFError) as exc:
        raise DumpFormatError(path, f"cannot read .npy: {getattr(exc, 'strerror', None) or exc}") from None


def mapping(folder: Path) -> dict[str, str]:
    """``mapping.csv`` of an iteration folder: stored file name -> original file name."""
    path = folder / "mapping.csv"
    if not path.is_file():
        return {}
    out = {}
    with open_regular(path, "r", newline="", encoding="utf-8", errors="replace") as fh:
        for row in csv.reader(fh):
            if len(row) >= 2 and row[0].strip() and parse_file_name(row[1].strip()):
                out[os.path.basename(row[0].strip())] = row[1].strip()
    return out
