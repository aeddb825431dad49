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

from collections import defaultdict

from precnb.analysis.align._state import API_THRESHOLD, Hints, Pairing, _confidence
from precnb.analysis.align.aside import same_result
from precnb.analysis.align.certify import certified_pairs
from precnb.analysis.align.evidence import node_values
from precnb.analysis.align.leftover import classify
from precnb.analysis.align.match import pair_in_order, programme_cells
from precnb.analysis.align.pair_modules import ModulePairing
from precnb.analysis.align.pair_tensors import TensorPairing
from precnb.analysis.align.scores import decided
from precnb.analysis.align.tree import ROOT, SCOPES, NodeInfo, RunTree
from precnb.analysis.align.vocab import is_glue_op, op_similarity
from precnb.naming import is_communication, op_key

__all__ = ["Hints", "Pairing", "pair_runs"]


class _Aligner(ModulePairing, TensorPairing):
    """The pairing of two run trees, step by step (modules, calls, tensors, then what is left)."""

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
            # the proof, where the programme weighs its pairs (every cell; for a long scope the band around the
            # anchors: a 1,000-call scope of one codebase scored ~34,000 pairs in its band, ~1,000 proven)
            cells = programme_cells(xs, ys, _anchor_key, _anchor_key) if (
                self.fast and self.same_names and self._bounded(xs)) else None
            if cells is not None:
                proven = certified_pairs(xs, ys, score, threshold=threshold)
                if proven is not None and all(cells[0][i] <= j < cells[1][i] for i, j, _s in proven):
                    return proven
            return pair_in_order(xs, ys, score, threshold=threshold, key_a=_anchor_key, key_b=_anchor_key)

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

def _anchor_key(x: NodeInfo) -> tuple[str, int]:
    """What two long call lists are first lined up on: the op and its first output's size."""
    return op_key(x.api), (x.outputs[0].numel if x.outputs else -1)


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
    classify(a)
    return a.out
