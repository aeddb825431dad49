"""Run the Megatron-Core side of the ``megatron`` sample in its own interpreter (torch-free here).

Megatron-Core 0.19.2 (with ``triton``, which it imports unconditionally) and ``transformers`` live in a venv
of their own, named by the ``PRECNB_MEGATRON_PYTHON`` environment variable (see :data:`RECIPE`); the
workers ``_mg_worker.py`` / ``_hf_worker.py`` next to this file run there and import neither precnb nor
this package.

>>> ENV
'PRECNB_MEGATRON_PYTHON'
>>> "--ignore-requires-python" in RECIPE
True
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._ms_run import interpreter, probe_versions, run_worker

__all__ = ["ENV", "MEGATRON_VERSION", "RECIPE", "megatron_python", "megatron_versions", "require_megatron",
           "run_mg"]

ENV = "PRECNB_MEGATRON_PYTHON"
MEGATRON_VERSION = "0.19.2"
RECIPE = ("python3.11 -m venv ~/venvs/megatron && ~/venvs/megatron/bin/pip install torch==2.13.0 "
          "mindstudio-probe==26.2.0 triton transformers && ~/venvs/megatron/bin/pip download --no-deps "
          "--ignore-requires-python megatron-core==0.19.2 -d mg-wheel && ~/venvs/megatron/bin/pip install "
          "--ignore-requires-python mg-wheel/megatron_core-0.19.2-cp311-*.whl && "
          "export PRECNB_MEGATRON_PYTHON=~/venvs/megatron/bin/python  "
          "(megatron-core 0.19.2 declares Requires-Python >=3.12, so plain pip on 3.11 picks 0.16)")


def megatron_python() -> str:
    """The interpreter named by ``PRECNB_MEGATRON_PYTHON``; ImportError naming the recipe if unusable."""
    return interpreter(ENV, RECIPE, f"the Megatron-Core sample needs a megatron-core {MEGATRON_VERSION} interpreter")


def megatron_versions(exe: str | None = None) -> dict[str, str]:
    """Versions of torch, megatron-core, msprobe, transformers and triton in that interpreter (checked once)."""
    code = ("import json, platform; from importlib import metadata; import megatron.core, transformers; "
            "print(json.dumps({k: metadata.version(k) for k in ('torch', 'megatron-core', 'mindstudio-probe', "
            "'transformers', 'triton')} | {'python': platform.python_version()}))")
    found = probe_versions(exe or megatron_python(), code, env=ENV, recipe=RECIPE,
                           imports="megatron.core and transformers")
    if found["megatron-core"] != MEGATRON_VERSION or not found["torch"].startswith("2.13.0") \
            or found["mindstudio-probe"] != "26.2.0":
        raise ImportError(f"${ENV} has {found}; the sample is made with megatron-core {MEGATRON_VERSION}, "
                          f"torch 2.13.0 and mindstudio-probe 26.2.0: {RECIPE}")
    return found


def require_megatron() -> None:
    """Fail early (ImportError) when the Megatron interpreter is missing or wrong."""
    megatron_versions()


def run_mg(spec: Mapping[str, Any], *, log_dir: Path, tag: str, timeout: float = 3600) -> dict[str, Any]:
    """Run ``_mg_worker.py`` with *spec* in the Megatron interpreter; return its result JSON."""
    return run_worker(megatron_python(), "_mg_worker.py", {**spec, "tag": tag, "log_dir": str(log_dir)},
                      log_dir=log_dir, tag=tag, env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
                      timeout=timeout, what="Megatron worker")
