"""Run the MindSpore side of a sample in its own interpreter (torch-free, mindspore-free).

MindSpore 2.10 wheels need ``numpy<2`` while precnb needs numpy 2, so the MindSpore workers run
as subprocesses of a separate interpreter named by the ``PRECNB_MINDSPORE_PYTHON`` environment
variable (see :data:`RECIPE`). The workers are standalone scripts next to this file
(``_ms_port_worker.py``, ``_ms_kernel_worker.py``); they import neither precnb nor torch.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ENV", "MINDSPORE_VERSION", "RECIPE", "mindspore_python", "mindspore_versions",
           "require_mindspore", "run_ms", "run_worker", "worker_path"]

ENV = "PRECNB_MINDSPORE_PYTHON"
MINDSPORE_VERSION = "2.10.0"
RECIPE = ("python3 -m venv ~/venvs/ms && ~/venvs/ms/bin/pip install 'numpy<2' "
          "mindspore==2.10.0 mindstudio-probe==26.2.0 && "
          "export PRECNB_MINDSPORE_PYTHON=~/venvs/ms/bin/python")
_HERE = Path(__file__).resolve().parent
_checked: dict[str, dict[str, str]] = {}


def worker_path(name: str) -> Path:
    """The path of a worker script shipped next to this module."""
    return _HERE / name


def interpreter(env: str, recipe: str, needs: str) -> str:
    """The interpreter named by the environment variable *env*; ImportError naming *recipe* if unusable.

    *needs* says what it is for, in the message (``"the MindSpore samples need a MindSpore 2.10 interpreter"``).
    """
    exe = os.environ.get(env, "").strip()
    if not exe:
        raise ImportError(f"{needs} in ${env}: {recipe}")
    if not (Path(exe).is_file() and os.access(exe, os.X_OK)):
        raise ImportError(f"${env}={exe!r} is not an executable file; create it with: {recipe}")
    return exe


def probe_versions(exe: str, code: str, *, env: str, recipe: str, imports: str) -> dict[str, str]:
    """Run *code* (which prints one JSON object of versions) in *exe*, once per interpreter; the object.

    ImportError naming *recipe* when it fails (*imports*: what it could not import, for the message).
    """
    if exe in _checked:
        return _checked[exe]
    out = subprocess.run([exe, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise ImportError(f"${env}={exe!r} cannot import {imports} "
                          f"({out.stderr.strip().splitlines()[-1:] or out.returncode}); create it with: {recipe}")
    found: dict[str, str] = json.loads(lines[-1])
    _checked[exe] = found
    return found


def mindspore_python() -> str:
    """The interpreter named by ``PRECNB_MINDSPORE_PYTHON``; ImportError naming the recipe if unusable."""
    return interpreter(ENV, RECIPE, f"the MindSpore samples need a MindSpore {MINDSPORE_VERSION} interpreter "
                                    "(MindSpore needs numpy<2, so it lives in a venv of its own)")


def mindspore_versions(exe: str | None = None) -> dict[str, str]:
    """Versions of mindspore, numpy and msprobe in the MindSpore interpreter (checked once)."""
    code = ("import json, platform, numpy, mindspore; from importlib import metadata; "
            "print(json.dumps({'mindspore': mindspore.__version__, 'numpy': numpy.__version__, "
            "'mindstudio-probe (msprobe)': metadata.version('mindstudio-probe'), "
            "'python': platform.python_version()}))")
    found = probe_versions(exe or mindspore_python(), code, env=ENV, recipe=RECIPE,
                           imports="mindspore, numpy and msprobe")
    if found["mindspore"] != MINDSPORE_VERSION:
        raise ImportError(f"${ENV} has mindspore {found['mindspore']}; the samples are made with "
                          f"{MINDSPORE_VERSION}: {RECIPE}")
    return found


def require_mindspore() -> None:
    """Fail early (ImportError) when the MindSpore interpreter is missing or wrong."""
    mindspore_versions()


def run_worker(exe: str, script: str, spec: Mapping[str, Any], *, log_dir: Path, tag: str,
               env: Mapping[str, str] | None = None, timeout: float = 1800, what: str = "worker") -> dict[str, Any]:
    """Run ``worker_path(script)`` with *spec* in the interpreter *exe*; return its result JSON.

    The spec gets a ``result`` path in *log_dir*; the worker's output goes to
    ``log_dir/<tag>.log`` (its tail is in the error when it fails). *what* names the worker in errors.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    spec_path = log_dir / f"{tag}_spec.json"
    result_path = log_dir / f"{tag}_result.json"
    spec_path.write_text(json.dumps({**spec, "result": str(result_path)}, indent=1), encoding="utf-8")
    log = log_dir / f"{tag}.log"
    full_env = {**os.environ, **(env or {})}
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.run([exe, str(worker_path(script)), str(spec_path)], stdout=fh,
                              stderr=subprocess.STDOUT, env=full_env, timeout=timeout, check=False)
    if proc.returncode != 0 or not result_path.is_file():
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{what} {script} ({tag}) failed with code {proc.returncode}; "
                           f"log {log}:\n{tail}")
    result: dict[str, Any] = json.loads(result_path.read_text(encoding="utf-8"))
    return result


def run_ms(script: str, spec: Mapping[str, Any], *, log_dir: Path, tag: str,
           env: Mapping[str, str] | None = None, timeout: float = 1800) -> dict[str, Any]:
    """Run ``worker_path(script)`` with *spec* in the MindSpore interpreter (see :func:`run_worker`)."""
    return run_worker(mindspore_python(), script, spec, log_dir=log_dir, tag=tag,
                      env={"GLOG_v": "3", **(env or {})}, timeout=timeout, what="MindSpore worker")


def run_ms_command(args: list[str], *, log_dir: Path, tag: str, timeout: float = 900) -> int:
    """Run ``PRECNB_MINDSPORE_PYTHON -m <args>`` (e.g. ``msprobe compare``), output to a log; the exit code."""
    exe = mindspore_python()
    log = log_dir / f"{tag}.log"
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.run([exe, *args], stdout=fh, stderr=subprocess.STDOUT,
                              env={**os.environ, "GLOG_v": "3"}, timeout=timeout, check=False)
    return proc.returncode
