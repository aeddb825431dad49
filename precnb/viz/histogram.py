"""Value histograms of one tensor in several runs, overlaid (tensor-mode dumps).

Examples
--------
>>> import numpy as np
>>> f = histogram_frame({"baseline": np.array([0.0, 1.0, 1.0]), "target": np.array([0.0, 2.0])}, bins=2)
>>> f[["run", "lo", "hi", "count"]].values.tolist()
[['baseline', 0.0, 1.0, 1], ['baseline', 1.0, 2.0, 2], ['target', 0.0, 1.0, 1], ['target', 1.0, 2.0, 1]]
>>> f.attrs["nonfinite"]
{'baseline': 0, 'target': 0}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

__all__ = ["histogram_chart", "histogram_frame"]


def histogram_frame(values: Mapping[str, Any], *, bins: int = 40) -> pd.DataFrame:
    """Counts of each run's finite values in shared bins (NaN / ±inf counted apart).

    Parameters
    ----------
    values : mapping of str to array-like
        Run name → the tensor's values (any shape; torch tensors are converted).
    bins : int

    Returns
    -------
    pandas.DataFrame
        ``run, lo, hi, count, share`` (share of the run's finite values); ``attrs["nonfinite"]``
        maps run → NaN/inf count, ``attrs["numel"]`` run → element count.
    """
    arrays: dict[str, np.ndarray] = {}
    for name, v in values.items():
        if hasattr(v, "detach"):  # a torch tensor (bf16 has no numpy dtype: go through float32)
            v = v.detach().float().cpu().numpy()
        arrays[str(name)] = np.asarray(v, dtype=np.float64).ravel()
    finite = {k: a[np.isfinite(a)] for k, a in arrays.items()}
    allv = np.concatenate([a for a in finite.values() if a.size]) if any(a.size for a in finite.values()) else None
    rows: list[dict[str, Any]] = []
    if allv is not None:
        lo, hi = float(allv.min()), float(allv.max())
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        edges = np.linspace(lo, hi, int(bins) + 1)
        for name, a in finite.items():
            counts, _ = np.histogram(a, bins=edges)
            total = max(int(a.size), 1)
            rows += [{"run": name, "lo": float(edges[i]), "hi": float(edges[i + 1]), "count": int(c),
                      "share": float(c) / total} for i, c in enumerate(counts)]
    out = pd.DataFrame(rows, columns=["run", "lo", "hi", "count", "share"])
    out.attrs.update(nonfinite={k: int((~np.isfinite(a)).sum()) for k, a in arrays.items()},
                     numel={k: int(a.size) for k, a in arrays.items()})
    return out


def histogram_chart(frame: pd.DataFrame, *, title: str = "", width: int = 400, height: int = 150) -> alt.Chart:
    """The runs' histograms overlaid (translucent bars, one colour per run)."""
    return alt.Chart(frame, title=title, width=width, height=height).mark_bar(opacity=0.5, binSpacing=0).encode(
        x=alt.X("lo:Q", title="value", scale=alt.Scale(nice=False, zero=False)), x2="hi:Q",
        y=alt.Y("share:Q", title="share of values", stack=None),
        color=alt.Color("run:N", title=None, legend=alt.Legend(orient="top")),
        tooltip=[alt.Tooltip("run:N"), alt.Tooltip("lo:Q", format=".4g"), alt.Tooltip("hi:Q", format=".4g"),
                 alt.Tooltip("count:Q")])
