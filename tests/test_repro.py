"""``precnb repro``: a standalone script that reruns one dumped op and checks it against the dump.

Generating the script needs neither torch nor msprobe (tested here on the bundled tensor-mode
samples); running it needs torch (``needs_generator``): linear, gelu, softmax (kwarg ``dim``),
matmul, Tensor methods (``masked_fill``, ``mean`` with ``keepdim``), an embedding with positional
``None`` scalars and an op under bf16 autocast all reproduce the dumped outputs.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from precnb.repro import ReproError, op_target, render_args, repro_script
from tests._inprocess_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]

NODES = {  # node -> what the call must look like (the op itself is OP, checked by call() against ALLOWED)
    "Functional.linear.0.forward": "call(OP, T('Functional.linear.0.forward.input.0.pt'), "
                                   "T('Functional.linear.0.forward.input.1.pt'), None)",
    "Functional.gelu.0.forward": "call(OP, T(",
    "Functional.softmax.0.forward": "dim=-1)",
    "Torch.matmul.0.forward": "call(OP, T(",
    "Tensor.masked_fill.0.forward": "T('Tensor.masked_fill.0.forward.input.1.pt'), float(\"-inf\"))",
    "Tensor.mean.0.forward": ", -1, keepdim=True)",
    "Functional.embedding.0.forward": ", None, None, 2.0, False, False)",
    "Tensor.__mul__.6.forward": ".pt'), 1.0)",
}
TARGETS = {"Functional.linear.0.forward": "torch.nn.functional.linear", "Torch.matmul.0.forward": "torch.matmul",
           "Tensor.masked_fill.0.forward": "torch.Tensor.masked_fill"}


def _have(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def test_scripts_are_generated_without_torch_and_compile(samples):
    run = samples("tensor_bug", "baseline")
    for node, expected in NODES.items():
        text = repro_script(run, node)
        assert expected in text, (node, [ln for ln in text.splitlines() if "return call(" in ln])
        assert f"OP = {node.rsplit('.', 2)[0]!r}  # {TARGETS.get(node, 'torch.')}" in text
        ast.parse(text)
        assert "weights_only=True" in text and "allow_pickle=False" in text
        assert "pickle.load" not in text and "eval(" not in text
    # a tensor label stands for its node; the record of another step/rank is asked explicitly
    assert "OP = 'Torch.matmul'" in repro_script(run, "Torch.matmul.0.forward.output.0", step=0, rank=0)


def test_autocast_is_recognised_from_the_dtypes(samples):
    text = repro_script(samples("tensor_bf16", "target"), "Functional.linear.0.forward")
    assert "AUTOCAST = 'bfloat16'" in text  # fp32 inputs, bf16 output
    assert "AUTOCAST = None" in repro_script(samples("tensor_bf16", "target"), "Tensor.pow.0.forward")


@pytest.mark.parametrize("node, why", [
    ("Functional.linear.0.backward", "backward record"),
    ("Module.blocks.1.Block.forward.0", "module record"),
    ("Functional.no_such_op.0.forward", "no node"),
])
def test_what_cannot_be_rebuilt_is_named(samples, node, why):
    with pytest.raises(ReproError, match=why):
        repro_script(samples("tensor_bug", "baseline"), node)


def test_argument_rules_name_the_argument():
    assert op_target("Torch.rsqrt.3.forward") == ("function", "torch.rsqrt")
    with pytest.raises(ReproError, match="collective"):
        op_target("Distributed.all_reduce.0.forward")
    with pytest.raises(ReproError, match="torch_npu"):
        op_target("NPU.npu_fusion_attention.0.forward")
    with pytest.raises(ReproError, match=r"input_args\.0: a torch.Tensor without a saved file"):
        render_args({"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]}]})
    with pytest.raises(ReproError, match=r"input_kwargs\.group: a torch.ProcessGroup"):
        render_args({"input_args": [], "input_kwargs": {"group": {"type": "torch.ProcessGroup", "group_ranks": [0]}}})
    with pytest.raises(ReproError, match="not a keyword argument name"):
        render_args({"input_args": [], "input_kwargs": {"a b": {"type": "int", "value": 1}}})
    args, kwargs, files = render_args({"input_args": [
        {"type": "slice", "value": [0, None, 2]}, {"type": "ellipsis", "value": "..."},
        {"type": "torch.Size", "value": [2, 3]}, {"type": "torch.dtype", "value": "torch.bfloat16"},
        [{"type": "int", "value": 1}, None], {"type": "float", "value": float("nan")}],
        "input_kwargs": {"device": {"type": "torch.device", "value": "npu:0"}}})
    assert args == ["slice(0, None, 2)", "Ellipsis", "torch.Size([2, 3])", "torch.bfloat16", "[1, None]",
                    'float("nan")']
    assert kwargs == {"device": "DEVICE"} and files == []


def test_cli_writes_a_new_file_and_never_replaces_one(samples, tmp_path):
    out = tmp_path / "repro.py"
    cmd = ["repro", str(samples("tensor_bug", "baseline")), "Functional.gelu.0.forward", "-o", str(out)]
    p = run_cli(*cmd)
    assert p.returncode == 0, p.stderr
    assert "OP = 'Functional.gelu'  # torch.nn.functional.gelu" in out.read_text()
    first, second = out.read_text().splitlines()[:2]
    assert first.startswith("#!") and second.startswith("# precnb_output: repro-script")  # shebang kept first
    p = run_cli(*cmd, "--overwrite")
    assert p.returncode == 0, p.stderr  # its own script: replaced
    out.write_text("mine")
    for extra in ([], ["--overwrite"]):  # a user's file is never replaced
        p = run_cli(*cmd, *extra)
        assert p.returncode == 1 and str(out) in p.stderr and out.read_text() == "mine", p.stderr
    p = run_cli("repro", samples("tensor_bug", "baseline"), "Distributed.all_reduce.0.forward")
    assert p.returncode == 1 and "Distributed.all_reduce.0.forward" in p.stderr


_TORCH_PYTHON = os.environ.get("PRECNB_TORCH_PYTHON")  # any Python with torch + numpy runs the scripts


def _run_script(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_TORCH_PYTHON or sys.executable, str(path), *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.needs_generator
@pytest.mark.skipif(not (_TORCH_PYTHON or _have("torch")), reason="running a repro script needs torch")
def test_repro_scripts_reproduce_the_dumped_outputs(samples, tmp_path):
    run = samples("tensor_bug", "baseline")
    for node in NODES:
        script = tmp_path / f"{node}.py"
        script.write_text(repro_script(run, node))
        p = _run_script(script)
        assert p.returncode == 0, (node, p.stdout, p.stderr)
        assert p.stdout.rstrip().endswith("REPRODUCED") and "NOT" not in p.stdout, p.stdout
    # the same op under autocast reproduces its bf16 output bit for bit
    script = tmp_path / "bf16.py"
    script.write_text(repro_script(samples("tensor_bf16", "target"), "Functional.linear.0.forward"))
    p = _run_script(script)
    assert p.returncode == 0 and "under autocast bfloat16" in p.stdout and "bitwise_equal=True" in p.stdout


@pytest.mark.needs_generator
@pytest.mark.skipif(not (_TORCH_PYTHON or _have("torch")), reason="running a repro script needs torch")
def test_a_repro_that_does_not_match_exits_nonzero(samples, tmp_path):
    """The baseline's residual mul (scale 1.0) checked against the buggy target's files (scale 0.5)."""
    gt = json.loads(samples("tensor_bug", "ground_truth.json").read_text())
    node = gt["faults"][0]["node"]
    script = tmp_path / "mul.py"
    script.write_text(repro_script(samples("tensor_bug", "baseline"), node))
    p = _run_script(script, "--data", str(samples("tensor_bug", "target", "step0", "rank0", "dump_tensor_data")))
    assert p.returncode == 1 and "NOT REPRODUCED" in p.stdout
    p = _run_script(script, "--data", str(tmp_path / "nowhere"))
    assert p.returncode == 2
