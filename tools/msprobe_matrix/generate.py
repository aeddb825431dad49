"""Generate the msprobe release conformance matrix (a development tool, not part of the precnb wheel).

For each ``mindstudio-probe`` release on PyPI this script makes a venv of its own
(``/work/venvs/msprobe-<version>``, ``python3 -m venv``, no system site packages), installs
``torch==2.13.0`` (CPU) and the release into it, trains the tiny model of ``_pt_worker.py`` for
2 steps under that release's ``PrecisionDebugger`` in every mode of :data:`MODES`, and stores beside each
dump that release's own compare reading of it (``_truth.py``)::

    python tools/msprobe_matrix/generate.py --out tests/fixtures/msprobe_releases [--only 26.2.0 1.0.1 ...]
    python tools/msprobe_matrix/generate.py --out tests/fixtures/msprobe_releases --table [--readme README.md]

Output, per release ``<out>/<version>/``:

- ``pt_<mode>/step{0,1}/<rank folder>/{dump,construct,stack}.json``: the files as the release wrote them;
- ``pt_<mode>.truth.json``: the release's compare of each rank file against itself (``_truth.py``);
- ``release.json``: how it was installed (torch, numpy, pandas, python, the pip command, the error when
  it failed), and per mode the msprobe config, the losses per rank and any error.

Each training runs in a new PID namespace when ``unshare`` allows it (``unshare --pid --fork``), so the
``proc<PID>`` folder of a single-process dump is ``proc1`` on every run (the files are then the same
on a re-run); where ``unshare`` is refused it runs plainly and ``release.json`` says so. Installs and
runs are sequential and niced (``nice -n 10``). What a release wrote names this machine's folders (every
``stack.json`` frame, the venvs in ``release.json``, the scratch folder in MindSpore's truth): each release folder
is rewritten by the samples' scrub (``tools/samples/precnb_samples/scrub.py``, the venvs' folder as ``<venvs>``)
once it is written; ``--scrub`` applies the same to the committed fixtures without generating anything. The
script itself needs only the standard library;
``--table`` imports ``conformance.py`` beside it, which needs precnb (run it with precnb's venv).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "samples"))
from precnb_samples.scrub import TEXT_SUFFIXES, leftovers, scrub_tree  # noqa: E402  (the standard library only)

#: every mindstudio-probe release on PyPI (``pip index versions mindstudio-probe``), oldest first
RELEASES = ("1.0.1", "1.0.3", "1.0.4", "1.1.0", "1.1.1", "1.2.0", "1.2.1", "1.2.2", "1.3.0",
            "8.1.0", "8.1.1", "8.1.2", "8.2.0", "8.2.1", "8.3.0", "8.3.1", "8.3.2", "8.3.3",
            "26.0.0", "26.1.0", "26.1.0.post1", "26.2.0")
REFERENCE = "26.2.0"
TORCH = "torch==2.13.0"
VENVS = Path(os.environ.get("MSPROBE_MATRIX_VENVS", "/work/venvs"))
#: the interpreter the venvs are made from (CPython 3.11: the 26.x wheels are cp311 builds)
BASE_PYTHON = os.environ.get("MSPROBE_MATRIX_PYTHON", "python3")
#: mode -> (level, summary_mode, world size); ``L1_2rank`` only for :data:`TWO_RANK_RELEASES`
MODES: dict[str, tuple[str, str, int]] = {
    "L0": ("L0", "statistics", 1),
    "L1": ("L1", "statistics", 1),
    "mix": ("mix", "statistics", 1),
    "md5": ("mix", "md5", 1),
    "L1_2rank": ("L1", "statistics", 2),
}
TWO_RANK_RELEASES = ("1.0.1", "26.2.0")
#: MindSpore 2.10 CPU modes: mode -> (level, summary_mode, how the network runs; see ``_ms_worker.py``)
MS_MODES: dict[str, tuple[str, str, str]] = {
    "ms_L0": ("L0", "statistics", "pynative"),
    "ms_L1": ("L1", "statistics", "pynative"),
    "ms_mix": ("mix", "statistics", "pynative"),
    "ms_md5": ("mix", "md5", "pynative"),
    "ms_jit": ("mix", "statistics", "jit"),
    "ms_graph": ("L0", "statistics", "graph"),
}
MINDSPORE = ("numpy<2", "mindspore==2.10.0")
#: a venv holding MindSpore 2.10 (numpy<2) and 8.3.3's requirements, which each release's ``-ms`` venv sees through a
#: ``.pth`` file (one 800 MB MindSpore install instead of one per release); pip still installs what a release needs
#: beyond it (its own pins: pip sees the base's packages as installed). Made when missing: ``python3 -m venv`` +
#: ``pip install 'numpy<2' mindspore==2.10.0``.
MS_BASE = Path(os.environ.get("MSPROBE_MATRIX_MS_BASE", str(VENVS / "ms-base")))
#: the releases the MindSpore modes are tried with by default, and which modes: every release, every mode (which ran
#: and which could not, and why: README.md's table, ``conformance.MS_GAPS``)
MS_RELEASES: dict[str, tuple[str, ...]] = {v: tuple(MS_MODES) for v in RELEASES}
STEPS = 2
#: extra requirements a release needs beside torch 2.13.0, and why (what the unpinned install did)
_NUMPY = ("its metadata does not bound numpy (1.0.4 on pin numpy<2) and pip takes numpy 2; then `from msprobe.pytorch "
          "import PrecisionDebugger` fails: AttributeError: `np.unicode_` was removed in the NumPy 2.0 release "
          "(msprobe/core/data_dump/data_processor/base.py line 54)")
_TWISTED = ("Twisted's TLS support needs service_identity (Twisted's `tls` extra), which the release's requirements "
            "do not list, and msprobe imports it: in 1.0.3 `from msprobe.pytorch import PrecisionDebugger`, in "
            "1.0.4-1.3.0, 8.1.0-8.1.2 and 8.3.0 the command line (`msprobe -f pytorch compare`; msprobe.py imports "
            "run_ut, whose tensor_transport_layer/client.py imports twisted.internet.endpoints -> ssl) fail: "
            "ModuleNotFoundError: No module named 'service_identity'")
_PSUTIL = ("the command line (`msprobe -f pytorch compare`) imports msprobe/nan_analyze/utils.py, which imports "
           "psutil; 8.1.0's requirements do not list it (8.1.1 on do): ModuleNotFoundError: No module named 'psutil'")
PINS: dict[str, tuple[tuple[str, ...], str]] = {
    "1.0.1": (("numpy<2",), _NUMPY),
    "1.0.3": (("numpy<2", "service_identity"), _NUMPY + "; " + _TWISTED),
    **{v: (("service_identity",), _TWISTED) for v in ("1.0.4", "1.1.0", "1.1.1", "1.2.0", "1.2.1", "1.2.2", "1.3.0",
                                                      "8.1.1", "8.1.2", "8.3.0")},
    "8.1.0": (("service_identity", "psutil"), _TWISTED + "; " + _PSUTIL),
}
#: compatibility shims a release needs with torch 2.13 (``_pt_worker.apply_shims``), and why
SHIMS: dict[str, tuple[tuple[str, ...], str]] = {
    "1.0.1": (("torch.Any",), "with torch 2.13.0 `from msprobe.pytorch import PrecisionDebugger` fails: "
              "AttributeError: module 'torch' has no attribute 'Any' (msprobe/pytorch/free_benchmark/perturbed_layers/"
              "npu/improve_precision.py line 35 annotates `-> torch.Any`, which older torch re-exported from typing); "
              "the worker sets torch.Any = typing.Any before importing msprobe"),
}

_MS_VIEW = ("msprobe/mindspore/common/utils.py is_backward_hook_output_a_view() tests "
            "`getattr(ms, '__version__', '2.4.0') < '2.7.0'` as strings, true for '2.10.0', so with MindSpore 2.10 "
            "it never inspects CellBackwardHook.__call__ (which takes one tuple from MindSpore 2.7 on) and the cell "
            "hooks call bw_hook(*args): TypeError: CellBackwardHook.__call__() takes 2 positional arguments but 3 "
            "were given. The worker sets the module's cached answer (is_output_of_backward_hook_a_view) to what the "
            "same function computes with the version compared as numbers, before PrecisionDebugger is made")
_MS_EXECUTOR = ("msprobe/mindspore/dump/jit_dump.py imports `from mindspore.common.api import "
                "_MindsporeFunctionExecutor`, a private class MindSpore 2.10 calls _JitExecutor, so `from "
                "msprobe.mindspore import PrecisionDebugger` (and the MindSpore compare) fail: ImportError: cannot "
                "import name '_MindsporeFunctionExecutor' from 'mindspore.common.api'. The worker sets the old name "
                "to _JitExecutor before msprobe is imported, the fallback 1.2.2's jit_dump.py has itself")
_MS_NO_DG = ("at level L0/mix in PyNative mode msprobe/mindspore/common/utils.py is_graph_mode_cell_dump_allowed() "
             "is true when mindspore.ops has DumpGradient, and the release dumps cells through MindSpore's own "
             "statistics dump (debugger.step() -> GraphModeCellDump.step -> cell_dump_process.process_statistics_step),"
             " which MindSpore 2.10 does not write on CPU: FileCheckException for <dump>/step0/rank0/statistic.csv. "
             "The worker hides ops.DumpGradient after msprobe's import, so the release takes its own hook-based "
             "cell dump (its path on a MindSpore without DumpGradient, and 8.2.0's), which writes dump.json. PyNative "
             "modes only: ms_jit and ms_graph keep the release's own choice")
_MS_VARARGS = ("msprobe/mindspore/cell_processor.py forward_pre_hook/forward_hook call MindSpore's CellBackwardHook "
               "as bw_hook(*args), the API of MindSpore <= 2.6 (from 2.7 __call__(self, args) takes one tuple): "
               "TypeError: CellBackwardHook.__call__() takes 2 positional arguments but 3 were given. No MindSpore "
               "<= 2.6 installs here (the registry has 2.7.0-2.10.0 for cp311); the worker wraps __call__ so that "
               "bw_hook(a, b) is bw_hook((a, b)) (bw_hook(x) means the same in both APIs)")
#: compatibility shims a release needs with MindSpore 2.10 (``ms_*``: ``_ms_worker.apply_ms_shims``, after msprobe's
#: import; others: ``_pt_worker.apply_shims``, before it, in the dump and the compare), and why
MS_SHIMS: dict[str, tuple[tuple[str, ...], str]] = {
    **{v: (("mindspore._MindsporeFunctionExecutor",), _MS_EXECUTOR)
       for v in ("1.0.3", "1.0.4", "1.1.0", "1.1.1", "1.2.0", "1.2.1")},
    **{v: (("ms_cell_backward_hook_varargs",), _MS_VARARGS) for v in ("8.1.0", "8.1.1", "8.1.2")},
    **{v: (("ms_backward_hook_view",), _MS_VIEW) for v in ("8.2.0", "26.0.0", "26.1.0", "26.1.0.post1")},
    **{v: (("ms_backward_hook_view", "ms_no_dump_gradient"), f"{_MS_VIEW}. {_MS_NO_DG}")
       for v in ("8.2.1", "8.3.0", "8.3.1", "8.3.2", "8.3.3")},
}

#: releases whose requirements conflict with MindSpore 2.10's: installed with ``--no-deps``, then their requirements
#: except the conflicting ones (``EXCLUDED``) -> (excluded requirement names, why)
MS_NO_DEPS: dict[str, tuple[tuple[str, ...], str]] = {
    "26.0.0": (("protobuf",), "26.0.0 requires protobuf<=3.20.2 and mindspore 2.10.0 protobuf>=7.34.1 (pip: "
               "ResolutionImpossible); 26.0.0 imports protobuf only in msprobe/msaccucmp (Ascend dump parsing), "
               "so it is installed with --no-deps and its other requirements, MindSpore's protobuf kept"),
}
_REQS = ("import sys; from importlib import metadata as m; import re; ex = set(sys.argv[1:]); "
         "print('\\n'.join(r for r in (m.requires('mindstudio-probe') or []) if 'extra ==' not in r "
         "and re.split(r'[<>=!~; \\[]', r)[0].strip().lower() not in ex))")


def shims_for(version: str, framework: str) -> list[str]:
    """The shims of *version* under *framework* (``SHIMS`` for PyTorch, ``MS_SHIMS`` for MindSpore)."""
    return list((SHIMS if framework == "pytorch" else MS_SHIMS).get(version, ((), ""))[0])


def venv_dir(version: str, framework: str = "pytorch") -> Path:
    """The venv of one release (``-ms``: its MindSpore venv, MindSpore 2.10 needs numpy<2)."""
    return VENVS / (f"msprobe-{version}" if framework == "pytorch" else f"msprobe-{version}-ms")


def fixture_name(mode: str) -> str:
    """The folder of a mode's dump (``pt_<mode>`` for PyTorch; MindSpore modes are named ``ms_*``)."""
    return mode if mode in MS_MODES else f"pt_{mode}"


def _tail(text: str, n: int = 25) -> str:
    """The last *n* lines of *text*, after the traceback's last exception line when those lines do not hold it.

    MindSpore's compile errors end in a long source listing, which would push ``RuntimeError: ...`` out.
    """
    lines = text.strip().splitlines()
    raised = [ln for ln in lines if re.match(r"^[\w.]*(?:Error|Exception)\b", ln)]
    if raised and raised[-1] not in lines[-n:]:
        return "\n".join([raised[-1], "...", *lines[-n:]])
    return "\n".join(lines[-n:])


def _pip_lines(text: str) -> str:
    """The pip output without the local-index warnings this machine's pip.conf adds."""
    return "\n".join(ln for ln in text.splitlines() if "is ignored: it is neither a file nor a directory" not in ln)


def install(version: str, log: Path, framework: str = "pytorch") -> dict[str, Any]:
    """Create the release's venv and install torch (or MindSpore) + the release; what happened."""
    venv = venv_dir(version, framework)
    py = venv / "bin" / "python"
    pins, why = PINS.get(version, ((), ""))
    first = [TORCH] if framework == "pytorch" else list(MINDSPORE)
    reqs = [*first, f"mindstudio-probe=={version}", *(p for p in pins if p not in first)]
    cmd = [str(py), "-m", "pip", "install", *reqs]
    info: dict[str, Any] = {"venv": str(venv), "command": f"python3 -m venv {venv} && {venv}/bin/pip install "
                            + " ".join(f"'{r}'" if "<" in r else r for r in reqs)}
    if pins:
        info["pins"] = {"requirements": list(pins), "why": why}
    if not py.exists():
        made = subprocess.run(["nice", "-n", "10", BASE_PYTHON, "-m", "venv", str(venv)], capture_output=True,
                              text=True, check=False)
        if made.returncode != 0:
            return {**info, "ok": False, "error": _tail(made.stderr)}
    if framework == "mindspore":
        base = _ms_base()
        if isinstance(base, str):
            return {**info, "ok": False, "error": base}
        info["base"] = f"{MS_BASE} (a .pth file: its site-packages after the venv's own)"
        _link_ms_base(venv)
    if framework == "mindspore" and version in MS_NO_DEPS:
        excluded, why_nd = MS_NO_DEPS[version]
        cmd = [*cmd, "--no-deps"]
        info["command"] += (" --no-deps && pip install 'numpy<2' mindspore==2.10.0 <its requirements but "
                            + ", ".join(excluded) + ">")
        info["no_deps"] = {"excluded": list(excluded), "why": why_nd}
    proc = subprocess.run(["nice", "-n", "10", *cmd], capture_output=True, text=True, check=False)
    out = _pip_lines(proc.stdout + proc.stderr)
    if proc.returncode == 0 and "no_deps" in info:
        reqs_out = subprocess.run([str(py), "-c", _REQS, *info["no_deps"]["excluded"]], capture_output=True,
                                  text=True, check=False)
        wanted = [r for r in reqs_out.stdout.splitlines() if r.strip()]
        info["no_deps"]["installed"] = wanted
        proc = subprocess.run(["nice", "-n", "10", str(py), "-m", "pip", "install", *MINDSPORE, *wanted],
                              capture_output=True, text=True, check=False)  # MindSpore's numpy<2 kept too
        out += _pip_lines(proc.stdout + proc.stderr)
    log.write_text(out, encoding="utf-8")
    if proc.returncode != 0:
        return {**info, "ok": False, "error": _tail(out, 12)}
    top = "torch" if framework == "pytorch" else "mindspore"
    code = ("import json, platform; from importlib import metadata as m; print(json.dumps({p: m.version(p) for p in "
            f"('{top}', 'mindstudio-probe', 'numpy', 'pandas')}} | {{'python': platform.python_version()}}))")
    ver = subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=False)
    if ver.returncode != 0:
        return {**info, "ok": False, "error": _tail(ver.stderr)}
    return {**info, "ok": True, "versions": json.loads(ver.stdout.strip().splitlines()[-1])}


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def _ms_base() -> Path | str:
    """Make :data:`MS_BASE` when missing (the MindSpore every ``-ms`` venv sees); its site-packages or an error."""
    py = MS_BASE / "bin" / "python"
    if not py.exists():
        for cmd in ([BASE_PYTHON, "-m", "venv", str(MS_BASE)], [str(py), "-m", "pip", "install", *MINDSPORE]):
            done = subprocess.run(["nice", "-n", "10", *cmd], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                return _tail(_pip_lines(done.stdout + done.stderr), 12)
    return _site(MS_BASE)


def _link_ms_base(venv: Path) -> None:
    (_site(venv) / "zz_ms_base.pth").write_text(f"{_site(MS_BASE)}\n", encoding="utf-8")


def msprobe_config(dump_path: Path, level: str, summary: str) -> dict[str, Any]:
    """The config.json every release reads (the keys 1.0.1 documents; later releases accept them)."""
    return {"task": "statistics", "dump_path": str(dump_path), "rank": [], "step": [], "level": level,
            "seed": 1234, "is_deterministic": False, "enable_dataloader": False,
            "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": summary}}


def _unshare_ok() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def run_mode(version: str, mode: str, dest: Path, scratch: Path, isolate: bool) -> dict[str, Any]:
    """Train under the release in *mode*; move the dump to *dest*; the run's record for release.json."""
    if mode in MS_MODES:
        level, summary, graph = MS_MODES[mode]
        world, worker, framework = 1, "_ms_worker.py", "mindspore"
    else:
        level, summary, world = MODES[mode]
        graph, worker, framework = "", "_pt_worker.py", "pytorch"
    py = venv_dir(version, framework) / "bin" / "python"
    work = scratch / mode
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    dump = work / "dump"
    config = msprobe_config(dump, level, summary)
    (work / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    shims = shims_for(version, framework)
    spec = {"config": str(work / "config.json"), "world_size": world, "steps": STEPS, "shims": shims,
            "graph": graph, "result": str(work / "result.json")}
    (work / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"] if isolate else []
    cmd = ["nice", "-n", "10", *prefix, str(py), str(HERE / worker), str(work / "spec.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False, cwd=work)
    (work / "worker.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    rec: dict[str, Any] = {"framework": framework, "level": level, "summary_mode": summary, "world_size": world,
                           "pid_namespace": isolate, "config": {k: v for k, v in config.items() if k != "dump_path"}}
    if graph:
        rec["execution"] = graph
    if proc.returncode != 0 or not (work / "result.json").is_file():
        return {**rec, "ok": False, "error": _tail(proc.stdout + proc.stderr, 20)}
    result = json.loads((work / "result.json").read_text(encoding="utf-8"))
    shutil.rmtree(dest, ignore_errors=True)
    if not dump.is_dir():
        return {**rec, "ok": False, "error": "the run finished but wrote no dump folder"}
    shutil.move(str(dump), str(dest))
    return {**rec, "ok": True, "losses": {r: v["losses"] for r, v in result["ranks"].items()},
            "attach": result["ranks"]["0"]["attach"], "files": sorted(str(p.relative_to(dest))
                                                                      for p in dest.rglob("*") if p.is_file())}


def run_truth(version: str, dump: Path, out: Path, scratch: Path, framework: str = "pytorch") -> dict[str, Any]:
    """The release's compare of each rank file of *dump* against itself, written to *out*."""
    py = venv_dir(version, framework) / "bin" / "python"
    work = scratch / f"truth_{dump.name}"
    shutil.rmtree(work, ignore_errors=True)
    shims = ",".join(shims_for(version, framework))
    cmd = ["nice", "-n", "10", str(py), str(HERE / "_truth.py"), str(dump), str(out), str(work), shims]
    proc = subprocess.run(cmd,
                          capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode != 0 or not out.is_file():
        return {"ok": False, "error": _tail(proc.stdout + proc.stderr, 20)}
    doc = json.loads(out.read_text(encoding="utf-8"))
    bad = {rel: f.get("error") for rel, f in doc["files"].items() if "rows" not in f}
    return {"ok": not bad, "files": len(doc["files"]), **({"errors": bad} if bad else {})}


def generate(version: str, out: Path, modes: list[str]) -> dict[str, Any]:
    """Install, run and read one release in *modes*; update ``<out>/<version>/release.json``; return it.

    The PyTorch modes use the release's venv (record ``install``), the MindSpore modes its ``-ms`` venv
    (record ``install_ms``). Modes not given keep their earlier record and files.
    """
    rel_dir = out / version
    if set(modes) >= set(MODES) | set(MS_RELEASES.get(version, ())):
        shutil.rmtree(rel_dir, ignore_errors=True)  # a whole release: nothing of an earlier generation stays
    for mode in modes:  # nor of the modes made again
        shutil.rmtree(rel_dir / fixture_name(mode), ignore_errors=True)
        (rel_dir / f"{fixture_name(mode)}.truth.json").unlink(missing_ok=True)
    rel_dir.mkdir(parents=True, exist_ok=True)
    previous = rel_dir / "release.json"
    record: dict[str, Any] = json.loads(previous.read_text(encoding="utf-8")) if previous.is_file() else {}
    record["release"] = version
    record.setdefault("runs", {})
    for mode in modes:
        record["runs"].pop(mode, None)
    if version in SHIMS:
        record["shims"] = {"names": list(SHIMS[version][0]), "why": SHIMS[version][1]}
    if version in MS_SHIMS and any(m in MS_MODES for m in modes):
        record["shims_ms"] = {"names": list(MS_SHIMS[version][0]), "why": MS_SHIMS[version][1]}
    # no '.' in the scratch path: MindSpore's graph dump accepts only letters, digits, '-', '_' and '/' in a dump path
    scratch = Path(tempfile.mkdtemp(prefix=f"msprobe-matrix-{version.replace('.', '_')}-"))
    isolate = _unshare_ok()
    for framework, key, wanted in (("pytorch", "install", [m for m in modes if m in MODES]),
                                   ("mindspore", "install_ms", [m for m in modes if m in MS_MODES])):
        if not wanted:
            continue
        print(f"[{version}] installing ({framework})", flush=True)
        inst = record[key] = install(version, scratch / f"pip_{framework}.log", framework)
        if not inst["ok"]:
            print(f"[{version}] install failed: {inst['error'].splitlines()[-1:]}", flush=True)
            continue
        for mode in wanted:
            if mode == "L1_2rank" and version not in TWO_RANK_RELEASES:
                continue
            print(f"[{version}] {mode}", flush=True)
            dest = rel_dir / fixture_name(mode)
            run = run_mode(version, mode, dest, scratch, isolate)
            if run["ok"]:
                run["truth"] = run_truth(version, dest, rel_dir / f"{fixture_name(mode)}.truth.json", scratch,
                                         framework)
            record["runs"][mode] = run
    first = ("install", "install_ms", "shims", "shims_ms")
    record = {"release": record.pop("release"), **{k: record.pop(k) for k in first if k in record}, **record}
    previous.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(scratch, ignore_errors=True)
    scrub(rel_dir)
    return record


def scrub(folder: Path) -> list[Path]:
    """Rewrite this machine's folders in *folder*'s text files; the files rewritten.

    The samples' scrub, then the venvs' folder as ``<venvs>``. A path left afterwards is an error (the scrub
    needs a rule for it).
    """
    changed = set(scrub_tree(folder)) | set(scrub_tree(folder, [(VENVS, "<venvs>")]))
    left = {str(p): leftovers(p.read_text(encoding="utf-8", errors="replace"))[:3]
            for p in folder.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()}
    left = {k: v for k, v in left.items() if v}
    if left:
        raise SystemExit(f"absolute paths left after the scrub: {dict(list(left.items())[:5])}")
    return sorted(changed)


TABLE_START = "<!-- msprobe-releases-table: generated by `python tools/msprobe_matrix/generate.py --table` -->"
TABLE_END = "<!-- /msprobe-releases-table -->"


def put_table(readme: Path, table: str) -> None:
    """Replace what is between README's table markers by *table*."""
    text = readme.read_text(encoding="utf-8")
    head, sep, rest = text.partition(TABLE_START)
    _, sep2, tail = rest.partition(TABLE_END)
    if not sep or not sep2:
        raise SystemExit(f"{readme}: the msprobe-releases-table markers are missing")
    readme.write_text(f"{head}{TABLE_START}\n{table}\n{TABLE_END}{tail}", encoding="utf-8")


def releases_in(out: Path) -> list[str]:
    """The release folders of *out*."""
    return sorted(p.name for p in out.iterdir() if (p / "release.json").is_file())


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/msprobe_releases"))
    ap.add_argument("--only", nargs="+", metavar="VERSION", help="these releases only (default: all)")
    ap.add_argument("--modes", nargs="+", choices=[*MODES, *MS_MODES],
                    help="these modes only (default: the PyTorch modes, and the MindSpore ones for MS_RELEASES)")
    ap.add_argument("--table", action="store_true", help="print the README table from the fixtures (needs precnb)")
    ap.add_argument("--readme", type=Path, metavar="README", help="with --table: put it between README's markers")
    ap.add_argument("--scrub", action="store_true",
                    help="only rewrite the machine's folders in the committed fixtures of --out (what a generation "
                         "does to each release it writes); the venvs' folder is MSPROBE_MATRIX_VENVS")
    args = ap.parse_args(argv)
    if args.scrub:
        for version in args.only or releases_in(args.out):
            print(f"{version}: {len(scrub(args.out / version))} file(s) rewritten")
        return 0
    if args.table:
        sys.path.insert(0, str(HERE))
        from conformance import readme_table  # needs precnb

        table = readme_table(args.out)
        print(table)
        if args.readme:
            put_table(args.readme, table)
        return 0
    versions = args.only or list(RELEASES)
    unknown = [v for v in versions if v not in RELEASES]
    if unknown:
        ap.error(f"not a release of the matrix: {', '.join(unknown)} (known: {', '.join(RELEASES)})")
    failed = 0
    for version in versions:
        modes = args.modes or [*MODES, *MS_RELEASES.get(version, ())]
        rec = generate(version, args.out, modes)
        failed += not all(rec[k]["ok"] for k in ("install", "install_ms") if k in rec) or not all(
            r["ok"] and r["truth"]["ok"] for r in rec["runs"].values())
    print(f"done: {len(versions)} release(s), {failed} with a failure (see <out>/<version>/release.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
