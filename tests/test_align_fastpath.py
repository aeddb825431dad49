"""The alignment's fast path (issue #30 item 5): runs whose names agree pay almost nothing, with the same result.

* :func:`precnb.analysis.align.certify.certified_pairs` proves that the order-preserving programme would
  pair calls by name; the alignment with the proof equals the alignment that scores every pair
  (``_align(..., fast=False)``), on every committed pair below: same names with an op more or less,
  shifted counters, renamed modules, a framework port;
* where names agree it computes a small share of the scores; where they differ (``xfw``: PyTorch vs
  MindSpore) it is not taken;
* its score bound holds for every pair of calls of real samples;
* label-identical runs keep the identity shortcut, whose pairs are the full programme's.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from tests.conftest import open_quiet, sample_path

align_mod = importlib.import_module("precnb.analysis.align")
pairing = importlib.import_module("precnb.analysis.align.pairing")
certify = importlib.import_module("precnb.analysis.align.certify")
match = importlib.import_module("precnb.analysis.align.match")
tree = importlib.import_module("precnb.analysis.align.tree")


def _run(*parts: str, steps=None):
    return open_quiet(sample_path(*parts), steps=steps)


def _drop_node(ds, node: str):
    nodes = np.asarray([str(n) for n in ds["node"].values])
    assert (nodes == node).any(), node
    return ds.isel(tensor=np.flatnonzero(nodes != node))


class _Spy:
    """Counts api_score calls and what the proof returned."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.scores = 0
        self.proven = 0
        self.refused = 0
        score, proof = pairing._Aligner.api_score, pairing.certified_pairs

        def counted(aligner, x, y):
            self.scores += 1
            return score(aligner, x, y)

        def watched(*a, **k):
            out = proof(*a, **k)
            if out is None:
                self.refused += 1
            else:
                self.proven += 1
            return out

        monkeypatch.setattr(pairing._Aligner, "api_score", counted)
        monkeypatch.setattr(pairing, "certified_pairs", watched)

    def reset(self) -> None:
        self.scores = self.proven = self.refused = 0


def _both(spy: _Spy, baseline, target):
    spy.reset()
    fast = align_mod._align(baseline, target)
    fast_counts = (spy.scores, spy.proven, spy.refused)
    spy.reset()
    slow = align_mod._align(baseline, target, fast=False)
    assert spy.proven == spy.refused == 0  # the slow path never tries the proof
    return fast, slow, fast_counts, spy.scores


def _lr10_one_op_fewer():
    """lr10's single-tensor AdamW (a large optimizer scope), the target one optimizer op fewer."""
    base = _run("preflight", "lr10", "baseline", steps=[0])
    targ = _drop_node(_run("preflight", "lr10", "target", steps=[0]), "Tensor.addcdiv_.3.forward")
    return base, targ


PAIRS = {
    "dp_sum (one op fewer)": (("dp_sum", "baseline"), ("dp_sum", "target")),
    "custom op registered (one op more)": (("custom_op_gap",), ("custom_op_registered",)),
    "tp_unsync tp1 vs tp2": (("tp_unsync", "tp1"), ("tp_unsync", "tp2")),
    "healthy vs dp_nan": (("healthy",), ("dp_nan",)),
    "rank_shift vs dp_nan (shifted counters)": (("rank_shift",), ("dp_nan",)),
    "renamed (HF vs Megatron names)": (("renamed", "baseline"), ("renamed", "target")),
    "xfw pt vs ms_bug (framework port)": (("xfw", "pt"), ("xfw", "ms_bug")),
    "pp_local pp1 vs pp2": (("pp_local", "pp1"), ("pp_local", "pp2")),
}


@pytest.mark.parametrize("case", sorted(PAIRS))
def test_fast_alignment_equals_the_full_programme(case, monkeypatch):
    spy = _Spy(monkeypatch)
    b, t = PAIRS[case]
    fast, slow, _counts, _slow_scores = _both(spy, _run(*b), _run(*t))
    assert fast.to_dict() == slow.to_dict()
    assert fast.target_coords == slow.target_coords
    assert fast.describe() == slow.describe()


def test_names_that_agree_take_the_fast_path(monkeypatch):
    spy = _Spy(monkeypatch)
    base, targ = _lr10_one_op_fewer()
    fast, slow, (scores, proven, refused), slow_scores = _both(spy, base, targ)
    assert fast.to_dict() == slow.to_dict() and fast.target_coords == slow.target_coords
    assert not fast.identical
    left = fast.unpaired["baseline"] + fast.unpaired["target"] + fast.unpaired["glue"]
    assert [u["node"] for u in left] == ["Tensor.addcdiv_.3.forward"]
    assert all(p.baseline == p.target for p in fast.nodes)
    assert proven > 0 and refused == 0
    assert slow_scores > 10_000 and scores * 20 < slow_scores  # e.g. a few hundred scores instead of ~10,000
    # dp_sum: the target lacks Tensor.div_ after each all_reduce; every call scope is proven
    spy.reset()
    fast = align_mod._align(_run("dp_sum", "baseline"), _run("dp_sum", "target"))
    assert spy.proven > 0 and spy.refused == 0
    assert {u["node"] for u in fast.unpaired["baseline"]} >= {"Tensor.div_.0.forward"}


def test_hints_that_only_lower_scores_keep_the_proof(monkeypatch):
    """A forced module pair, a target call left unpaired (the explorer's Match / Unmatch): proven, same pairs.

    Those hints only lower call scores (-100), which the bound still bounds; a forced pair of two calls of
    different names (a score of 100, above any bound) keeps its rows off the proof.
    """
    spy = _Spy(monkeypatch)
    base, targ = _lr10_one_op_fewer()
    plain = align_mod._align(base, targ)
    mod = next(p for p in plain.modules if p.baseline and p.target)
    calls = [p for p in plain.nodes if p.target.endswith(".forward") and ".backward" not in p.target]
    left_out = calls[len(calls) // 2].target
    forced = (calls[1].baseline, calls[2].target)  # a pair the aligner would not make
    for doc in (plain.with_pairs(set_modules={mod.baseline: mod.target}),
                plain.with_pairs(unpair_targets={left_out}),
                plain.with_pairs(set_nodes={forced[0]: forced[1]})):
        align_mod._TREES.clear()  # new trees: nothing kept from another alignment (scores, decisions)
        spy.reset()
        fast = align_mod._align(base, targ, mapping=doc)
        proven = spy.proven
        slow = align_mod._align(base, targ, mapping=doc, fast=False)
        assert fast.to_dict() == slow.to_dict() and fast.target_coords == slow.target_coords
        assert fast.describe() == slow.describe()
        assert proven > 0  # most scopes are still proven under the hints
    assert left_out in fast.user_unpaired or forced in {(p.baseline, p.target) for p in fast.nodes}
    assert forced in {(p.baseline, p.target) for p in fast.nodes}
    aligner = pairing._Aligner(tree.run_tree(base), tree.run_tree(targ), pairing.Hints(nodes={forced[0]: forced[1]}))
    rows = [aligner.tb.nodes[forced[0]], aligner.tb.nodes[calls[3].baseline]]
    assert not aligner._bounded(rows) and aligner._bounded(rows[1:])


@pytest.mark.parametrize("case", ["renamed (HF vs Megatron names)", "xfw pt vs ms_bug (framework port)",
                                  "dp_sum (one op fewer)"])
def test_a_new_mapping_on_the_same_trees_reuses_the_decisions_and_answers_as_afresh(case, monkeypatch):
    """Match, Unmatch, Match again on the same trees: scopes and tensor groups no hint reaches are decided once,
    and each alignment is the one computed on trees read afresh (nothing kept)."""
    spy = _Spy(monkeypatch)
    b, t = PAIRS[case]
    base, targ = _run(*b), _run(*t)
    align_mod._TREES.clear()
    plain = align_mod._align(base, targ)
    mod = next(p for p in plain.modules if p.baseline and p.target)
    call = [p for p in plain.nodes if p.target.endswith(".forward")][-1]
    docs = [plain.with_pairs(set_modules={mod.baseline: mod.target}), plain.with_pairs(unpair_targets={call.target}),
            plain.with_pairs(set_modules={mod.baseline: mod.target}, unpair_targets={call.target})]
    again = []
    for doc in docs:
        spy.reset()
        again.append((align_mod._align(base, targ, mapping=doc), spy.scores + spy.proven + spy.refused))
    for doc, (kept, work) in zip(docs, again, strict=True):
        align_mod._TREES.clear()
        spy.reset()
        fresh = align_mod._align(base, targ, mapping=doc)
        assert kept.to_dict() == fresh.to_dict() and kept.target_coords == fresh.target_coords
        assert kept.describe() == fresh.describe()
        assert work < spy.scores + spy.proven + spy.refused  # less decided again than afresh
    assert call.target in again[1][0].user_unpaired


def test_names_that_differ_do_not_take_the_fast_path(monkeypatch):
    spy = _Spy(monkeypatch)
    for b, t in ((("xfw", "pt"), ("xfw", "ms_same")), (("xfw", "pt"), ("xfw", "ms_bug"))):
        fast, slow, (scores, _proven, refused), slow_scores = _both(spy, _run(*b), _run(*t))
        assert fast.to_dict() == slow.to_dict()
        # PyTorch vs MindSpore: two codebases, whose global call counters say nothing (issue 24): no proof by
        # name is tried and the programme scores every pair, as without it
        assert _proven == 0 and refused == 0 and scores == slow_scores
        assert fast.counts()["nodes"]["by_how"].get("name", 0) < len(fast.nodes) // 2


def test_name_partners():
    assert certify.name_partners(["a", "b", "c"], ["a", "c"]) == [0, None, 1]
    assert certify.name_partners(["a", "b", "c"], ["c", "b", "a"]) is None  # crossed
    assert certify.name_partners(["a", "b", "c", "d"], ["a", "x", "y", "z"]) is None  # too few shared
    assert certify.name_partners([], []) is None  # nothing shared: nothing to prove


@pytest.mark.parametrize("pair", [(("renamed", "baseline"), ("renamed", "target")),
                                  (("rank_shift",), ("dp_nan",)),
                                  (("divergence", "baseline"), ("divergence", "target")),
                                  (("xfw", "pt"), ("xfw", "ms_bug"))])
def test_score_bound_holds_on_real_calls(pair):
    tb, tt = tree.run_tree(_run(*pair[0])), tree.run_tree(_run(*pair[1]))
    aligner = pairing._Aligner(tb, tt, None)
    xs = [n for n in tb.nodes.values() if n.kind == "api"][:120]
    ys = [n for n in tt.nodes.values() if n.kind == "api"][:120]
    bound = certify.ApiBound(ys, cross_codebase=not aligner.same_names)
    checked = 0
    for x in xs:
        row = bound.row(x)
        for y in ys:
            if x.name == y.name:
                continue
            assert aligner.api_score(x, y) <= row[y.api], (x.name, y.name)
            checked += 1
    assert checked > 5_000


def _call(name: str, seq: int) -> tree.NodeInfo:
    info = tree.NodeInfo(name, "api", "Functional.relu", "", "forward", seq, "", seq)
    for slot in ("input.0", "output.0"):
        info.tensors.append(tree.TensorInfo(f"{name}.{slot}", slot, slot.split(".")[0], "[4]", 4, "float32",
                                            (1.0, -1.0, 0.1, 2.0), seq))
    return info


def test_a_competing_score_refuses_the_proof():
    """Where another cell could beat the name pairs, there is no proof (the programme decides)."""
    xs = [_call("f.0", 0), _call("f.1", 1)]
    ys = [_call("f.0", 0), _call("f.1", 1)]
    table = {("f.0", "f.0"): 3.0, ("f.1", "f.1"): 3.0, ("f.0", "f.1"): 3.5, ("f.1", "f.0"): 0.0}
    assert certify.ApiBound(ys).row(xs[0])["Functional.relu"] >= 3.5  # the table is within the bound

    def score(a, b):
        return table[a.name, b.name]

    def proof(xs, ys):
        out = certify.certified_pairs(xs, ys, score, threshold=1.2)
        if out is not None:  # a proof is the programme's own answer
            assert out == match.pair_in_order(xs, ys, score, threshold=1.2)
        return out

    assert proof(xs, ys) is None
    table[("f.0", "f.1")] = 1.5
    assert proof(xs, ys) == [(0, 0, 3.0), (1, 1, 3.0)]
    # a call without partner that could pair with another call without partner: not proven
    xs2, ys2 = [_call("f.0", 0), _call("g.0", 1)], [_call("f.0", 0), _call("h.0", 1)]
    table.update({("f.0", "h.0"): 0.0, ("g.0", "f.0"): 0.0, ("g.0", "h.0"): 2.0})
    assert proof(xs2, ys2) is None
    table[("g.0", "h.0")] = 1.0
    assert proof(xs2, ys2) == [(0, 0, 3.0)]
    # one call more on the baseline, of an op the target makes too: its cells give the column a potential
    xs3, ys3 = [_call("f.0", 0), _call("g.0", 1), _call("f.1", 2)], [_call("f.0", 0), _call("f.1", 1)]
    table.update({("g.0", "f.1"): 2.0, ("f.1", "f.0"): 0.0, ("f.0", "f.1"): 1.5})
    assert proof(xs3, ys3) == [(0, 0, 3.0), (2, 1, 3.0)]
    table[("g.0", "f.1")] = 3.2  # now pairing g.0 with f.1 beats f.1 = f.1
    assert proof(xs3, ys3) is None


@pytest.mark.parametrize("pair", [(("divergence", "baseline"), ("divergence", "target")),
                                  (("preflight", "lr10", "baseline"), ("preflight", "lr10", "target")),
                                  (("sdc", "job1"), ("sdc", "job2"))])
def test_identity_shortcut_pairs_what_the_programme_pairs(pair):
    b, t = _run(*pair[0]), _run(*pair[1])
    fast = align_mod._align(b, t)
    slow = align_mod._align(b, t, fast=False)
    assert fast.identical and slow.identical
    for kind in ("modules", "nodes", "tensors"):
        assert {(p.baseline, p.target) for p in getattr(fast, kind)} == {
            (p.baseline, p.target) for p in getattr(slow, kind)}, kind
