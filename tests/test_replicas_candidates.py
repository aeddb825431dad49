"""The replica check compares an optimizer call's list entries over every step, like a module's records.

Real Megatron-Core tp2pp1 run of the committed population subset (``data_samples/megatron_pop``, 5 steps): the
fused AdamW's gradient list holds the replicated parameters' gradients (layernorm weights, row-parallel biases)
identically on both TP ranks. API counters shift after step 0 (the rotary embedding computes its frequencies once),
so the check pools steps 1-4 apart from step 0; a gradient that departs at step 1 was then judged from step 1 on,
where it already differs, and was no candidate (the population's ``bias_grad_scale`` on a tp2pp1 run was found a
step later, in the parameter the optimizer had changed). The optimizer call names one call at every step.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests._cli_json import cli_json

RUN = Path(__file__).resolve().parents[1] / "data_samples" / "megatron_pop" / "runs" / "r376997605075" / "dump"

pytestmark = pytest.mark.skipif(not RUN.exists(), reason="data_samples/megatron_pop missing")


# rank 1 in make test only: the same run and check, the other rank of the pair (issue #53 item 8)
@pytest.mark.parametrize("rank", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_a_replicated_gradient_in_the_optimizer_list_departs_at_its_step(tmp_path: Path, rank: int) -> None:
    run = tmp_path / "dump"
    shutil.copytree(RUN, run)
    for step in (1, 2, 3, 4):  # the fault from step 1 on (a corrupted gradient accumulation on one rank)
        f = run / f"step{step}" / f"rank{rank}" / "dump.json"
        doc = json.loads(f.read_text())
        entry = doc["data"]["Torch._fused_adamw_.0.forward"]["input_args"][1][23]
        for k in ("Max", "Min", "Mean", "Norm"):
            entry[k] *= 1.03
        f.write_text(json.dumps(doc, indent=1))
    healthy = cli_json(tmp_path, "replicas", str(RUN))
    assert healthy["kind"] == "none", healthy["reason"]
    got = cli_json(tmp_path, "replicas", str(run))
    assert got["step"] == 1 and got["tensor"] == "Torch._fused_adamw_.0.forward.input.1.23", got["reason"]
    assert rank in {c["rank"] for c in got["evidence"]["candidates"]}
