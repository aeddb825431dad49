"""A pipeline run's optimizer lists compared with an unsharded run's, entry by entry, by the parameter each holds.

Real Megatron-Core dumps (``data_samples/megatron``: tp1pp2 and tp1pp1, steps 0-1, the same weights and data): each
stage calls ``Torch._fused_adamw_`` on its own parameters (21 entries on stage 0, 22 on stage 1); the unsharded run
has one call of 43. An optimizer-state fault (one first moment scaled on stage 1 at step 1, the population's
``optimizer_state`` kind) is found at its step in the optimizer's list, named by its parameter, on its dump rank —
before, the stages' lists were set aside as pipeline organisation and the fault showed only a step later.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import precnb
from precnb.analysis.layout import Layout
from precnb.analysis.layout.optimizer_lists import align_optimizer_lists
from precnb.pipeline.prepare import merge_layouts
from tests._cli_json import cli_json

MG = Path(__file__).resolve().parents[1] / "data_samples" / "megatron"

pytestmark = pytest.mark.skipif(not (MG / "tp1pp2").exists(), reason="data_samples/megatron missing")


@pytest.mark.parametrize("step", [0, 1])
def test_every_stage_entry_is_renamed_to_the_unsharded_runs(step: int) -> None:
    base = precnb.open_run(MG / "tp1pp1", steps=[step], progress=False)
    targ = precnb.open_run(MG / "tp1pp2", steps=[step], progress=False)
    notes: list[str] = []
    mb, mt = merge_layouts(base, targ, None, Layout.coerce("pp=2", 2), notes)
    assert mb is not None
    assert any("optimizer lists renamed" in n and "(215 entries)" in n for n in notes), notes
    opt = sorted(str(t) for t in mt["tensor"].values if "_fused_adamw_" in str(t))
    assert opt == sorted(str(t) for t in mb["tensor"].values if "_fused_adamw_" in str(t))
    # entry k of the parameter list holds the statistics of the same parameter in both runs (step 0: equal init)
    for k in (0, 21, 42):
        label = f"Torch._fused_adamw_.0.forward.input.0.{k}"
        a, b = mt.sel(tensor=label).isel(step=0, rank=0), mb.sel(tensor=label).isel(step=0, rank=0)
        assert float(a["norm"]) == pytest.approx(float(b["norm"]), rel=1e-5)
    # nothing to rename twice; a run without parameter records (level L1) is left alone
    assert align_optimizer_lists(mt, mb)[1] == 0
    no_params = targ.isel(tensor=(targ["role"].values != "parameter"))
    assert align_optimizer_lists(no_params, base)[1] == 0


@pytest.mark.slow
def test_an_optimizer_state_fault_on_one_stage_is_found_at_its_step(tmp_path: Path) -> None:
    run = tmp_path / "tp1pp2_exp_avg"
    shutil.copytree(MG / "tp1pp2", run)
    f = run / "step1" / "rank1" / "dump.json"
    doc = json.loads(f.read_text())
    entry = doc["data"]["Torch._fused_adamw_.0.forward"]["input_args"][2][5]  # stage 1's 6th first moment
    for k in ("Max", "Min", "Mean", "Norm"):
        entry[k] *= 1.01
    f.write_text(json.dumps(doc, indent=1))
    healthy = cli_json(tmp_path, "diff", str(MG / "tp1pp1"), str(MG / "tp1pp2"), "--target-layout", "pp=2")
    assert healthy["kind"] == "none", healthy["reason"]
    d = cli_json(tmp_path, "diff", str(MG / "tp1pp1"), str(run), "--target-layout", "pp=2")
    assert d["step"] == 1 and d["node"] == "Torch._fused_adamw_.0.forward", d["reason"]
    assert d["tensor"] == "Torch._fused_adamw_.0.forward.input.2.26"  # 21 entries of stage 0 come first
    assert d["evidence"]["dump"]["rank"] == 1
    assert "first moment" in d["reason"] and d["module"].startswith("0.decoder.layers.2."), d["reason"]
