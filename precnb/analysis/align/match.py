"""Order-preserving pairing of two sequences (execution order is shared by both runs).

:func:`pair_in_order` is a Needleman–Wunsch style dynamic programme that maximises the summed
score of the pairs it keeps (a pair is kept only when its score reaches the threshold; gaps
cost nothing), with ties resolved towards the earliest partner. Long sequences are first cut
at exact anchors (equal keys found by ``difflib``) so the programme only runs inside the gaps.

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

__all__ = ["pair_greedy", "pair_in_order"]

A = TypeVar("A")
B = TypeVar("B")

MAX_CELLS = 250_000
"""Largest gap (rows × columns) solved by the dynamic programme; larger gaps pair by key in order."""


def _dp(a: Sequence[Any], b: Sequence[Any], score: Callable[[Any, Any], float], threshold: float
        ) -> list[tuple[int, int, float]]:
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return []
    gain = np.full((n, m), -np.inf)
    raw = np.zeros((n, m))
    for i in range(n):
        for j in range(m):
            s = float(score(a[i], b[j]))
            raw[i, j] = s
            if s >= threshold:
                # a little less for later partners: ties go to the earliest pairing
                gain[i, j] = s - threshold + 1e-3 - 1e-7 * (i + j)
    best = np.zeros((n + 1, m + 1))
    move = np.zeros((n + 1, m + 1), np.int8)  # 0 diag, 1 skip a, 2 skip b
    for i in range(1, n + 1):
        gi = gain[i - 1]
        for j in range(1, m + 1):
            diag = best[i - 1, j - 1] + gi[j - 1] if gi[j - 1] > -np.inf else -np.inf
            up = best[i - 1, j]
            left = best[i, j - 1]
            if diag >= up and diag >= left:
                best[i, j], move[i, j] = diag, 0
            elif up >= left:
                best[i, j], move[i, j] = up, 1
            else:
                best[i, j], move[i, j] = left, 2
    out: list[tuple[int, int, float]] = []
    i, j = n, m
    while i > 0 and j > 0:
        mv = move[i, j]
        if mv == 0:
            out.append((i - 1, j - 1, float(raw[i - 1, j - 1])))
            i, j = i - 1, j - 1
        elif mv == 1:
            i -= 1
        else:
            j -= 1
    out.reverse()
    return out


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
    ka = [key_a(x) for x in a]
    kb = [key_b(y) for y in b]
    sm = difflib.SequenceMatcher(None, ka, kb, autojunk=False)
    out: list[tuple[int, int, float]] = []
    pa = pb = 0
    for blk in sm.get_matching_blocks():
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
