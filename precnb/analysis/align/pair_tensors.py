"""Tensor pairing: within each pair of calls, which input/output tensors (and gradient snapshots) correspond."""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

from precnb.analysis.align._state import (
    _OTHER_LABEL_MAX,
    TENSOR_THRESHOLD,
    AlignerState,
    _confidence,
    _list_argument,
    _same_label_pairs,
)
from precnb.analysis.align.aside import ValueIndex, tensors_disagree
from precnb.analysis.align.evidence import close, tensor_score
from precnb.analysis.align.match import pair_greedy
from precnb.analysis.align.scores import decided
from precnb.analysis.align.tree import NodeInfo, TensorInfo

__all__ = ["TensorPairing"]

_GROUPS = (("input", "kwargs"), ("output",), ("parameters",), ("grad",))
_RANK = {"input": 0, "kwargs": 0, "output": 1, "parameters": 2}  # a group's place in _GROUPS ("grad": 3)


def _groups(node: NodeInfo) -> list[tuple[list[TensorInfo], list[str]]]:
    """*node*'s tensors split into the groups paired apart (:data:`_GROUPS`), in slot order, with their labels."""
    parts = [[t for t in node.tensors if t.group in g] for g in _GROUPS]
    return [(p, [t.label for t in p]) for p in parts]


class TensorPairing(AlignerState):
    """The tensor steps of the pairing."""

    def pair_tensors(self) -> None:
        """Pair the tensors of every paired call (the mapping's tensor pairs first)."""
        for b_lbl, t_lbl in self.hints.tensors.items():
            self.out.tensors.setdefault(t_lbl, (b_lbl, *self.hints.how("tensors", b_lbl)))
        for t_lbl, b_lbl in self.hints.many_tensors.items():  # msprobe data mappings: several onto one
            self.out.tensors.setdefault(t_lbl, (b_lbl, "user", 1.0))
        used_b = {v[0] for v in self.out.tensors.values()}
        # two codebases: a tensor is not paired with another value where its own value is recorded elsewhere
        # in the other run, nor masked scores with masked scores (each codebase's fill value)
        values = None if self.same_names else (ValueIndex(self.tb), ValueIndex(self.tt))
        # no tensor pair given by the mapping: each node pair's tensors are paired as on the last alignment
        clean = not self.hints.tensors and not self.hints.many_tensors
        for nb, (nt, how, _conf) in self.out.nodes.items():
            made = decided(self._decided, ("node tensors", self.fast, nb, nt) if clean else None,
                           functools.partial(self._node_tensor_pairs, nb, nt, used_b, values))
            for c_lbl, a_lbl, t_how, conf in made:
                self.out.tensors[c_lbl] = (a_lbl, how if how == "user" else t_how, conf)
                used_b.add(a_lbl)

    def _node_tensor_pairs(self, nb: str, nt: str, used_b: set[str], values: Any) -> list[tuple[str, str, str, float]]:
        """(target label, baseline label, how, confidence) of one node pair's tensors, group by group.

        The groups hold other tensors: each is paired on what was paired before this node pair.
        """
        kept = self._tensor_kept  # kept for a rerun on the same trees (:mod:`precnb.analysis.align.scores`)
        xb, xt = self.tb.nodes[nb], self.tt.nodes[nt]
        by_name = self.fast and self.same_fw and self.same_names and values is None
        whole = self._whole_node(xb, xt, used_b, kept) if by_name else None
        if whole is not None:
            return whole
        copies_b = self._self_copies(xb)
        copies_t = self._self_copies(xt)
        out: list[tuple[str, str, str, float]] = []
        taken_t = self.out.tensors
        for (all_b, labels_b), (all_t, labels_t) in zip(_groups(xb), _groups(xt), strict=True):
            if by_name and labels_b == labels_t and all_b and len(all_b) <= 16 and (
                    used_b.isdisjoint(labels_b) and taken_t.keys().isdisjoint(labels_t)):
                same = self._same_names(all_b, all_t, kept)
                if same is not None:
                    out += same
                    continue
            gb = [t for t in all_b if t.label not in used_b and t.label not in copies_b]
            gt = [t for t in all_t if t.label not in taken_t and t.label not in copies_t]
            if not gb or not gt:
                continue
            pos_b = {t.label: k for k, t in enumerate(gb)}
            pos_t = {t.label: k for k, t in enumerate(gt)}

            def score(a: Any, c: Any, pos_b: dict[str, int] = pos_b, pos_t: dict[str, int] = pos_t) -> float:
                k = (a.label, c.label, pos_b[a.label] == pos_t[c.label])
                v = kept.get(k)
                if v is None:
                    same_list = a.label == c.label and (self.tb.lists_renamed or self.tt.lists_renamed)
                    v = kept[k] = -100.0 if values is not None and tensors_disagree(
                        a, c, *values, same_list=same_list) else \
                        tensor_score(a, c, same_framework=self.same_fw, position=k[2])
                return v

            for a, c, s in self._tensor_pairs(gb, gt, score):
                t_how = "name" if a.label == c.label else ("value" if close(a.stats, c.stats) else
                                                          ("structure" if a.slot == c.slot else "shape"))
                out.append((c.label, a.label, t_how, _confidence(s, TENSOR_THRESHOLD)))
        return out

    def _whole_node(self, xb: NodeInfo, xt: NodeInfo, used_b: set[str], kept: dict[Any, float]
                    ) -> list[tuple[str, str, str, float]] | None:
        """:meth:`_same_names` of every group of a node pair at once (None: not that case, decided group by group).

        Both nodes list the same labels in the same order, their groups one after the other in pairing order (at
        most 16 tensors each), none paired yet.
        """
        out: list[tuple[str, str, str, float]] = []
        if not xb.tensors or len(xb.tensors) != len(xt.tensors):
            return None
        taken_t, last, counts = self.out.tensors, 0, [0, 0, 0, 0]
        for a, c in zip(xb.tensors, xt.tensors, strict=True):
            label, rank = a.label, _RANK.get(a.group, 3)
            if label != c.label or label in used_b or label in taken_t or rank < last or _RANK.get(c.group, 3) != rank:
                return None
            last = rank
            counts[rank] += 1
            if counts[rank] > 16:
                return None
            k = (label, label, True)
            v = kept.get(k)
            if v is None:
                v = kept[k] = tensor_score(a, c, same_framework=self.same_fw, position=True)
            if not v > _OTHER_LABEL_MAX + 1e-9 or v < TENSOR_THRESHOLD:
                return None
            out.append((label, label, "name", _confidence(v, TENSOR_THRESHOLD)))
        return out

    def _same_names(self, gb: list[TensorInfo], gt: list[TensorInfo], kept: dict[Any, float]
                    ) -> list[tuple[str, str, str, float]] | None:
        """One group whose two sides hold the same labels in the same order (one codebase), none paired yet.

        What the general path (:meth:`_tensor_pairs`, :func:`_same_label_pairs`) gives when every same-label
        pair scores above :data:`_OTHER_LABEL_MAX` (no other pair can take its place), without building its
        position tables and score closure per group (~2,200 node pairs in a Match of a 5,000-tensor pair);
        None otherwise (the general path decides). The scores are the ones the general path keeps.
        """
        out = []
        for a, c in zip(gb, gt, strict=True):
            k = (a.label, c.label, True)
            v = kept.get(k)
            if v is None:
                v = kept[k] = tensor_score(a, c, same_framework=self.same_fw, position=True)
            if not v > _OTHER_LABEL_MAX + 1e-9 or v < TENSOR_THRESHOLD:
                return None
            out.append((c.label, a.label, "name", _confidence(v, TENSOR_THRESHOLD)))
        return out

    def pair_grad_snapshots(self) -> None:
        """Two codebases: a parameter gradient pairs the same parameter's gradient record that holds its value.

        With several micro-batches a gradient is recorded as it accumulates, and when msprobe's hook fires
        depends on the codebase and the schedule (on Megatron's last pipeline stage a row-parallel bias's
        first record already holds both micro-batches' sum): a gradient whose positional counterpart
        (the same call of the paired module) disagrees pairs the same parameter's record of another call of
        that module whose statistics are close, if one is not paired yet.
        """
        if self.same_names:
            return
        stats = {t.label: t.stats for tree in (self.tb, self.tt) for n in tree.nodes.values() for t in n.tensors}
        for b, (t, _how, _conf) in self.out.modules.items():
            mb, mt = self.tb.modules[b], self.tt.modules[t]
            if len(mb.param_grads) < 2 and len(mt.param_grads) < 2:
                continue
            ours = [c for n in mt.param_grads for c in self.tt.nodes[n].tensors]
            good = {c.label for c in ours if c.label in self.out.tensors
                    and close(stats[self.out.tensors[c.label][0]], c.stats)}
            taken = {self.out.tensors[x][0] for x in good}
            free = [a for n in mb.param_grads for a in self.tb.nodes[n].tensors if a.label not in taken]
            moved: set[str] = set()
            for c in ours:
                now = self.out.tensors.get(c.label)
                if c.label in good or (now is not None and now[1] == "user"):
                    continue
                hit = next((a for a in free if a.slot == c.slot and close(a.stats, c.stats)), None)
                if hit is not None:
                    free.remove(hit)
                    moved.add(hit.label)
                    self.out.tensors[c.label] = (hit.label, "value", 0.9)
            for c in ours:  # a record whose counterpart moved to the record that holds its value: unpaired
                now = self.out.tensors.get(c.label)
                if now is not None and now[0] in moved and not close(stats[now[0]], c.stats):
                    del self.out.tensors[c.label]

    def _tensor_pairs(self, gb: list[Any], gt: list[Any], score: Any) -> list[tuple[Any, Any, float]]:
        """:func:`pair_greedy` of one group's tensors; in one codebase, a list argument's elements per argument.

        An optimizer call holds its parameters, gradients and states as list arguments of a few hundred
        elements: within one codebase argument ``input.K`` pairs with ``input.K`` (slots mean the same), so
        their elements are paired list by list instead of all against all.
        """
        proof = self.fast and self.same_fw and self.same_names  # one codebase: same labels pair, when proven
        if not (self.same_fw and self.same_names) or len(gb) * len(gt) <= 256:
            same = _same_label_pairs(gb, gt, score) if proof else None
            if same is not None:
                return same
            return [(gb[i], gt[j], s) for i, j, s in pair_greedy(gb, gt, score, threshold=TENSOR_THRESHOLD)]
        parts_b: dict[str, list[Any]] = defaultdict(list)
        parts_t: dict[str, list[Any]] = defaultdict(list)
        for t in gb:
            parts_b[_list_argument(t.slot)].append(t)
        for t in gt:
            parts_t[_list_argument(t.slot)].append(t)
        out: list[tuple[Any, Any, float]] = []
        for key, xs in parts_b.items():
            ys = parts_t.get(key, [])
            same = _same_label_pairs(xs, ys, score) if ys and proof else None
            if same is not None:
                out += same
            elif ys:
                out += [(xs[i], ys[j], s) for i, j, s in pair_greedy(xs, ys, score, threshold=TENSOR_THRESHOLD)]
        return out

    def _self_copies(self, info: NodeInfo) -> set[str]:
        """Backward outputs of an API node that only repeat its own input.

        msprobe's PyTorch hooks record the output gradient, viewed, as a backward API's output:
        across frameworks these are not the gradients the other framework records there, so they
        are not paired.
        """
        if (self.same_fw and self.same_names) or info.kind != "api" or info.direction != "backward":
            return set()
        ins = info.group("input")
        out = set()
        for o in info.group("output"):
            if any(o.numel == i.numel and close(o.stats, i.stats, 1e-6) for i in ins):
                out.add(o.label)
        return out
