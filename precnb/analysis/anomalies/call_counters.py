"""msprobe's call counters across steps: which (step, rank, tensor) of an API call names the same call.

msprobe numbers an API's calls within a step (``Torch.matmul.3``). When one step makes more or fewer calls of
an API than another, every later counter of that API names another call there, so a counter's statistics
are one series only where the step made as many calls as the rank's last step (used by the anomaly search,
:mod:`precnb.analysis.anomalies`, so a shifted counter is not read as a spike).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

__all__ = ["same_calls"]


def same_calls(ds: xr.Dataset) -> np.ndarray:
    """(step, rank, tensor): an API call's counter names the same call as at the rank's last step.

    msprobe numbers an API's calls per step; when a step makes more or fewer calls of an API (Megatron
    computes its rotary embedding at the first step only and caches it), every later counter of that API
    names another call, so its statistics are not one series. Module records keep their names.
    """
    present = np.asarray(ds["present"].values, bool)
    out = np.ones(present.shape, bool)
    if present.shape[0] < 2:
        return out
    kinds, apis, nodes = ds["kind"].values, ds["api"].values, ds["node"].values
    fwd = np.fromiter((k == "api" and str(n).endswith(".forward") for k, n in zip(kinds, nodes, strict=True)),
                      bool, len(nodes))
    by_api: dict[str, list[int]] = {}
    for j in np.flatnonzero(kinds == "api").tolist():
        by_api.setdefault(str(apis[j]), []).append(j)
    for cols in by_api.values():
        node_cols: dict[str, int] = {}
        for j in cols:
            if fwd[j]:
                node_cols.setdefault(str(nodes[j]), j)  # one tensor per forward call stands for its presence
        if not node_cols:
            continue
        counts = present[:, :, list(node_cols.values())].sum(axis=2)  # (step, rank)
        recorded = np.asarray(present[:, :, cols].any(axis=2), bool)
        for ri in range(present.shape[1]):
            steps = np.flatnonzero(recorded[:, ri])
            if len(steps) < 2:
                continue
            ok = counts[:, ri] == counts[steps[-1], ri]
            if not ok[steps].all():
                out[np.ix_(~ok, [ri], cols)] = False
    return out
