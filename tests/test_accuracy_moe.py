"""The MoE part of the accuracy benchmark (issue 48 item 6): the MoE draw's plan and the MoE scoring rule.

The plan is checked without running anything (``_pop_moe.draw_moe`` is torch-free). The scoring rule
(``benchmarks/_acc_moe.py``: the answer's module with the global expert, from ``evidence.global_module``, a
merged record, or the rank-local module mapped with the run's expert coordinates) is applied to precnb's answers
on the committed MoE samples (``data_samples/megatron/moe_*``) and judged against their ``ground_truth.json``
(section ``moe``, read back from the dumps by the generator, never from precnb).
"""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path

import pytest

from tests._cli_json import cli_json

ROOT = Path(__file__).resolve().parents[1]
MG = ROOT / "data_samples" / "megatron"
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tools" / "samples"))


def test_moe_draw_pairs_every_fault_with_its_twin_and_ep1_reference():
    from precnb_samples._pop_moe import KINDS, LAYOUTS, draw_moe, expert_rank

    plan = draw_moe(1)
    assert {(f["kind"], f["layout"]) for f in plan["faults"]} == {(k, lay) for k, lays in KINDS.items()
                                                                   for lay in lays}
    for f in plan["faults"]:
        run, twin, ref = (plan["runs"][f[k]] for k in ("run", "twin", "reference"))
        assert run["bugs"] == [*f["condition"], f["injection"]] and twin["bugs"] == ref["bugs"] == f["condition"]
        assert (run["seed"], run["layout"]) == (twin["seed"], twin["layout"]) and ref["layout"] == "moe_ep1"
        if "expert" in f["injection"]:
            assert f["injection"]["rank"] == expert_rank(f["injection"]["expert"], LAYOUTS[f["layout"]]["ep"])
    assert draw_moe(1) == plan


@pytest.mark.parametrize("name", ["moe_pp2ep2dp2", "moe_tp2pp2ep2"])
def test_moe_pp_draw_injects_on_the_stage_holding_the_layer(name):
    """EP + PP (issue 48, "EP+PP>1 not generated"): moe_pp2ep2dp2 and moe_tp2pp2ep2 hold layer l on ranks 2l, 2l+1
    (order tp-cp-ep-dp-pp), global expert g of it on EP rank g // 2 of that stage (EP over DP, or folded onto TP)."""
    from _acc_moe import LAYOUT_TEXT
    from precnb_samples._pop_moe import LAYOUTS, draw_moe

    from precnb.analysis.layout import Layout

    lay = LAYOUTS[name]
    assert (lay["tp"] * lay["dp"], lay["pp"], lay["ep"], lay["etp"]) == (2, 2, 2, 1)
    layout = Layout.coerce(LAYOUT_TEXT[name], 4)
    plan = draw_moe(2, repeat=1, layouts=[name])
    assert plan["draw_seed"] == f"moe2_{name[4:]}"
    assert {s["layout"] for s in plan["runs"].values()} == {"moe_ep1", name}
    assert sorted(f["kind"] for f in plan["faults"]) == sorted(["expert_fc1_scale", "expert_dw_only",
                                                                "router_logit_scale", "starved_grad_per_token"])
    for f in plan["faults"]:
        b = f["injection"]
        coords = layout.coords(b["rank"])
        assert coords["pp"] == b["layer"], f
        if "expert" in b:
            assert coords["ep"] == layout.expert_coords(b["rank"])["ep"] == b["expert"] // 2, f


@cache
def gt() -> dict:
    return json.loads((MG / "ground_truth.json").read_text(encoding="utf-8"))["moe"]


def precnb(*args: str) -> dict:
    return cli_json(MG, *args)


def _result(root: str) -> dict:
    """The worker's per-rank facts the scorer uses, from the ground truth (layer numbers, expert coordinates)."""
    ranks = {}
    for r, coords in gt()["expert_coords"][root].items():
        names = {f"0:{k.removeprefix('Module.0.')}.linear_fc1.weight": f"{v}.linear_fc1.weight"
                 for k, v in gt()["expert_map"][root][r].items()}
        assert gt()["layouts"][root]["pp"] == 1  # one chunk holding every layer: local layer i is global i
        layers = {k.split(".")[3] for k in gt()["expert_map"][root][r]}
        ranks[r] = {"layer_numbers": {"0": list(range(1, len(layers) + 1))}, "expert_coords": coords, "names": names}
    return {"ranks": ranks}


@pytest.mark.skipif(not (MG / "moe_tp2ep2").exists(), reason="data_samples/megatron MoE roots missing")
@pytest.mark.parametrize(("kind", "args"), [
    ("divergence", ("diff", "moe_tp2ep2", "moe_tp2ep2_expert_scale")),
    ("nan", ("nan", "moe_tp2ep2_starved")),
])
def test_moe_rule_scores_the_committed_faults_exact(kind, args):
    from _acc_moe import moe_module, moe_module_right

    truth = next(f for f in gt()["faults"] if f["kind"] == kind)
    answer = precnb(*args)
    module, _source, rank = moe_module(answer, _result(truth["root"]))
    assert (answer["step"], rank) == (truth["step"], truth["rank"])
    assert moe_module_right(module, truth["module"]), (module, truth["module"])
    assert f"local_experts.{truth['global_expert']}" in module
