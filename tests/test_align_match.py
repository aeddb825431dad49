"""The order-preserving pairing of long call lists (precnb.analysis.align.match).

A long pair of call lists is lined up on anchors (runs of equal keys) and paired by the scores in a band
around them: an anchor says where the runs are, not which of several alike calls is the counterpart. A real
case: a healthy tp2 run with sequence parallelism against tp1 at level L1 (no module records, so every call
pairs at the root) had its backward ``matmul, t, matmul`` runs shifted by two places, and the first
divergence named a weight gradient paired with another layer's ("computed differently here").
"""

from __future__ import annotations

import random

import numpy as np

from precnb.analysis.align import match


def _reference_programme(a, b, score, threshold):
    """The Needleman-Wunsch programme written out over the whole table (what the banded one must equal)."""
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return []
    gain = np.full((n, m), -np.inf)
    raw = np.zeros((n, m))
    for i in range(n):
        for j in range(m):
            s = raw[i, j] = float(score(a[i], b[j]))
            if s >= threshold:
                gain[i, j] = s - threshold + 1e-3 - 1e-7 * (i + j)
    best = np.zeros((n + 1, m + 1))
    move = np.zeros((n + 1, m + 1), np.int8)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            diag = best[i - 1, j - 1] + gain[i - 1, j - 1]
            up, left = best[i - 1, j], best[i, j - 1]
            pick = (diag, 0) if diag >= up and diag >= left else ((up, 1) if up >= left else (left, 2))
            best[i, j], move[i, j] = pick
    out, i, j = [], n, m
    while i > 0 and j > 0:
        if move[i, j] == 0:
            out.append((i - 1, j - 1, float(raw[i - 1, j - 1])))
            i, j = i - 1, j - 1
        elif move[i, j] == 1:
            i -= 1
        else:
            j -= 1
    return out[::-1]


def _pairs(out: list[tuple[int, int, float]]) -> list[tuple[int, int]]:
    return [(i, j) for i, j, _ in out]


def test_long_lists_pair_on_scores_near_their_anchors(monkeypatch):
    monkeypatch.setattr(match, "MAX_CELLS", 4)  # these lists count as long
    a = [("mm", 1), ("mm", 2), ("mm", 3)]
    b = [("mm", 9), ("mm", 1), ("mm", 2), ("mm", 3)]  # an extra call first: the keys alone line up 0-0, 1-1, 2-2
    out = match.pair_in_order(a, b, lambda p, q: 2.0 if p == q else 1.0, threshold=0.5,
                              key_a=lambda x: x[0], key_b=lambda y: y[0])
    assert _pairs(out) == [(0, 1), (1, 2), (2, 3)]


def test_a_band_over_every_column_is_the_full_programme():
    rng = random.Random(7)
    for _ in range(400):
        n, m = rng.randint(0, 8), rng.randint(0, 8)
        table = {(i, j): rng.choice([0.0, 0.5, 1.0, 1.5, 2.0]) for i in range(n) for j in range(m)}

        def score(p: int, q: int, t: dict[tuple[int, int], float] = table) -> float:
            return t[(p, q)]

        full = _reference_programme(list(range(n)), list(range(m)), score, 1.0)
        assert match._dp(list(range(n)), list(range(m)), score, 1.0) == full


def test_the_band_follows_the_anchors_and_spans_each_gap():
    import difflib

    ka, kb = list("abXcd"), list("abYYcd")
    blocks = difflib.SequenceMatcher(None, ka, kb, autojunk=False).get_matching_blocks()
    lo, hi = match._band(blocks, len(ka), len(kb), 0)
    assert lo.tolist() == [0, 1, 2, 4, 5] and hi.tolist() == [1, 2, 4, 5, 6]  # X may pair with either Y
