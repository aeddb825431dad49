"""The pairing itself: modules top-down, then the calls inside paired modules, then their tensors.

1. **Modules.** Children of paired parents are paired in execution order (an order-preserving
   programme, :mod:`precnb.analysis.align.match`) on name and class similarity, the sizes of
   the parameters below them and, where the runs share weights, equal parameter and output
   statistics. A module with one child facing several is tried as a wrapper (DDP's
   ``module``, a ``model.`` prefix); an unpaired container is tried expanded.
2. **Calls.** The k-th forward / backward call of paired modules pair; inside each paired call,
   the API calls it made (those of unpaired sub-modules folded in) pair in execution order on
   the op family (``Functional.linear`` ≈ ``Primitive.matmul.MatMul``), output sizes and
   values. A backward API node pairs where its forward node paired. Root-level calls pair at
   the root, optimizer calls in the optimizer scope.
3. **Tensors.** Inside paired nodes, inputs / outputs / parameters / gradients pair one to one
   on size, dtype kind, values and position.
4. What is left is classified: framework glue (reshape / view / cast / shape ops, ops that copy
   their input), organisation (a module level the other run does not have), not captured (a
   scope the other run did not record) — none of them a divergence — and the rest, a real
   extra or missing computation.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from precnb.analysis.align.aside import ValueIndex, aside_reason, call_modules, same_result, tensors_disagree
from precnb.analysis.align.certify import certified_pairs
from precnb.analysis.align.evidence import close, module_values, node_values, tensor_score
from precnb.analysis.align.match import MAX_CELLS, pair_greedy, pair_in_order
from precnb.analysis.align.scores import decided, score_memo
from precnb.analysis.align.tree import ROOT, SCOPES, NodeInfo, RunTree
from precnb.analysis.align.vocab import class_similarity, is_glue_op, name_similarity, op_similarity
from precnb.naming import is_communication, op_key

__all__ = ["Hints", "Pairing", "pair_runs"]

_P2P = frozenset({"send", "recv", "isend", "irecv", "batchisendirecv", "p2pop"})

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


class _Aligner:
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
        self._aside_args: _AsideArgs | None = None
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

    # ------------------------------------------------------------------ modules
    def module_score(self, b: str, t: str) -> float:
        if self.hints.modules.get(b) == t:
            return 100.0
        if b in self.hints.modules or t in self.hints.modules.values():
            return -100.0  # the user paired these elsewhere
        mb, mt = self.tb.modules[b], self.tt.modules[t]
        s = 1.2 * name_similarity(mb.name, mt.name)
        s += class_similarity(mb.cls, mt.cls)
        if mb.n_params or mt.n_params:
            s += _dice(mb.param_numels, mt.param_numels)
        else:
            s += 0.2
        s += module_values(self.tb, mb, self.tt, mt)
        if b == t:
            s += 0.5
        nb, nt = len(mb.children), len(mt.children)
        if nb or nt:
            s += 0.3 * (1.0 - abs(nb - nt) / max(nb, nt))
        return s

    def _how_module(self, b: str, t: str) -> str:
        if self.hints.modules.get(b) == t:
            return self.hints.how("modules", b)[0]
        mb, mt = self.tb.modules[b], self.tt.modules[t]
        if b == t and (mb.cls == mt.cls or class_similarity(mb.cls, mt.cls) >= 0.8):
            return "name"
        if module_values(self.tb, mb, self.tt, mt) >= 1.5:
            return "value"
        if mb.n_params and _dice(mb.param_numels, mt.param_numels) >= 0.99 and name_similarity(mb.name, mt.name) < 0.8:
            return "shape"
        return "structure"

    def _align_children(self, cb: list[str], ct: list[str]) -> list[tuple[int, int, float]]:
        """Children paired in order; kept for the same children when no module pair of the mapping is among them."""
        forced = self.hints.modules
        touched = any(b in forced for b in cb) or not set(forced.values()).isdisjoint(ct)
        return decided(self._decided, None if touched else ("modules", tuple(cb), tuple(ct)),
                       lambda: pair_in_order(cb, ct, self.module_score, threshold=MODULE_THRESHOLD))

    @staticmethod
    def _total(pairs: list[tuple[int, int, float]]) -> float:
        return sum(s - MODULE_THRESHOLD for _, _, s in pairs)

    def pair_modules(self, pb: str = ROOT, pt: str = ROOT) -> None:
        cb = list(self.tb.modules[pb].children)
        ct = list(self.tt.modules[pt].children)
        cb, ct = self._unwrap(cb, ct)
        pairs = self._align_children(cb, ct)
        pairs, cb, ct = self._expand_unpaired(cb, ct, pairs)
        for i, j, s in pairs:
            b, t = cb[i], ct[j]
            self._pair_module(b, t, self._how_module(b, t), _confidence(s, MODULE_THRESHOLD))
        for i, j, _s in pairs:
            self.pair_modules(cb[i], ct[j])

    def _unwrap(self, cb: list[str], ct: list[str]) -> tuple[list[str], list[str]]:
        """One child facing several: try it as a wrapper of what the other side holds directly."""
        for _ in range(8):
            if len(cb) == 1 and len(ct) > 1 and self.tb.modules[cb[0]].children:
                inner = list(self.tb.modules[cb[0]].children)
                if self._total(self._align_children(inner, ct)) > self._total(self._align_children(cb, ct)):
                    self.wrappers["baseline"].add(cb[0])
                    cb = inner
                    continue
            if len(ct) == 1 and len(cb) > 1 and self.tt.modules[ct[0]].children:
                inner = list(self.tt.modules[ct[0]].children)
                if self._total(self._align_children(cb, inner)) > self._total(self._align_children(cb, ct)):
                    self.wrappers["target"].add(ct[0])
                    ct = inner
                    continue
            break
        return cb, ct

    def _expand_unpaired(self, cb: list[str], ct: list[str], pairs: list[tuple[int, int, float]]
                         ) -> tuple[list[tuple[int, int, float]], list[str], list[str]]:
        """Unpaired containers (and wrappers) on either side: try pairing their children instead."""
        for _ in range(4):
            used_b = {i for i, _, _ in pairs}
            used_t = {j for _, j, _ in pairs}
            changed = False
            for side in ("baseline", "target"):
                lst, used, tree = (cb, used_b, self.tb) if side == "baseline" else (ct, used_t, self.tt)
                for k, path in enumerate(lst):
                    m = tree.modules[path]
                    if k in used or not m.children or not (m.virtual or len(m.children) >= 1):
                        continue
                    new = lst[:k] + list(m.children) + lst[k + 1:]
                    trial = self._align_children(new, ct) if side == "baseline" else self._align_children(cb, new)
                    if self._total(trial) > self._total(pairs) + 1e-9:
                        self.wrappers[side].add(path)
                        if side == "baseline":
                            cb = new
                        else:
                            ct = new
                        pairs, changed = trial, True
                        break
                if changed:
                    break
            if not changed:
                break
        return pairs, cb, ct

    def pair_moved_modules(self) -> None:
        """Modules the tree walk left unpaired that moved to another parent (a restructured model).

        Only strong evidence pairs here — equal parameters or outputs and a similar class — since
        position no longer helps; pairs made this way are walked into like the others.
        """
        for _ in range(3):
            left_b = [p for p, m in self.tb.modules.items() if p and p not in self.out.modules and m.forward]
            left_t = [p for p, m in self.tt.modules.items() if p and p not in self.mod_rev and m.forward]
            if not left_b or not left_t or len(left_b) * len(left_t) > 250_000:
                return
            strong = MODULE_THRESHOLD + 2.0

            def score(b: str, t: str) -> float:
                mb, mt = self.tb.modules[b], self.tt.modules[t]
                if module_values(self.tb, mb, self.tt, mt) < 1.5 or class_similarity(mb.cls, mt.cls) < 0.5:
                    return 0.0
                return self.module_score(b, t)

            pairs = pair_greedy(left_b, left_t, score, threshold=strong)
            if not pairs:
                return
            for i, j, s in pairs:
                self._pair_module(left_b[i], left_t[j], "value", _confidence(s, MODULE_THRESHOLD))
            for i, j, _s in pairs:
                self.pair_modules(left_b[i], left_t[j])

    # ------------------------------------------------------------------ calls
    def api_score(self, x: NodeInfo, y: NodeInfo) -> float:
        if self.hints.nodes.get(x.name) == y.name:
            return 100.0
        if x.name in self.hints.nodes or y.name in self.hints.unpair_nodes:
            return -100.0
        k = (x.name, y.name)
        v = self._api_kept.get(k)
        if v is None:  # kept for a rerun on the same trees (:mod:`precnb.analysis.align.scores`)
            v = self._api_kept[k] = self.api_value(x, y)
        return v

    def api_value(self, x: NodeInfo, y: NodeInfo) -> float:
        """What a call pair scores on the runs' evidence (the mapping's own pairs aside)."""
        sim = op_similarity(x.api, y.api)
        want = self.hints.api_names.get(op_key(x.api))
        if want and op_key(y.api) in want:
            sim = max(sim, 1.0)
        s = 1.4 * sim
        ox, oy = x.outputs, y.outputs
        if ox and oy:
            s += 0.5 if ox[0].numel == oy[0].numel else -0.6
        s += node_values(x, y)
        if sim == 0.0 and (is_glue_op(x.api) or is_glue_op(y.api)):
            s -= 1.0
        elif not self.same_names and is_communication(x.name) != is_communication(y.name):
            # two codebases: a collective one run adds (a TP all-reduce completing a row-parallel matmul's
            # partial sum) is glue, never the counterpart of the other's computation, whatever its output holds
            s -= 2.0
        elif sim < 1.0 and not self.same_names and same_result(x, y):
            # two codebases: one value computed by other ops (baddbmm(alpha) against matmul, then * scale; a
            # loss from cross_entropy against one from max, exp, sum, log, mean)
            s += 0.5 if ox[0].numel > 1 else 0.8
        if self.same_fw and self.same_names and x.name == y.name:
            # one codebase: the same name is strong evidence (values decide a shifted counter); across two
            # codebases a call's global counter says nothing: calls pair by module and order within it
            s += 1.0
        return s

    def _calls_in_order(self, xs: list[NodeInfo], ys: list[NodeInfo], threshold: float
                        ) -> list[tuple[int, int, float]]:
        """:func:`pair_in_order` of two call lists on :meth:`api_score`, proven by name where names agree.

        Where the calls' names pair one to one, :func:`precnb.analysis.align.certify.certified_pairs`
        proves that the programme would pair exactly them (a few scores instead of ``n × m``); else the
        programme runs, reusing the scores the attempt computed.
        """
        seen: dict[tuple[str, str], float] = {}

        def score(x: NodeInfo, y: NodeInfo) -> float:
            k = (x.name, y.name)
            v = seen.get(k)
            if v is None:
                v = seen[k] = self.api_score(x, y)
            return v

        def decide() -> list[tuple[int, int, float]]:
            if self.fast and self.same_names and self._bounded(xs) and len(xs) * len(ys) <= MAX_CELLS:
                proven = certified_pairs(xs, ys, score, threshold=threshold)
                if proven is not None:
                    return proven
            return pair_in_order(xs, ys, score, threshold=threshold,
                                 key_a=lambda x: op_key(x.api), key_b=lambda y: op_key(y.api))

        hints = self.hints  # a scope no hint reaches scores as without the mapping: its pairs are kept
        touched = any(x.name in hints.nodes for x in xs) or any(y.name in hints.unpair_nodes for y in ys)
        return decided(self._decided, None if touched else (
            "calls", self.fast, threshold, tuple(x.name for x in xs), tuple(y.name for y in ys)), decide)

    def _bounded(self, xs: list[NodeInfo]) -> bool:
        """Whether :class:`~precnb.analysis.align.certify.ApiBound` bounds every score of *xs*'s rows.

        The mapping's hints only lower a score (-100: a call paired elsewhere, a target left unpaired),
        which a bound still bounds, except a forced pair of two names (100) and op names said to be
        equal (a higher similarity): rows without those are proven as without hints.
        """
        if not self.hints:
            return True
        if self.hints.api_names:
            return False
        forced = self.hints.nodes
        return not any(forced.get(x.name, x.name) != x.name for x in xs)

    def _scope(self, tree: RunTree, kids: dict[str, list[str]], node: str, side: str) -> list[str]:
        """API calls made inside *node* (a module call, the root, or a scope), unpaired sub-modules folded in."""
        paired = self.out.modules if side == "baseline" else self.mod_rev
        out: list[str] = []
        for child in kids.get(node, []):
            info = tree.nodes[child]
            if info.kind == "api":
                if info.direction != "backward":
                    out.append(child)
            elif info.kind == "module" and info.module not in paired:
                out.extend(self._scope(tree, kids, child, side))
        out.sort(key=lambda n: (tree.nodes[n].seq, n))
        return out

    def pair_calls(self, nb: str, nt: str) -> None:
        ab = self._scope(self.tb, self.kids_b, nb, "baseline")
        at = self._scope(self.tt, self.kids_t, nt, "target")
        ab = [n for n in ab if n not in self.out.nodes]
        at = [n for n in at if n not in self.node_rev]
        if not ab or not at:
            return
        xs = [self.tb.nodes[n] for n in ab]
        ys = [self.tt.nodes[n] for n in at]
        pairs = self._calls_in_order(xs, ys, API_THRESHOLD)
        for i, j, s in pairs:
            x, y = xs[i], ys[j]
            if self.hints.nodes.get(x.name) == y.name:
                how, conf = self.hints.how("nodes", x.name)
                self._pair_node(x.name, y.name, how, conf if how != "user" else _confidence(s, API_THRESHOLD))
                continue
            if x.name == y.name:
                how = "name"
            elif node_values(x, y) >= 1.0:
                how = "value"
            elif op_similarity(x.api, y.api) >= 0.8:
                how = "structure"
            else:
                how = "shape"
            self._pair_node(x.name, y.name, how, _confidence(s, API_THRESHOLD))

    def pair_nodes(self) -> None:
        for b, (t, how, conf) in list(self.out.modules.items()):
            mb, mt = self.tb.modules[b], self.tt.modules[t]
            for lst_b, lst_t in ((mb.forward, mt.forward), (mb.backward, mt.backward),
                                 (mb.param_grads, mt.param_grads)):
                for nb, nt in zip(lst_b, lst_t, strict=False):
                    self._pair_node(nb, nt, how, conf)
        # the calls inside every paired module call, outermost first (a call belongs to its innermost scope)
        for nb, (nt, _how, _c) in sorted(self.out.nodes.items(), key=lambda kv: self.tb.nodes[kv[0]].seq):
            if self.tb.nodes[nb].kind == "module":
                self.pair_calls(nb, nt)
        self.pair_calls(ROOT, ROOT)
        for scope in SCOPES:
            self.pair_calls(scope, scope)
        self._pair_leftover_apis()
        # backward API nodes follow their forward nodes
        for nb, (nt, how, conf) in list(self.out.nodes.items()):
            xb, _xt = self.tb.nodes[nb], self.tt.nodes[nt]
            if xb.kind == "api" and xb.direction == "forward" and nb.endswith(".forward") and nt.endswith(".forward"):
                bb, bt = nb[: -len("forward")] + "backward", nt[: -len("forward")] + "backward"
                # a fused op paired by value with the last op of a decomposition (baddbmm against matmul, * scale):
                # their backward calls return the gradients of other inputs, so they do not pair
                fused = not self.same_names and op_similarity(xb.api, _xt.api) == 0.0
                if bb in self.tb.nodes and bt in self.tt.nodes and not fused:
                    self._pair_node(bb, bt, how, conf)
        for b, t in self.hints.nodes.items():  # user pairs the structure did not reach
            if b in self.tb.nodes and t in self.tt.nodes:
                self._pair_node(b, t, *self.hints.how("nodes", b))

    def _pair_leftover_apis(self) -> None:
        """API calls still unpaired whose module pair is known (a call recorded under another parent)."""
        by_mod_b: dict[str, list[str]] = defaultdict(list)
        for n, info in self.tb.nodes.items():
            if info.kind == "api" and info.direction != "backward" and n not in self.out.nodes:
                by_mod_b[info.module].append(n)
        by_mod_t: dict[str, list[str]] = defaultdict(list)
        for n, info in self.tt.nodes.items():
            if info.kind == "api" and info.direction != "backward" and n not in self.node_rev:
                by_mod_t[info.module].append(n)
        for mb, nodes_b in by_mod_b.items():
            mt = self.out.modules.get(mb, (mb if mb in by_mod_t else None, "", 0.0))[0] if mb else ROOT
            if mt is None or mt not in by_mod_t:
                continue
            xs = sorted((self.tb.nodes[n] for n in nodes_b), key=lambda i: i.seq)
            ys = sorted((self.tt.nodes[n] for n in by_mod_t[mt] if n not in self.node_rev), key=lambda i: i.seq)
            for i, j, s in self._calls_in_order(xs, ys, API_THRESHOLD + 0.5):
                how = "name" if xs[i].name == ys[j].name else ("value" if node_values(xs[i], ys[j]) >= 1.0
                                                               else "structure")
                self._pair_node(xs[i].name, ys[j].name, how, _confidence(s, API_THRESHOLD + 0.5))

    # ------------------------------------------------------------------ tensors
    def pair_tensors(self) -> None:
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
        copies_b = self._self_copies(xb)
        copies_t = self._self_copies(xt)
        out: list[tuple[str, str, str, float]] = []
        for groups in (("input", "kwargs"), ("output",), ("parameters",), ("grad",)):
            gb = [t for t in xb.tensors if t.group in groups and t.label not in used_b and t.label not in copies_b]
            gt = [t for t in xt.tensors if t.group in groups and t.label not in self.out.tensors
                  and t.label not in copies_t]
            if not gb or not gt:
                continue
            pos_b = {t.label: k for k, t in enumerate(gb)}
            pos_t = {t.label: k for k, t in enumerate(gt)}

            def score(a: Any, c: Any, pos_b: dict[str, int] = pos_b, pos_t: dict[str, int] = pos_t) -> float:
                k = (a.label, c.label, pos_b[a.label] == pos_t[c.label])
                v = kept.get(k)
                if v is None:
                    v = kept[k] = -100.0 if values is not None and tensors_disagree(a, c, *values) else \
                        tensor_score(a, c, same_framework=self.same_fw, position=k[2])
                return v

            for a, c, s in self._tensor_pairs(gb, gt, score):
                t_how = "name" if a.label == c.label else ("value" if close(a.stats, c.stats) else
                                                          ("structure" if a.slot == c.slot else "shape"))
                out.append((c.label, a.label, t_how, _confidence(s, TENSOR_THRESHOLD)))
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

    # ------------------------------------------------------------------ the rest
    def _aside(self, info: NodeInfo) -> str | None:
        a = self._aside_args
        if a is None:
            return None
        return aside_reason(info, a.tree, a.other, partner=a.partner, modules=a.modules, other_values=a.values,
                            other_call_modules=a.call_modules)

    def _backward_aside(self, info: NodeInfo, side: str, paired: dict[str, Any]) -> str | None:
        """Two codebases: why the backward of an API call is organisation (its forward's pair or reason)."""
        if self.same_names or info.kind != "api" or not info.name.endswith(".backward"):
            return None
        fwd = info.name[: -len("backward")] + "forward"
        why = self.out.left[side].get(fwd, "")
        if why.startswith(("organisation", "glue")):
            return f"organisation: the backward of {fwd}, set aside ({why.split(': ', 1)[-1]})"
        partner = paired.get(fwd)
        if partner is not None:
            other_name = partner[0] if isinstance(partner, tuple) else partner
            other = (self.tt if side == "baseline" else self.tb).nodes.get(other_name)
            if other is not None and op_similarity(info.api, other.api) == 0.0:
                return (f"organisation: the backward of {fwd}, paired by value with {other_name}, another op of the "
                        "other run's decomposition (their gradients are of other inputs)")
        return None

    def classify(self) -> None:
        for side, tree, paired, other in (("baseline", self.tb, self.out.nodes, self.tt),
                                          ("target", self.tt, self.node_rev, self.tb)):
            if not self.same_names:
                self._aside_args = _AsideArgs(tree, other, paired, self.out.modules if side == "baseline"
                                              else self.mod_rev)
            other_scopes = {i.parent for i in other.nodes.values()}
            other_backward = any(i.direction == "backward" for i in other.nodes.values())
            wrappers = self.wrappers[side]
            mods = self.out.modules if side == "baseline" else self.mod_rev
            # forward calls first: the backward of a call set aside is set aside with it
            for n, info in sorted(tree.nodes.items(), key=lambda kv: kv[1].direction == "backward"):
                if n in paired:
                    continue
                if not info.tensors:
                    continue  # known from construct.json only: nothing to compare
                why = self._backward_aside(info, side, paired) or self._why(
                    info, tree, mods, wrappers, other_scopes, other_backward, paired, other.parallel)
                self.out.left[side][n] = why
        self._aside_args = None

    def _why(self, info: NodeInfo, tree: RunTree, mods: dict[str, Any], wrappers: set[str],
             other_scopes: set[str], other_backward: bool, paired: dict[str, Any], other_parallel: str) -> str:
        if info.direction == "backward" and not other_backward:
            return "not captured: the other run recorded no backward pass"
        scope = info.parent if info.parent in SCOPES else ""
        if scope and scope not in other_scopes:
            return f"not captured: the other run recorded no {scope} calls"
        if info.kind != "api" and info.name in tree.glue:  # e.g. a part of a fused projection
            return f"organisation: {tree.glue[info.name]}"
        if info.kind == "module":
            if info.module in wrappers:
                return "organisation: a wrapper module the other run does not have"
            if info.module not in mods:
                inside = [m for m in mods if m.startswith(info.module + ".")]
                if inside:
                    return "organisation: a module level the other run does not have (its contents paired)"
            return self._aside(info) or "unpaired: a module call with no counterpart"
        if info.kind == "param_grad":
            return "unpaired: a parameter gradient with no counterpart"
        if is_glue_op(info.api):
            return f"glue: {op_key(info.api)} only moves, reshapes or casts data"
        if info.name in tree.glue:
            return f"organisation: {tree.glue[info.name]}"
        if tree.parallel and not other_parallel and _after_collective(info, tree):
            return ("organisation: it finishes a collective of this run's parallel layout (e.g. averages a "
                    "data-parallel gradient all-reduce)")
        key = op_key(info.api).rstrip("_")
        if key in _P2P:
            return "organisation: point-to-point communication (between pipeline stages)"
        if is_communication(info.name) and tree.parallel and not other_parallel:
            return f"organisation: a collective of this run's parallel layout ({tree.parallel})"
        if info.parent == "optimizer" and any(
                op_key(tree.nodes[n].api) == op_key(info.api) for n in paired if n in tree.nodes
                and tree.nodes[n].parent == "optimizer"):
            return "organisation: one more call of an optimizer op the other run makes once (e.g. per stage)"
        ins, outs = info.inputs, info.outputs
        if ins and outs and ins[0].numel == outs[0].numel and close(ins[0].stats, outs[0].stats, 1e-6):
            return "glue: its output equals its input (a copy or a layout change)"
        aside = self._aside(info)
        if aside:
            return aside
        if info.direction == "backward":
            return "unpaired: the backward of an unpaired call"
        return "unpaired: an op with no counterpart"


_FINISHING_OPS = ("div_", "mul_", "__itruediv__", "__imul__", "div", "mul", "__truediv__", "__mul__")


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


class _AsideArgs:
    """What :func:`precnb.analysis.align.aside.aside_reason` needs about one side, built once."""

    def __init__(self, tree: RunTree, other: RunTree, paired: dict[str, Any], modules: dict[str, Any]) -> None:
        self.tree, self.other = tree, other
        self.partner = {k: (v[0] if isinstance(v, tuple) else v) for k, v in paired.items()}
        self.modules = {k: (v[0] if isinstance(v, tuple) else v) for k, v in modules.items()}
        self.values = ValueIndex(other)
        self.call_modules = call_modules(other)


def _after_collective(info: NodeInfo, tree: RunTree) -> bool:
    """An in-place scaling whose input is the output of the collective called just before it in its scope."""
    if info.kind != "api" or op_key(info.api).rsplit(".", 1)[-1] not in _FINISHING_OPS or not info.inputs:
        return False
    calls = tree.calls_in.get(info.parent or ROOT, [])
    k = calls.index(info.name) if info.name in calls else -1
    if k <= 0:
        return False
    prev = tree.nodes[calls[k - 1]]
    first = info.inputs[0]
    return is_communication(prev.name) and any(o.numel == first.numel and close(o.stats, first.stats, 0)
                                               for o in prev.outputs)


def pair_runs(tb: RunTree, tt: RunTree, hints: Hints | None = None, *, fast: bool = True) -> Pairing:
    """Pair two runs' modules, nodes and tensors (see the module docstring).

    Parameters
    ----------
    tb, tt : RunTree
        Baseline and target (:func:`precnb.analysis.align.tree.run_tree`).
    hints : Hints, optional
        Pairs a mapping file forces.
    fast : bool, default True
        Pair calls whose names agree by proof (:mod:`precnb.analysis.align.certify`) instead of
        scoring every pair; the result is the same (False: always score, for testing).

    Returns
    -------
    Pairing
    """
    a = _Aligner(tb, tt, hints, fast=fast)
    for b, t in (hints.modules.items() if hints else ()):
        if b in tb.modules and t in tt.modules:
            a._pair_module(b, t, *a.hints.how("modules", b))
    a.pair_modules()
    for b, t in (hints.modules.items() if hints else ()):  # below the user's pairs, pair as usual
        if a.out.modules.get(b, ("",))[0] == t:
            a.pair_modules(b, t)
    a.pair_moved_modules()
    a.pair_nodes()
    a.pair_tensors()
    a.pair_grad_snapshots()
    a.classify()
    return a.out
