"""Merging a TP run whose replicated tensor differs across the TP ranks: classified, flagged, explained.

A tensor that must be replicated (its op's tensor inputs are identical on every rank, or, in a
group of three or more, some copies agree and others do not) but whose copies differ is not a
partial sum: the merge keeps the first copy, marks the entries in ``replicas_differ``, and the
comparison counts them as differences, naming the odd ranks.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

import precnb
from precnb.analysis.layout import Layout
from precnb.analysis.merge import classify_shards, merge_shards
from tests.conftest import open_quiet, sample_path


def _gt():
    return json.loads((sample_path("tp_unsync") / "ground_truth.json").read_text())


def test_unsynced_dropout_is_classified_as_replicas_differ_on_the_real_sample():
    fault = _gt()["faults"][0]
    tp2, tp1 = open_quiet(sample_path("tp_unsync", "tp2")), open_quiet(sample_path("tp_unsync", "tp1"))
    merged = merge_shards(tp2, Layout(2, tp=2), reference=tp1)
    label = f"{fault['node']}.{fault['tensor']}"
    assert str(merged["shard_kind_tp"].sel(tensor=label).values) == "replicas_differ"
    reason = str(merged["shard_reason_tp"].sel(tensor=label).values)
    assert "inputs are identical" in reason and "rank(s) [1] differ from rank(s) [0]" in reason
    # the merged entry is rank 0's copy, exactly; the mark is set where the copies differ
    for stat in ("max", "min", "mean", "norm"):
        assert merged[stat].sel(step=0, rank=0, tensor=label).item() == tp2[stat].sel(step=0, rank=0,
                                                                                         tensor=label).item()
    assert bool(merged["replicas_differ"].sel(step=0, rank=0, tensor=label))
    # its input is replicated (identical on both ranks), as the ground truth says
    assert str(merged["shard_kind_tp"].sel(tensor=f"{fault['node']}.input.0").values) == "replicated"
    assert fault["input_identical_across_ranks"]


def test_diff_against_tp1_names_the_dropout_and_the_odd_rank():
    fault = _gt()["faults"][0]
    t = precnb.diagnose(sample_path("tp_unsync", "tp2"), sample_path("tp_unsync", "tp1"), target_layout="tp=2",
                        progress=False)
    f = t.finding
    assert (f.kind, f.step, f.node) == ("first_divergence", fault["step"], fault["node"])
    assert "copies differ: rank(s) [1] differ from rank(s) [0]" in f.reason


def test_healthy_tp_run_has_no_replicas_differ():
    tp2, tp1 = open_quiet(sample_path("tp", "tp2")), open_quiet(sample_path("tp", "tp1"))
    merged = merge_shards(tp2, Layout(2, tp=2), reference=tp1)
    assert "replicas_differ" not in set(merged["shard_kind_tp"].values.tolist())
    assert not bool(merged["replicas_differ"].any())
    assert precnb.diagnose(sample_path("tp", "tp2"), sample_path("tp", "tp1"), target_layout="tp=2",
                           progress=False).finding.kind == "none"


def _four_ranks(copies: list[float], *, sharded: bool = False) -> xr.Dataset:
    """One step, four ranks, one tensor of an op with no recorded input: each rank's statistics."""
    from precnb.schema import empty_dataset

    base = empty_dataset()
    n = len(copies)
    data = {s: (("step", "rank", "tensor"), np.asarray([[[v + (k if sharded else 0)] for k, v in enumerate(copies)]],
                                                      np.float64)) for s in ("max", "min", "mean", "norm")}
    data["min"] = (("step", "rank", "tensor"), -data["min"][1])
    data["present"] = (("step", "rank", "tensor"), np.ones((1, n, 1), bool))
    data["null_stats"] = (("step", "rank", "tensor"), np.zeros((1, n, 1), np.uint8))
    data["seq"] = (("step", "rank", "tensor"), np.zeros((1, n, 1), np.int32))
    data["numel"] = (("step", "rank", "tensor"), np.full((1, n, 1), 4, np.int64))
    coords = {k: ("tensor", [v]) for k, v in {"node": "Torch.randn.0.forward", "module": "", "api": "Torch.randn",
                                               "kind": "api", "direction": "forward", "role": "output",
                                               "dtype": "torch.float32", "shape": "[4]", "parent": "", "call": 0,
                                               "micro_step": -1}.items()}
    return xr.Dataset(data, coords={"step": [0], "rank": list(range(n)),
                                    "tensor": ["Torch.randn.0.forward.output.0"], **coords}, attrs=dict(base.attrs))


def test_three_of_four_copies_agreeing_is_a_replica_difference_not_a_shard():
    kinds, reasons, _ = classify_shards(_four_ranks([1.0, 1.0, 2.0, 1.0]), [[0, 1, 2, 3]])
    assert kinds.tolist() == ["replicas_differ"]
    assert "rank(s) [2] differ from rank(s) [0, 1, 3]" in reasons[0]
    kinds, _, _ = classify_shards(_four_ranks([1.0, 1.0, 1.0, 1.0]), [[0, 1, 2, 3]])
    assert kinds.tolist() == ["replicated"]
    kinds, _, _ = classify_shards(_four_ranks([1.0, 1.0, 1.0, 1.0], sharded=True), [[0, 1, 2, 3]])
    assert kinds.tolist() == ["sharded"]  # every copy different: shards


@pytest.mark.shared
def test_real_healthy_tp2_run_has_no_replicas_differ(shared):
    """S5 (real msprobe TP=2 vs TP=1, healthy): every tensor classified as before, nothing flagged."""
    root = shared("data_samples", "msprobe", "S5_tp_shards")
    tp2, tp1 = open_quiet(root / "tp2"), open_quiet(root / "tp1")
    merged = merge_shards(tp2, Layout(2, tp=2), reference=tp1)
    assert "replicas_differ" not in set(merged["shard_kind_tp"].values.tolist())
    assert not bool(merged["replicas_differ"].any())
    assert precnb.diagnose(root / "tp2", root / "tp1", target_layout="tp=2", progress=False).finding.kind == "none"
