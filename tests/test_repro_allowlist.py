"""``precnb repro`` never runs code a dump names (issue 23, item 1; exit codes: item 10; malformed records: 7).

A dumped API name is a string anyone can write: ``Torch.builtins.exec.0.forward`` with a string
argument used to become ``torch.builtins.exec("<code>", ...)`` in the generated script. Only the
genuine torch operators msprobe hooks are callable: precnb refuses every other name (tested here
without torch, for every hostile name class), the script refuses it again before it calls (an
edited ``OP``; tested without torch too), and the script's ``call`` checks what the name resolves
to (a torch operator, never a module, class, builtin, or anything of builtins/os/sys/subprocess/
importlib; tested with torch). Every op of the bundled tensor samples stays on the list and still
reproduces.

Running scripts needs torch in the interpreter that runs them: ``sys.executable``, or
``$PRECNB_TORCH_PYTHON`` (any Python with torch and numpy; precnb is not needed there).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from precnb.repro import ReproError, allowed_op, op_target, render_args, repro_script
from precnb.repro._args import DTYPES, MEMORY_FORMATS, call_source
from precnb.repro._oplist import CALLABLE

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "precnb" / "repro" / "_script.py"
TENSOR_RUNS = [("tensor_bug", "baseline"), ("tensor_bug", "target"), ("tensor_bf16", "baseline"),
               ("tensor_bf16", "target")]

# every class of hostile name: builtins / os / sys / subprocess / importlib reached through a torch
# namespace, modules, classes, file side effects, dunders that are not operators, attributes that are
# data (msprobe's own aten list holds __doc__, __loader__, name), and names under other prefixes
HOSTILE = [
    "Torch.builtins.exec", "Torch.builtins.eval", "Torch.builtins.open", "Torch.builtins.__import__",
    "Torch.os.system", "Torch.os.popen", "Torch.sys.exit", "Torch.sys.modules", "Torch.subprocess.run",
    "Torch.importlib.import_module", "Functional.torch.os.system", "Functional.importlib.import_module",
    "Functional.warnings.warn", "Torch.nn", "Torch.linalg", "Torch.Tensor", "Torch.nn.Module", "Torch.load",
    "Torch.save", "Torch.from_file", "Torch.hub.load", "Torch.compile", "Torch.jit.load", "Torch.__builtins__",
    "Torch._C._set_print_stack_traces_on_fatal_signal", "Tensor.__class__", "Tensor.__reduce_ex__",
    "Tensor.__init_subclass__", "Tensor.__getattribute__", "Tensor.__setstate__", "Tensor.register_hook",
    "Aten.__doc__", "Aten.__loader__", "Aten.name", "Aten._dir", "VF.__class__", "VF.os.system",
    "NPU.builtins.exec", "Distributed.os.system", "Module.os.system", "Builtins.exec", "Os.system",
]


def _node(op: str) -> str:
    return f"{op}.0.forward"


def _load_script(allowed: frozenset[str] | None = None):
    spec = importlib.util.spec_from_file_location(f"_repro_script_{len(sys.modules)}", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if allowed is not None:
        mod.ALLOWED = allowed
    return mod


def _every_callable() -> frozenset[str]:
    return frozenset(f"{p}.{n}" for p, names in CALLABLE.items() for n in names)


def _torch_python() -> str:
    py = os.environ.get("PRECNB_TORCH_PYTHON") or sys.executable
    probe = subprocess.run([py, "-c", "import torch, numpy"], capture_output=True, timeout=300)
    if probe.returncode:
        pytest.skip("running a repro script needs torch (set PRECNB_TORCH_PYTHON to a Python that has it)")
    return py


def _sample_nodes(samples) -> list[tuple[Path, str]]:
    out = []
    for name, side in TENSOR_RUNS:
        run = samples(name, side)
        data = json.loads((run / "step0" / "rank0" / "dump.json").read_text())["data"]
        out += [(run, n) for n in data if n.endswith(".forward") and not n.startswith("Module.")]
    return out


# ----------------------------------------------------------------------------- precnb refuses (no torch)
@pytest.mark.parametrize("op", HOSTILE)
def test_a_hostile_name_is_refused_by_precnb(op):
    with pytest.raises(ReproError) as info:
        op_target(_node(op))
    assert op in str(info.value) or "prefix" in str(info.value) or "module record" in str(info.value)
    assert not allowed_op(*op.split(".", 1))


def test_the_allow_list_holds_only_operator_names():
    assert {"Functional", "Torch", "Tensor", "VF", "Aten"} <= set(CALLABLE)
    every = _every_callable()
    for op in HOSTILE:
        assert op not in every, op
    for prefix, names in CALLABLE.items():
        for name in names:
            assert all(part.isidentifier() for part in name.split(".")), (prefix, name)
            assert name.split(".")[0] not in {"builtins", "os", "sys", "subprocess", "importlib", "nn", "jit",
                                              "hub"}, (prefix, name)
            assert not (name.startswith("__") and name.endswith("__")) or prefix in ("Tensor", "Aten"), name
            assert "load" not in name.split("_") and "save" not in name.split("_"), name
    assert {"__doc__", "__loader__", "name", "_dir"}.isdisjoint(CALLABLE["Aten"])  # on msprobe's list: no ops


@pytest.mark.slow
def test_every_op_of_the_bundled_tensor_samples_is_on_the_list(samples):
    nodes = _sample_nodes(samples)
    assert len({n.rsplit(".", 2)[0] for _, n in nodes}) == 13  # linear, gelu, softmax, matmul, rsqrt, __mul__, ...
    for run, node in nodes:
        op = node.rsplit(".", 2)[0]
        assert allowed_op(*op.split(".", 1)), node
        text = repro_script(run, node)
        assert f"OP = {op!r}" in text
        tree = ast.parse(text)
        _static_check(tree, op)


def test_the_dump_record_is_data_and_one_checked_call(samples):
    """Static check of the script (no torch): the op is never named in code, only passed to ``call``."""
    text = repro_script(samples("tensor_bug", "baseline"), "Functional.embedding.0.forward")
    tree = ast.parse(text)
    _static_check(tree, "Functional.embedding")
    assert "torch.nn.functional.embedding(" not in text  # only in a comment: "OP = '...'  # torch.nn..."


def _static_check(tree: ast.Module, op: str) -> None:
    assigned = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            assigned[stmt.targets[0].id] = stmt.value
    assert ast.literal_eval(assigned["OP"]) == op and isinstance(ast.literal_eval(assigned["NODE"]), str)
    for name in ("SOURCE", "INPUTS", "OUTPUTS", "AUTOCAST"):
        ast.literal_eval(assigned[name])  # plain literals
    run_op = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "run_op"]
    assert len(run_op) == 1
    (ret,) = [s for s in run_op[0].body if isinstance(s, ast.Return)]
    call = ret.value
    assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "call"
    assert isinstance(call.args[0], ast.Name) and call.args[0].id == "OP"
    allowed_names = {"call", "OP", "T", "DEVICE", "float", "slice", "Ellipsis", "torch"}
    for node in ast.walk(call):
        if isinstance(node, ast.Name):
            assert node.id in allowed_names, node.id
        if isinstance(node, ast.Attribute):
            assert isinstance(node.value, ast.Name) and node.value.id == "torch"
            assert node.attr in DTYPES | MEMORY_FORMATS | {"Size"}, node.attr
        if isinstance(node, ast.Call) and node is not call:
            fn = node.func
            assert (isinstance(fn, ast.Name) and fn.id in ("T", "float", "slice")) or (
                isinstance(fn, ast.Attribute) and fn.attr == "Size"), ast.dump(fn)
    # the only calls of the resolved op go through resolve(), which checks the allow-list first
    script_calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Call)]
    assert [ast.unparse(n.func) for n in script_calls] == ["resolve(op)"]


def test_a_keyword_named_like_a_python_keyword_compiles():
    args, kwargs, _ = render_args({"input_args": [{"type": "torch.Tensor", "data_name": "x.pt"}],
                                   "input_kwargs": {"lambda": {"type": "float", "value": 0.5},
                                                    "dim": {"type": "int", "value": 1},
                                                    "class": {"type": "bool", "value": True}}})
    src = call_source(args, kwargs)
    assert src == "call(OP, T('x.pt'), dim=1, **{'lambda': 0.5, 'class': True})"
    ast.parse(src)


def test_a_keyword_argument_lambda_in_a_dump_gives_a_script_that_compiles(tmp_path, samples):
    run = _hostile_dump(tmp_path, samples, {"Functional.hardshrink.0.forward": {
        "input_args": [_tensor("Functional.gelu.0.forward.input.0.pt")],
        "input_kwargs": {"lambda": {"type": "float", "value": 0.5}},
        "output": [_tensor("Functional.gelu.0.forward.output.0.pt")]}})
    text = repro_script(run, "Functional.hardshrink.0.forward")
    compile(text, "repro.py", "exec")
    assert "**{'lambda': 0.5}" in text


@pytest.mark.parametrize("record, where", [
    ({"input_args": [{"type": "slice", "value": [0, "a", 2]}]}, r"input_args\.0: 'a' is not an integer"),
    ({"input_args": [{"type": "slice", "value": [0, float("inf"), 2]}]}, "is not an integer"),
    ({"input_args": [{"type": "slice", "value": [0, {}, 2]}]}, "is not an integer"),
    ({"input_args": [{"type": "torch.Size", "value": [2, 1.5]}]}, "is not an integer"),
    ({"input_args": [{"type": "torch.Size", "value": ["x"]}]}, "is not an integer"),
    ({"input_args": [{"type": "float", "value": "abc"}]}, "is not a number"),
    ({"input_args": [{"type": "float", "value": [1]}]}, "is not a number"),
    ({"input_args": [{"type": "float32", "value": None}]}, "is not a number"),
    ({"input_args": [{"type": "float", "value": 10 ** 400}]}, "does not fit a float"),
    ({"input_args": {"a": 1}}, "input_args: a dict, not a list"),
    ({"input_args": 7}, "input_args: a int, not a list"),
    ({"input_args": [], "input_kwargs": [1]}, "input_kwargs: a list, not an object"),
    ({"input_args": [{"type": "torch.dtype", "value": "torch.os"}]}, "not a torch dtype"),
    ({"input_args": [{"type": "torch.memory_format", "format": "builtins"}]}, "cannot be rebuilt"),
    ({"input_args": [{"type": "torch.Tensor", "data_name": "../../etc/passwd"}]}, "not a file name"),
    ({"input_args": [{"type": "torch.Tensor", "data_name": "/etc/passwd"}]}, "not a file name"),
    ({"input_args": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}, "nested deeper"),
])
def test_a_malformed_record_is_a_repro_error_naming_the_argument(record, where):
    with pytest.raises(ReproError, match=where):
        render_args(record)


# ----------------------------------------------------------------------------- the script refuses (no torch)
def test_the_script_checks_its_allow_list_before_torch():
    mod = _load_script(_every_callable())
    for op in HOSTILE:
        assert not mod.allowed(op), op
        with pytest.raises(mod.CannotRun, match="allow-list"):
            mod.resolve(op)
    assert mod.allowed("Functional.gelu") and mod.allowed("Tensor.__mul__")
    # the operator check alone (no torch needed for these): modules, classes, builtins are never operators
    import builtins
    import os as os_module
    import subprocess as sp
    for obj in (exec, eval, open, print, __import__, builtins, os_module, os_module.system, sp.run, sp.Popen, type,
                importlib.import_module, sys.exit, Path, ast.literal_eval, lambda x: x):
        assert not mod.is_operator(obj), obj


def test_an_edited_script_is_refused_before_anything_runs(samples, tmp_path):
    """``OP`` edited to a hostile name: exit 2 (could not run), nothing ran — even without torch."""
    text = repro_script(samples("tensor_bug", "baseline"), "Functional.gelu.0.forward")
    marker = tmp_path / "pwned"
    for op in ("Torch.builtins.exec", "Torch.os.system", "Tensor.__class__", "Functional.torch.os.system"):
        edited = text.replace("OP = 'Functional.gelu'", f"OP = {op!r}")
        assert edited != text
        script = tmp_path / "edited.py"
        script.write_text(edited)
        env = {**os.environ, "PYTHONPATH": ""}
        p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env,
                           cwd=tmp_path)
        assert p.returncode == 2, (op, p.stdout, p.stderr)
        assert "not an operator on this script's allow-list" in p.stderr and op in p.stderr
        assert not marker.exists()


# ----------------------------------------------------------------------------- hostile dumps, end to end
def _tensor(name: str) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1, 8, 32], "Max": 1.0, "Min": -1.0,
            "Mean": 0.0, "Norm": 1.0, "requires_grad": False, "data_name": name}


def _hostile_dump(tmp_path: Path, samples, records: dict) -> Path:
    src = samples("tensor_bug", "baseline", "step0", "rank0")
    rank = tmp_path / "hostile" / "step0" / "rank0"
    (rank / "dump_tensor_data").mkdir(parents=True)
    for name in ("Functional.gelu.0.forward.input.0.pt", "Functional.gelu.0.forward.output.0.pt"):
        shutil.copy(src / "dump_tensor_data" / name, rank / "dump_tensor_data" / name)
    doc = {"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": str(rank / "dump_tensor_data"),
           "data": records}
    (rank / "dump.json").write_text(json.dumps(doc))
    return tmp_path / "hostile"


def test_the_exec_attack_of_the_issue_is_refused(tmp_path, samples):
    marker = tmp_path / "pwned"
    code = f"open({str(marker)!r}, 'w').write('ran')"
    records = {f"{op}.0.forward": {"input_args": [{"type": "str", "value": code},
                                                   {"g": _tensor("Functional.gelu.0.forward.input.0.pt")}],
                                    "input_kwargs": {}, "output": [_tensor("Functional.gelu.0.forward.output.0.pt")]}
               for op in ("Torch.builtins.exec", "Torch.os.system", "Torch.builtins.eval", "Tensor.__class__")}
    run = _hostile_dump(tmp_path, samples, records)
    for node in records:
        with pytest.raises(ReproError, match="not an operator precnb may call"):
            repro_script(run, node)
        p = subprocess.run([sys.executable, "-m", "precnb", "repro", str(run), node, "-o", str(tmp_path / "r.py")],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert p.returncode == 1 and "not an operator precnb may call" in p.stderr and node in p.stderr, p.stderr
        assert not (tmp_path / "r.py").exists() and not marker.exists()


def test_a_mindspore_dump_is_not_rebuilt_as_torch(tmp_path, samples):
    run = _hostile_dump(tmp_path, samples, {"Functional.gelu.0.forward": {
        "input_args": [_tensor("Functional.gelu.0.forward.input.0.pt")], "input_kwargs": {},
        "output": [_tensor("Functional.gelu.0.forward.output.0.pt")]}})
    dump = run / "step0" / "rank0" / "dump.json"
    dump.write_text(dump.read_text().replace('"pytorch"', '"mindspore"'))
    with pytest.raises(ReproError, match="MindSpore dump"):
        repro_script(run, "Functional.gelu.0.forward")


# ----------------------------------------------------------------------------- with torch
@pytest.mark.needs_generator
def test_with_torch_what_a_name_resolves_to_is_checked(tmp_path):
    """Even with the allow-list forced open, ``resolve`` calls nothing but a torch operator."""
    py = _torch_python()
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('s', {str(SCRIPT)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        f"hostile = {json.dumps(HOSTILE)}\n"
        "m.ALLOWED = frozenset(hostile) | {'Functional.gelu', 'Torch.matmul', 'Tensor.__mul__', 'Aten.add',"
        " 'VF.lstm', 'Torch.linalg.norm', 'Tensor.masked_fill', 'Functional.softmax'}\n"
        "out = {}\n"
        "for op in sorted(m.ALLOWED):\n"
        "    try:\n"
        "        m.resolve(op); out[op] = 'ok'\n"
        "    except m.CannotRun as exc:\n"
        "        out[op] = 'refused: ' + str(exc)\n"
        "print(json.dumps(out))\n")
    p = subprocess.run([py, str(probe)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    for op in ("Functional.gelu", "Torch.matmul", "Tensor.__mul__", "Aten.add", "VF.lstm", "Torch.linalg.norm",
               "Tensor.masked_fill", "Functional.softmax"):
        assert got[op] == "ok", (op, got[op])
    # genuine torch functions with side effects (load, save, compile, hooks) pass this check: the allow-list
    # refuses them (tested above); everything else is refused by what it resolves to
    side_effects = {"Torch.load", "Torch.save", "Torch.from_file", "Torch.compile", "Torch.jit.load",
                    "Torch.hub.load", "Tensor.register_hook", "Tensor.__reduce_ex__", "Tensor.__setstate__",
                    "Torch._C._set_print_stack_traces_on_fatal_signal", "Tensor.__getattribute__",
                    "Tensor.__init_subclass__"}
    for op in set(HOSTILE) - side_effects:
        assert got[op].startswith("refused"), (op, got[op])


@pytest.mark.needs_generator
def test_every_op_of_the_bundled_tensor_samples_reproduces(samples, tmp_path):
    """All forward API records of tensor_bug and tensor_bf16 (both runs): exit 0, REPRODUCED."""
    py = _torch_python()
    scripts = []
    for i, (run, node) in enumerate(_sample_nodes(samples)):
        path = tmp_path / f"r{i}.py"
        path.write_text(repro_script(run, node))
        scripts.append(str(path))
    driver = tmp_path / "driver.py"  # one torch import for all the scripts
    driver.write_text(
        "import contextlib, io, json, runpy, sys\n"
        "codes = {}\n"
        "for path in sys.argv[1:]:\n"
        "    sys.argv = [path]\n"
        "    out = io.StringIO()\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
        "            runpy.run_path(path, run_name='__main__')\n"
        "    except SystemExit as exc:\n"
        "        codes[path] = [exc.code, out.getvalue()[-300:]]\n"
        "print(json.dumps(codes))\n")
    p = subprocess.run([py, str(driver), *scripts], capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr
    codes = json.loads(p.stdout)
    assert len(codes) == len(scripts) >= 100
    bad = {k: v for k, v in codes.items() if v[0] != 0 or not v[1].rstrip().endswith("REPRODUCED")
           or "NOT REPRODUCED" in v[1]}
    assert not bad, bad


@pytest.mark.needs_generator
def test_the_script_exit_codes_are_distinct(samples, tmp_path):
    """0 reproduced, 1 NOT reproduced, 2 could not run (an unreadable output file, a failing op)."""
    py = _torch_python()
    run = samples("tensor_bug", "baseline")
    text = repro_script(run, "Functional.gelu.0.forward")
    data = tmp_path / "data"
    shutil.copytree(run / "step0" / "rank0" / "dump_tensor_data", data)
    script = tmp_path / "gelu.py"
    script.write_text(text)

    def rerun(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([py, str(script), "--data", str(data), *extra], capture_output=True, text=True,
                              timeout=300)

    assert rerun().returncode == 0
    out = data / "Functional.gelu.0.forward.output.0.pt"
    saved = out.read_bytes()
    out.write_bytes(b"PK\x03\x04 not a tensor")  # an unreadable output file: could not run, not "NOT REPRODUCED"
    p = rerun()
    assert p.returncode == 2 and "could not run" in p.stderr and "NOT REPRODUCED" not in p.stdout, (p.stdout, p.stderr)
    out.unlink()
    p = rerun()
    assert p.returncode == 2 and "no such tensor file" in p.stderr
    out.write_bytes(saved)
    (data / "Functional.gelu.0.forward.input.0.pt").write_bytes(saved)  # the op runs on other inputs
    assert rerun().returncode in (0, 1)
    # a result that cannot be compared (an index into a tensor as if a tuple: the script's own error)
    script.write_text(text.replace("OUTPUTS = [('0',", "OUTPUTS = [('0.x',"))
    p = rerun()
    assert p.returncode == 2 and "could not run" in p.stderr, (p.stdout, p.stderr)
