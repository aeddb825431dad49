"""``precnb repro --replicas`` (issue 28, item 4): the departing op re-run on its dumped inputs on another device.

sdc_tensor: device 10.0.0.1:1 (rank 1 of TP group [0, 1]) flips one bit of one ``torch.rsqrt`` output element
at step 1; the op's dumped inputs are bit-identical on ranks 0 and 1. ``precnb replicas`` finds the departure,
``precnb plan`` gives the repro command, ``precnb repro`` writes the script (no torch needed: tested here on
its content); running it needs torch (``needs_generator``): on the CPU the recomputation equals rank 0's dumped
output bit for bit, not rank 1's — a device fault of rank 1's device, as the ground truth says.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import precnb
from precnb.cli import main
from precnb.repro import ReproError, repro_script

SAMPLE = "sdc_tensor"
NODE = "Torch.rsqrt.0.forward"


def _gt() -> dict:
    return json.loads((precnb.sample_path(SAMPLE) / "ground_truth.json").read_text())


def _record_block(text: str) -> dict:
    """The literals of the script's record block (NODE, RANK, INPUTS, REPLICAS, ...)."""
    block = text.rsplit("# <record>", 1)[1].split("# </record>")[0].split("\n", 1)[1]
    out = {}
    for node in ast.parse(block).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return out


def _plan_repro(capsys) -> list[str]:
    code = main(["plan", str(precnb.sample_path(SAMPLE)), "--layout", "tp=2,dp=2", "--kind", "replica_mismatch",
                 "--json", "--workers", "1"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["finding"]["node"] == NODE and out["finding"]["step"] == 1
    cmd = out["repro"].split(";")[0]
    return shlex.split(cmd)[1:]  # drop "precnb"


def test_replicas_finds_the_departure_with_identical_inputs(capsys):
    g = _gt()["faults"][0]
    code = main(["replicas", str(precnb.sample_path(SAMPLE)), "--tp", "2", "--json", "--workers", "1"])
    f = json.loads(capsys.readouterr().out)
    assert code == 0 and (f["kind"], f["step"], f["rank"], f["node"]) == ("replica_mismatch", g["step"], g["rank"],
                                                                          g["node"])
    dep = f["evidence"]["departure"]
    assert dep["group"] == g["ranks"] and dep["inputs_identical"] and dep["cause"] == "compute_fault"
    assert dep["scalar_args_identical"] is True  # read without --layout too
    assert [d["step"] for d in f["evidence"]["departures"]] == [1]  # step 2 is clean


def test_the_plan_gives_the_replica_repro_and_the_script_carries_the_replicas(capsys, tmp_path):
    argv = _plan_repro(capsys)
    assert argv[:7] == ["repro", str(precnb.sample_path(SAMPLE)), NODE, "--step", "1", "--rank", "1"]
    assert argv[7:9] == ["--replicas", "0"]
    script = tmp_path / "repro.py"
    code = main([*argv[:9], "-o", str(script), "--workers", "1"])
    assert code == 0 and "agrees with rank 1's dumped output or with rank(s) 0's" in capsys.readouterr().out
    text = script.read_text()
    compile(text, str(script), "exec")
    rec = _record_block(text)
    root = precnb.sample_path(SAMPLE)
    assert (rec["NODE"], rec["OP"], rec["RANK"]) == (NODE, "Torch.rsqrt", 1)
    assert rec["INPUTS"] == [f"{NODE}.input.0.pt"]
    assert Path(rec["SOURCE"]) == root / "step1" / "rank1" / "dump.json"
    assert list(rec["REPLICAS"]) == [0]
    rep = rec["REPLICAS"][0]
    assert Path(rep["data"]) == root / "step1" / "rank0" / "dump_tensor_data"
    assert rep["inputs"] == rec["INPUTS"] and rep["outputs"] == rec["OUTPUTS"] == [("0", f"{NODE}.output.0.pt",
                                                                                     "torch.float32")]
    assert "--replica-data" in text and "this_rank_is_wrong" in text
    # without --replicas the script is the plain one (no replica to compare with)
    assert _record_block(repro_script(root, NODE, step=1, rank=1))["REPLICAS"] == {}


def test_a_replica_with_other_scalar_arguments_is_refused(tmp_path, capsys):
    root = tmp_path / SAMPLE
    shutil.copytree(precnb.sample_path(SAMPLE), root)
    path = root / "step1" / "rank0" / "dump.json"
    doc = json.loads(path.read_text())
    doc["data"][NODE]["input_kwargs"] = {"eps": {"type": "float", "value": 0.5}}  # a per-rank argument
    path.write_text(json.dumps(doc))
    with pytest.raises(ReproError, match="rank 0's call differs from this rank's in its scalar arguments"):
        repro_script(root, NODE, step=1, rank=1, replicas=[0])
    with pytest.raises(ReproError, match="no dump folder for step 1, rank 7"):
        repro_script(root, NODE, step=1, rank=1, replicas=[7])
    assert main(["repro", str(root), NODE, "--step", "1", "--replicas", "0"]) == 2
    assert "--replicas needs --rank" in capsys.readouterr().err


def _torch_python() -> str | None:
    env = os.environ.get("PRECNB_TORCH_PYTHON")
    if env:
        return env
    try:
        return sys.executable if importlib.util.find_spec("torch") is not None else None
    except (ImportError, ValueError):
        return None


@pytest.mark.needs_generator
@pytest.mark.skipif(_torch_python() is None, reason="running a repro script needs torch (PRECNB_TORCH_PYTHON)")
def test_the_recomputation_on_the_cpu_confirms_the_device_fault(capsys, tmp_path):
    g = _gt()["faults"][0]
    argv = _plan_repro(capsys)
    script = tmp_path / "repro.py"
    assert main([*argv[:9], "-o", str(script), "--workers", "1"]) == 0

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([_torch_python(), str(script), "--device", "cpu", *extra], capture_output=True,
                              text=True, timeout=300)

    p = run("--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["inputs_identical"] == {"0": True}
    assert out["decided"] and out["this_rank_is_wrong"]
    assert out["agrees_with"] == g["recomputed"]["equals_dumped_output_of"] == [0]
    assert out["wrong_ranks"] == [g["rank"]] == [1]
    assert out["sides"]["0"][0]["bitwise_equal"] and not out["sides"]["1"][0]["bitwise_equal"]
    p = run()
    assert p.returncode == 0 and "inputs of rank 0 vs rank 1: bit-identical" in p.stdout
    assert "VERDICT: Torch.rsqrt.0.forward recomputed on cpu from rank 1's dumped inputs agrees bit for bit with " \
           "the dumped output of rank(s) 0, not with rank(s) 1" in p.stdout
    # the same script with rank 1's files as the "replica": no side to tell apart (exit 1)
    own = str(precnb.sample_path(SAMPLE) / "step1" / "rank1" / "dump_tensor_data")
    p = run("--replica-data", f"0={own}", "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["agrees_with"] == [] and "agrees with no replica" in p.stdout
    # step 2 (no fault): the recomputation agrees with both replicas, nothing is decided
    script2 = tmp_path / "repro2.py"
    assert main(["repro", str(precnb.sample_path(SAMPLE)), NODE, "--step", "2", "--rank", "1", "--replicas", "0",
                 "-o", str(script2), "--workers", "1"]) == 0
    p = subprocess.run([_torch_python(), str(script2)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "the replicas agree, no departure here" in p.stdout
    # a replica whose inputs differ (rank 2 is in the other TP group): not decided, said so
    script3 = tmp_path / "repro3.py"
    assert main(["repro", str(precnb.sample_path(SAMPLE)), NODE, "--step", "1", "--rank", "1", "--replicas", "2",
                 "-o", str(script3), "--workers", "1"]) == 0
    p = subprocess.run([_torch_python(), str(script3), "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and json.loads(p.stdout)["inputs_identical"] == {"2": False}
    p = subprocess.run([_torch_python(), str(script3), "--replica-data", "9=/nowhere"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2 and "--replica-data" in p.stderr


def test_the_text_finding_shows_the_repro_command(capsys):
    code = main(["replicas", str(precnb.sample_path(SAMPLE)), "--tp", "2", "--workers", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    repro = [x for x in lines if x.startswith("  repro: ")]
    assert repro == [f"  repro: precnb repro {precnb.sample_path(SAMPLE)} {NODE} --step 1 --rank 1 --replicas 0 "
                     "-o repro.py; then on another device: python repro.py --device npu:0 (or cuda:0, cpu): it re-runs "
                     "the op on rank 1's dumped inputs, checks rank(s) 0 had the same inputs, and says whose dumped "
                     "output it agrees with (the other side computed it wrongly)"]
    code = main(["replicas", str(precnb.sample_path("sdc/job1")), "--tp", "2", "--workers", "1"])
    assert code == 0 and "  repro: " not in capsys.readouterr().out  # a statistics dump: no tensors to re-run on
