"""The loss-spike samples (spike_*; issue 29): ground truth re-checked on the dumps, monitor CSVs and loss log.

Parsed with Python's json and csv (no precnb reader), like ``test_samples_generator``. The spike
step is re-derived here from ``loss_log.csv`` with the rule the ground truth states (first step
after the warm-up whose loss exceeds 1.2 x the previous step's, on the mean over ranks), and each
cause's evidence is checked in the dump and in TrainerMon's CSVs.
"""

from __future__ import annotations

import csv
import math
import re
import subprocess
import sys

import pytest

from tests.test_samples_generator import DATA, ROOT, _have, gt, leaves, load

SPIKES = ("spike_healthy", "spike_data", "spike_optimizer", "spike_hardware", "spike_numerics")
WARMUP = 3


def _rows(path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _loss_log(name: str) -> dict[int, list[float]]:
    rows = _rows(DATA / name / "loss_log.csv")
    assert list(rows[0]) == ["step", "loss", "rank"]
    out: dict[int, list[float]] = {}
    for row in rows:
        out.setdefault(int(row["rank"]), []).append(float(row["loss"]))
        assert int(row["step"]) == len(out[int(row["rank"])]) - 1
    return out


def _spike(series: list[float]) -> int | None:
    return next((t for t in range(WARMUP, len(series)) if series[t] > 1.2 * series[t - 1]), None)


def _dump(name: str, step: int, rank: int) -> dict:
    return load(DATA / name / "dump" / f"step{step}" / f"rank{rank}" / "dump.json")["data"]


def _leaf(data: dict, node: str, path: str) -> dict:
    return dict(leaves(data[node]))[path]


def _folder(name: str, rank: int):
    (folder,) = [p for p in (DATA / name / "monitor_output").iterdir() if re.search(rf"-rank{rank}-", p.name)]
    return folder


def _mon(name: str, rank: int, prefix: str, step: int, row: str, stat: str) -> float:
    rows = {r["name"]: r for r in _rows(_folder(name, rank) / f"{prefix}_{step}-{step}.csv")}
    return float(rows[row][stat])


@pytest.mark.parametrize("name", SPIKES)
def test_loss_log_dump_and_spike_step_agree(name):
    g = gt(name)
    losses = _loss_log(name)
    assert sorted(losses) == [0, 1] and all(len(v) == g["trained_steps"] == 10 for v in losses.values())
    assert {str(r): v for r, v in losses.items()} == g["losses"]
    for step in g["steps"]:  # the dump covers the steps around the spike: its loss op equals the log
        for rank in (0, 1):
            out = _leaf(_dump(name, step, rank), "Functional.cross_entropy.0.forward", "output.0")
            assert out["Mean"] == losses[rank][step]
    mean = [(a + b) / 2 for a, b in zip(losses[0], losses[1], strict=True)]
    assert _spike(mean) == g["spike"]["step"]
    assert {f"rank{r}": _spike(v) for r, v in losses.items()} == {
        k: (v[0] if v else None) for k, v in g["spike"]["rank_departures"].items()}
    # warm-up then a falling loss: the first steps fall, the control never departs
    assert mean[WARMUP - 1] < mean[0]
    for r in (0, 1):  # one TrainerMon folder per rank, a CSV per step
        assert (_folder(name, r) / "actv_9-9.csv").is_file()
    steps = sorted(int(p.name[4:]) for p in (DATA / name / "dump").iterdir())
    assert steps == g["steps"] and len(steps) == 3


def test_healthy_has_no_spike():
    g = gt("spike_healthy")
    assert g["spike"]["step"] is None and g["faults"] == [] and g["causes"] == []
    assert g["spike"]["max_step_ratio_after_warmup"] < 1.0


def test_data_spike_is_one_ranks_outlier_batch():
    g = gt("spike_data")
    (f,) = g["faults"]
    assert (f["cause"], f["step"], f["rank"], f["node"], f["tensor"]) == (
        "data", 6, 1, "Functional.embedding.0.forward", "input_args.0")
    losses = _loss_log("spike_data")
    assert losses[1][6] > 1.5 * losses[1][5] and losses[0][6] < losses[0][5]  # only rank 1 jumps
    for step in g["steps"]:
        for rank in (0, 1):
            ids = _leaf(_dump("spike_data", step, rank), f["node"], f["tensor"])
            assert ids["dtype"] == "torch.int64"
            if (step, rank) == (6, 1):
                assert ids["Min"] >= 32 and ids["Max"] <= 63
            else:
                assert ids["Max"] <= 15
    means = [_mon("spike_data", 1, "actv", s, "embed.input", "mean") for s in range(10)]
    assert means[6] > 2 * max(means[:6] + means[7:])
    construct = load(DATA / "spike_data" / "dump" / "step6" / "rank1" / "construct.json")
    assert construct[f["node"]] == f["module"]


def test_optimizer_spike_is_an_lr_jump_without_a_gradient_jump():
    g = gt("spike_optimizer")
    (f,) = g["faults"]
    assert (f["cause"], f["step"], f["rank"], g["spike"]["step"]) == ("optimizer", 6, None, 7)
    for step in g["steps"]:
        d = _dump("spike_optimizer", step, 0)
        adds = [n for n in d if n.startswith("Tensor.add_.")]
        assert len(adds) == 6  # one SGD update per parameter
        alphas = {_leaf(d, n, "input_kwargs.alpha")["value"] for n in adds}
        assert alphas == ({-15.0} if step == 6 else {-0.5})
    # the reduced gradient of step 6 is like step 5's, the weight change is not
    g5, g6 = (_mon("spike_optimizer", 0, "grad_reduced", s, "lm_head.weight", "norm") for s in (5, 6))
    assert g6 < 3 * g5
    change = [abs(_mon("spike_optimizer", 0, "param_updated", s, "lm_head.weight", "norm")
                  - _mon("spike_optimizer", 0, "param_origin", s, "lm_head.weight", "norm")) for s in (5, 6)]
    assert change[1] > 10 * change[0]
    losses = _loss_log("spike_optimizer")
    assert all(losses[r][6] < losses[r][5] * 1.2 < losses[r][7] for r in (0, 1))  # one step later


def test_hardware_spike_is_one_ranks_gradient_before_the_reduce():
    g = gt("spike_hardware")
    (f,) = g["faults"]
    assert (f["cause"], f["step"], f["rank"], f["parameter"], g["spike"]["step"]) == (
        "hardware", 5, 1, "lm_head.weight", 6)
    d = {r: _dump("spike_hardware", 5, r) for r in (0, 1)}
    ar = f["all_reduce"]
    pre = {r: _leaf(d[r], ar, "input_args.0")["Norm"] for r in (0, 1)}
    post = {r: _leaf(d[r], ar, "output.0")["Norm"] for r in (0, 1)}
    assert pre[1] > 50 * pre[0] and post[0] == post[1] > 20 * pre[0]
    assert {r: _leaf(d[r], f["node"], "weight.0")["Norm"] for r in (0, 1)} == pre
    # the same parameter at the neighbouring steps, and the other parameters at step 5: ordinary
    for step in (4, 6):
        n = {r: _leaf(_dump("spike_hardware", step, r), ar, "input_args.0")["Norm"] for r in (0, 1)}
        assert n[1] < 5 * n[0]
    for i in range(6):
        if f"Distributed.all_reduce.{i}.forward" != ar:
            n = {r: _leaf(d[r], f"Distributed.all_reduce.{i}.forward", "input_args.0")["Norm"] for r in (0, 1)}
            assert max(n.values()) < 5 * min(n.values())
    # its inputs are ordinary: the activation into lm_head and the gradient of its output
    for node, path in ((f["module"], "input_args.0"), ("Module.lm_head.Linear.backward.0", "input.0")):
        n = [_leaf(d[r], node, path)["Norm"] for r in (0, 1)]
        assert max(n) < 3 * min(n)
    un = [_mon("spike_hardware", r, "grad_unreduced", 5, "lm_head.weight", "norm") for r in (0, 1)]
    red = [_mon("spike_hardware", r, "grad_reduced", 5, "lm_head.weight", "norm") for r in (0, 1)]
    assert un[1] > 50 * un[0] and red[0] == pytest.approx(red[1]) and red[0] > 20 * un[0]
    # the rank table names the origin's device
    table = load(DATA / "spike_hardware" / "rank_tables" / "rank_table.json")
    dev = {int(d["rank_id"]): {"host": s["server_id"], "device": d["device_id"]}
           for s in table["server_list"] for d in s["device"]}
    assert dev[1] == f["device"]


def test_numerics_spike_follows_a_float16_overflow():
    g = gt("spike_numerics")
    (f,) = g["faults"]
    assert (f["cause"], f["step"], f["rank"], f["node"], f["module"]) == (
        "numerics", 8, None, "Tensor.pow.1.forward", "Module.norm_out.RMSNorm.forward.0")
    for rank in (0, 1):
        out = _leaf(_dump("spike_numerics", 8, rank), f["node"], "output.0")
        inp = _leaf(_dump("spike_numerics", 8, rank), f["node"], "input_args.0")
        assert out["dtype"] == inp["dtype"] == "torch.float16"
        assert out["Max"] == math.inf and math.isfinite(inp["Max"]) and inp["Max"] > 255.9
        before = _leaf(_dump("spike_numerics", 7, rank), f["node"], "output.0")
        assert math.isfinite(before["Max"]) and before["Norm"] == math.inf  # msprobe's float16 Norm overflows first
        # no element is infinite anywhere at step 7 (Max and Min of every model tensor finite)
        for n, rec in _dump("spike_numerics", 7, rank).items():
            for _, lf in leaves(rec):
                assert not any(isinstance(lf.get(k), float) and math.isinf(lf[k]) for k in ("Max", "Min")), n
    rs = f["overflow"]["rsqrt_node"]
    assert _leaf(_dump("spike_numerics", 8, 0), rs, "output.0")["Min"] == 0.0
    # the lead indicator: norm_out's input max grows 4x a step from step 5, the output does not
    mx = [_mon("spike_numerics", 0, "actv", s, "norm_out.input", "max") for s in range(10)]
    assert all(mx[s] == pytest.approx(4 * mx[s - 1], rel=0.5) for s in (5, 6, 7))
    assert max(mx[1:5]) < 2 * min(mx[1:5])
    assert g["evidence"]["lead_indicator"]["departs_at"] == 5


@pytest.mark.slow
@pytest.mark.needs_generator
@pytest.mark.skipif(not (_have("torch") and _have("msprobe")), reason="needs torch and msprobe (make test-generator)")
def test_regenerate_spike_data(tmp_path):
    out = subprocess.run([sys.executable, "-m", "precnb_samples", "--out", str(tmp_path), "--only", "spike_data",
                          "--no-readme"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    new = load(tmp_path / "spike_data" / "ground_truth.json")
    old = gt("spike_data")
    assert new["losses"] == old["losses"] and new["faults"][0]["node"] == old["faults"][0]["node"]
    assert new["spike"] == old["spike"]
    for step in old["steps"]:
        for rank in (0, 1):
            rel = f"dump/step{step}/rank{rank}/dump.json"
            assert load(tmp_path / "spike_data" / rel)["data"] == load(DATA / "spike_data" / rel)["data"]
