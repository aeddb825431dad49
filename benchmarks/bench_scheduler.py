"""``precnb nan --scheduler``: a real Dask cluster (separate scheduler and worker processes) with 1 and 2 workers.

Ratios in one run: the same command on the same generated tree (``generate.py``, real msprobe structure), with the
cluster's workers parsing the files; 1-worker and 2-worker clusters alternate, each measured end to end (interpreter
start and connection included); medians. Also the local run (``--workers auto``) for scale.

Usage::

    python benchmarks/bench_scheduler.py [--ranks 64] [--reps 5] [--out benchmarks/RESULTS_scheduler.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate  # noqa: E402
from _cluster import dask_cluster  # noqa: E402


def timed(argv: list[str]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "precnb", *argv, "--json"], capture_output=True, text=True, timeout=3600,
                       cwd=HERE.parent)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"precnb {' '.join(argv)} failed: {p.stderr[-2000:]}")
    return dt, json.loads(p.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "precnb-bench-scheduler")
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS_scheduler.md")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bytecode import compile_precnb

    compile_precnb()  # an installed package's bytecode, not compiled inside what is timed (see _bytecode)
    tree = args.workdir / f"r{args.ranks}"
    if not (tree / "manifest.json").exists():
        m = generate.generate(tree, ranks=args.ranks, steps=4, quiet=True, trees=("nan",))
        (tree / "manifest.json").write_text(json.dumps(m))
    m = json.loads((tree / "manifest.json").read_text())
    truth = (m["nan"]["step"], m["nan"]["rank"], m["nan"]["node"])
    cmd = ["nan", str(tree / "nan")]
    times: dict[str, list[float]] = {"local (--workers auto)": [], "cluster, 1 worker": [], "cluster, 2 workers": []}
    answers = {}
    t_start = time.time()
    with dask_cluster(args.workdir / "c1", 1) as one, dask_cluster(args.workdir / "c2", 2) as two:
        runs = {"local (--workers auto)": cmd, "cluster, 1 worker": [*cmd, "--scheduler", one],
                "cluster, 2 workers": [*cmd, "--scheduler", two]}
        for i in range(args.reps):
            for label in (list(runs) if i % 2 == 0 else list(reversed(runs))):
                dt, f = timed(runs[label])
                times[label].append(dt)
                answers[label] = (f.get("step"), f.get("rank"), f.get("node"))
    med = {k: statistics.median(v) for k, v in times.items()}
    speedup = med["cluster, 1 worker"] / med["cluster, 2 workers"]
    mb = sum(p.stat().st_size for p in (tree / "nan").rglob("*.json")) / 1e6
    lines = ["# precnb on a real Dask cluster (`--scheduler`)", "",
             f"Written by `benchmarks/bench_scheduler.py` on {time.strftime('%Y-%m-%d %H:%M')} in "
             f"{(time.time() - t_start) / 60:.1f} min: `precnb nan RUN --json` on {args.ranks} ranks × 4 steps "
             f"({mb:.0f} MB of JSON), medians of {args.reps} alternating runs, each end to end (interpreter start "
             f"and connection included). Cluster: `dask scheduler` + `dask worker --nthreads 1` processes on "
             f"this machine ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end).", "",
             "| run | median | answer |", "|---|---:|---|"]
    for k, v in med.items():
        ok = "✓" if answers[k] == truth else "✗"
        lines.append(f"| {k} | {v:.2f} s | step {answers[k][0]}, rank {answers[k][1]}, {answers[k][2]} {ok} |")
    lines += ["", f"1 → 2 workers: **×{speedup:.2f}** (injected: step {truth[0]}, rank {truth[1]}, {truth[2]})."]
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps({"ranks": args.ranks, "reps": args.reps, "medians": med,
                                                         "speedup_1_to_2": speedup, "answers": answers,
                                                         "truth": truth}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
