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
from precnb.analysis.layout.merge import classify_shards, merge_shards
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
    t = precnb.diagnose(sample_path("tp_unsync", "tp2"), baseline=sample_path("tp_unsync", "tp1"), target_layout="tp=2",
                        progress=False)
    f = t.finding
    assert (f.kind, f.step, f.node) == ("first_divergence", fault["step"], fault["node"])
    assert "copies differ: rank(s) [1] differ from rank(s) [0]" in f.reason


def test_healthy_tp_run_has_no_replicas_differ():
    tp2, tp1 = open_quiet(sample_path("tp", "tp2")), open_quiet(sample_path("tp", "tp1"))
    merged = merge_shards(tp2, Layout(2, tp=2), reference=tp1)
    assert "replicas_differ" not in set(merged["shard_kind_tp"].values.tolist())
    assert not bool(merged["replicas_differ"].any())
    assert precnb.diagnose(sample_path("tp", "tp2"), baseline=sample_path("tp", "tp1"), target_layout="tp=2",
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
    t = precnb.diagnose(root / "tp2", baseline=root / "tp1", target_layout="tp=2", progress=False)
    assert t.finding.kind == "none"


# -- issue 26 item 2: a merge never invents a value ------------------------------------------------
def _noise():
    gt = json.loads((sample_path("tp_noise") / "ground_truth.json").read_text())
    return gt["faults"][0], open_quiet(sample_path("tp_noise", "tp2")), open_quiet(sample_path("tp_noise", "tp1"))


def test_a_per_rank_seeded_random_op_is_replicas_differ_not_a_partial_sum():
    fault, tp2, tp1 = _noise()
    label = f"{fault['node']}.{fault['tensor']}"
    assert fault["tensor_inputs"] == 0  # torch.normal(mean, std, size): no tensor input
    merged = merge_shards(tp2, Layout(2, tp=2), reference=tp1)
    kinds = merged["shard_kind_tp"].to_series()
    assert kinds[label] == "replicas_differ"
    assert "full shape on every rank" in str(merged["shard_reason_tp"].sel(tensor=label).values)
    for stat in ("max", "min", "mean", "norm"):  # rank 0's copy, exactly: no sum of means, no null
        assert merged[stat].sel(step=0, rank=0, tensor=label).item() == fault["stats"]["rank0"][stat.title()]
    assert int(merged["null_stats"].sel(step=0, rank=0, tensor=label)) == 0
    # what is computed from the noise is replicated by design too: only shard-reading ops give partial sums
    partial = [str(t) for t in kinds.index[kinds == "partial_sum"]]
    assert partial and all("linear" in t or "all_reduce" in t for t in partial), partial


def test_tp1_comparison_names_the_random_op_and_the_odd_rank_everywhere():
    fault = _noise()[0]
    label = f"{fault['node']}.{fault['tensor']}"
    t = precnb.diagnose(sample_path("tp_noise", "tp2"), baseline=sample_path("tp_noise", "tp1"), target_layout="tp=2")
    f = t.finding
    assert (f.kind, f.step, f.tensor) == ("first_divergence", 0, label)
    assert "must be replicated" in f.reason and "rank(s) [1] differ from rank(s) [0]" in f.reason
    rep = t.result("replica_mismatch")
    assert (rep.kind, rep.step, rep.rank, rep.tensor) == ("replica_mismatch", 0, fault["rank"], label)
    assert "no tensor input" in rep.reason
    assert t.flagged_ranks().first() == (0, fault["rank"], label)  # the rank × step view points at it
    pre = t.result("preflight")
    assert not [c for c in pre.evidence["checks"] if c["status"] != "pass" and "nan" in c.get("message", "")]


def test_unsynced_replicated_weights_do_not_mislead_the_pre_flight_checks():
    t = precnb.diagnose(sample_path("tp_unsync", "tp2"), baseline=sample_path("tp_unsync", "tp1"), target_layout="tp=2")
    checks = {c["name"]: c for c in t.result("preflight").evidence["checks"]}
    assert checks["initial_weights"]["status"] == "pass", checks["initial_weights"]
    merged = t.target
    w = [str(x) for x in merged["tensor"].values if str(x).endswith("mlp_norm.RMSNorm.forward.0.parameters.weight")]
    assert w and str(merged["shard_kind_tp"].sel(tensor=w[0]).values) == "replicas_differ"
    assert np.isfinite(merged["max"].sel(tensor=w[0]).values).all()  # never a null, never a NaN made up


def test_detail_table_shows_each_runs_own_values_and_nulls():
    pytest.importorskip("ipywidgets")
    from precnb.widgets import explore

    ex = explore(sample_path("tp_noise", "tp2"), baseline=sample_path("tp_noise", "tp1"), target_layout="tp=2")
    fault = _noise()[0]
    assert (ex.step, ex.tensor) == (0, f"{fault['node']}.{fault['tensor']}")
    assert ex.unmerged and ex.rank == 1  # it opens on the departing copy as dumped (issue 51); the merged record:
    ex.select_record(0, 0, ex.tensor)
    row = ex.record.detail.frame.set_index("tensor").loc[ex.tensor]
    assert row["null_stats"] == 0 and row["null_stats_tp1"] == 0 and row["max"] == fault["stats"]["rank0"]["Max"]
    # a real partial sum (the row-parallel linear before its all-reduce): only its mean, said so; the
    # TP=1 baseline's own values stay in its columns (its nulls are its own, not the merged run's)
    healthy = explore(sample_path("tp", "tp2"), baseline=sample_path("tp", "tp1"), target_layout="tp=2")
    healthy.select_record(0, 0, "Functional.linear.3.forward.output.0")
    r = healthy.record.detail.frame.set_index("tensor").loc["Functional.linear.3.forward.output.0"]
    assert r["merged"] == "partial_sum" and r["null_stats"] & 1 and r["null_stats_tp1"] == 0
    assert np.isfinite(r["max_tp1"])
    page = healthy.record.detail.html.value
    assert "a partial sum across shards" in page
    cell = page.split("<tr class='focus'>", 1)[1].split("</tr>", 1)[0]  # the selected record's row
    assert "Functional.linear.3.forward.output.0<span" in cell
    assert "null</span>" not in cell and "Σ" in cell
