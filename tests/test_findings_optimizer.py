"""A first divergence at a fused optimizer's list entry names the parameter's module (issue 47).

Fixture from the real megatron_pop tp1pp1 run (Megatron-Core, msprobe mix): its steps 0-1 copied twice, and in
the copy the gradient list entry 17 of ``Torch._fused_adamw_`` scaled at step 1 (a gradient departing where only
the optimizer reads it, as a data-parallel replica's scaled gradient does after the reduction).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "data_samples" / "megatron_pop" / "runs" / "rc401ea8866a8" / "dump"

pytestmark = pytest.mark.skipif(not RUN.exists(), reason="data_samples/megatron_pop missing")


def _copy(dest: Path) -> Path:
    for s in ("step0", "step1"):
        shutil.copytree(RUN / s, dest / s)
    return dest


def test_an_optimizer_entry_names_its_parameters_module(tmp_path):
    import precnb

    base, run = _copy(tmp_path / "a"), _copy(tmp_path / "b")
    f = run / "step1" / "rank0" / "dump.json"
    doc = json.loads(f.read_text(encoding="utf-8"))
    entry = doc["data"]["Torch._fused_adamw_.0.forward"]["input_args"][1][17]
    for k in ("Max", "Min", "Mean", "Norm"):
        entry[k] *= 1.01
    f.write_text(json.dumps(doc), encoding="utf-8")
    t = precnb.diagnose(str(run), baseline=str(base))
    got = t.finding
    assert (got.step, got.node, got.tensor) == (1, "Torch._fused_adamw_.0.forward",
                                                "Torch._fused_adamw_.0.forward.input.1.17"), got.reason
    ev = got.evidence["optimizer_parameter"]
    assert ev["entry"] == 17 and ev["list"] == "gradient"
    # the parameter whose statistics entry 17 of the parameter list holds: a 128x32 weight (an MLP's fc1)
    assert got.module == ev["module"] and got.module.endswith("mlp.linear_fc1"), got.reason
    assert "the gradient of" in got.reason
