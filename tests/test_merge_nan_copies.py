"""A NaN on one TP rank of a pipeline run, read against the unsharded run: the rank that went NaN, at its step.

Real Megatron-Core dumps (``data_samples/megatron``: tp2pp2 and tp1pp1, step 0) read twice as steps 0 and 1; at step
1, TP rank 3 (the second stage) goes NaN at ``pre_mlp_layernorm`` (the population's ``nan`` fault: a negative eps)
and every record after it on that rank is NaN. Two defects of the held-out draw 4 are covered:

- NaN statistics identified tensors: the merge's tensor-parallel glue search matched any NaN output to any NaN
  input, so batches holding the NaN step re-classified healthy sharded tensors of the earlier step as glue (kept
  one rank's copy) and ``diff`` reported a false divergence one step before the fault;
- a copy whose statistics are NaN was read as "no statistic" and looked like the copy agreeing with the baseline,
  so the healthy copy was named as departing.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from precnb.analysis.layout.rank_args import _signature
from tests._cli_json import cli_json

MG = Path(__file__).resolve().parents[1] / "data_samples" / "megatron"
NORM = "Module.0.decoder.layers.1.pre_mlp_layernorm.RMSNorm.forward.0"

pytestmark = pytest.mark.skipif(not (MG / "tp2pp2").exists(), reason="data_samples/megatron missing")


def _nan_stats(obj):
    if isinstance(obj, dict):
        if "Max" in obj and obj.get("type", "").endswith("Tensor"):
            for k in ("Max", "Min", "Mean", "Norm"):
                obj[k] = math.nan
        for v in obj.values():
            _nan_stats(v)
    elif isinstance(obj, list):
        for v in obj:
            _nan_stats(v)


def _runs(tmp: Path, rank: int) -> tuple[Path, Path]:
    base, targ = tmp / "tp1pp1", tmp / "tp2pp2"
    for name, run in (("tp1pp1", base), ("tp2pp2", targ)):
        for step in (0, 1):
            shutil.copytree(MG / name / "step0", run / f"step{step}")
    f = targ / "step1" / f"rank{rank}" / "dump.json"
    doc = json.loads(f.read_text())
    keys = list(doc["data"])
    for k in keys[keys.index(NORM):]:  # the layernorm and everything this rank ran after it
        _nan_stats(doc["data"][k])
    f.write_text(json.dumps(doc, indent=1))  # msprobe writes NaN literals
    return base, targ


@pytest.mark.slow
@pytest.mark.parametrize("rank", [2, 3])
def test_diff_names_the_nan_rank_at_its_step(tmp_path: Path, rank: int) -> None:
    base, targ = _runs(tmp_path, rank)
    d = cli_json(tmp_path, "diff", str(base), str(targ), "--target-layout", "tp=2,pp=2")
    assert d["step"] == 1, d["reason"]
    assert d["node"] == "Module.0.decoder.layers.3.pre_mlp_layernorm.RMSNorm.forward.0", d["reason"]
    assert d["evidence"]["dump"]["rank"] == rank, d["reason"]
    assert d["values"]["departing_rank"] == rank


def test_nan_statistics_identify_no_tensor() -> None:
    arr = {s: np.array([[[v]]]) for s, v in (("numel", 64), ("max", np.nan), ("min", np.nan), ("mean", np.nan),
                                             ("norm", np.nan))}
    assert _signature(arr, 0, 0, 0, np.array(["torch.float32"])) is None
    arr["max"] = np.array([[[1.0]]])
    arr["min"] = np.array([[[-np.inf]]])  # a by-design -inf fill still names its tensor
    arr["mean"] = arr["norm"] = np.array([[[-np.inf]]])
    assert _signature(arr, 0, 0, 0, np.array(["torch.float32"])) is not None


MOE = MG / "moe_tp1ep2dp2"
GRAD = "Module.0.decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.RowParallelLinear.parameters_grad.0"


@pytest.mark.slow
@pytest.mark.skipif(not MOE.exists(), reason="data_samples/megatron/moe_tp1ep2dp2 missing")
def test_a_nan_in_a_replicas_own_gradient_is_not_hidden_by_the_data_parallel_merge(tmp_path: Path) -> None:
    """Experts over two data-parallel ranks against one device: an expert's gradient is its replica's own (no
    whole-batch counterpart, set aside), but a NaN in it (an expert that got no token dividing by its count) is
    never by construction: the merge keeps it, with the rank it came from, and ``diff`` names it at its step."""
    run = tmp_path / "moe_tp1ep2dp2_nan"
    shutil.copytree(MOE, run)
    f = run / "step2" / "rank1" / "dump.json"
    doc = json.loads(f.read_text())
    _nan_stats(doc["data"][GRAD])
    f.write_text(json.dumps(doc, indent=1))
    healthy = cli_json(tmp_path, "diff", str(MG / "moe_ep1"), str(MOE), "--target-layout", "dp=2,ep=2")
    assert healthy["kind"] == "none", healthy["reason"]
    d = cli_json(tmp_path, "diff", str(MG / "moe_ep1"), str(run), "--target-layout", "dp=2,ep=2")
    assert d["step"] == 2 and d["evidence"]["dump"]["rank"] == 1, d["reason"]
    assert d["module"] == "0.decoder.layers.1.mlp.experts.local_experts.2.linear_fc2", d["reason"]  # global expert 2
