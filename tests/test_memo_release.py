"""A result kept for reuse never keeps its runs alive (issue #30 item 3: the peak of a 4,096-rank session).

The memos of :mod:`precnb.analysis._memo` key their entries by weak references to the datasets; an entry
whose value held those datasets (a prepared comparison holds the pair it was made of, a merge of runs without
a layout is the runs themselves) kept them, and everything computed from them, alive after the caller let
them go: at 1,024 ranks 0.7 GB stayed behind after ``first_divergence(b, t)`` and ``del b, t``.
"""

from __future__ import annotations

import gc
import weakref

import precnb
from precnb.analysis._memo import DatasetMemo
from tests.conftest import sample_path


def test_first_divergence_lets_its_runs_go():
    from tests.test_viz import make_run

    b, t = make_run(seed=1), make_run(seed=2)  # same grid, nothing to rename: the prepared pair is these objects
    f = precnb.first_divergence(b, t)
    again = precnb.first_divergence(b, t)  # answered from the memo
    assert (again.step, again.rank, again.node) == (f.step, f.rank, f.node)
    refs = [weakref.ref(b), weakref.ref(t)]
    del b, t
    gc.collect()
    assert [r() is None for r in refs] == [True, True]


def test_a_triage_dropped_frees_its_runs():
    tri = precnb.diagnose(sample_path("dp_sum", "target"), baseline=sample_path("dp_sum", "baseline"),
                          progress=False)
    assert tri.finding.kind == "first_divergence"
    refs = [weakref.ref(tri.raw_target), weakref.ref(tri.raw_baseline), weakref.ref(tri.target)]
    del tri
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_a_value_holding_its_datasets_is_given_back_with_them():
    import xarray as xr

    memo, calls = DatasetMemo(), []
    a, b = xr.Dataset({"x": ("t", [1.0])}), xr.Dataset({"x": ("t", [2.0])})

    def compute(pair=(a, b)):
        calls.append(1)
        return {"pair": pair, "n": 2}

    first = memo.get([a, b], "k", compute, copy=False)
    again = memo.get([a, b], "k", compute, copy=False)
    assert len(calls) == 1 and again["pair"][0] is a and again["pair"][1] is b and again["n"] == 2
    assert first["pair"][0] is a
    ref = weakref.ref(a)
    del a, first, again, compute  # (its default held the pair)
    gc.collect()
    assert ref() is None and not memo._items  # the entry went with its dataset
