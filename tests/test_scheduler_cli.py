"""``--scheduler ADDRESS`` / ``$PRECNB_SCHEDULER``: the command line on a real Dask cluster.

A ``dask scheduler`` and two ``dask worker`` processes are started as on a cluster (separate processes, talking
over TCP on loopback); ``precnb diff``, ``nan``, ``anomalies``, ``convert`` and ``report`` connect to it and give
the same answer as a local run, and the files are parsed by the workers (the scheduler's task log says so).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._cluster import DASK, dask_cluster
from tests.conftest import SAMPLES

pytestmark = pytest.mark.slow


def _precnb(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "precnb", *args], capture_output=True, text=True, timeout=600,
                          env=env, cwd=cwd)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A scheduler and two single-threaded workers, each its own process; yields the scheduler's address."""
    if not DASK.is_file():
        pytest.fail(f"{DASK} missing: dask's command line comes with the core dependencies (distributed)")
    with dask_cluster(tmp_path_factory.mktemp("cluster"), 2) as address:
        yield address


def _task_count(address: str) -> int:
    """Tasks the cluster's workers have run so far (from the scheduler)."""
    from distributed import Client

    with Client(address, timeout="30s") as c:
        return sum(len(v) for v in c.run(lambda dask_worker: list(dask_worker.state.log)).values())


def _finding(proc: subprocess.CompletedProcess) -> tuple:
    assert proc.returncode == 0, proc.stderr
    f = json.loads(proc.stdout)
    return f["kind"], f["step"], f["rank"], f["node"]


@pytest.mark.parametrize("argv", [
    ["nan", str(SAMPLES / "dp_nan")],
    ["diff", str(SAMPLES / "divergence" / "baseline"), str(SAMPLES / "divergence" / "target")],
    ["anomalies", str(SAMPLES / "monitor")],
], ids=["nan", "diff", "anomalies"])
def test_same_finding_as_a_local_run(cluster, argv):
    before = _task_count(cluster)
    local = _finding(_precnb(*argv, "--json"))
    assert _task_count(cluster) == before  # the measure below tells a cluster run from a local one
    remote = _finding(_precnb(*argv, "--json", "--scheduler", cluster))
    assert remote == local
    assert _task_count(cluster) > before  # the files were parsed by the cluster's workers


def test_the_environment_variable_names_the_scheduler(cluster):
    env = {**os.environ, "PRECNB_SCHEDULER": cluster}
    before = _task_count(cluster)
    assert _finding(_precnb("nan", str(SAMPLES / "dp_nan"), "--json", env=env))[1:] == (1, 1, "Torch.sqrt.0.forward")
    assert _task_count(cluster) > before


def test_convert_and_report_on_the_cluster(cluster, tmp_path):
    pytest.importorskip("jinja2", reason="the report needs the [notebook] extra")
    conv = _precnb("convert", str(SAMPLES / "dp_nan"), "-o", str(tmp_path / "run.zarr"), "--scheduler", cluster)
    assert conv.returncode == 0, conv.stderr
    assert _finding(_precnb("nan", str(tmp_path / "run.zarr"), "--json")) == _finding(
        _precnb("nan", str(SAMPLES / "dp_nan"), "--json"))
    rep = _precnb("report", str(SAMPLES / "dp_nan"), "-o", str(tmp_path / "r.html"), "--scheduler", cluster)
    assert rep.returncode == 0, rep.stderr
    assert "Torch.sqrt.0.forward" in (tmp_path / "r.html").read_text(encoding="utf-8")


def test_an_unreachable_scheduler_is_one_line(tmp_path):
    env = {**os.environ, "PRECNB_SCHEDULER_TIMEOUT": "2s"}
    proc = _precnb("nan", str(SAMPLES / "dp_nan"), "--scheduler", "tcp://127.0.0.1:9", env=env)
    assert proc.returncode == 1
    assert proc.stderr.startswith("precnb nan: error: cannot reach the Dask scheduler at tcp://127.0.0.1:9 "
                                  "(--scheduler)") and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("bad", ["not an address", "tcp://", "http//x:1"])
def test_a_malformed_address_is_a_usage_error(bad):
    proc = _precnb("nan", str(SAMPLES / "dp_nan"), "--scheduler", bad)
    assert proc.returncode == 2 and "Dask scheduler address" in proc.stderr, proc.stderr
    env = {**os.environ, "PRECNB_SCHEDULER": bad}
    proc = _precnb("nan", str(SAMPLES / "dp_nan"), env=env)
    assert proc.returncode == 2 and "$PRECNB_SCHEDULER" in proc.stderr, proc.stderr


def test_dask_cli_present():
    assert shutil.which("dask", path=str(DASK.parent)), "dask's command line is needed by the cluster tests"
