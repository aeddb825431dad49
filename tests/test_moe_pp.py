"""Expert parallelism with pipeline parallelism on real Megatron-Core MoE dumps (issue #48, "EP+PP>1").

``data_samples/megatron_moe_pp`` (see its README and ground_truth.json): the reference ``moe_ep1``, a healthy
``moe_pp2ep2dp2`` run (PP 2 × DP 2, one layer per stage, EP 2 over each stage's DP pair, ETP 1: each expert on
one rank) and a healthy ``moe_tp2pp2ep2`` run (TP 2 with sequence parallelism × PP 2, EP 2 folded onto each stage's
TP pair; step 0), made by the population generator.

The replica check compared a stage's DP pair tensor by tensor under the dump's local names: ``local_experts.0`` is
global expert 0 on rank 0 and global expert 2 on rank 1, so every healthy run of this layout "departed" at step 0
(the expert weights differ by design). With EP the stages are now stitched and the experts named by their global
index before the check (as without PP), and a departure is still reported on the dump rank that recorded it, under
that rank's own name.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest

import precnb
from precnb.analysis import Layout
from precnb.analysis.replicas import check_replicas

ROOT = Path(__file__).resolve().parents[1]
PP = ROOT / "data_samples" / "megatron_moe_pp"

pytestmark = pytest.mark.skipif(not (PP / "ground_truth.json").exists(),
                                reason="data_samples/megatron_moe_pp missing")


@cache
def gt() -> dict:
    return json.loads((PP / "ground_truth.json").read_text(encoding="utf-8"))


def _pair(layout: str = "moe_pp2ep2dp2") -> dict:
    return next(h for h in gt()["draws"]["moe_pp"]["healthy"] if h["layout"] == layout)


def _run(rid: str) -> str:
    return str(PP / "runs" / rid / "dump")


def _cli_json(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "precnb", *args, "--json", "--workers", "1"],
                         capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert out.returncode in (0, 1), out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize("layout", ["moe_pp2ep2dp2", "moe_tp2pp2ep2"])
def test_replicas_healthy_pp_ep_run_finds_nothing(layout):
    got = _cli_json("replicas", _run(_pair(layout)["run"]))
    assert got["kind"] == "none", got["reason"]
    assert any("experts have no replicas" in h for h in got["hints"])


def test_replicas_departure_on_stage_one_named_on_its_dump_rank():
    """A dense weight of stage 1 (layer 1, local layer 0 on ranks 2-3) changed on rank 3 only: found there."""
    run = precnb.open_run(_run(_pair()["run"]))
    layout = Layout.coerce(gt()["layouts"]["moe_pp2ep2dp2"]["text"], 4)
    node = "Module.0.decoder.layers.0.self_attention.linear_proj.RowParallelLinear.forward.0"
    tensor = f"{node}.parameters.weight"
    ri, ti = [int(r) for r in run["rank"].values].index(3), list(run["tensor"].values).index(tensor)
    assert bool(run["present"].values[0, ri, ti])
    for stat in ("max", "min", "mean", "norm"):
        values = run[stat].values.copy()
        values[0, ri, ti] *= 1.5
        run[stat] = (run[stat].dims, values)
    got = check_replicas(run, layout)
    assert (got.kind, got.step, got.rank, got.node) == ("replica_mismatch", 0, 3, node), got.reason
    assert got.evidence["ranks"] == [2, 3]
    assert np.isclose(got.values["rank3"]["mean"], 1.5 * got.values["rank2"]["mean"]), got.values


@pytest.mark.slow
def test_healthy_pp_ep_against_ep1_finds_nothing():
    got = _cli_json("diff", _run(_pair()["reference"]), _run(_pair()["run"]), "--target-layout",
                    gt()["layouts"]["moe_pp2ep2dp2"]["text"])
    assert got["kind"] == "none", got["reason"]


def _expert_calls(ds, api: str) -> dict[str, str]:
    """Label -> parent module of every call of *api* made inside an expert, on every rank of *ds*."""
    out: dict[str, str] = {}
    for i in range(ds.sizes["rank"]):
        pres = ds["present"].values[0, i]
        for j in np.flatnonzero(pres).tolist():
            node, parent = str(ds["node"].values[j]), str(ds["parent"].values[j])
            if node.startswith(api + ".") and ".local_experts." in parent:
                assert out.setdefault(node, parent) == parent, (node, parent, out[node])
    return out


def test_stitched_stages_number_expert_calls_as_one_rank_holding_every_expert():
    """TP 2 x PP 2 with EP folded onto TP: each stitched TP rank holds two of the four experts of each layer. Its
    API calls inside experts are numbered as the EP=1 run numbers them (the other EP rank's experts counted where
    they run, backward blocks from the last expert down), so a label names the same global expert's call."""
    from precnb.analysis.layout.pp import relabel_pipeline

    pair = _pair("moe_tp2pp2ep2")
    ref = _expert_calls(precnb.open_run(_run(pair["reference"]), workers=1), "Tensor.t")
    run = precnb.open_run(_run(pair["run"]), workers=1)
    stitched, _ = relabel_pipeline(run, Layout.coerce(gt()["layouts"]["moe_tp2pp2ep2"]["text"], 4))
    got = _expert_calls(stitched, "Tensor.t")
    assert len(got) == len(ref) == 32
    assert {n: p for n, p in got.items()} == {n: ref[n] for n in got}


@pytest.mark.slow
def test_healthy_tp_folded_pp_ep_against_ep1_finds_nothing():
    pair = _pair("moe_tp2pp2ep2")
    got = _cli_json("diff", _run(pair["reference"]), _run(pair["run"]), "--target-layout",
                    gt()["layouts"]["moe_tp2pp2ep2"]["text"])
    assert got["kind"] == "none", got["reason"]
