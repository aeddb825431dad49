"""Step-by-step search and loading: concat_steps, first_divergence_stepwise, lazy inputs, the CLI.

The stepwise answer must be the whole-run answer, while reading only the steps up to the fault.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np
import pytest
import xarray as xr

import precnb
from precnb.analysis import first_divergence, first_divergence_stepwise
from precnb.analysis.divergence.stepwise import step_batches
from precnb.cli import main
from precnb.combine import concat_steps
from tests.conftest import open_quiet as _open
from tests.conftest import sample_path, shared_path

warnings.filterwarnings("ignore", message=".*could not be read.*")




# ------------------------------------------------------------------------------ concat_steps
@pytest.mark.parametrize("name", ["dp_nan", "divergence/target", "healthy"])
def test_concat_of_per_step_loads_is_the_whole_load(name):
    path = sample_path(*name.split("/"))
    whole = _open(path)
    parts = [_open(path, steps=[int(s)]) for s in whole["step"].values]
    xr.testing.assert_identical(concat_steps(parts), whole)  # attrs included


def test_concat_steps_of_shared_s1_statistics_equals_whole():
    path = shared_path("data_samples", "msprobe", "S1_baseline", "statistics")
    whole = _open(path)
    cat = concat_steps([_open(path, steps=[0, 1]), _open(path, steps=[2]), _open(path, steps=[3, 4])])
    xr.testing.assert_identical(cat, whole)


def test_concat_steps_fills_missing_ranks_tensors_and_variables():
    path = sample_path("dp_nan")
    a = _open(path, steps=[0], ranks=[0])
    b = _open(path, steps=[1])
    b = b.assign(crc=(("step", "rank", "tensor"), np.full((1, 2, b.sizes["tensor"]), "abc", dtype=object)))
    out = concat_steps([b, a])  # out of order: sorted by step
    assert out["step"].values.tolist() == [0, 1]
    assert out["rank"].values.tolist() == [0, 1]
    assert not out["present"].sel(step=0, rank=1).values.any()  # rank 1 was not loaded at step 0
    assert (out["seq"].sel(step=0, rank=1).values == -1).all()
    assert (out["crc"].sel(step=0).values == "").all() and (out["crc"].sel(step=1).values == "abc").all()
    assert out["max"].dtype == np.float64 and out["present"].dtype == bool


def test_concat_steps_refuses_overlapping_steps():
    path = sample_path("dp_nan")
    a = _open(path, steps=[0, 1])
    with pytest.raises(ValueError, match=r"step\(s\) \[1\]"):
        concat_steps([a, _open(path, steps=[1, 2])])
    with pytest.raises(ValueError, match="at least one"):
        concat_steps([])


def test_step_batches_double():
    assert step_batches([]) == []
    assert step_batches([5]) == [[5]]
    assert step_batches(list(range(9))) == [[0], [1], [2, 3], [4, 5, 6, 7], [8]]
    assert [s for b in step_batches(list(range(100))) for s in b] == list(range(100))


# ------------------------------------------------------------------------------ stepwise search
def _answer(f):
    return (f.kind, f.step, f.rank, f.node, f.tensor, f.reason, f.suspects, f.structural, f.evidence,
            f.values)


def _recording_loader(base_path, target_path, offset=0):
    batches = []

    def load(batch):
        batches.append(list(batch))
        return _open(base_path, steps=batch), _open(target_path, steps=[s + offset for s in batch])

    return load, batches


def test_stepwise_equals_whole_run_and_stops_at_the_fault():
    base, target = sample_path("divergence", "baseline"), sample_path("divergence", "target")
    want = json.loads((sample_path("divergence") / "ground_truth.json").read_text())
    whole = first_divergence(_open(base), _open(target))
    load, batches = _recording_loader(base, target)
    f = first_divergence_stepwise(load, [0, 1, 2])
    assert _answer(f) == _answer(whole)
    assert (f.step, f.rank) == (1, 0) and f.step == whole.step
    assert "gelu" in f.node and want["steps"] == [0, 1, 2]
    assert batches == [[0], [1]]  # step 2 was never read
    assert f.stats["steps"] == [0, 1] and f.stats["steps_not_searched"] == [2]


def test_stepwise_none_searches_every_step():
    path = shared_path("data_samples", "msprobe", "S1_baseline")
    load, batches = _recording_loader(path / "md5", path / "md5_rerun")
    f = first_divergence_stepwise(load, [0, 1])
    whole = first_divergence(_open(path / "md5", steps=[0, 1]), _open(path / "md5_rerun"))
    assert f.kind == whole.kind == "none"
    assert f.reason == whole.reason and f.crc_only == whole.crc_only
    assert f.stats["crc_only_records"] == whole.stats["crc_only_records"] == 107
    assert batches == [[0], [1]] and f.stats["steps_not_searched"] == []


def test_stepwise_with_offset_reads_the_shifted_target_steps():
    base, target = sample_path("divergence", "baseline"), sample_path("divergence", "target")
    load, batches = _recording_loader(base, target, offset=1)
    f = first_divergence_stepwise(load, [0, 1], step_offset=1)
    whole = first_divergence(_open(base), _open(target), step_offset=1, steps=[0, 1])
    assert _answer(f) == _answer(whole)
    assert f.values.get("target_step") == f.step + 1
    assert batches[0] == [0] and f.stats["step_offset"] == 1


def test_stepwise_needs_a_step():
    with pytest.raises(ValueError, match="no step"):
        first_divergence_stepwise(lambda b: (None, None), [])


# ------------------------------------------------------------------------------ lazy (out of core)
def test_lazy_first_divergence_loads_only_steps_up_to_the_fault(tmp_path):
    base, target = sample_path("divergence", "baseline"), sample_path("divergence", "target")
    precnb.to_zarr(base, tmp_path / "b.zarr", progress=False)
    precnb.to_zarr(target, tmp_path / "t.zarr", progress=False)
    lb = precnb.open_run(tmp_path / "b.zarr", lazy=True)
    lt = precnb.open_run(tmp_path / "t.zarr", lazy=True)
    assert lb["max"].chunks is not None
    whole = first_divergence(_open(base), _open(target))
    f = first_divergence(lb, lt)
    assert (f.kind, f.step, f.rank, f.node, f.tensor) == (whole.kind, whole.step, whole.rank, whole.node,
                                                          whole.tensor)
    assert f.reason == whole.reason and f.suspects == whole.suspects
    assert f.stats["steps_not_searched"] == [2]
    # the lazy inputs stay lazy (nothing was loaded into them)
    assert lb["max"].chunks is not None and lt["norm"].chunks is not None


def test_lazy_combined_runs_dataset(tmp_path):
    base, target = sample_path("divergence", "baseline"), sample_path("divergence", "target")
    both = precnb.open_runs({"gpu": base, "npu": target}, progress=False)
    lazy = both.chunk({"step": 1})
    f = first_divergence(lazy)
    whole = first_divergence(both)
    assert (f.step, f.rank, f.node) == (whole.step, whole.rank, whole.node)
    assert f.stats["steps_not_searched"] == [2]
    assert "gpu" in f.values and "npu" in f.values


# ------------------------------------------------------------------------------ command line
def _diff_json(capsys, *argv):
    assert main(["diff", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_cli_diff_reads_steps_up_to_the_fault(capsys, workers):
    base, target = sample_path("divergence", "baseline"), sample_path("divergence", "target")
    d = _diff_json(capsys, str(base), str(target), "--workers", workers)
    whole = first_divergence(_open(base), _open(target))
    assert (d["kind"], d["step"], d["rank"], d["node"], d["tensor"]) == (
        "first_divergence", whole.step, whole.rank, whole.node, whole.tensor)
    assert d["stats"]["steps_not_searched"] == [2]
    assert d["reason"] == whole.reason


def test_cli_diff_single_step_and_auto_offset_read_whole(capsys):
    base, target = sample_path("divergence", "baseline"), sample_path("divergence", "target")
    d = _diff_json(capsys, str(base), str(target), "--step", "1")
    assert d["step"] == 1 and "steps_not_searched" not in d["stats"]
    d = _diff_json(capsys, str(base), str(target), "--step-offset", "auto")
    assert d["step"] == 1 and d["stats"]["steps"] == [0, 1, 2]


def test_cli_diff_stepwise_ignores_a_broken_later_step(capsys, tmp_path):
    import shutil

    base, target = sample_path("divergence", "baseline"), sample_path("divergence", "target")
    broken = tmp_path / "target"
    shutil.copytree(target, broken)
    for f in (broken / "step2").rglob("dump.json"):
        f.write_text("{ truncated")
    d = _diff_json(capsys, str(base), str(broken))
    assert (d["step"], d["rank"]) == (1, 0)  # the fault is found before the broken step
    assert d["stats"]["steps_not_searched"] == [2]


# ------------------------------------------------------------------------------ lazy NaN origin
def _nan_answer(f):  # as JSON text: NaN statistics compare equal
    return json.dumps([f.kind, f.step, f.rank, f.node, f.tensor, f.reason, f.suspects, f.values, f.hints],
                      default=str)


@pytest.mark.parametrize("name", ["dp_nan", "healthy", "monitor"])
def test_lazy_nan_origin_equals_eager(name):
    from precnb.analysis import nan_origin

    ds = _open(sample_path(name))
    eager = nan_origin(ds)
    lazy = nan_origin(ds.chunk({"step": 1}))
    assert _nan_answer(lazy) == _nan_answer(eager)
    for key in ("nan_values", "inf_values", "steps", "ranks"):
        assert lazy.stats[key] == eager.stats[key]
    if eager.kind == "nan_origin":
        later = [s for s in eager.stats["steps"] if s > eager.step]
        assert set(lazy.stats["steps_not_searched"]) <= set(later)
    else:
        assert lazy.stats["event_records"] == eager.stats["event_records"] == 0


def test_lazy_nan_origin_on_shared_s1_statistics_is_none():
    from precnb.analysis import nan_origin

    path = shared_path("data_samples", "msprobe", "S1_baseline", "statistics")
    ds = _open(path)
    lazy = nan_origin(ds.chunk({"step": 1}))
    eager = nan_origin(ds)
    assert lazy.kind == eager.kind == "none"
    assert lazy.stats["benign_inf_records"] == eager.stats["benign_inf_records"] > 0
    assert lazy.evidence["benign_nodes"] == eager.evidence["benign_nodes"]


def test_cli_summary_says_which_steps_were_not_read(capsys):
    base, target = sample_path("divergence", "baseline"), sample_path("divergence", "target")
    assert main(["diff", str(base), str(target)]) == 0
    out = capsys.readouterr().out
    assert "steps  2 not read: a later step cannot come first" in out


# ------------------------------------------------------------------------------ lazy anomalies
@pytest.mark.parametrize("name", ["monitor", "dp_nan", "healthy"])
@pytest.mark.parametrize("budget", [1, 10**9])
def test_lazy_anomalies_equal_eager(name, budget, monkeypatch):
    """Rank blocks (one rank at a time with budget=1) give the in-memory table exactly."""
    import importlib

    import pandas as pd

    from precnb.analysis import anomalies, anomaly_table

    mod = importlib.import_module("precnb.analysis.anomalies")

    monkeypatch.setattr(mod, "RANK_BLOCK_BYTES", budget)
    ds = _open(sample_path(name))
    lazy = ds.chunk({"step": 1, "rank": 1})
    pd.testing.assert_frame_equal(anomaly_table(lazy), anomaly_table(ds))
    assert anomalies(lazy).to_json() == anomalies(ds).to_json()


def test_store_chunks_ranks_in_blocks(tmp_path, monkeypatch):
    from precnb.io import store

    monkeypatch.setattr(store, "RANK_CHUNK", 1)
    path = precnb.to_zarr(sample_path("dp_nan"), tmp_path / "s.zarr", progress=False)
    lazy = precnb.open_run(path, lazy=True)
    assert lazy["max"].chunks[:2] == ((1, 1, 1), (1, 1))
    xr.testing.assert_identical(lazy.load(), _open(sample_path("dp_nan")))
    ds = _open(sample_path("dp_nan"))
    precnb.to_zarr(ds, tmp_path / "d.zarr")
    assert precnb.open_run(tmp_path / "d.zarr", lazy=True)["norm"].chunks[1] == (1, 1)


def _shifted(src, dst):
    """*src* with its step 0 dropped: the divergence sample's fault (step 1, forward) at step 0."""
    import shutil

    for s in (1, 2):
        shutil.copytree(src / f"step{s}", dst / f"step{s - 1}")
    return dst


_OPENED: list[list[str]] = []  # the audit hook's log while a test listens (hooks cannot be removed)


def _hook(event, args):
    if event == "open" and _OPENED and isinstance(args[0], str) and args[0].endswith("dump.json"):
        _OPENED[-1].append(os.path.basename(os.path.dirname(os.path.dirname(args[0]))))


def test_cli_diff_forward_fault_at_step_0_reads_step_0_only(capsys, tmp_path):
    base = _shifted(sample_path("divergence", "baseline"), tmp_path / "b")
    target = _shifted(sample_path("divergence", "target"), tmp_path / "t")
    if not getattr(sys, "_precnb_test_open_hook", False):
        sys.addaudithook(_hook)
        sys._precnb_test_open_hook = True  # type: ignore[attr-defined]
    _OPENED.append([])
    try:
        d = _diff_json(capsys, str(base), str(target), "--workers", "1")
    finally:
        opened = _OPENED.pop()
    assert (d["kind"], d["step"], d["rank"], d["node"]) == ("first_divergence", 0, 0, "Functional.gelu.0.forward")
    assert set(opened) == {"step0"}  # the pre-flight checks run on step 0 alone: step 1 is not read
    assert d["stats"]["steps_not_searched"] == [1]
    tr = precnb.diagnose(str(target), baseline=str(base), kinds=["preflight", "first_divergence"])
    assert [f.kind for f in tr.findings if f.found] == ["first_divergence"]
    assert any("on the first step only" in n and "precnb preflight" in n for n in tr.notes), tr.notes
    assert "pre-flight checks on baseline steps 0" in tr.notes


def test_forward_fault_first_needs_a_forward_node_of_the_one_step_read():
    from precnb.analysis.findings import Finding
    from precnb.pipeline.stepwise_read import _forward_fault_first

    t = _open(sample_path("divergence", "target"), steps=[1])
    b = _open(sample_path("divergence", "baseline"), steps=[1])
    back = str(t["node"].values[t["direction"].values == "backward"][0])
    # msprobe calls ops outside autograd "forward": the gradient all-reduce is dumped after the backward pass
    late = "Distributed.all_reduce.0.forward"
    assert late in set(t["node"].values)

    def triage(node, rank=0):  # the search's finding
        return Finding(kind="first_divergence", step=1, rank=rank, node=node, reason="x")

    assert _forward_fault_first(triage("Functional.gelu.0.forward"), [(b, t)])
    assert not _forward_fault_first(triage(back), [(b, t)])
    assert not _forward_fault_first(triage(late), [(b, t)])
    assert not _forward_fault_first(triage("no.such.node"), [(b, t)])
    assert not _forward_fault_first(triage("Functional.gelu.0.forward", rank=7), [(b, t)])
    two = (_open(sample_path("divergence", "baseline")), _open(sample_path("divergence", "target")))
    assert not _forward_fault_first(triage("Functional.gelu.0.forward"), [two])
    assert not _forward_fault_first(triage("Functional.gelu.0.forward"), [(b, t), (b, t)])
    fwd_only = t.where(t["direction"] == "forward", drop=True)  # no backward record: nothing to order against
    assert not _forward_fault_first(triage("Functional.gelu.0.forward"), [(b, fwd_only)])


def test_cli_diff_optimizer_fault_at_step_0_still_reads_step_1(capsys):
    """lr x10: the first difference is an optimizer op at step 0 ("forward" by name): the two-step checks run."""
    d = _diff_json(capsys, str(sample_path("preflight", "lr10", "baseline")),
                   str(sample_path("preflight", "lr10", "target")))
    assert d["kind"] == "preflight" and "the first parameter updates are x10" in d["reason"]
