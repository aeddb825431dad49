"""The state one pairing of two run trees builds up, and the pieces its steps share.

Its steps: :mod:`~precnb.analysis.align.pair_modules`, the calls (:mod:`~precnb.analysis.align.pairing`),
:mod:`~precnb.analysis.align.pair_tensors`, then :mod:`~precnb.analysis.align.leftover`.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from precnb.analysis.align.scores import score_memo
from precnb.analysis.align.tree import ROOT, RunTree

__all__ = ["API_THRESHOLD", "MODULE_THRESHOLD", "TENSOR_THRESHOLD", "AlignerState", "Hints", "Pairing"]

MODULE_THRESHOLD = 1.6
API_THRESHOLD = 1.2
TENSOR_THRESHOLD = 1.0


@dataclass
class Hints:
    """What the user (a mapping file) says: forced pairs, and pairs that must not be made."""

    modules: dict[str, str] = field(default_factory=dict)  # baseline path -> target path
    nodes: dict[str, str] = field(default_factory=dict)  # baseline node -> target node
    tensors: dict[str, str] = field(default_factory=dict)  # baseline label -> target label
    api_names: dict[str, set[str]] = field(default_factory=dict)  # op key (baseline) -> op keys (target)
    unpair_nodes: set[str] = field(default_factory=set)  # target nodes that must stay unpaired
    problems: list[str] = field(default_factory=list)  # pairs of a mapping file that were not kept, and why
    many_tensors: dict[str, str] = field(default_factory=dict)  # target label -> baseline label (many-to-one)
    # how a pair of precnb's own mapping file was found when it was written ("modules" / "nodes" /
    # "tensors" -> baseline -> (how, confidence)): a reloaded file keeps it; pairs without one are "user"
    found: dict[str, dict[str, tuple[str, float]]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.modules or self.nodes or self.tensors or self.api_names or self.unpair_nodes
                    or self.many_tensors)

    def how(self, level: str, baseline: str) -> tuple[str, float]:
        """(how, confidence) of a forced pair: as its mapping file recorded it, else ``("user", 1.0)``."""
        return self.found.get(level, {}).get(baseline, ("user", 1.0))


@dataclass
class Pairing:
    """Raw result: pairs (baseline → (target, how, confidence)) and the classification of the rest."""

    modules: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    nodes: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    tensors: dict[str, tuple[str, str, float]] = field(default_factory=dict)  # target label -> (baseline, ...)
    left: dict[str, dict[str, str]] = field(default_factory=lambda: {"baseline": {}, "target": {}})
    # left[side][node] = "glue: ..." | "organisation: ..." | "not captured: ..." | "unpaired: ..."


@functools.lru_cache(maxsize=4096)  # a pairing maps a few distinct scores thousands of times
def _confidence(score: float, threshold: float) -> float:
    """A score mapped into (0, 1): the threshold gives 0.5, twice its margin about 0.9."""
    return round(1.0 / (1.0 + math.exp(-2.2 * (score - threshold) / max(threshold, 1e-9))), 3)


#: the most :func:`~precnb.analysis.align.evidence.tensor_score` gives two tensors of one node (one framework)
#: whose labels differ: same size 1.0, dtype kind 0.3, close values 2.2, position 0.2, keyword 0.3
_OTHER_LABEL_MAX = 4.0


def _same_label_pairs(gb: list[Any], gt: list[Any], score: Any) -> list[tuple[Any, Any, float]] | None:
    """One group's tensors paired label to label, when that is provably what :func:`pair_greedy` pairs.

    Both sides hold the same labels (one node of one codebase) and every same-label pair reaches the
    threshold and beats every other pair of its row and column: best-first, nothing can take its place.
    Above the most a pair of different labels can score (:data:`_OTHER_LABEL_MAX`) that holds without
    scoring them; below it (values that differ: a bug, a later consequence), its row and column are
    scored. None when it is not proven (a label on one side only, a competitor as good).
    """
    if len(gb) != len(gt):
        return None
    by_label = {t.label: k for k, t in enumerate(gt)}
    if len(by_label) != len(gt) or any(a.label not in by_label for a in gb):
        return None
    out = [(a, gt[by_label[a.label]], float(score(a, gt[by_label[a.label]]))) for a in gb]
    if any(sc < TENSOR_THRESHOLD for _, _, sc in out):
        return None
    low = [i for i, (_, _, sc) in enumerate(out) if sc <= _OTHER_LABEL_MAX + 1e-9]
    if len(low) * 2 * (len(gb) - 1) > len(gb) * len(gb) // 4:
        return None  # checking them costs about what the programme costs: let it decide
    for i in low:
        a, c, sc = out[i]
        if (any(float(score(a, y)) >= sc for y in gt if y is not c)
                or any(float(score(x, c)) >= sc for x in gb if x is not a)):
            return None
    return out


def _dice(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    if not a and not b:
        return 0.0
    from collections import Counter

    ca, cb = Counter(a), Counter(b)
    inter = sum((ca & cb).values())
    return 2.0 * inter / (len(a) + len(b))


def _list_argument(slot: str) -> str:
    """``input.0`` for an element ``input.0.5`` of a list argument; ``""`` for a plain tensor."""
    parts = slot.split(".")
    return ".".join(parts[:2]) if len(parts) >= 3 and parts[0] in ("input", "kwargs") else ""


def _one_codebase(tb: RunTree, tt: RunTree) -> bool:
    """Whether two runs come from one codebase: most module paths, or most module classes, are shared.

    Pipeline chunks renumber the paths of one codebase (``0.decoder`` / ``1.decoder``) but keep its classes;
    a port to another codebase (Megatron-Core's ``ColumnParallelLinear`` / Hugging Face's ``Linear``) changes both.
    """
    paths_b, paths_t = set(tb.modules) - {ROOT}, set(tt.modules) - {ROOT}
    if len(paths_b & paths_t) >= 0.5 * max(1, min(len(paths_b), len(paths_t))):
        return True
    cls_b = {m.cls for m in tb.modules.values() if m.cls}
    cls_t = {m.cls for m in tt.modules.values() if m.cls}
    return bool(cls_b | cls_t) and len(cls_b & cls_t) >= 0.5 * len(cls_b | cls_t)



class AlignerState:
    """The two trees, the hints and the pairs made so far (modules, nodes, both directions)."""

    def __init__(self, tb: RunTree, tt: RunTree, hints: Hints | None, *, fast: bool = True) -> None:
        self.tb, self.tt = tb, tt
        self.hints = hints or Hints()
        self.fast = fast
        self.same_fw = tb.framework == tt.framework
        self.out = Pairing()
        self.mod_rev: dict[str, str] = {}
        self.node_rev: dict[str, str] = {}
        self.wrappers: dict[str, set[str]] = {"baseline": set(), "target": set()}
        self.kids_b = self._children_nodes(tb)
        self.kids_t = self._children_nodes(tt)
        # two codebases (module paths and classes mostly differ): their own glue is set aside by the rules
        # of :mod:`precnb.analysis.align.aside`; within one codebase an unpaired call stays a difference
        self.same_names = _one_codebase(tb, tt)
        self._aside_args: Any = None  # the side being classified (precnb.analysis.align.leftover)
        api_names = sorted((k, sorted(v)) for k, v in self.hints.api_names.items())
        self._api_kept, self._tensor_kept, self._decided = score_memo(tb, tt, (self.same_names, repr(api_names)))

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _children_nodes(tree: RunTree) -> dict[str, list[str]]:
        kids: dict[str, list[str]] = defaultdict(list)
        for n, info in tree.nodes.items():
            kids[info.parent or ROOT].append(n)
        for k in kids:
            kids[k].sort(key=lambda n: (tree.nodes[n].seq, n))
        return kids

    def _pair_module(self, b: str, t: str, how: str, conf: float) -> None:
        if b in self.out.modules or t in self.mod_rev:
            return
        self.out.modules[b] = (t, how, conf)
        self.mod_rev[t] = b

    def _pair_node(self, b: str, t: str, how: str, conf: float) -> bool:
        if b in self.out.nodes or t in self.node_rev or t in self.hints.unpair_nodes:
            return False
        self.out.nodes[b] = (t, how, conf)
        self.node_rev[t] = b
        return True
