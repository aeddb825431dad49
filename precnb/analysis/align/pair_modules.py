"""Module pairing: the two runs' module trees matched level by level (wrappers unwrapped, moved modules found)."""

from __future__ import annotations

from precnb.analysis.align._state import MODULE_THRESHOLD, AlignerState, _confidence, _dice
from precnb.analysis.align.evidence import module_values
from precnb.analysis.align.match import pair_greedy, pair_in_order
from precnb.analysis.align.scores import decided
from precnb.analysis.align.tree import ROOT
from precnb.analysis.align.vocab import class_similarity, name_similarity

__all__ = ["ModulePairing"]


class ModulePairing(AlignerState):
    """The module steps of the pairing."""

    def module_score(self, b: str, t: str) -> float:
        """How alike modules *b* (baseline) and *t* (target) are; 100 when the mapping pairs them."""
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
        """Pair the children of the module pair (*pb*, *pt*), then theirs, down the trees."""
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
