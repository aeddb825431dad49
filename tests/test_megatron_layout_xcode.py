"""A layout change and a codebase change in one diff (issue 24, items 5 and 6 together).

``tp2pp2`` (Megatron-Core, 4 ranks: TP 2 x PP 2) against ``hf_llama`` (the same weights in one Hugging Face
LlamaForCausalLM rank): the shards and stages are merged first (no reference run of Megatron's names exists),
then the fused ``linear_qkv`` / ``linear_fc1`` pair the separate q/k/v and gate/up projections.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import precnb
from tests.test_megatron import _scaled_copy  # the same scaled copy of the HF run

ROOT = Path(__file__).resolve().parents[1]
MG = ROOT / "data_samples" / "megatron"

pytestmark = pytest.mark.skipif(not (MG / "ground_truth.json").exists(), reason="data_samples/megatron missing")


def _diff(baseline: Path, target: Path) -> precnb.Triage:
    return precnb.diagnose(str(target), baseline=str(baseline))  # the pipeline every front end uses


# HF as the baseline in make test only: that direction stays fast in the scaled-op test below (issue #53 item 8)
@pytest.mark.parametrize("baseline, target", [("tp2pp2", "hf_llama"),
                                              pytest.param("hf_llama", "tp2pp2", marks=pytest.mark.slow)])
def test_sharded_megatron_against_its_hugging_face_twin_finds_nothing(baseline, target):
    t = _diff(MG / baseline, MG / target)
    assert t.finding.kind == "none", t.finding.reason
    pre = t.result("preflight")
    assert pre is not None and pre.kind == "none", pre.reason if pre is not None else t.checks
    assert any("shards merged" in n for n in t.notes), t.notes


@pytest.mark.parametrize("direction", ["megatron_first", "hf_first"])
def test_a_scaled_hugging_face_op_is_found_against_the_sharded_run(tmp_path, direction):
    # layer 1's o_proj output scaled by 1.5 in a copy of the HF run: its inputs agree, its output differs
    bug = _scaled_copy(tmp_path, "Functional.linear.10.forward", 1.5)
    if direction == "megatron_first":
        f = _diff(MG / "tp2pp2", bug).finding
        node, module, other = f.node, f.module, (f.baseline or {}).get("module")
    else:
        f = _diff(bug, MG / "tp2pp2").finding
        node, module, other = (f.baseline or {}).get("node"), (f.baseline or {}).get("module"), f.module
    assert f.kind == "first_divergence" and f.step == 0 and f.rank == 0, f.reason
    assert node == "Functional.linear.10.forward", f.reason
    assert module == "model.layers.1.self_attn.o_proj", f.reason
    # global layer 1 of the whole model (stage 0 of tp2pp2 holds layers 0 and 1)
    assert other == "0.decoder.layers.1.self_attention.linear_proj", f.reason
