"""What to run next for a replica departure (issue 28, item 4): an md5-mode dump of its group, and a repro."""

from __future__ import annotations

import json

import pytest

import precnb
from precnb.analysis.findings.plan import plan_dump
from precnb.cli import main


def plan(capsys, sample: str, *extra: str) -> dict:
    code = main(["plan", str(precnb.sample_path(sample)), "--layout", "tp=2,dp=2", "--kind", "replica_mismatch",
                 "--json", "--workers", "1", *extra])
    assert code == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("sample", "ranks", "node"), [("sdc/job1", [0, 1], "Torch.rsqrt.0."),
                                                       ("sdc/job2", [2, 3], "Torch.rsqrt.0."),
                                                       ("sdc_rank/job1", [0, 1], "Torch.normal.0.")])
def test_the_cheapest_confirmation_is_md5_on_the_group_at_the_next_steps(capsys, sample, ranks, node):
    out = plan(capsys, sample)
    cfg = out["config"]
    assert out["finding"]["node"] == node + "forward"
    assert (cfg["task"], cfg["statistics"]["summary_mode"], cfg["level"]) == ("statistics", "md5", "mix")
    assert cfg["rank"] == ranks and cfg["step"] == [4, 5, 6]  # the dumps hold steps 1-3
    assert cfg["statistics"]["list"][0] == node and cfg["statistics"]["scope"] == []
    assert any("CRC-32" in n for n in out["notes"]) and out["estimated_bytes"] < 100_000


def test_consequences_are_in_the_list_and_task_tensor_still_plans_tensors(capsys):
    out = plan(capsys, "sdc/job1")
    assert out["config"]["statistics"]["list"] == ["Torch.rsqrt.0.", "Tensor.__mul__.0.", "Tensor.__mul__.1.",
                                                   "Functional.linear.0."]
    out = plan(capsys, "sdc/job1", "--task", "tensor")
    assert out["config"]["task"] == "tensor" and out["config"]["step"] == [1]


def test_a_tensor_dump_gets_the_repro_command():
    ds = precnb.open_run(precnb.sample_path("sdc/job2"), workers=1)
    f = precnb.diagnose(ds, layout="tp=2,dp=2", kinds=["replica_mismatch"]).finding
    assert f.dump_plan["repro"] is None and "TENSOR_DUMP" in f.dump_plan["notes"][-1]
    ds.attrs["task"] = "tensor"
    p = plan_dump(f, ds)
    assert p["repro"].startswith(f"precnb repro {ds.attrs['source']} Torch.rsqrt.0.forward --step 2 --rank 3 ")
    assert "--device" in p["repro"] and "another device" in p["notes"][-1]
