"""A replicated tensor whose copies depart at a later step is a finding without a baseline counterpart (issue 47).

Megatron's row-parallel layers return their bias (skip_bias_add): its gradient is replicated over the TP group,
and msprobe records it where the schedule puts it (``parameters_grad.0`` of a pipeline run, not at all in the
unsharded run). A fault on one TP rank's bias gradient therefore has no baseline counterpart: the merge's replica
check alone can see it, at the step it happens. The fixture: the real ``megatron/tp2pp2`` and ``tp1pp1`` dumps,
step 0 written again as step 1 (so both steps agree), then rank 3's bias gradient scaled by 1.05 at step 1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MG = ROOT / "data_samples" / "megatron"
NODE = "Module.0.decoder.layers.1.mlp.linear_fc2.RowParallelLinear.parameters_grad.0"

pytestmark = pytest.mark.skipif(not (MG / "tp2pp2" / "step0").exists(), reason="data_samples/megatron missing")


def _two_steps(src: Path, dest: Path) -> Path:
    shutil.copytree(src / "step0", dest / "step0")
    shutil.copytree(src / "step0", dest / "step1")
    return dest


def _scale_bias_grad(dump: Path, factor: float) -> None:
    doc = json.loads(dump.read_text(encoding="utf-8"))
    bias = doc["data"][NODE]["bias"][0]
    for key in ("Max", "Min", "Mean", "Norm"):
        bias[key] = bias[key] * factor
    dump.write_text(json.dumps(doc), encoding="utf-8")


def test_a_bias_gradient_departing_on_one_tp_rank_is_found_at_its_step(tmp_path):
    import precnb

    base = _two_steps(MG / "tp1pp1", tmp_path / "tp1pp1")
    run = _two_steps(MG / "tp2pp2", tmp_path / "tp2pp2")
    _scale_bias_grad(run / "step1" / "rank3" / "dump.json", 1.05)
    t = precnb.diagnose(str(run), baseline=str(base), target_layout="tp=2,pp=2")
    f = t.finding
    assert f.kind == "first_divergence" and f.step == 1, f.reason
    assert "decoder.layers.3.mlp.linear_fc2" in (f.module or ""), f.reason  # stage 1's layer 1 = global layer 3
    assert "copies differ" in f.reason
    assert f.evidence["dump"]["ranks"] == [2, 3]


def test_the_replica_check_finds_the_bias_gradient_departing_at_its_step(tmp_path):
    """``replicas`` on the run alone: a replicated parameter's gradient is a tensor that must stay replicated like
    any other (it was left out: the departure showed one step later, in the bias the optimizer updated)."""
    import precnb

    run = _two_steps(MG / "tp2pp2", tmp_path / "tp2pp2")
    _scale_bias_grad(run / "step1" / "rank3" / "dump.json", 1.05)
    f = precnb.diagnose(str(run), kinds=["replica_mismatch"], target_layout="tp=2,pp=2").finding
    assert f.kind == "replica_mismatch" and f.step == 1, f.reason
    assert f.node == NODE and f.tensor == f"{NODE}.bias", f.reason
