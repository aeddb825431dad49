"""Order-preserving pairing of two sequences (execution order is shared by both runs).

:func:`pair_in_order` is a Needleman–Wunsch style dynamic programme that maximises the summed
score of the pairs it keeps (a pair is kept only when its score reaches the threshold; gaps
cost nothing), with ties resolved towards the earliest partner. Long sequences are first cut
at exact anchors (runs of equal keys found by ``difflib``), and the programme runs in a band
around the path they trace (:data:`BAND` calls either side of it, the whole of each gap between
them): an anchor only says where the two runs are, not which of several alike calls near it is
the counterpart (a tensor-parallel run's extra calls shift a run of ``matmul, t, matmul`` by a
few places), so the scores decide inside the band.

Examples
--------
>>> pair_in_order(["a", "x", "b"], ["a", "b"], lambda p, q: 1.0 if p == q else 0.0, threshold=0.5)
[(0, 0, 1.0), (2, 1, 1.0)]
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np

__all__ = ["pair_greedy", "pair_in_order", "programme_cells"]

A = TypeVar("A")
B = TypeVar("B")

MAX_CELLS = 250_000
"""Largest pair of sequences (rows × columns) solved by the full dynamic programme; longer ones run banded."""

BAND = 16
"""How many places either side of the anchors' path the banded programme considers."""

MAX_BAND_CELLS = 2_000_000
"""Largest band (cells scored); beyond it, runs of equal keys pair by position and the gaps as below."""


def _dp(a: Sequence[Any], b: Sequence[Any], score: Callable[[Any, Any], float], threshold: float
        ) -> list[tuple[int, int, float]]:
    """The full programme: every pair of *a* and *b* considered (:func:`_banded_dp` over every column)."""
    return _banded_dp(a, b, score, threshold, np.zeros(len(a), np.int64), np.full(len(a), len(b), np.int64))


def pair_in_order(
    a: Sequence[A],
    b: Sequence[B],
    score: Callable[[A, B], float],
    *,
    threshold: float,
    key_a: Callable[[A], Hashable] | None = None,
    key_b: Callable[[B], Hashable] | None = None,
) -> list[tuple[int, int, float]]:
    """Pairs ``(i, j, score)`` of *a* and *b*, increasing in both i and j.

    Parameters
    ----------
    a, b : sequence
    score : callable
        ``score(a[i], b[j])``; pairs below *threshold* are never made.
    threshold : float
    key_a, key_b : callable, optional
        Cheap keys; for long sequences, runs of equal keys are taken as anchors first.

    Returns
    -------
    list of (int, int, float)
    """
    n, m = len(a), len(b)
    if n * m <= MAX_CELLS or key_a is None or key_b is None:
        if n * m > MAX_CELLS:  # no keys to anchor with: pair by position, scored
            return [(i, i, float(score(a[i], b[i]))) for i in range(min(n, m))
                    if float(score(a[i], b[i])) >= threshold]
        return _dp(a, b, score, threshold)
    blocks = _matching_blocks([key_a(x) for x in a], [key_b(y) for y in b])
    lo, hi = _band(blocks, n, m, BAND)
    if int((hi - lo).sum()) <= MAX_BAND_CELLS:
        return _banded_dp(a, b, score, threshold, lo, hi)
    out: list[tuple[int, int, float]] = []
    pa = pb = 0
    for blk in blocks:
        # the gap before this block
        ga, gb = list(range(pa, blk.a)), list(range(pb, blk.b))
        if ga and gb:
            sub = pair_in_order([a[i] for i in ga], [b[j] for j in gb], score, threshold=threshold)
            out.extend((ga[i], gb[j], s) for i, j, s in sub)
        for k in range(blk.size):
            s = float(score(a[blk.a + k], b[blk.b + k]))
            if s >= threshold:
                out.append((blk.a + k, blk.b + k, s))
        pa, pb = blk.a + blk.size, blk.b + blk.size
    return out


def programme_cells(a: Sequence[A], b: Sequence[B], key_a: Callable[[A], Hashable],
                    key_b: Callable[[B], Hashable]) -> tuple[np.ndarray, np.ndarray] | None:
    """The cells :func:`pair_in_order`'s programme weighs for these lists: per row of *a*, columns ``[lo, hi)``.

    Every column for lists within :data:`MAX_CELLS`, the band around the anchors for longer ones; None when it
    pairs them otherwise (a band beyond :data:`MAX_BAND_CELLS`: run by run). A pairing proven the best of every
    pairing (:func:`precnb.analysis.align.certify.certified_pairs`) is what the programme returns when each of its
    pairs is one of these cells: the programme finds the best pairing among them, and that one is among them.
    """
    n, m = len(a), len(b)
    if n * m <= MAX_CELLS:
        return np.zeros(n, np.int64), np.full(n, m, np.int64)
    lo, hi = _band(_matching_blocks([key_a(x) for x in a], [key_b(y) for y in b]), n, m, BAND)
    return (lo, hi) if int((hi - lo).sum()) <= MAX_BAND_CELLS else None


def _matching_blocks(ka: list[Hashable], kb: list[Hashable]) -> list[difflib.Match]:
    """``difflib.SequenceMatcher(None, ka, kb, autojunk=False).get_matching_blocks()``.

    Equal key lists (one codebase: the same ops in the same order) have one block, the whole list, and the
    sentinel: what difflib finds (the longest common block is the whole list, unique) without its quadratic
    search (0.02-0.03 s for a scope of 1,000 calls).

    >>> keys = ["a", "b", "a"]
    >>> _matching_blocks(keys, list(keys)) == difflib.SequenceMatcher(None, keys, keys).get_matching_blocks()
    True
    """
    if ka == kb:
        n = len(ka)
        return [difflib.Match(0, 0, n), difflib.Match(n, n, 0)] if n else [difflib.Match(0, 0, 0)]
    return difflib.SequenceMatcher(None, ka, kb, autojunk=False).get_matching_blocks()


def _band(blocks: Sequence[Any], n: int, m: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of *a*, the columns ``[lo, hi)`` of *b* it may pair with: *width* around the anchors' path.

    A row inside a run of equal keys is centred on its anchor's column; a row in a gap between two runs
    spans the gap's columns. Both bounds never decrease (an order-preserving pairing stays inside).
    """
    lo = np.zeros(n, np.int64)
    hi = np.zeros(n, np.int64)
    pa = pb = 0
    for blk in blocks:
        lo[pa:blk.a] = pb - width
        hi[pa:blk.a] = blk.b + width
        k = np.arange(blk.size)
        lo[blk.a:blk.a + blk.size] = blk.b + k - width
        hi[blk.a:blk.a + blk.size] = blk.b + k + width + 1
        pa, pb = blk.a + blk.size, blk.b + blk.size
    lo[pa:] = pb - width
    hi[pa:] = m
    return (np.clip(np.maximum.accumulate(lo), 0, m) if n else lo,
            np.clip(np.maximum.accumulate(hi), 0, m) if n else hi)


def _banded_dp(a: Sequence[Any], b: Sequence[Any], score: Callable[[Any, Any], float], threshold: float,
               lo: np.ndarray, hi: np.ndarray) -> list[tuple[int, int, float]]:
    """The order-preserving programme with row ``i`` of *a* pairing only inside columns ``[lo[i], hi[i])`` of *b*.

    A pair's gain is its score less the threshold (kept only at or above it), a little less for later partners
    (ties go to the earliest pairing); gaps cost nothing; the pairing maximises the summed gain. The table
    ``best[i][j]`` (the best total over ``a[:i]``, ``b[:j]``) is kept per row over the band's columns only:
    below them a row adds nothing to the row above, beyond them it stays at its last value (both bounds never
    decrease), so each row is computed from the one above. On equal totals a pair is preferred, then skipping a
    call of *a*, then one of *b*.

    >>> lo, hi = np.array([0, 0, 1]), np.array([2, 2, 2])
    >>> _banded_dp("axb", "ab", lambda p, q: 1.0 if p == q else 0.0, 0.5, lo, hi)
    [(0, 0, 1.0), (2, 1, 1.0)]
    """
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return []
    rows: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []  # (start column, best, move, raw) per row
    start, prev = 0, np.zeros(m + 1)  # row 0: all zeros (stored whole)

    def above(cols: np.ndarray) -> np.ndarray:
        return prev[np.minimum(cols - start, len(prev) - 1)]

    for i in range(n):
        c0, c1 = int(lo[i]), int(hi[i])  # pairs with b[c0:c1]: table columns c0 + 1 .. c1
        cols = np.arange(c0, c1 + 1)  # table columns kept for this row
        up = above(cols)
        raw = np.full(len(cols), np.nan)
        diag = np.full(len(cols), -np.inf)
        if c1 > c0:
            js = np.arange(c0, c1)
            s = np.array([float(score(a[i], b[j])) for j in range(c0, c1)])
            raw[1:] = s
            ok = s >= threshold
            g = s - threshold + 1e-3 - 1e-7 * (i + js)
            diag[1:] = np.where(ok, above(js) + g, -np.inf)
        best = np.empty(len(cols))
        move = np.empty(len(cols), np.int8)
        left = -np.inf
        for k in range(len(cols)):
            d, u = diag[k], up[k]
            if d >= u and d >= left:
                best[k], move[k] = d, 0
            elif u >= left:
                best[k], move[k] = u, 1
            else:
                best[k], move[k] = left, 2
            left = best[k]
        rows.append((c0, best, move, raw))
        start, prev = c0, best
    out: list[tuple[int, int, float]] = []
    i, j = n, m
    while i > 0 and j > 0:
        c0, _best, move, raw = rows[i - 1]
        k = j - c0
        if k >= len(move):  # beyond the band: the row's last value, carried along b
            j = c0 + len(move) - 1
            continue
        if k < 0:  # before the band: the row above's value
            i -= 1
            continue
        mv = move[k]
        if mv == 0:
            out.append((i - 1, j - 1, float(raw[k])))
            i, j = i - 1, j - 1
        elif mv == 1:
            i -= 1
        else:
            j -= 1
    out.reverse()
    return out


def pair_greedy(a: Sequence[A], b: Sequence[B], score: Callable[[A, B], float], *, threshold: float
                ) -> list[tuple[int, int, float]]:
    """Best-first one-to-one pairs (order not required), each at least *threshold*.

    Examples
    --------
    >>> pair_greedy([1, 5], [5, 1], lambda p, q: 1.0 if p == q else 0.0, threshold=0.5)
    [(0, 1, 1.0), (1, 0, 1.0)]
    """
    cand = []
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            s = float(score(x, y))
            if s >= threshold:
                cand.append((-s, i, j))
    cand.sort()
    used_a: set[int] = set()
    used_b: set[int] = set()
    out = []
    for neg, i, j in cand:
        if i in used_a or j in used_b:
            continue
        used_a.add(i)
        used_b.add(j)
        out.append((i, j, -neg))
    out.sort()
    return out
