"""The memory of ``first_divergence`` on two runs already in memory: its transient against one dataset.

Each measurement runs in a fresh interpreter: both runs are opened (``open_run``, a subset of a
``bench_ranks.py`` tree's ranks), then the process RSS is sampled every 5 ms while
``first_divergence`` runs; the transient is the peak minus the RSS before it, reported as a multiple of
one run's ``Dataset.nbytes``. ``--code DIR`` imports precnb from another checkout (the code before a
change), so both are measured in one session, alternating.

Usage::

    python benchmarks/bench_compare_memory.py --ranks 1024 --rank-from 1024 --tree /tmp/precnb-ranks/r4096 \\
        --code /work/main --reps 2 --results /tmp/RESULTS_compare_memory.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

_ONE = r"""
import json, os, sys, threading, time
sys.path.insert(0, sys.argv[1])
os.environ["PRECNB_NO_DASK_CLIENT"] = "1"
import warnings; warnings.simplefilter("ignore")
import psutil
import precnb
def main():
    tree, first, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ranks = list(range(first, first + n))
    b = precnb.open_run(tree + "/baseline", ranks=ranks, progress=False, workers=2)
    d = precnb.open_run(tree + "/diverge", ranks=ranks, progress=False, workers=2)
    proc, peak = psutil.Process(), [0]
    def sample():
        while True:
            peak[0] = max(peak[0], proc.memory_info().rss); time.sleep(0.005)
    threading.Thread(target=sample, daemon=True).start()
    time.sleep(0.1)
    before = proc.memory_info().rss; peak[0] = before
    c = time.process_time()
    f = precnb.first_divergence(b, d)
    cpu = time.process_time() - c
    time.sleep(0.05)
    print(json.dumps({"code": precnb.__file__, "dataset_bytes": b.nbytes, "rss_before": before, "peak": peak[0],
                      "transient_x": (peak[0] - before) / b.nbytes, "cpu_s": cpu,
                      "finding": {"step": f.step, "rank": f.rank, "node": f.node}}))
if __name__ == "__main__":
    main()
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--rank-from", type=int, default=0, help="first rank of the subset")
    ap.add_argument("--tree", type=Path, help="a bench_ranks.py tree (baseline/, diverge/); default: build one")
    ap.add_argument("--out", type=Path, default=Path("/tmp/precnb-ranks"), help="where to build the tree")
    ap.add_argument("--code", type=Path, action="append", default=[], help="another checkout to measure too")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--results", type=Path, required=True, help="JSON results (never into benchmarks/)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bytecode import compile_precnb

    compile_precnb()  # an installed package's bytecode, not compiled inside what is timed (see _bytecode)
    tree = args.tree
    if tree is None:
        sys.path.insert(0, str(HERE))
        import run  # the tree cache of the benchmarks

        tree, _ = run.trees(args.out, args.rank_from + args.ranks)
    rows = []
    for rep in range(args.reps):
        for code in [HERE.parent, *args.code]:
            r = subprocess.run([sys.executable, "-c", _ONE, str(code), str(tree), str(args.rank_from),
                                str(args.ranks)], capture_output=True, text=True, check=True, cwd=code)
            rows.append({"rep": rep, **json.loads(r.stdout.strip().splitlines()[-1])})
            print(json.dumps(rows[-1]), flush=True)
    args.results.write_text(json.dumps({"ranks": args.ranks, "rank_from": args.rank_from, "tree": str(tree),
                                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
