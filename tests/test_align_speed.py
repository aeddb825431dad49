"""Shortcuts of the pairing and of the combined pair (issue #51 item 8): each answers as the general path does.

* equal op-key lists anchor as one block (``match._matching_blocks``), what difflib finds, without its search;
* a long call scope (the banded programme's) is proven by name where every proven pair lies in the band the
  programme weighs (``match.programme_cells``): the alignment equals the banded programme's;
* a node pair whose tensors carry the same labels in the same order pairs them label to label in one pass
  (``TensorPairing._whole_node``) only while every pair scores above what another label can: a tensor whose
  values differ sends the node back to the general path, and the alignment equals the full programme's;
* an in-memory run is reindexed onto the combined labels by one positional take (``combine._taken``): the
  dataset ``reindex`` + ``fillna`` + ``astype`` gave, and it follows the run's current values;
* the target's tensor coordinates are read as rows of its columns (``align._target_coords``).
"""

from __future__ import annotations

import difflib
import importlib
import random

import numpy as np
import xarray as xr

from tests.conftest import open_quiet, sample_path

align_mod = importlib.import_module("precnb.analysis.align")
match = importlib.import_module("precnb.analysis.align.match")
pair_tensors = importlib.import_module("precnb.analysis.align.pair_tensors")
tree_mod = importlib.import_module("precnb.analysis.align.tree")
combine = importlib.import_module("precnb.combine")


def _difflib_blocks(ka, kb):
    return difflib.SequenceMatcher(None, ka, kb, autojunk=False).get_matching_blocks()


def test_equal_key_lists_are_one_matching_block():
    rng = random.Random(5)
    for n in (1, 2, 7, 40, 300):
        keys = [rng.choice("abcab") for _ in range(n)]  # repeated keys: difflib's costly case
        assert match._matching_blocks(keys, list(keys)) == _difflib_blocks(keys, keys)
        other = list(keys)
        other[n // 2] = "z"
        assert match._matching_blocks(keys, other) == _difflib_blocks(keys, other)  # unequal: difflib itself


def test_long_scopes_pair_as_with_difflib(monkeypatch):
    """Above the programme's size, equal key lists pair exactly as difflib's anchors made them pair."""
    rng = random.Random(11)
    a = [(rng.choice("xyz"), rng.random()) for _ in range(60)]
    b = [(k, v + (0.5 if i % 9 == 0 else 0.0)) for i, (k, v) in enumerate(a)]  # same keys, some values off

    def score(p, q):
        return (1.0 if p[0] == q[0] else 0.0) + (1.0 if abs(p[1] - q[1]) < 0.1 else 0.0)

    monkeypatch.setattr(match, "MAX_CELLS", 30)  # every gap anchored, as a 1,000-call scope is
    kw = {"threshold": 0.5, "key_a": lambda p: p[0], "key_b": lambda q: q[0]}
    fast = match.pair_in_order(a, b, score, **kw)
    monkeypatch.setattr(match, "_matching_blocks", _difflib_blocks)
    assert fast == match.pair_in_order(a, b, score, **kw)
    assert len(fast) == len(a)


def _with_values_off(ds: xr.Dataset, label: str) -> xr.Dataset:
    """*ds* with one tensor's statistics ten times larger everywhere (names unchanged)."""
    out = ds.copy(deep=True)
    j = list(map(str, out["tensor"].values)).index(label)
    for s in ("max", "min", "mean", "norm"):
        out[s].values[..., j] *= 10.0
    return out


def test_same_label_shortcut_declines_where_a_value_differs(monkeypatch):
    base = open_quiet(sample_path("healthy"))
    labels = [str(t) for t in base["tensor"].values]
    nodes = [str(n) for n in base["node"].values]
    off = next(t for t, n in zip(labels, nodes, strict=True) if ".output." in t and n.startswith("Functional."))
    targ = _with_values_off(base, off)
    calls: list[tuple[str, bool]] = []
    whole = pair_tensors.TensorPairing._whole_node

    def spied(self, xb, xt, used_b, kept):
        got = whole(self, xb, xt, used_b, kept)
        calls.append((xb.name, got is not None))
        return got

    monkeypatch.setattr(pair_tensors.TensorPairing, "_whole_node", spied)
    module = next(str(m) for m in base["module"].values if str(m))
    mapping = {"modules": {module: module}}  # a mapping: the pairing runs (no identity shortcut)
    fast = align_mod._align(base, targ, mapping=mapping)
    taken = dict(calls)
    assert taken and sum(taken.values()) > len(taken) // 2  # most node pairs take the shortcut ...
    assert taken[nodes[labels.index(off)]] is False  # ... not the one whose output differs
    slow = align_mod._align(base, targ, mapping=mapping, fast=False)
    assert fast.to_dict() == slow.to_dict() and fast.target_coords == slow.target_coords
    assert fast.describe() == slow.describe()


def _subset(ds: xr.Dataset, drop: int) -> xr.Dataset:
    keep = np.ones(ds.sizes["tensor"], bool)
    keep[::drop] = False
    return ds.isel(tensor=np.flatnonzero(keep))


def test_positional_take_equals_reindex_and_follows_the_run(monkeypatch):
    ds = open_quiet(sample_path("healthy"))
    ds = ds.assign(crc=(ds["max"].dims, np.full(ds["max"].shape, "ab", dtype=object)))
    labels = [str(t) for t in ds["tensor"].values]
    part = _subset(ds, 3)
    want = [*labels[:5], "extra.only.in.the.other.run", *labels[5:]]
    coords = {"node": np.asarray(["n"] * len(want), dtype=object)}
    fast = combine.reindex_tensors(part, want, coords)
    with monkeypatch.context() as m:
        m.setattr(combine, "_taken", lambda *a: None)  # the xarray path
        slow = combine.reindex_tensors(part, want, coords)
    xr.testing.assert_identical(fast, slow)
    assert {v: fast[v].dtype for v in fast.variables} == {v: slow[v].dtype for v in slow.variables}
    j = want.index("extra.only.in.the.other.run")
    assert not fast["present"].values[..., j].any() and fast["crc"].values[0, 0, j] == ""
    assert int(fast["numel"].values[0, 0, j]) == -1 and np.isnan(fast["max"].values[0, 0, j])
    # a value written into the run in place is what the next reindexing reads (nothing kept between calls)
    k = want.index(str(part["tensor"].values[0]))
    part["max"].values[0, 0, 0] = 1234.5
    again = combine.reindex_tensors(part, want, coords)
    assert again["max"].values[0, 0, k] == 1234.5 and fast["max"].values[0, 0, k] != 1234.5


def test_target_coords_are_each_labels_row():
    tt = tree_mod.run_tree(open_quiet(sample_path("healthy")))
    index, every = align_mod._target_coords(tt)
    col = {n: align_mod._plain_values(tt.coords[n]) for n in align_mod._COORDS if n in tt.coords}
    want = {t: tuple(col[n][j] if n in col else None for n in align_mod._COORDS) for t, j in index.items()}
    assert list(every.items()) == list(want.items())


def test_long_scopes_are_proven_inside_the_band_and_answer_as_the_banded_programme(monkeypatch):
    """Every scope counts as long (the banded programme's): the proof is taken where its pairs lie in the band."""
    pairing = importlib.import_module("precnb.analysis.align.pairing")
    monkeypatch.setattr(match, "MAX_CELLS", 4)
    proven = []
    proof = pairing.certified_pairs

    def watched(xs, ys, *a, **k):
        out = proof(xs, ys, *a, **k)
        if out is not None and len(xs) * len(ys) > 4:
            proven.append(len(xs))
        return out

    monkeypatch.setattr(pairing, "certified_pairs", watched)
    for b, t in ((("dp_sum", "baseline"), ("dp_sum", "target")), (("rank_shift",), ("dp_nan",)),
                 (("healthy",), ("dp_nan",))):
        base, targ = open_quiet(sample_path(*b)), open_quiet(sample_path(*t))
        module = next(str(m) for m in base["module"].values if str(m))
        mapping = {"modules": {module: module}}
        fast = align_mod._align(base, targ, mapping=mapping)
        slow = align_mod._align(base, targ, mapping=mapping, fast=False)  # the banded programme, every score
        assert fast.to_dict() == slow.to_dict() and fast.target_coords == slow.target_coords
    assert proven  # long scopes were proven, not programmed


def test_the_cells_weighed_are_every_column_or_the_band(monkeypatch):
    """A proof is taken only where its pairs are cells the programme weighs: the band, for a long scope."""
    keys = [f"op{i % 3}" for i in range(40)]
    a = b = list(range(40))
    lo, hi = match.programme_cells(a, b, keys.__getitem__, keys.__getitem__)
    assert lo.tolist() == [0] * 40 and hi.tolist() == [40] * 40  # a short scope: every column
    monkeypatch.setattr(match, "MAX_CELLS", 100)
    lo, hi = match.programme_cells(a, b, keys.__getitem__, keys.__getitem__)
    assert all(lo[i] <= i < hi[i] for i in range(40))  # equal keys: the diagonal is inside the band
    assert not all(lo[i] <= 39 - i < hi[i] for i in range(40))  # a pairing far off it is not
    monkeypatch.setattr(match, "MAX_BAND_CELLS", 10)
    assert match.programme_cells(a, b, keys.__getitem__, keys.__getitem__) is None  # paired run by run: no proof
