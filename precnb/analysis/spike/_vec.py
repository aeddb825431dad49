"""Medians the cause tests take over ranks and steps, vectorised and equal to ``np.median`` of the same values.

The tests were first written one rank at a time (``np.median(np.delete(g, ri))`` and the like:
one NumPy call per rank, per parameter, per step; 128 ranks made the loss-spike search 2-4x slower
than the anomaly search, issue 29). These helpers compute the same order statistics for every
rank at once: a sort, then the middle element (odd count) or the mean of the two middle elements
(even count), which is what ``np.median`` returns for those values.

Examples
--------
>>> import numpy as np
>>> x = np.array([[1.0, 5.0], [np.nan, 2.0], [3.0, np.inf], [7.0, 1.0]])
>>> masked_median(x, np.isfinite(x)).tolist()
[3.0, 2.0]
>>> median_without_each(np.array([4.0, 1.0, np.nan, 2.0])).tolist()
[1.5, 3.0, nan, 2.5]
"""

from __future__ import annotations

import numpy as np

__all__ = ["masked_median", "median_without_each", "ratios", "row_medians"]


def masked_median(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Median over axis 0 of the entries of *x* where *mask* holds (NaN where a column holds none).

    Equal to ``np.median(x[mask[:, c], c])`` for every column ``c``.
    """
    x = np.asarray(x, dtype=float)
    mask = np.asarray(mask, bool) & ~np.isnan(x)
    s = np.sort(np.where(mask, x, np.nan), axis=0)  # NaN last
    cnt = mask.sum(axis=0)
    lo = np.take_along_axis(s, np.maximum((cnt - 1) // 2, 0)[None], axis=0)[0]
    hi = np.take_along_axis(s, np.maximum(cnt // 2, 0)[None], axis=0)[0]
    with np.errstate(invalid="ignore", over="ignore"):
        mid = np.where(cnt % 2 == 1, lo, (lo + hi) / 2)
    return np.where(cnt > 0, mid, np.nan)


def median_without_each(g: np.ndarray) -> np.ndarray:
    """For each finite ``g[i]``: the median of the other finite entries (NaN where ``g[i]`` is not finite).

    Equal to ``np.median`` of ``np.delete(g, i)`` restricted to its finite values (NaN when none).
    """
    g = np.asarray(g, dtype=float)
    fin = np.isfinite(g)
    s = np.sort(g[fin])
    m = len(s)
    out = np.full(len(g), np.nan)
    if m < 2:
        return out
    p = np.searchsorted(s, g[fin], side="left")  # a position of g[i] itself: dropping any equal copy is the same

    def rest(k: int) -> np.ndarray:  # element k of the remaining m - 1 sorted values, for every i
        return np.where(k < p, s[min(k, m - 1)], s[min(k + 1, m - 1)])

    n = m - 1
    with np.errstate(invalid="ignore", over="ignore"):
        med = rest((n - 1) // 2) if n % 2 == 1 else (rest(n // 2 - 1) + rest(n // 2)) / 2
    out[fin] = med
    return out


def row_medians(m: np.ndarray) -> np.ndarray:
    """``np.median(m, axis=1)`` (every entry finite), in blocks of rows so that memory stays bounded."""
    if not m.shape[0]:
        return np.zeros(0)
    step = max(1, 2_000_000 // max(m.shape[1], 1))
    return np.concatenate([np.median(m[i:i + step], axis=1) for i in range(0, m.shape[0], step)])


def ratios(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a / b`` where both are finite and ``b > 0``, else NaN (elementwise ``_ratio``)."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    ok = np.isfinite(a) & np.isfinite(b) & (b > 0)
    with np.errstate(all="ignore"):
        return np.where(ok, a / np.where(ok, b, 1.0), np.nan)
