"""Expert parallelism folded onto TP and over DP, on real Megatron-Core MoE dumps (issue #48).

The roots in ``data_samples/megatron/moe_*`` (alltoall dispatcher, 4 experts, top-2; see its ground truth):
healthy ``moe_ep1`` (world 1), ``moe_tp2ep2`` (TP 2 × EP 2 on the same two ranks, etp 1, sequence parallel) and
``moe_tp1ep2dp2``; ``moe_tp2ep2_expert_scale`` (global expert 1 of layer 0, on rank 0, scales its linear_fc1
output by 1.01 from step 1) and ``moe_tp2ep2_starved`` (global expert 2 of layer 1 gets no token at step 1 and
divides its weight gradient by its token count: 0/0).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import precnb
from precnb.analysis import Layout
from precnb.analysis.experts import expert_tokens, starved_experts
from precnb.analysis.layout.infer import infer_layout
from tests._inprocess_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
MG = ROOT / "data_samples" / "megatron"

pytestmark = pytest.mark.skipif(not (MG / "moe_tp2ep2_starved").is_dir(), reason="data_samples/megatron/moe_* missing")


def _cli(*args: str) -> tuple[int, str]:
    out = run_cli(*args)  # in this process (tests/_inprocess_cli.py)
    return out.returncode, out.stdout


def _json(*args: str) -> dict:
    rc, out = _cli(*args, "--json")
    assert rc in (0, 1), out
    return json.loads(out)


def gt() -> dict:
    return json.loads((MG / "ground_truth.json").read_text(encoding="utf-8"))


def test_layouts_read_from_the_dumps():
    fold = infer_layout(precnb.open_run(MG / "moe_tp2ep2")).layout
    assert (fold.tp, fold.dp, fold.ep, fold.etp, fold.edp) == (2, 1, 2, 1, 1)
    assert "etp=1 assumed" in fold.etp_assumed  # Megatron's default etp=tp cannot hold on 2 ranks: said
    dp = infer_layout(precnb.open_run(MG / "moe_tp1ep2dp2")).layout
    assert (dp.tp, dp.dp, dp.ep, dp.etp) == (1, 2, 2, 1)
    truth = gt()["moe"]["expert_coords"]
    for root, lay in (("moe_tp2ep2", fold), ("moe_tp1ep2dp2", dp)):
        for r, want in truth[root].items():
            got = lay.expert_coords(int(r))
            assert (got["ep"], got["etp"], got["edp"]) == (want["ep"], want["etp"], want["edp"]), (root, r)


@pytest.mark.parametrize("layout_args", [pytest.param((), marks=pytest.mark.slow),
                                         pytest.param(("--target-layout", "tp=2,ep=2,etp=1"), marks=pytest.mark.slow),
                                         ("--target-layout", "tp=2,ep=2")])
def test_healthy_folded_layout_against_ep1_finds_nothing(layout_args):
    got = _json("diff", str(MG / "moe_ep1"), str(MG / "moe_tp2ep2"), *layout_args)
    assert got["kind"] == "none", got["reason"]


def test_preflight_counts_experts_by_global_index():
    rc, out = _cli("preflight", str(MG / "moe_ep1"), str(MG / "moe_tp2ep2"))
    assert rc == 0 and "PRE-FLIGHT CHECKS PASSED" in out, out


@pytest.mark.parametrize("root", ["moe_tp2ep2", "moe_tp1ep2dp2", "moe_tp2ep2_expert_scale"])
def test_replicas_no_false_departure_from_expert_parallelism(root):
    got = _json("replicas", str(MG / root))
    assert got["kind"] == "none", got["reason"]
    if root == "moe_tp2ep2_expert_scale":  # what the check cannot see in this layout is said
        assert any("experts have no replicas" in h for h in got["hints"])


# against ep1 in make test only: the scaled expert is found against moe_tp2ep2 here, and ep1 as a baseline is read
# and folded in test_healthy_folded_layout_against_ep1_finds_nothing (issue #53 item 8)
@pytest.mark.parametrize("baseline", ["moe_tp2ep2", pytest.param("moe_ep1", marks=pytest.mark.slow)])
def test_scaled_expert_found_at_its_step_rank_and_expert(baseline):
    truth = next(f for f in gt()["faults"] if f["root"] == "moe_tp2ep2_expert_scale")
    got = _json("diff", str(MG / baseline), str(MG / "moe_tp2ep2_expert_scale"))
    assert got["kind"] == "first_divergence" and got["step"] == truth["step"] == 1
    dump = (got.get("evidence", {}).get("dump") or {})
    assert dump.get("rank", got["rank"]) == truth["rank"] == 0
    assert "experts.local_experts.1.linear_fc1" in got["module"]


def test_starved_expert_named_beside_the_nan():
    truth = next(f for f in gt()["faults"] if f["root"] == "moe_tp2ep2_starved")
    got = _json("nan", str(MG / "moe_tp2ep2_starved"))
    assert (got["step"], got["rank"]) == (truth["step"], truth["rank"]) == (1, 1)
    assert got["evidence"]["global_module"] == truth["global_module"]
    starved = got["evidence"]["starved_experts"]
    assert [(s["step"], s["rank"], s["layer"], s["expert"], s["tokens"]) for s in starved] == \
        [(1, 1, "decoder.layers.1", 2, 0)]
    assert got["hints"][0].startswith("expert 2 of decoder.layers.1 (local_experts.0 on rank 1) received 0 tokens "
                                      "at step 1")


def test_tokens_per_expert_match_the_ground_truth():
    lay = Layout.parse("tp=2,ep=2,etp=1", world_size=2)
    rows = expert_tokens(precnb.open_run(MG / "moe_tp2ep2_starved"), lay)
    per = gt()["moe"]["tokens_per_expert"]["moe_tp2ep2_starved"]
    for step, by_step in per.items():
        for layer, counts in by_step["per_global_expert"].items():
            got = [sum(r["tokens"] for r in rows if r["step"] == int(step) and r["layer"] == f"decoder.layers.{layer}"
                       and r["expert"] == e) for e in range(4)]
            assert got == counts, (step, layer)
    assert [(r["step"], r["expert"]) for r in starved_experts(precnb.open_run(MG / "moe_tp2ep2_starved"), lay)] == \
        [(1, 2)]
    anomalies = _json("anomalies", str(MG / "moe_tp2ep2_starved"))
    assert anomalies["evidence"]["tokens_per_expert"]["decoder.layers.1"]["2"]["1"] == 0


def test_explorer_experts_tab_lists_the_starved_expert_and_narrows_to_it():
    ex = precnb.explore(str(MG / "moe_tp2ep2_starved"))
    tab = next(p for p in ex.panels if p.title == "Experts")
    assert "<b>0</b>" in tab.table.value and "decoder.layers.1" in tab.table.value
    labels = [lbl for lbl, _ in tab.starved.options]
    assert labels[1] == "expert 2 of decoder.layers.1 (local_experts.0 on rank 1) received 0 tokens at step 1"
    tab.starved.value = 0
    assert ex.filters.pattern.value == "experts.local_experts.0"
    dense = precnb.explore(str(ROOT / "data_samples" / "megatron" / "tp2pp1"))
    assert "Experts" not in [p.title for p in dense.panels]


def _shift_counters(root: Path, api: str, after: int, rank: int = 1, step: int = 1) -> str:
    """An extra ``api`` call (a multiply by one: same values) right after call *after* in rank *rank*'s step, every
    later call of that API renumbered on that rank only, as msprobe numbers them. Returns the new call's node."""
    import re

    d = root / f"step{step}" / f"rank{rank}"
    dump = json.loads((d / "dump.json").read_text(encoding="utf-8"))
    construct = json.loads((d / "construct.json").read_text(encoding="utf-8"))
    pat = re.compile(rf"^{re.escape(api)}\.(\d+)\.(forward|backward)$")

    def renamed(k: str) -> str:
        m = pat.match(k)
        return f"{api}.{int(m.group(1)) + 1}.{m.group(2)}" if m and int(m.group(1)) > after else k

    new_data: dict = {}
    for k, v in dump["data"].items():
        new_data[renamed(k)] = v
        if k == f"{api}.{after}.forward":
            out = v["output"][0]
            new_data[f"{api}.{after + 1}.forward"] = {"input_args": [out, {"type": "int", "value": 1}],
                                                      "input_kwargs": {}, "output": [out]}
    dump["data"] = new_data
    new_construct = {}
    for k, v in construct.items():
        new_construct[renamed(k)] = v
        if k == f"{api}.{after}.forward":
            new_construct[f"{api}.{after + 1}.forward"] = v
    (d / "dump.json").write_text(json.dumps(dump), encoding="utf-8")
    (d / "construct.json").write_text(json.dumps(new_construct), encoding="utf-8")
    return f"{api}.{after + 1}.forward"


@pytest.fixture(scope="module")
def extra_call(tmp_path_factory):
    import shutil

    target = tmp_path_factory.mktemp("moe") / "moe_tp2ep2_extra"
    shutil.copytree(MG / "moe_tp2ep2", target)
    extra = _shift_counters(target, "Tensor.__mul__", 8)  # inside expert 2 of layer 0 (rank 1's local expert 0)
    return target, extra


def test_an_extra_call_on_one_rank_does_not_mis_pair_calls_across_ranks(extra_call):
    target, _ = extra_call  # the EP group's calls numbered as one rank would: rank 0 and 1 still pair
    assert _json("replicas", str(target))["kind"] == "none"


@pytest.mark.slow
def test_an_extra_call_at_a_later_step_does_not_mis_pair_against_ep1(extra_call):
    target, _ = extra_call
    merged = _json("diff", str(MG / "moe_ep1"), str(target), "--target-layout", "tp=2,ep=2,etp=1")
    assert merged["kind"] in ("none", "first_divergence")
    assert "first value difference" not in merged["reason"] and "computed differently" not in merged["reason"], \
        merged["reason"]


def test_an_extra_call_on_one_rank_is_named_as_such_against_its_twin(extra_call):
    target, extra = extra_call
    same = _json("diff", str(MG / "moe_tp2ep2"), str(target))
    assert same["kind"] == "first_divergence" and (same["step"], same["rank"]) == (1, 1), same["reason"]
    assert same["node"] == extra and "runs in target but not in baseline" in same["reason"], same["reason"]
