"""A compact summary of a dataset (what ``precnb info`` prints)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.masks import nonfinite
from precnb.schema import STATS

__all__ = ["format_ranges", "summarize"]


def summarize(ds: xr.Dataset) -> dict[str, Any]:
    """Summarise runs, steps, ranks, tensors, task/level/framework, dtypes and non-finite counts.

    Parameters
    ----------
    ds : xarray.Dataset

    Returns
    -------
    dict
        JSON-serialisable.

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> summarize(empty_dataset())["tensors"]
    0
    """
    present = ds["present"]
    nan = nonfinite(ds, STATS, kind="nan")
    inf = nonfinite(ds, STATS, kind="inf")
    by_tensor = (nan | inf).any([d for d in present.dims if d != "tensor"])
    dtypes = Counter(str(d) for d in ds["dtype"].values) if ds.sizes["tensor"] else Counter()
    kinds = Counter(str(k) for k in ds["kind"].values) if ds.sizes["tensor"] else Counter()
    report = json.loads(ds.attrs.get("load_report") or "{}")
    out: dict[str, Any] = {
        "source": ds.attrs.get("source", ""),
        "format": ds.attrs.get("source_format", ""),
        "runs": [str(r) for r in ds["run"].values] if "run" in ds.dims else [],
        "steps": [int(s) for s in ds["step"].values],
        "ranks": [int(r) for r in ds["rank"].values],
        "tensors": int(ds.sizes["tensor"]),
        "nodes": len(np.unique(ds["node"].values)) if ds.sizes["tensor"] else 0,
        "records": int(present.sum()),
        "task": ds.attrs.get("task", ""),
        "level": ds.attrs.get("level", ""),
        "framework": ds.attrs.get("framework", ""),
        "kinds": dict(sorted(kinds.items())),
        "dtypes": dict(sorted(dtypes.items())),
        "nonfinite": {
            "nan_values": int(nan.sum()),
            "inf_values": int(inf.sum()),
            "tensors": int(by_tensor.sum()),
        },
        "has_crc": "crc" in ds,
        "skipped_files": report.get("skipped", []),
    }
    return out


def format_ranges(vals: Any, *, sep: str = ",", dash: str = "-", empty: str = "-") -> str:
    """Compress integers into ranges: ``[0, 1, 2, 5]`` → ``"0-2,5"``.

    Examples
    --------
    >>> format_ranges([0, 1, 2, 5, 7, 8])
    '0-2,5,7-8'
    >>> format_ranges([], empty="—")
    '—'
    """
    vals = sorted(int(v) for v in vals)
    if not vals:
        return empty
    parts: list[str] = []
    start = prev = vals[0]
    for v in [*vals[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}" if start == prev else f"{start}{dash}{prev}")
        if v is not None:
            start = prev = v
    return sep.join(parts)
