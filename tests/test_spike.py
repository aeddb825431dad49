"""Loss spikes (issue 29): the step, the origin rank / node / tensor / module and the cause, on the real samples.

Every answer is checked against the samples' ``ground_truth.json`` (written by the generator from
what it injected and read back from the dumps), through the command line (``precnb spike --json``),
``precnb.diagnose``, the report's embedded findings and the explorer; the healthy control and the
other bundled samples must report no spike.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import precnb
from precnb.analysis.spike import LossSpikeRule, first_departure, loss_spike
from precnb.naming import parse_node
from tests._inprocess_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data_samples"
CAUSES = ["data", "optimizer", "hardware", "numerics"]


def gt(name: str) -> dict:
    return json.loads((SAMPLES / name / "ground_truth.json").read_text())


def inputs(name: str) -> tuple[Path, Path, Path]:
    root = SAMPLES / name
    return root / "dump", root / "monitor_output", root / "loss_log.csv"


def cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args)  # `python -m precnb ARGS` in this process (tests/_inprocess_cli.py)


def expected(name: str) -> dict:
    """The finding the sample's ground truth implies, in precnb's names."""
    g = gt(name)
    fault = g["faults"][0]
    node = fault["node"]
    section, _, index = fault["tensor"].partition(".")
    if fault["origin"] == "parameter":  # parameters_grad leaves: {node}.{parameter name}
        tensor = f"{node}.{section}"
    elif section == "input_kwargs":  # a scalar argument: the op's updated tensor is the record, the argument named
        tensor = f"{node}.output.0"
    else:
        tensor = f"{node}.{'input' if section.startswith('input') else 'output'}.{index}"
    module = parse_node(fault["module"]).module if fault["module"] else "optimizer"
    return {"step": g["spike"]["step"], "rank": fault["rank"], "origin_step": fault["step"], "node": node,
            "tensor": tensor, "module": module, "cause": fault["cause"], "argument": index if
            section == "input_kwargs" else None, "parameters": fault.get("parameters")}


def check(f: dict, want: dict) -> None:
    assert f["kind"] == "loss_spike", f["reason"]
    assert (f["step"], f["rank"]) == (want["step"], want["rank"])
    assert (f["node"], f["tensor"], f["module"]) == (want["node"], want["tensor"], want["module"])
    first = f["causes"][0]
    assert first["cause"] == want["cause"] and first["certain"] is True
    assert (first["step"], first["rank"], first["node"]) == (want["origin_step"], want["rank"], want["node"])
    assert f["values"]["origin"]["step"] == want["origin_step"]
    if want["argument"]:
        assert f["values"]["origin"]["arguments"][0]["argument"] == want["argument"]
    if want["parameters"]:
        assert set(f["values"]["origin"]["parameters"]) == set(want["parameters"])
    # the evidence: the loss per rank around the spike, from the log
    loss = f["evidence"]["loss"]
    assert want["step"] in loss["steps"] and {"rank0", "rank1", "all"} <= set(loss)


@pytest.mark.parametrize("cause", CAUSES)
def test_cli_names_step_rank_origin_and_cause(cause):
    name = f"spike_{cause}"
    dump, mon, log = inputs(name)
    out = cli("spike", dump, "--monitor", mon, "--loss", log, "--json")
    assert out.returncode == 0, out.stderr
    f = json.loads(out.stdout)
    check(f, expected(name))
    assert f["causes"][0]["cause"] == cause
    text = cli("spike", dump, "--monitor", mon, "--loss", log)
    assert text.returncode == 0 and text.stdout.startswith("LOSS SPIKE:") and "loss around the spike" in text.stdout


@pytest.mark.parametrize("cause", [pytest.param(c, marks=() if c == "data" else pytest.mark.slow) for c in CAUSES])
def test_diagnose_report_and_explorer_agree(cause, tmp_path):
    name = f"spike_{cause}"
    dump, mon, log = inputs(name)
    want = expected(name)
    t = precnb.diagnose(dump, monitor=mon, loss=log, progress=False)
    assert t.finding.kind == "loss_spike"  # before the NaN origin and the anomalies the spike causes
    check(t.finding.to_dict(), want)
    plan = t.finding.plan()
    assert want["origin_step"] in plan["step"] and (want["rank"] is None or want["rank"] in plan["rank"])

    html = tmp_path / "r.html"
    out = cli("report", dump, "--monitor", mon, "--loss", log, "-o", html)
    assert out.returncode == 0, out.stderr
    m = re.search(r'<script type="application/json" id="precnb-findings">(.*?)</script>', html.read_text(), re.S)
    check(json.loads(m.group(1))[0], want)
    assert "Likely cause" in html.read_text()

    pytest.importorskip("ipywidgets")
    ex = precnb.explore(dump, monitor=mon, loss=log)
    assert ex.finding.kind == "loss_spike" and ex.current_finding is ex.finding
    rank = want["rank"] if want["rank"] is not None else 0  # every rank: the first one
    assert (ex.step, ex.rank, ex.tensor) == (want["origin_step"], rank, want["tensor"])  # opens on the origin
    first = t.flagged().first()
    assert first == (want["origin_step"], rank, want["tensor"])  # the heat map's cell number 1


def test_healthy_control_reports_no_spike(tmp_path):
    dump, mon, log = inputs("spike_healthy")
    assert gt("spike_healthy")["spike"]["step"] is None
    out = cli("spike", dump, "--monitor", mon, "--loss", log, "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["kind"] == "none"
    for kw in ({"monitor": mon, "loss": log}, {"loss": log}, {"monitor": mon}, {}):
        t = precnb.diagnose(dump, progress=False, kinds=["loss_spike"], **kw)
        assert t.finding.kind == "none", (kw, t.finding.reason)
    t = precnb.diagnose(dump, monitor=mon, loss=log, progress=False)
    assert not [f for f in t.found if f.kind == "loss_spike"]
    page = precnb.report.to_html(t)
    assert "loss spike (the first step whose loss departs" in page  # listed among the checks run
    pytest.importorskip("ipywidgets")
    ex = precnb.explore(dump, monitor=mon, loss=log)
    assert ex.finding.kind == "none"


@pytest.mark.parametrize("cause", CAUSES)
def test_monitor_and_loss_log_alone(cause):
    """Without the dump: the monitor's gradients, updates and activations still tell the cause."""
    name = f"spike_{cause}"
    _dump, mon, log = inputs(name)
    want = expected(name)
    f = loss_spike(precnb.open_run(mon, progress=False), loss=precnb.io.read_loss_log(log))
    assert (f.kind, f.step, f.rank) == ("loss_spike", want["step"], want["rank"])
    if cause == "numerics":  # the monitor does not see the overflowing op, only its lead indicator
        assert not f.causes and f.evidence["trend"]["modules"][0]["module"] == "norm_out"
        return
    assert f.causes[0]["cause"] == cause and f.causes[0]["certain"] is True
    if cause == "optimizer":  # the weight change of the step, from param_origin / param_updated
        assert f.tensor.startswith("param_updated/") and f.values["origin"]["step"] == want["origin_step"]
        assert {"embed.weight", "norm_out.weight", "lm_head.weight"} <= set(f.values["origin"]["parameters"])
    else:
        assert f.module == want["module"] and f.values["origin"]["step"] == want["origin_step"]


def test_dump_alone_is_too_short_a_history_and_says_so():
    dump, _mon, _log = inputs("spike_data")
    f = loss_spike(precnb.open_run(dump, progress=False))
    assert f.kind == "none" and "only 3 steps" in f.reason and "--loss" in f.reason


def test_a_log_without_ranks_uses_the_dump_for_the_rank():
    dump, mon, log = inputs("spike_data")
    glob = pd.read_csv(log).groupby("step", as_index=False)["loss"].mean()
    f = loss_spike(precnb.open_run(dump, progress=False), monitor=precnb.open_run(mon, progress=False), loss=glob)
    assert (f.step, f.rank, f.node, f.causes[0]["cause"]) == (6, 1, "Functional.embedding.0.forward", "data")
    assert f.causes[0]["certain"] is False  # the run's loss only: the rank-local jump is not seen


def test_hardware_monitor_only_without_loss_uses_the_gradient_norm():
    _dump, mon, _log = inputs("spike_hardware")
    f = loss_spike(precnb.open_run(mon, progress=False))
    assert (f.kind, f.step, f.rank, f.tensor) == ("loss_spike", 5, 1, "grad_unreduced/lm_head.weight")
    assert f.values["spike"]["signal"] == "grad_norm" and f.causes[0]["cause"] == "hardware"


def test_numerics_lead_indicator_and_overflow():
    dump, mon, log = inputs("spike_numerics")
    g = gt("spike_numerics")
    t = precnb.diagnose(dump, monitor=mon, loss=log, progress=False, kinds=["loss_spike"])
    f = t.finding
    lead = f.evidence["trend"]["modules"][0]
    want = g["evidence"]["lead_indicator"]
    assert (lead["module"], lead["onset_step"], lead["lead_steps"]) == (want["module"], want["departs_at"],
                                                                        want["steps_before_spike"])
    assert "overflow" in f.causes[0]["text"] and "float16" in f.causes[0]["text"]
    # the float16 Norm of step 7 is inf while no element overflowed: not the origin
    assert f.values["origin"]["step"] == 8


def test_hardware_plan_dumps_the_parameter_and_its_reduce():
    dump, mon, log = inputs("spike_hardware")
    fault = gt("spike_hardware")["faults"][0]
    f = precnb.diagnose(dump, monitor=mon, loss=log, progress=False, kinds=["loss_spike"]).finding
    cfg = f.plan()
    assert cfg["task"] == "tensor" and cfg["level"] == "mix" and cfg["step"] == [fault["step"], fault["spike_step"]]
    assert fault["rank"] in cfg["rank"] and len(cfg["rank"]) == 2  # the departing rank and one healthy replica
    assert "Module.lm_head." in cfg["tensor"]["list"] and f"{fault['all_reduce'].rsplit('.', 1)[0]}." in \
        cfg["tensor"]["list"]
    assert f.values["origin"]["parameter"] == fault["parameter"]
    before = f.values["origin"]["values"]["before_reduce"]
    assert before == pytest.approx([g for g in gt("spike_hardware")["evidence"]["pre_reduce_grad_norm"].values()])


def test_data_plan_dumps_the_batch_of_the_rank():
    dump, mon, log = inputs("spike_data")
    cfg = precnb.diagnose(dump, monitor=mon, loss=log, progress=False, kinds=["loss_spike"]).finding.plan()
    assert (cfg["step"], cfg["rank"]) == ([6], [1]) and "Functional.embedding.0." in cfg["tensor"]["list"]


def test_anomalies_names_the_spike_beside_its_finding():
    dump, _mon, log = inputs("spike_hardware")
    out = cli("anomalies", dump, "--loss", log, "--json")
    assert out.returncode == 0, out.stderr
    f = json.loads(out.stdout)
    assert f["kind"] == "anomaly" and f["values"]["loss_spike"]["cause"] == "hardware"
    assert f["values"]["loss_spike"]["rank"] == 1


# -- no false spike anywhere else; the real one of the monitor sample is found ----------------------
@pytest.mark.parametrize("path", ["healthy", "dp_nan", "drift/dump", "drift/monitor_output", "moe_monitor",
                                  "moe_empty_expert", "divergence/target", "custom_op_gap", "tp/tp2"])
def test_no_false_spike_on_the_other_samples(path):
    f = loss_spike(precnb.open_run(SAMPLES / path, progress=False))
    assert f.kind == "none", f.reason


def test_monitor_sample_gradient_spike_is_found():
    fault = next(x for x in gt("monitor")["faults"] if x["kind"] == "gradient_spike")
    t = precnb.diagnose(SAMPLES / "monitor", progress=False)
    f = t.finding
    assert (f.kind, f.step, f.rank) == ("loss_spike", fault["step"], fault["rank"])
    # every gradient of rank 1 is scaled by one factor (the loss x1000 before backward): a loss-scale change
    assert f.causes[0]["cause"] == "numerics" and "loss-scale" in f.causes[0]["text"]
    assert f.values["origin"]["scale"] == pytest.approx(1000, rel=0.2)


@pytest.mark.shared
def test_s6_monitor_spike(shared):
    f = loss_spike(precnb.open_run(shared("data_samples", "msprobe", "S6_monitor", "monitor_output"), progress=False))
    assert (f.kind, f.step, f.rank, f.causes[0]["cause"]) == ("loss_spike", 2, 1, "numerics")
    g = loss_spike(precnb.open_run(shared("data_samples", "msprobe", "S1_baseline", "statistics"), progress=False))
    assert g.kind == "none"


# -- the rule -----------------------------------------------------------------------------------
def test_rule_follows_a_falling_loss_and_ignores_warmup_and_plateaus():
    steps = np.arange(12)
    falling = 4.4 * np.exp(-0.12 * steps) * (1 + 0.02 * np.sin(steps * 2.1))
    assert first_departure(falling, steps) is None
    warm = falling.copy()
    warm[1] = warm[0] * 1.8  # the first steps of training may rise: no noise estimate yet, below 10x
    assert first_departure(warm, steps) is None
    plateau = falling.copy()
    plateau[8:] = plateau[7]  # stops falling: a departure from the trend but no rise
    assert first_departure(plateau, steps) is None
    spike = falling.copy()
    spike[9] *= 1.5
    d = first_departure(spike, steps)
    assert d is not None and d["step"] == 9 and d["test"] == "trend" and d["z"] > 6
    assert first_departure(spike, steps, LossSpikeRule(warmup=10)) is None


def test_rule_nan_is_not_a_spike_and_short_history_needs_ten_x():
    steps = np.arange(4)
    assert first_departure(np.array([4.0, np.nan, 3.8, 3.7]), steps) is None
    assert first_departure(np.array([4.0, 6.0, 3.8, 3.7]), steps) is None
    assert first_departure(np.array([4.0, 41.0, 3.8, 3.7]), steps)["step"] == 1
    assert first_departure(np.array([-1.0, -1.1, -1.2, -1.3, -1.4, -0.1]), np.arange(6))["step"] == 5


def test_options_and_triage_json_carry_the_side_inputs():
    dump, mon, log = inputs("spike_data")
    t = precnb.diagnose(dump, monitor=mon, loss=log, progress=False, kinds=["loss_spike"])
    opts = json.loads(t.to_json())["options"]
    assert opts["monitor"] == str(mon) and opts["loss"] == str(log)
    t2 = precnb.diagnose(dump, monitor=precnb.open_run(mon, progress=False), loss=pd.read_csv(log),
                         progress=False, kinds=["loss_spike"])
    assert t2.finding.to_dict()["causes"][0] == t.finding.to_dict()["causes"][0]
    with pytest.raises(ValueError, match="step and loss"):
        precnb.diagnose(dump, loss=pd.DataFrame({"x": [1]}), progress=False, kinds=["loss_spike"])


def test_the_loss_spike_reads_its_side_inputs_through_its_own_inputs_hook(monkeypatch):
    """The monitor output and loss log are the loss spike's inputs (issue #50 item 2): read once, and only for it."""
    import precnb.pipeline.tensors as tensors
    from precnb.analysis.registry import get
    from precnb.analysis.spike.diagnosis import LOSS_SPIKE

    assert get(LOSS_SPIKE).reads.inputs == "precnb.pipeline.tensors:side_inputs"
    calls: list[object] = []
    real = tensors._loss_table
    monkeypatch.setattr(tensors, "_loss_table", lambda p: calls.append(p) or real(p))
    dump, _mon, log = inputs("spike_data")
    precnb.diagnose(dump, loss=log, progress=False, kinds=["nan_origin"])
    assert calls == []  # a triage without the loss spike does not read its loss log
    t = precnb.diagnose(dump, loss=log, progress=False, kinds=["nan_origin", LOSS_SPIKE])
    assert len(calls) == 1 and t.finding is not None


def test_bad_loss_log_is_one_line_naming_the_file(tmp_path):
    dump, _mon, _log = inputs("spike_data")
    bad = tmp_path / "loss.csv"
    bad.write_text("step,loss\n0,4.1\nx,3.9\n")
    out = cli("spike", dump, "--loss", bad)
    assert out.returncode == 1 and str(bad) in out.stderr and "line 3" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_data_cause_names_the_micro_batch_where_the_dump_has_it():
    dump, mon, log = inputs("spike_data")
    ds = precnb.open_run(dump, progress=False)
    micro = np.where(ds["node"].values == "Functional.embedding.0.forward", 3, ds["micro_step"].values)
    ds = ds.assign_coords(micro_step=("tensor", micro))  # as a Megatron dump's [parent, micro_step] records it
    f = loss_spike(ds, monitor=precnb.open_run(mon, progress=False), loss=precnb.io.read_loss_log(log))
    assert f.values["origin"]["micro_batch"] == 3 and "micro-batch 3" in f.causes[0]["text"]


def test_a_spike_plan_never_says_0_recorded_nodes_about_0_b():
    """Issue #53 item 7: a plan from monitor output has no dump to count nodes or bytes in: it says so."""
    from types import SimpleNamespace

    from precnb.analysis.spike._plan import spike_plan

    _dump, mon, log = inputs("spike_data")
    plan = precnb.diagnose(mon, loss=log, progress=False, kinds=["loss_spike"]).finding.dump_plan
    assert plan["selects"]["node_count"] == 0 and (plan["estimated_bytes"], plan["estimate"]) == (0, "unknown")
    assert "0 B" not in plan["summary"] and "0 recorded" not in plan["summary"], plan["summary"]
    assert "nodes and size not known" in plan["summary"] and "no msprobe dump" in plan["summary"]
    out = cli("plan", mon, "--loss", log)
    assert out.returncode == 0, out.stderr
    said = out.stdout + out.stderr  # the config on stdout, the summary lines beside it
    assert "# estimated dump size: unknown\n" in said and "0 bytes" not in said and "0 B" not in said, said
    # no cause found on a dump: everything at the spike step is planned, and what the dump records is counted
    dump, _mon, _log = inputs("spike_numerics")
    ds = precnb.open_run(dump, progress=False)
    plan = spike_plan(SimpleNamespace(found=True, step=8, causes=[], values={"spike": {"ranks": [0]}}), ds)
    assert plan["selects"]["list"] == [] and plan["selects"]["node_count"] > 0 and plan["estimated_bytes"] > 0
    assert "every recorded node" in plan["summary"] and plan["estimate"] in plan["summary"], plan["summary"]
