"""Pair scores kept between two alignments of the same two run trees (an explorer's Match / Unmatch).

A Match or an Unmatch changes the mapping, and the pairing runs again on the same two trees
(:func:`precnb.analysis.align._tree` reads each run once). What a call pair or a tensor pair scores
from the runs' own evidence (:meth:`precnb.analysis.align.pairing._Aligner.api_value`,
:func:`~precnb.analysis.align.evidence.tensor_score`) does not depend on the mapping's pairs: it is
kept on the baseline tree, for that target tree, and the pairing decides again on the same
numbers. The mapping's own pairs and unpairings are applied before it (they are not in the kept
scores), and a mapping that renames APIs (``api_names``) keeps its own scores.
"""

from __future__ import annotations

import weakref
from typing import Any

from precnb.analysis.align.tree import RunTree

__all__ = ["score_memo"]


def score_memo(tb: RunTree, tt: RunTree, key: Any) -> tuple[dict[Any, float], dict[Any, float]]:
    """(call scores, tensor scores) kept for the trees (*tb*, *tt*) and *key* (what else the scores read)."""
    kept = getattr(tb, "_score_memo", None)
    if kept is None or kept[0]() is not tt or kept[1] != key:
        kept = (weakref.ref(tt), key, {}, {})
        tb._score_memo = kept  # type: ignore[attr-defined]
    return kept[2], kept[3]
