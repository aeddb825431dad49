"""Which entries two runs record in different dtypes (a bf16 port, an upcast), beyond the per-tensor dtype.

Used by :func:`precnb.analysis.compare.compare_runs`.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from precnb.dtypes import canonical_dtype, equivalence, same_values
from precnb.schema import dtype_changes

__all__ = ["entry_dtype_differences"]


def _numel(shape: str) -> int:
    """Element count of a shape text (``"[4, 16, 32]"``), -1 when unreadable."""
    try:
        dims = [int(x) for x in shape.strip("[]() ").replace(" ", "").split(",") if x]
    except ValueError:
        return -1
    n = 1
    for d in dims:
        n *= d
    return n


def _same_dtype(a: str, b: str, *, cross: bool = False) -> bool:
    """One dtype in both runs, or two that hold the same values (:data:`precnb.dtypes.EQUIVALENT`).

    A bool mask stored as uint8, an index tensor in another integer width: the statistics decide.
    (*cross*, the two runs' frameworks differ, is kept for callers; the table holds everywhere.)
    """
    return same_values(a, b)


def entry_dtype_differences(b: xr.Dataset, t: xr.Dataset, both_ds: xr.Dataset, *, cross: bool = False,
                            notes: dict[str, tuple[str, str, str]] | None = None
                            ) -> tuple[xr.DataArray, dict[str, tuple[str, str]]]:
    """Entries whose dtype differs between two aligned runs (per entry, not first seen).

    Parameters
    ----------
    b, t : xarray.Dataset
        The runs, steps already aligned (their ``dtype_changes`` attributes use these steps).
    both_ds : xarray.Dataset
        Their combination (:func:`precnb.combine.combine_runs`): gives the output grid.

    Returns
    -------
    mask : xarray.DataArray
        (step, rank, tensor) bool; True where both dtypes are known and differ.
    examples : dict
        tensor → (baseline dtype, target dtype) at its first differing entry.

    *notes*, when given, receives the tensors whose dtypes differ but hold the same values
    (:func:`precnb.dtypes.equivalence`): tensor → (baseline dtype, target dtype, why). They are
    not in the mask.
    """
    steps = [int(x) for x in both_ds["step"].values]
    ranks = [int(x) for x in both_ds["rank"].values]
    labels = both_ds["tensor"].values
    mask = np.zeros((len(steps), len(ranks), len(labels)), bool)
    examples: dict[str, tuple[str, str]] = {}
    cb, ct = dtype_changes(b), dtype_changes(t)
    coord_b = dict(zip(b["tensor"].values.tolist(), b["dtype"].values.tolist(), strict=True))
    coord_t = dict(zip(t["tensor"].values.tolist(), t["dtype"].values.tolist(), strict=True))
    si = {s: i for i, s in enumerate(steps)}
    ri = {r: i for i, r in enumerate(ranks)}
    for j, lbl in enumerate(labels.tolist()):
        xb, xt = coord_b.get(lbl), coord_t.get(lbl)
        if not xb or not xt or (_same_dtype(xb, xt, cross=cross) and lbl not in cb and lbl not in ct):
            if notes is not None and xb and xt and canonical_dtype(xb) != canonical_dtype(xt):
                why = equivalence(xb, xt)
                if why is not None:
                    notes[str(lbl)] = (str(xb), str(xt), why)
            continue
        grid_b = np.full((len(steps), len(ranks)), xb, dtype=object)
        grid_t = np.full((len(steps), len(ranks)), xt, dtype=object)
        for grid, table in ((grid_b, cb), (grid_t, ct)):
            for (st, r), d in table.get(lbl, {}).items():
                if st in si and r in ri:
                    grid[si[st], ri[r]] = d
        same = np.vectorize(lambda x, y: _same_dtype(x, y, cross=cross), otypes=[bool])
        diff = ~same(grid_b, grid_t) & (grid_b != "") & (grid_t != "")
        if diff.any():
            mask[:, :, j] = diff
            a, c = np.argwhere(diff)[0]
            examples[str(lbl)] = (str(grid_b[a, c]), str(grid_t[a, c]))
    da = xr.DataArray(mask, dims=("step", "rank", "tensor"),
                      coords={"step": both_ds["step"], "rank": both_ds["rank"], "tensor": both_ds["tensor"]})
    return da, examples
