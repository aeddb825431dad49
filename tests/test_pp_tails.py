"""precnb.analysis.layout.pp_tails: the stages' step tails merged, on real Megatron-Core MoE dumps (issue #48).

``data_samples/megatron_moe_pp``: the healthy ``moe_tp2pp2ep2`` run (TP 2 with sequence parallelism × PP 2, EP 2
folded onto each stage's TP pair) and its reference ``moe_ep1`` (one rank, both MoE layers). After its backward
pass each stage all-reduces its sequence-parallel gradients and its routers' token counts ([1, 4]: its one MoE
layer) and updates its expert biases; the one-rank run does it once over both layers ([2, 4]).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

import precnb
from precnb.analysis import Layout
from precnb.analysis.layout.merge import merge_shards
from precnb.analysis.layout.pp import relabel_pipeline
from precnb.analysis.layout.pp_tails import merge_stage_tails

PP = Path(__file__).resolve().parents[1] / "data_samples" / "megatron_moe_pp"

pytestmark = pytest.mark.skipif(not (PP / "ground_truth.json").exists(), reason="data_samples/megatron_moe_pp missing")


@cache
def _runs() -> tuple:
    gt = json.loads((PP / "ground_truth.json").read_text(encoding="utf-8"))
    pair = next(h for h in gt["draws"]["moe_pp"]["healthy"] if h["layout"] == "moe_tp2pp2ep2")
    ref = precnb.open_run(PP / "runs" / pair["reference"] / "dump", workers=1)
    run = precnb.open_run(PP / "runs" / pair["run"] / "dump", workers=1)
    return ref, run, Layout.coerce(gt["layouts"]["moe_tp2pp2ep2"]["text"], 4)


def _entry(ds, label: str, rank: int = 0) -> dict:
    j = list(ds["tensor"].values).index(label)
    out = {s: float(ds[s].values[0, rank, j]) for s in ("max", "min", "mean", "norm")}
    return {**out, "present": bool(ds["present"].values[0, rank, j]), "shape": str(ds["shape"].values[j])}


def test_token_counts_of_both_stages_are_one_stack_as_one_rank_makes_it():
    ref, run, layout = _runs()
    stitched, _ = relabel_pipeline(run, layout)
    # stitched: stage 0's token-count all-reduce is .4 ([1, 4]), stage 1's .6 ([1, 4])
    assert _entry(stitched, "Distributed.all_reduce.4.forward.output.0")["shape"] == "[1, 4]"
    assert _entry(stitched, "Distributed.all_reduce.6.forward.output.0")["present"]
    merged = merge_stage_tails(stitched, run, layout)
    got = _entry(merged, "Distributed.all_reduce.4.forward.output.0")
    want = _entry(ref, "Distributed.all_reduce.3.forward.output.0")  # the one rank's counts of both layers
    assert got["shape"] == want["shape"] == "[2, 4]"
    for s in ("max", "min", "mean", "norm"):
        assert np.isclose(got[s], want[s], rtol=1e-6), (s, got, want)
    assert not _entry(merged, "Distributed.all_reduce.6.forward.output.0")["present"]
    # the sequence-parallel gradients: stage 0's 96 and stage 1's 112 elements, one buffer as without PP
    assert _entry(merged, "Distributed.all_reduce.3.forward.input.0")["shape"] == "[208]"
    # the optimizer's calls are left to the optimizer's own naming
    assert _entry(merged, "Torch._fused_adamw_.1.forward.input.0.0")["present"]


def test_a_merged_entry_combines_the_parts_exactly():
    _ref, run, layout = _runs()
    stitched, _ = relabel_pipeline(run, layout)
    merged = merge_stage_tails(stitched, run, layout)
    a = _entry(stitched, "Torch.sign.0.forward.output.0")
    b = _entry(stitched, "Torch.sign.1.forward.output.0")
    got = _entry(merged, "Torch.sign.0.forward.output.0")
    assert got["max"] == max(a["max"], b["max"]) and got["min"] == min(a["min"], b["min"])
    assert np.isclose(got["norm"], np.hypot(a["norm"], b["norm"]))
    assert np.isclose(got["mean"], (a["mean"] + b["mean"]) / 2)  # equal parts: 4 elements each


def test_one_stage_or_a_dataset_with_checksums_is_left_as_it_is():
    _ref, run, layout = _runs()
    stitched, _ = relabel_pipeline(run, layout)
    assert merge_stage_tails(stitched, run, Layout.coerce("tp=2", 4)) is stitched
    with_crc = stitched.assign(crc=(("step", "rank", "tensor"), np.full(stitched["max"].shape, "", object)))
    assert merge_stage_tails(with_crc, run, layout) is with_crc


@pytest.mark.slow
def test_healthy_tp_folded_pp_ep_merged_has_no_unpaired_call_against_ep1():
    from precnb.analysis.align import align

    ref, run, layout = _runs()
    a = align(ref, merge_shards(run, layout, reference=ref))
    unpaired = [e for side in a.unpaired.values() for e in side if str(e.get("why", "")).startswith("an op")]
    assert not unpaired, unpaired


def test_integer_copies_agreeing_on_max_and_min_alone_stay_dispatch_bookkeeping():
    """Stage 1's per-rank token counts ([1, 2], Max 9 and Min 7 on both TP ranks, no Mean) agree by chance: they are
    still the rank's own dispatch bookkeeping, not a replicated value with a whole-model counterpart."""
    ref, run, layout = _runs()
    merged = merge_shards(run, layout, reference=ref)
    labels = list(merged["tensor"].values)
    j = labels.index("Tensor.sum.12.forward.input.0")
    assert str(merged["shape"].values[j]) == "[1, 2]"
    assert "token-dispatch bookkeeping" in str(merged["shard_reason_tp"].values[j])


def _with_a_second_step(src: Path, dst: Path) -> Path:
    """*src* (one dumped step) with a step 1 made from step 0 as Megatron runs it: the rotary embedding cached, so its
    ``Tensor.__add__.0`` is not called again and every later ``Tensor.__add__`` is numbered one lower, on every rank."""
    import re
    import shutil

    shutil.copytree(src, dst)
    pat = re.compile(r"^Tensor\.__add__\.(\d+)\.(forward|backward)$")

    def renamed(k: str) -> str | None:
        m = pat.match(k)
        if not m:
            return k
        return None if m.group(1) == "0" else f"Tensor.__add__.{int(m.group(1)) - 1}.{m.group(2)}"

    for rank in sorted((dst / "step0").iterdir()):
        out = dst / "step1" / rank.name
        out.mkdir(parents=True)
        dump = json.loads((rank / "dump.json").read_text(encoding="utf-8"))
        dump["data"] = {renamed(k): v for k, v in dump["data"].items() if renamed(k)}
        construct = json.loads((rank / "construct.json").read_text(encoding="utf-8"))
        construct = {renamed(k): v for k, v in construct.items() if renamed(k)}
        (out / "dump.json").write_text(json.dumps(dump), encoding="utf-8")
        (out / "construct.json").write_text(json.dumps(construct), encoding="utf-8")
    return dst


@pytest.mark.slow
def test_a_later_step_numbered_otherwise_merges_its_own_tails(tmp_path):
    """The stitch numbers each step on its own; the tails of a later step are found under that step's names (the
    whole read of two steps found stage 0's tail add "only in the target" when they were looked up by step 0's)."""
    gt = json.loads((PP / "ground_truth.json").read_text(encoding="utf-8"))
    pair = next(h for h in gt["draws"]["moe_pp"]["healthy"] if h["layout"] == "moe_tp2pp2ep2")
    ref = _with_a_second_step(PP / "runs" / pair["reference"] / "dump", tmp_path / "ref")
    run = _with_a_second_step(PP / "runs" / pair["run"] / "dump", tmp_path / "run")
    t = precnb.diagnose(str(run), baseline=str(ref), target_layout="tp=2,pp=2,ep=2,etp=1")
    assert t.finding.kind == "none", t.finding.reason
