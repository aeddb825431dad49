"""The first replica departure, classified (issue 28, item 2), on the faulty-device samples.

Ground truth: each sample's ground_truth.json (re-checked on the dumps by test_samples_sdc.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import precnb
from precnb.analysis.layout import Layout
from precnb.analysis.replicas.departures import check_departures, departure_events, scalar_args
from precnb.cli import main

LAYOUT = "tp=2,dp=2"


def _gt(name: str) -> dict:
    return json.loads((precnb.sample_path(name) / "ground_truth.json").read_text())


def _open(name: str):
    return precnb.open_run(precnb.sample_path(name), workers=1)


def _diagnose(name: str, **kw):
    return precnb.diagnose(precnb.sample_path(name), layout=LAYOUT, kinds=["replica_mismatch"], workers=1, **kw)


@pytest.mark.parametrize(("sample", "fault"), [("sdc/job1", 0), ("sdc/job2", 2), ("sdc_md5", 0)])
def test_the_bit_flip_is_a_compute_fault_with_identical_inputs(sample, fault):
    g = _gt(sample.split("/")[0])["faults"][fault]
    f = _diagnose(sample).finding
    ev = f.evidence["departure"]
    assert (f.kind, f.step, f.node, f.module) == ("replica_mismatch", g["step"], g["node"], "blocks.0.mlp_norm")
    assert f.tensor == f"{g['node']}.{g['tensor']}"
    assert ev["group"] == g["ranks"] and ev["dim"] == g["group"] == "tp"
    # tensors and scalar arguments (read from the dump's records) alike
    assert ev["inputs_identical"] is ev["tensor_inputs_identical"] is ev["scalar_args_identical"] is True
    assert (ev["random_op"], ev["cause"]) == (g["random_op"], g["cause"]) == (False, "compute_fault")
    assert "a compute fault on that device, or a non-deterministic kernel" in f.reason
    # later mismatches of that step are its consequences, not origins
    assert ev["consequences"]["tensors"] == g["consequences"]["tensors"]
    assert ev["consequences"]["nodes"] == g["consequences"]["nodes"]
    assert f.stats["consequences"] == {"count": g["consequences"]["tensors"], "steps": [g["step"]]}
    # a pair, no baseline: both ranks are candidates
    assert [c["rank"] for c in f.evidence["candidates"]] == g["ranks"] and not ev["wrong_side"]
    assert "both are candidates" in f.reason


def test_events_at_separate_steps_are_separate_origins():
    f = _diagnose("sdc/job1").finding
    want = [(x["step"], x["node"], x["inputs_identical"]) for x in _gt("sdc")["faults"] if x["run"] == "job1"]
    assert [(e["step"], e["node"], e["inputs_identical"]) for e in f.evidence["departures"]] == want
    assert f.stats["origins"] == 2 and "1 more departure(s) with identical inputs (step 3 ranks [0, 1])" in f.hints[0]


@pytest.mark.parametrize("sample", ["sdc/job1", "sdc/job2", "sdc_rank/job1", "sdc_rank/job2"])
def test_a_clean_run_decides_the_pair_where_the_inputs_still_match_it(sample):
    clean = precnb.sample_path("sdc_clean")
    f = _diagnose(sample, replica_baseline=clean).finding
    scenario, job = sample.split("/")
    faults = [x for x in _gt(scenario)["faults"] if x["run"] == job]
    got = {(e["step"], tuple(e["group"])): e for e in f.evidence["departures"]}
    for x in faults:
        e = got[(x["step"], tuple(x["ranks"]))]
        assert e["wrong_side"] == (x["baseline"]["differ_from_baseline"] if x["baseline"]["decides"] else [])
        assert e["candidates"] == ([x["rank"]] if x["baseline"]["decides"] else x["ranks"])
    first = faults[0]
    assert (f.step, f.rank) == (first["step"], first["rank"])
    assert f.evidence["departure"]["baseline"]["decides"] is first["baseline"]["decides"]
    assert "the clean run decides" in f.reason


def test_an_unsynchronised_seed_is_the_random_op_not_its_consequence():
    for job in ("job1", "job2"):
        g = [x for x in _gt("sdc_rank")["faults"] if x["run"] == job]
        f = _diagnose(f"sdc_rank/{job}").finding
        assert (f.step, f.node, f.tensor) == (1, "Torch.normal.0.forward", "Torch.normal.0.forward.output.0")
        ev = f.evidence["departure"]
        assert ev["random_op"] and ev["cause"] == "unsynchronised_seed" == g[0]["cause"]
        assert ev["tensor_inputs_identical"] is None and ev["scalar_args_identical"] is True  # mean, std, size
        assert "unsynchronised seed" in f.reason
        assert [(e["step"], e["group"]) for e in f.evidence["departures"]] == [(x["step"], x["ranks"]) for x in g]


def test_the_negative_control_finds_nothing():
    f = _diagnose("sdc_clean").finding
    assert f.kind == "none" and f.stats["mismatches"] == 0
    f = _diagnose("sdc_clean", replica_baseline=precnb.sample_path("sdc_clean")).finding
    assert f.kind == "none"


def test_inside_a_model_parallel_rng_region_dropout_is_set_aside():
    run = precnb.sample_path("tp_unsync/tp2")
    f = precnb.diagnose(run, layout="tp=2", kinds=["replica_mismatch"], workers=1).finding
    assert (f.step, f.node, f.evidence["departure"]["cause"]) == (0, "Functional.dropout.0.forward",
                                                                 "unsynchronised_seed")
    f = precnb.diagnose(run, layout="tp=2", kinds=["replica_mismatch"], workers=1, rng_regions=("blocks.0",)).finding
    aside = f.evidence["set_aside"]
    assert aside[0]["node"] == "Functional.dropout.0.forward" and "model-parallel RNG region" in aside[0]["why"]
    assert f.node != "Functional.dropout.0.forward"


def test_a_per_rank_scalar_argument_is_not_a_departure():
    ds = _open("sdc/job1")
    lay = Layout.parse(LAYOUT, world_size=4)

    def records(step, rank, node):  # the op took a rank-dependent constant
        return {"input_args": [{"type": "torch.Tensor", "shape": [2]}, {"type": "int", "value": rank % 2}]}

    f = check_departures(ds, lay, records=records)
    assert f.kind == "none" and [a["step"] for a in f.evidence["set_aside"]] == [1, 3]
    assert "scalar arguments differ" in f.hints[0]
    assert scalar_args(records(1, 0, "x")) == {"input_args.1": ("int", 0)}


def test_a_third_replica_decides_and_a_parameter_is_inherited():
    ds = _open("sdc_clean")
    j = list(ds["tensor"].values).index("Module.lm_head.Linear.forward.0.parameters.weight")
    one = ds.isel(tensor=[j]).copy(deep=True)  # replicated on all 4 ranks (TP- and DP-synced)
    one["max"].values[1, 2, 0] *= 1.5  # rank 2, step 2
    f = check_departures(one, Layout(4))
    ev = f.evidence["departure"]
    assert (f.step, f.rank, ev["group"], ev["dim"]) == (2, 2, [0, 1, 2, 3], "dp")
    assert ev["wrong_side"] == [2] and ev["decided_by"] == "majority" and ev["cause"] == "inherited"
    assert [c["rank"] for c in f.evidence["candidates"]] == [2] and "the majority decides" in f.reason


def test_random_ops_without_tensor_inputs_are_checked():
    from precnb.analysis.replicas import replica_mismatches

    ds = _open("sdc_rank/job1")
    rows, _ = replica_mismatches(ds, Layout.parse(LAYOUT, world_size=4))
    assert {(r["step"], r["rank"], r["node"]) for r in rows} == {(s, r, "Torch.normal.0.forward") for s in (1, 2, 3)
                                                                 for r in (1, 3)}
    events, _ = departure_events(ds, rows)
    assert len(events) == 6 and all(e["cause"] == "unsynchronised_seed" and e["random_op"] for e in events)


def test_cli_replicas_baseline(capsys):
    code = main(["replicas", str(precnb.sample_path("sdc/job2")), "--layout", LAYOUT, "--baseline",
                 str(precnb.sample_path("sdc_clean")), "--rank-table",
                 str(precnb.sample_path("sdc/rank_tables/job2.csv")), "--json", "--workers", "1"])
    f = json.loads(capsys.readouterr().out)
    assert code == 0 and (f["step"], f["rank"]) == (2, 2)
    assert f["device"] == _gt("sdc")["faulty_device"]
    assert f["evidence"]["candidates"] == [{"rank": 2, "wrong_side": True, "device": f["device"]}]
    assert np.isfinite(f["values"]["rank2"]["min"])


def test_md5_dumps_compare_bitwise_a_crc_only_departure():
    """Statistics equal on both replicas (as a flip below their precision would leave them), CRC-32 not."""
    from precnb.analysis.replicas import replica_mismatches
    from precnb.analysis.replicas.departures import crc_rows

    ds = _open("sdc_md5")
    lay = Layout.parse(LAYOUT, world_size=4)
    assert crc_rows(ds, lay) == []  # where the statistics already differ, the CRC adds nothing
    rows, _ = replica_mismatches(ds, lay)
    labels = list(ds["tensor"].values)
    flat = ds.copy(deep=True)
    for r in rows:
        if r["step"] == 1:  # rank 1's statistics made equal to rank 0's: only the CRC still differs
            for s in ("max", "min", "mean", "norm"):
                flat[s].values[0, 1, labels.index(r["tensor"])] = flat[s].values[0, 0, labels.index(r["tensor"])]
    assert replica_mismatches(flat, lay)[0][0]["step"] == 3  # statistics alone miss step 1
    f = check_departures(flat, lay)
    g = _gt("sdc_md5")["faults"][0]
    assert (f.step, f.node, f.evidence["departure"]["cause"]) == (1, g["node"], "compute_fault")
    assert f.evidence["departure"]["consequences"]["tensors"] == g["consequences"]["tensors"]
    assert "CRC differs" in f.suspects[0]["why"]
