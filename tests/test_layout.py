"""Parallel layouts: rank mapping, exact shard merging, PP/VPP/EP relabelling, replica checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

import precnb
from precnb.analysis import Layout, LayoutError, check_replicas, compare_runs, first_divergence, merge_shards
from tests.conftest import shared_path
from tests.synthetic import make_run, reference_stats


# -- rank mapping -------------------------------------------------------------------------
def test_megatron_rank_groups_tp2_pp2_dp2():
    lay = Layout(8, tp=2, pp=2)
    assert lay.dp == 2
    assert lay.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert lay.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert lay.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for r in range(8):
        assert lay.rank_of(**lay.coords(r)) == r


def test_megatron_16_gpus_tp2_pp4():
    # the Megatron-LM docstring example: 16 GPUs, TP 2, PP 4 -> DP 2
    lay = Layout(16, tp=2, pp=4)
    assert lay.groups("pp")[0] == [0, 4, 8, 12]
    assert lay.groups("tp")[0] == [0, 1]
    assert lay.groups("dp")[0] == [0, 2]


def test_order_string_changes_mapping():
    lay = Layout(8, tp=2, pp=2, order="tp-pp-dp-cp-ep")
    assert lay.groups("pp")[0] == [0, 2]
    assert lay.groups("dp")[0] == [0, 4]


def test_ep_and_cp_groups():
    lay = Layout(8, tp=2, ep=2)
    assert lay.dp == 4
    assert lay.groups("ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert lay.groups("dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    cp = Layout(8, tp=2, cp=2)
    assert cp.groups("cp")[0] == [0, 2] and cp.dp == 2


@pytest.mark.parametrize(("kw", "msg"), [
    ({"world_size": 6, "tp": 4}, "not divisible"),
    ({"world_size": 8, "tp": 2, "ep": 3}, r"not divisible by expert_tensor_model_pipeline_parallel size"),
    ({"world_size": 4, "tp": 2, "ep": 2, "etp": 2, "pp": 2}, r"etp×ep×pp = 2×2×2 = 8"),
    ({"world_size": 8, "pp": 2, "ep": 4, "etp": 1, "tp": 2, "order": "tp-cp-ep-pp-dp"}, "pp-last"),
    ({"world_size": 8, "order": "tp-dp-pp"}, "order"),
    ({"world_size": 8, "tp": 0}, "positive"),
    ({"world_size": 8, "pp": 2, "num_layers": 3}, "num_layers"),
])
def test_layout_validation(kw, msg):
    with pytest.raises(LayoutError, match=msg):
        Layout(**kw)


def test_layout_parse():
    assert Layout.parse("tp=2, pp=2", world_size=8) == Layout(8, tp=2, pp=2)
    with pytest.raises(LayoutError, match="dp=3"):
        Layout.parse("tp=2,dp=3", world_size=8)
    with pytest.raises(LayoutError, match="unknown layout key"):
        Layout.parse("xx=2", world_size=8)
    assert Layout(4, tp=2).check_groups([[0, 1], [2, 3]]) == []
    assert Layout(4, tp=2).check_groups([[0, 3]])
    assert Layout.infer(4, [[0, 1], [2, 3]]).tp == 2


# -- exact merge math -----------------------------------------------------------------------
def assert_matches_reference(merged, ref, *, rank=0, rtol=1e-12):
    checked = 0
    for label, per_step in ref.items():
        if label not in merged.indexes["tensor"]:
            continue
        kind = str(merged["shard_kind_tp"].sel(tensor=label).values) if "shard_kind_tp" in merged.coords else ""
        for s, want in enumerate(per_step):
            got = merged.sel(step=s, rank=rank, tensor=label)
            assert bool(got.present), label
            stats = ("mean",) if kind == "partial_sum" else ("max", "min", "mean", "norm")
            for k in stats:
                assert math.isclose(float(got[k]), want[k], rel_tol=rtol, abs_tol=1e-12), (label, k, kind)
            if kind == "partial_sum":
                assert np.isnan(float(got["max"])) and int(got.null_stats) == 1 | 2 | 8
            checked += 1
    return checked


@pytest.mark.parametrize("rows", [6, 7])  # 7 rows over tp=2: unequal 4 + 3 shards
def test_tp2_merge_exact_including_unequal_shards(rows):
    run = make_run(Layout(2, tp=2), rows=rows)
    merged = merge_shards(run, Layout(2, tp=2))
    kinds = dict(zip(merged.tensor.values, merged.shard_kind_tp.values, strict=True))
    assert kinds["Functional.linear.0.forward.output.0"] == "partial_sum"
    assert kinds["Module.decoder.layers.0.norm.LayerNorm.forward.0.parameters.weight"] == "replicated"
    assert kinds["Functional.gelu.1.forward.output.0"] == "sharded"
    assert kinds["Distributed.all_reduce.0.forward.output.0"] == "replicated"
    assert assert_matches_reference(merged, reference_stats(rows=rows)) > 20


def test_plain_mean_of_means_is_wrong_for_unequal_shards():
    run = make_run(Layout(2, tp=2), rows=7)
    lbl = "Module.decoder.layers.0.mlp.linear_fc1.ColumnParallelLinear.forward.0.parameters.weight"
    shard_means = run["mean"].sel(step=0, tensor=lbl).values
    want = reference_stats(rows=7)[lbl][0]["mean"]
    assert not math.isclose(shard_means.mean(), want, rel_tol=1e-9)  # what msprobe's merge would do
    merged = merge_shards(run, Layout(2, tp=2))
    assert math.isclose(float(merged["mean"].sel(step=0, rank=0, tensor=lbl)), want, rel_tol=1e-12)


def test_nan_propagates_through_merge():
    run = make_run(Layout(2, tp=2))
    lbl = "Functional.gelu.0.forward.output.0"
    run["max"].loc[dict(step=1, rank=1, tensor=lbl)] = np.nan
    run["norm"].loc[dict(step=1, rank=0, tensor=lbl)] = np.inf
    merged = merge_shards(run, Layout(2, tp=2))
    got = merged.sel(step=1, rank=0, tensor=lbl)
    assert np.isnan(float(got["max"])) and np.isinf(float(got["norm"]))


def test_tp2_pp2_dp2_merge_and_renumber():
    lay = Layout(8, tp=2, pp=2)
    run = make_run(lay, n_layers=4)
    assert "Module.decoder.layers.1.norm.LayerNorm.forward.0.parameters.weight" in run.tensor
    assert "Module.decoder.layers.3.norm.LayerNorm.forward.0.parameters.weight" not in run.tensor
    merged = merge_shards(run, lay)
    assert list(merged["rank"].values) == [0, 1]  # one entry per DP replica
    assert "Module.decoder.layers.3.norm.LayerNorm.forward.0.parameters.weight" in merged.tensor
    assert "Functional.linear.3.forward.output.0" in merged.tensor  # API counters offset by stage 0
    ref = reference_stats(n_layers=4)
    for dp in (0, 1):
        assert assert_matches_reference(merged, ref, rank=dp) >= 40
    assert merged.attrs["merged_layout"].startswith("world 8")


def test_vpp2_folds_chunks_into_global_layers():
    lay = Layout(4, pp=2, vpp=2)
    run = make_run(lay, n_layers=8)
    assert any(t.startswith("Module.1.decoder.layers.0.") for t in run.tensor.values)
    merged = merge_shards(run, lay)
    mods = sorted({int(t.split("layers.")[1].split(".")[0]) for t in merged.tensor.values if "layers." in t})
    assert mods == list(range(8))
    ref = {k: v for k, v in reference_stats(n_layers=8).items() if k.startswith("Module.")}
    assert assert_matches_reference(merged, ref, rank=0) >= 32
    assert assert_matches_reference(merged, ref, rank=1) >= 32


def test_cp2_merges_sequence_shards():
    lay = Layout(2, cp=2)
    run = make_run(lay, n_layers=2)
    merged = merge_shards(run, lay)
    kinds = dict(zip(merged.tensor.values, merged.shard_kind_cp.values, strict=True))
    assert kinds["Functional.gelu.0.forward.output.0"] == "sharded"
    assert kinds["Module.decoder.layers.0.norm.LayerNorm.forward.0.parameters.weight"] == "replicated"
    ref = reference_stats(n_layers=2)
    got = merged.sel(step=0, rank=0, tensor="Functional.gelu.1.forward.output.0")
    want = ref["Functional.gelu.1.forward.output.0"][0]
    for k in ("max", "min", "mean", "norm"):
        assert math.isclose(float(got[k]), want[k], rel_tol=1e-12)


def test_moe_parallel_folding_follows_megatron_rank_generators():
    # tp2 ep2 etp1 on 2 ranks (MoE parallel folding): both ranks are one TP group and one EP group
    fold = Layout.parse("tp=2,ep=2,etp=1", world_size=2)
    assert (fold.dp, fold.edp, fold.etp) == (1, 1, 1)
    assert fold.groups("tp") == [[0, 1]] and fold.groups("ep") == [[0, 1]] and fold.groups("edp") == [[0], [1]]
    assert [fold.expert_coords(r)["ep"] for r in (0, 1)] == [0, 1]
    assert not fold.check_groups([[0, 1]])
    # ep alone: Megatron's default etp=tp cannot hold here, etp=1 is assumed and said
    implied = Layout.parse("tp=2,ep=2", world_size=2)
    assert implied == fold and "etp=1 assumed" in implied.etp_assumed
    assert Layout(4, tp=2, ep=2).etp == 2 and not Layout(4, tp=2, ep=2).etp_assumed
    # tp1 dp2 ep2: the expert groups lie over the data-parallel ranks
    dp = Layout.parse("ep=2", world_size=2)
    assert dp.groups("dp") == [[0, 1]] and dp.groups("ep") == [[0, 1]] and dp.edp == 1
    # Megatron-Core 0.19 RankGenerator, world 16: tp2 pp2 dp4; experts etp1 ep4 edp2 (order tp-cp-ep-dp-pp)
    big = Layout(16, tp=2, pp=2, ep=4, etp=1)
    assert big.groups("ep")[:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert big.groups("edp")[0] == [0, 4] and big.groups("tp")[0] == [0, 1] and big.groups("pp")[0] == [0, 8]
    assert big.expert_coords(13) == {"etp": 0, "ep": 1, "edp": 1, "pp": 1}
    with pytest.raises(LayoutError, match="edp=3"):
        Layout.parse("tp=2,ep=2,etp=1,edp=3", world_size=2)


def test_ep2_experts_by_global_index():
    lay = Layout(2, ep=2)
    run = make_run(lay, n_layers=1, experts=4)
    local = {t for t in run.tensor.values if "local_experts" in t}
    assert {t.split("local_experts.")[1].split(".")[0] for t in local} == {"0", "1"}
    # EP over the data-parallel ranks: each rank keeps its own (dense) data and its experts under global indices
    per_rank = merge_shards(run, lay)
    assert list(per_rank["rank"].values) == [0, 1]
    held = {r: {t.split("local_experts.")[1].split(".")[0] for t in per_rank.tensor.values
                if "local_experts" in t and bool(per_rank["present"].sel(rank=r, tensor=t).any())} for r in (0, 1)}
    assert held == {0: {"0", "1"}, 1: {"2", "3"}}
    # merged over DP into the whole model: every expert taken from the rank that holds it
    merged = merge_shards(run, lay, merge_dp=True)
    assert list(merged["rank"].values) == [0]
    experts = {t.split("local_experts.")[1].split(".")[0] for t in merged.tensor.values if "local_experts" in t}
    assert experts == {"0", "1", "2", "3"}
    ref = {k: v for k, v in reference_stats(n_layers=1, experts=4).items() if "experts" in k}
    assert assert_matches_reference(merged, ref) == 8


def test_merge_needs_matching_ranks():
    run = make_run(Layout(2, tp=2))
    with pytest.raises(LayoutError, match=r"needs ranks 0\.\.3"):
        merge_shards(run, Layout(4, tp=2))


# -- replica consistency --------------------------------------------------------------------
def test_replica_check_finds_perturbed_dp_rank():
    lay = Layout(4)
    clean = make_run(lay, n_layers=2)
    assert check_replicas(clean, lay).kind == "none"
    bad = make_run(lay, n_layers=2, perturb={"rank": 2, "step": 1, "label": "norm.LayerNorm"})
    f = check_replicas(bad, lay)
    assert (f.kind, f.step, f.rank) == ("replica_mismatch", 1, 2)
    assert "norm.LayerNorm" in f.tensor and any("only rank 2" in h for h in f.hints)


def test_replica_check_tp_replicated_tensors():
    lay = Layout(2, tp=2)
    bad = make_run(lay, n_layers=2, perturb={"rank": 1, "step": 1, "label": "norm.LayerNorm"})
    f = check_replicas(bad, lay, dims=("tp",))
    assert (f.kind, f.step, f.rank) == ("replica_mismatch", 1, 1)


# -- the real TP sample ---------------------------------------------------------------------
def test_s5_merged_tp2_equals_tp1():
    S = ("data_samples", "msprobe", "S5_tp_shards")
    tp1 = precnb.open_run(shared_path(*S, "tp1"))
    tp2 = precnb.open_run(shared_path(*S, "tp2"))
    for ref in (tp1, None):
        merged = merge_shards(tp2, Layout(2, tp=2), reference=ref)
        kinds = merged["shard_kind_tp"].to_series()
        partial = sorted(t for t in kinds[kinds == "partial_sum"].index if not t.startswith("Distributed."))
        assert partial == sorted(f"Functional.linear.{i}.forward.output.0" for i in (3, 5, 9, 11))
        assert all(str(kinds[f"Distributed.all_reduce.{i}.forward.input.0"]) == "partial_sum"
                   for i in range(12))
        cmp = compare_runs(tp1, merged)
        both = cmp.both.values
        for stat in ("max", "min", "mean", "norm"):
            a = cmp.baseline[stat].values[both]
            b = cmp.target[stat].values[both]
            ok = ~np.isnan(b) & ~np.isnan(a)  # null stats (int Mean, partial-sum Max) skip
            scale = np.fmax(np.abs(a), np.abs(cmp.baseline["norm"].values[both]) /
                               np.sqrt(np.maximum(cmp.baseline["numel"].values[both], 1)))
            with np.errstate(invalid="ignore"):
                rel = np.abs(a[ok] - b[ok]) / np.maximum(scale[ok], 1e-30)
            rel = np.where(a[ok] == b[ok], 0.0, rel)  # equal infinities (masks)
            assert rel.max() < 1e-5, stat
        assert int(both.sum()) == 2 * 867
    with_ref = merge_shards(tp2, Layout(2, tp=2), reference=tp1)
    dims = with_ref["shard_dim_tp"].to_series()
    assert (dims == -2).sum() == 192 and (dims == -1).sum() == 156 and (dims == -3).sum() == 44
    assert first_divergence(tp1, with_ref).kind == "none"
    assert first_divergence(tp1, tp2).kind == "first_divergence"


def test_cli_diff_with_target_layout(capsys):
    import json

    from precnb.cli import main

    S = ("data_samples", "msprobe", "S5_tp_shards")
    a, b = str(shared_path(*S, "tp1")), str(shared_path(*S, "tp2"))
    assert main(["diff", a, b, "--target-layout", "tp=2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "none"
    assert main(["diff", a, b, "--json"]) == 0
    # without the layout it is read from the dumps (ranks holding different values of the same parameters and
    # reducing together: tp=2, issue 24) and the answer is the one with the layout
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "none"
    assert main(["diff", a, b, "--target-layout", "tp=3"]) == 2
