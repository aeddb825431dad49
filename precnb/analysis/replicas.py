"""Replica consistency: tensors that must be identical across replicas, and ranks that are not.

Across a data-parallel group, parameters (``role == "parameter"``; monitor families
``param_origin``, ``param_updated``, ``grad_reduced``, ``exp_avg``, ``exp_avg_sq``) must agree.
Across a tensor-parallel group, tensors that are replicated at the first step they are
recorded (layer norms, biases of row-parallel layers, ...) must stay replicated. A rank that
departs from the majority of its group is a *silent divergence* on that rank.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.evidence import entry_values, node_evidence
from precnb.analysis.findings import Finding
from precnb.analysis.layout import Layout

__all__ = ["REPLICATED_MONITOR_FAMILIES", "check_replicas"]

REPLICATED_MONITOR_FAMILIES = ("param_origin", "param_updated", "grad_reduced", "exp_avg", "exp_avg_sq")
STATS = ("max", "min", "mean", "norm")


def _candidates(ds: xr.Dataset, dim: str, groups: list[list[int]], ranks: list[int], rtol: float) -> np.ndarray:
    roles = ds["role"].values
    apis = ds["api"].values
    kinds = ds["kind"].values
    must = (roles == "parameter") | ((kinds == "monitor") & np.isin(apis, REPLICATED_MONITOR_FAMILIES))
    if dim == "dp":
        return must
    # tp/cp: tensors replicated (and not all-zero) at most of the steps recorded on the group
    pres = ds["present"].values
    n_t = ds.sizes["tensor"]
    rep_steps = np.zeros(n_t, np.int64)
    rec_steps = np.zeros(n_t, np.int64)
    for g in groups:
        idx = [ranks.index(r) for r in g]
        allp = pres[:, idx, :].all(axis=1)  # (step, tensor)
        same = np.ones(allp.shape, bool)
        for s in STATS:
            v = ds[s].values[:, idx, :]  # (step, n, tensor)
            ref = v[:, :1, :]
            scale = np.fmax(np.abs(ref), 1e-30)
            with np.errstate(invalid="ignore"):
                ok = (np.abs(v - ref) <= rtol * scale) | (np.isnan(v) & np.isnan(ref)) | (v == ref)
            same &= ok.all(axis=1)
        mx, mn = ds["max"].values[:, idx[0], :], ds["min"].values[:, idx[0], :]
        degenerate = (mx == 0) & (mn == 0)
        rep_steps += (allp & same & ~degenerate).sum(axis=0)
        rec_steps += allp.sum(axis=0)
    ok = (rec_steps > 0) & (2 * rep_steps >= rec_steps)
    not_opt = ds["module"].values != "optimizer"
    return ok & not_opt & (kinds != "param_grad")


def check_replicas(
    ds: xr.Dataset,
    layout: Layout | None = None,
    *,
    dims: Sequence[str] = ("dp", "tp"),
    rtol: float = 1e-6,
    limit: int = 50,
) -> Finding:
    """Report ranks whose copy of a replicated tensor differs from their group's majority.

    Parameters
    ----------
    ds : xarray.Dataset
        One run.
    layout : Layout, optional
        Defaults to pure data parallelism over all ranks.
    dims : sequence of {"dp", "tp", "cp"}
        Which replica groups to check.
    rtol : float
        Relative tolerance (on each statistic, relative to its magnitude).
    limit : int
        How many mismatches to list as suspects.

    Returns
    -------
    Finding
        Kind ``replica_mismatch`` naming the first (step, rank, tensor) in execution order
        that departs from its replicas, or ``none``.

    Examples
    --------
    >>> import precnb
    >>> f = precnb.check_replicas(run, precnb.Layout(4))  # doctest: +SKIP
    """
    ranks = [int(r) for r in ds["rank"].values]
    layout = layout or Layout(len(ranks))
    if sorted(ranks) != list(range(layout.world_size)):
        raise ValueError(f"layout {layout.describe()} does not match the run's ranks {ranks[:8]}")
    rows: list[dict[str, Any]] = []
    checked = 0
    for dim in dims:
        if layout.size(dim) * (layout.ep if dim == "dp" else 1) <= 1:
            continue
        groups = layout.groups(dim)
        cand = _candidates(ds, dim, groups, ranks, rtol)
        if not cand.any():
            continue
        cols = np.flatnonzero(cand)
        pres = ds["present"].values[:, :, cols]
        vals = np.stack([ds[s].values[:, :, cols] for s in STATS], axis=-1)  # (step, rank, t, 4)
        seq = ds["seq"].values[:, :, cols]
        for g in groups:
            idx = [ranks.index(r) for r in g]
            v = vals[:, idx]  # (step, n, t, 4)
            p = pres[:, idx].all(axis=1)  # (step, t)
            checked += int(p.sum()) * len(g)
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                med = np.nanmedian(np.where(np.isfinite(v), v, np.nan), axis=1, keepdims=True)
                scale = np.fmax(np.abs(med), 1e-30)
                bad = ~((np.abs(v - med) <= rtol * scale) | (np.isnan(v) & np.isnan(med)))
            bad = bad.any(axis=-1) & p[:, None, :]  # (step, n, t)
            n = len(g)
            for si, k, tj in np.argwhere(bad):
                if n == 2 and k == 0 and bad[si, 1, tj]:
                    continue  # a pair: report the later rank only
                rows.append({"step": int(ds["step"].values[si]), "rank": g[k], "group": list(g), "dim": dim,
                             "tensor": str(ds["tensor"].values[cols[tj]]),
                             "node": str(ds["node"].values[cols[tj]]),
                             "seq": int(seq[si, idx[k], tj]),
                             "why": f"differs from its {dim} replicas {[r for r in g if r != g[k]]}"
                             + (" (a pair: either side may be wrong)" if n == 2 else "")})
    rows.sort(key=lambda r: (r["step"], r["seq"], r["rank"]))
    stats = {"checked_records": checked, "mismatches": len(rows), "layout": layout.describe()}
    if not rows:
        return Finding(kind="none", reason="all replicas agree", stats=stats)
    first = rows[0]
    ranks_bad = sorted({r["rank"] for r in rows if r["step"] == first["step"]})
    reason = (f"{first['tensor']} on rank {first['rank']} at step {first['step']} {first['why']}")
    hints = []
    if len(ranks_bad) == 1:
        hints.append(f"only rank {ranks_bad[0]} departs at step {first['step']}: a silent divergence on "
                     "that rank (hardware fault, non-deterministic kernel, or a missed synchronisation)")
    values = {f"rank{r}": entry_values(ds, step=first["step"], rank=r, tensor=first["tensor"])
              for r in first["group"]}
    return Finding(kind="replica_mismatch", reason=reason, step=first["step"], rank=first["rank"],
                   node=first["node"], tensor=first["tensor"],
                   module=str(ds["module"].sel(tensor=first["tensor"]).values) or None, values=values,
                   hints=hints, suspects=[{k: v for k, v in r.items() if k != "seq"} for r in rows[1:limit + 1]],
                   evidence=node_evidence(ds, first["node"]), stats=stats)
