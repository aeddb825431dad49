"""Benchmark: reading a MindSpore tensor-layout kernel dump vs the raw floor, as a ratio in one run.

The floor is what any reader must do: list the files, ``np.load`` each one and reduce it to
max/min/mean/norm in float64. precnb additionally parses names, the graph IR and builds the
dataset. Prints medians of ``--reps`` runs of each, interleaved::

    python benchmarks/bench_kernel_tensors.py [PATH ...] [--reps 5]

Default paths: the bundled ``data_samples/kernel_resume/{correct,bad}`` and the shared S14 dump
when ``../shared`` is present.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def floor(path: Path) -> int:
    """np.load + float64 statistics of every .npy below *path*; the number of files."""
    n = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            if f.endswith(".npy"):
                x = np.load(os.path.join(dirpath, f), allow_pickle=False).astype(np.float64).ravel()
                if x.size:
                    x.max(), x.min(), x.mean(), np.sqrt(np.sum(x * x))
                n += 1
    return n


def precnb_load(path: Path) -> int:
    """precnb's reader in this process (no worker pool); the number of (step, rank, tensor) entries."""
    from precnb.io.mindspore._names import _cached_table
    from precnb.io.mindspore.tensors import open_ms_kernel_tensors

    _cached_table.cache_clear()  # parse the IR every time, as a fresh process would
    ds = open_ms_kernel_tensors(path, progress=False, workers=1)
    return int(ds["present"].sum())


def main(argv: list[str] | None = None) -> int:
    """Print one line per path: files, medians and the ratio precnb / floor."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bytecode import compile_precnb

    compile_precnb()  # an installed package's bytecode, not compiled inside what is timed (see _bytecode)
    shared = Path(os.environ.get("PRECNB_SHARED", ROOT.parent / "shared"))
    bundled = ROOT / "data_samples/kernel_resume"
    paths = args.paths or [bundled / "correct/dump", bundled / "bad/dump",
                           shared / "data_samples/msprobe/S14_ms_kernel_resume/correct/dump"]
    print("| dump | files | floor median s | precnb median s | ratio |")
    print("|---|---|---|---|---|")
    for p in paths:
        if not p.exists():
            continue
        t_floor, t_precnb = [], []
        n_files = n_entries = 0
        for _ in range(args.reps):
            t0 = time.perf_counter()
            n_files = floor(p)
            t1 = time.perf_counter()
            n_entries = precnb_load(p)
            t2 = time.perf_counter()
            t_floor.append(t1 - t0)
            t_precnb.append(t2 - t1)
        assert n_entries == n_files, (n_entries, n_files)
        mf, mp = statistics.median(t_floor), statistics.median(t_precnb)
        print(f"| {p.relative_to(p.parents[2])} | {n_files} | {mf:.3f} | {mp:.3f} | {mp / mf:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
