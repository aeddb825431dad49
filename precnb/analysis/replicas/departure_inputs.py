"""What a replica departure's inputs were: random ops, scalar arguments, and the departures only a CRC shows.

Used by :mod:`precnb.analysis.replicas.departures` to classify a departure (identical inputs and a random op outside
an RNG region: an unsynchronised seed; identical inputs otherwise: a compute fault).

Examples
--------
>>> is_random_op("Torch.normal"), is_random_op("Functional.dropout"), is_random_op("Torch.rsqrt")
(True, True, False)
>>> scalar_args({"input_args": [{"type": "float", "value": 0.0}, {"type": "torch.Tensor", "shape": [2]}],
...              "input_kwargs": {"p": {"type": "float", "value": 0.1}}})
{'input_args.0': ('float', 0.0), 'input_kwargs.p': ('float', 0.1)}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.layout import Layout
from precnb.analysis.random_ops import RANDOM_OPS, is_random_op

__all__ = ["RANDOM_OPS", "crc_rows", "is_random_op", "scalar_args"]

STATS = ("max", "min", "mean", "norm")


def scalar_args(record: Mapping[str, Any] | None) -> dict[str, tuple[str, Any]]:
    """``{path: (type, value)}`` of the scalar (non-tensor) arguments of one node's dump record."""
    out: dict[str, tuple[str, Any]] = {}

    def walk(v: Any, path: str, depth: int) -> None:
        if depth > 6:
            return
        if isinstance(v, dict):
            if "type" in v and "shape" not in v and "value" in v:
                val = v["value"]
                out[path] = (str(v["type"]), repr(val) if isinstance(val, float) and val != val else val)
                return
            if "shape" in v or "data_name" in v:
                return  # a tensor
            for k, x in v.items():
                walk(x, f"{path}.{k}", depth + 1)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{path}.{i}", depth + 1)

    for side in ("input_args", "input_kwargs"):
        walk((record or {}).get(side), side, 0)
    return out


def _equal(v: np.ndarray, ref: np.ndarray, rtol: float) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return (v == ref) | (np.isnan(v) & np.isnan(ref)) | (np.abs(v - ref) <= rtol * np.fmax(np.abs(ref), 1e-30))


def crc_rows(ds: xr.Dataset, layout: Layout, *, dims: Sequence[str] = ("tp", "cp", "dp")) -> list[dict[str, Any]]:
    """Departures only the CRC shows (md5 dumps): statistics equal across the group, CRC-32 not.

    A tensor counts as replicated on a group when its statistics are equal on every member at most of the
    steps recorded there and its CRC at one of them at least (the CRC of a collective's input is skipped:
    msprobe may take it after the collective changed the buffer in place). Rows have the shape of
    :func:`precnb.analysis.replicas.replica_mismatches`'s.
    """
    if "crc" not in ds.data_vars:
        return []
    from precnb.naming import is_communication

    crc = ds["crc"].values
    has = np.vectorize(lambda c: isinstance(c, str) and bool(c), otypes=[bool])(crc) & ds["present"].values
    if not has.any():
        return []
    ok_col = np.array([not (is_communication(str(n)) and r == "input") for n, r in
                       zip(ds["node"].values.tolist(), ds["role"].values.tolist(), strict=True)], bool)
    ranks = [int(r) for r in ds["rank"].values]
    stats = np.stack([ds[s].values for s in STATS], axis=-1)
    rows: list[dict[str, Any]] = []
    for dim in dims:
        if layout.size(dim) <= 1:
            continue
        for g in layout.groups(dim):
            idx = [ranks.index(r) for r in g]
            c, h = crc[:, idx], has[:, idx].all(axis=1)  # (step, n, t), (step, t)
            same_crc = (c == c[:, :1]).all(axis=1) & h
            v = stats[:, idx]
            same_stats = _equal(v, v[:, :1], 0.0).all(axis=(1, 3))
            # replicated: equal statistics at most recorded steps and one CRC at one step at least
            rep = (2 * (same_stats & h).sum(axis=0) >= h.sum(axis=0)) & same_crc.any(axis=0) & ok_col
            bad = h & ~same_crc & same_stats & rep[None, :]
            for si, tj in np.argwhere(bad):
                counts: dict[str, int] = {}
                for k in range(len(g)):
                    counts[str(c[si, k, tj])] = counts.get(str(c[si, k, tj]), 0) + 1
                odd = [k for k in range(len(g)) if counts[str(c[si, k, tj])] * 2 <= len(g)] or [len(g) - 1]
                for k in (odd[-1:] if len(g) == 2 else odd):
                    rows.append({"step": int(ds["step"].values[si]), "rank": g[k], "group": list(g), "dim": dim,
                                 "tensor": str(ds["tensor"].values[tj]), "node": str(ds["node"].values[tj]),
                                 "seq": int(ds["seq"].values[si, idx[k], tj]), "inputs_identical": False,
                                 "why": f"its CRC differs from its {dim} replicas' (statistics equal)"})
    return rows
