"""Start a real Dask cluster as separate processes (``dask scheduler`` + ``dask worker``), as on a cluster.

Used by ``bench_scheduler.py`` and by ``tests/test_scheduler_cli.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

DASK = Path(sys.executable).with_name("dask")


@contextlib.contextmanager
def dask_cluster(work: Path, n_workers: int, *, timeout: float = 120) -> Iterator[str]:
    """A scheduler on 127.0.0.1 and *n_workers* single-threaded worker processes; yields the scheduler address."""
    work.mkdir(parents=True, exist_ok=True)
    sfile = work / "scheduler.json"
    sfile.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PRECNB_NO_DASK_CLIENT"}
    logs = []

    def start(argv: list[str], log: str) -> subprocess.Popen:
        fh = open(work / log, "w")  # noqa: SIM115 - closed below
        logs.append(fh)
        return subprocess.Popen([str(DASK), *argv], cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=fh)

    procs = [start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                    str(sfile)], "scheduler.log")]
    try:
        deadline = time.monotonic() + timeout
        while not sfile.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not sfile.exists():
            raise RuntimeError(f"dask scheduler did not start: {(work / 'scheduler.log').read_text()[-2000:]}")
        for i in range(n_workers):
            procs.append(start(["worker", "--scheduler-file", str(sfile), "--nworkers", "1", "--nthreads", "1",
                                "--no-dashboard", "--name", f"w{i}", "--local-directory", str(work / f"w{i}")],
                               f"w{i}.log"))
        address = json.loads(sfile.read_text())["address"]
        from distributed import Client

        with Client(address, timeout="30s") as c:
            c.wait_for_workers(n_workers, timeout=timeout)
        yield address
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        for fh in logs:
            fh.close()
