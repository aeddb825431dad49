"""Pair scores kept between two alignments of the same two run trees (an explorer's Match / Unmatch).

A Match or an Unmatch changes the mapping, and the pairing runs again on the same two trees
(:func:`precnb.analysis.align._tree` reads each run once). What a call pair or a tensor pair scores
from the runs' own evidence (:meth:`precnb.analysis.align.pairing._Aligner.api_value`,
:func:`~precnb.analysis.align.evidence.tensor_score`) does not depend on the mapping's pairs: it is
kept on the baseline tree, for that target tree, and the pairing decides again on the same
numbers. The mapping's own pairs and unpairings are applied before it (they are not in the kept
scores), and a mapping that renames APIs (``api_names``) keeps its own scores.

What a pairing step decides from those scores alone is kept too (:func:`decided`): the calls of a
scope paired in order when no hint of the mapping reaches their scores, one node pair's group of
tensors. Given the same lists (the same names, in the same order) it decides the same pairs: a
Match re-pairs only the scopes and nodes whose lists or scores it changed.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from precnb.analysis.align.tree import RunTree

__all__ = ["decided", "score_memo"]

T = TypeVar("T")


def score_memo(tb: RunTree, tt: RunTree, key: Any) -> tuple[dict[Any, float], dict[Any, float], dict[Any, Any]]:
    """(call scores, tensor scores, decisions) kept for the trees (*tb*, *tt*) and *key* (what else the scores read)."""
    kept = getattr(tb, "_score_memo", None)
    if kept is None or kept[0]() is not tt or kept[1] != key:
        kept = (weakref.ref(tt), key, {}, {}, {})
        tb._score_memo = kept  # type: ignore[attr-defined]
    return kept[2], kept[3], kept[4]


def decided(kept: dict[Any, Any], key: Any, decide: Callable[[], list[T]]) -> list[T]:
    """*decide()*, kept under *key* (what it reads besides the kept scores; None: not kept)."""
    if key is None:
        return decide()
    got = kept.get(key)
    if got is None:
        got = kept[key] = tuple(decide())
    return list(got)
