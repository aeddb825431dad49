"""What a parallel layout costs ``precnb diff`` on the real Megatron-Core corpus (issue 24).

The same target dumps are diffed twice: against a run of the same layout (compared rank by rank, no
merge) and against the single-rank ``tp1pp1`` run, step 0 on both sides (the target's layout read from the dumps, its TP
shards merged and its pipeline stages stitched into the whole model before comparing). Both
``precnb diff --json`` end to end (interpreter start included) and the in-process
``precnb.diagnose`` are timed, alternating the two cases; the findings are printed next to the
medians so a fast wrong answer cannot pass. Results: medians and their ratio, measured in one run.

    python benchmarks/bench_layout.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's precnb, in process too
MG = ROOT / "data_samples" / "megatron"

#: target -> (same-layout baseline, other-layout baseline)
CASES = {
    "tp2pp2_scaled": ("tp2pp2", "tp1pp1"),
    "tp2pp1_wrong_shard": ("tp2pp1", "tp1pp1"),
    "tp1pp2_nan": ("tp1pp2", "tp1pp1"),
}


def cli_seconds(baseline: str, target: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "precnb", "diff", str(MG / baseline), str(MG / target), "--json",
                        "--steps", "0"],
                       cwd=ROOT, capture_output=True, text=True, check=False)
    dt = time.perf_counter() - t0
    if p.returncode not in (0, 1):
        raise SystemExit(p.stderr)
    return dt, json.loads(p.stdout)


def inproc_seconds(baseline: str, target: str) -> tuple[float, dict]:
    import precnb

    t0 = time.perf_counter()
    f = precnb.diagnose(str(MG / target), baseline=str(MG / baseline), steps=[0], progress=False).finding
    return time.perf_counter() - t0, {"kind": f.kind, "step": f.step, "rank": f.rank, "node": f.node}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bytecode import compile_precnb

    compile_precnb()  # an installed package's bytecode, not compiled inside what is timed (see _bytecode)
    res: dict[str, dict] = {}
    for target in args.cases:
        same, other = CASES[target]
        times: dict[str, list[float]] = {"cli same layout": [], "cli with layout": [],
                                         "in-process same layout": [], "in-process with layout": []}
        found: dict[str, dict] = {}
        for _ in range(args.reps):  # alternate the cases, so load on the machine hits both alike
            for label, base in (("same layout", same), ("with layout", other)):
                dt, f = cli_seconds(base, target)
                times[f"cli {label}"].append(dt)
                found[f"cli {label}"] = {k: f.get("finding", f).get(k) for k in ("kind", "step", "rank", "node")}
                dt, g = inproc_seconds(base, target)
                times[f"in-process {label}"].append(dt)
                found[f"in-process {label}"] = g
        med = {k: statistics.median(v) for k, v in times.items()}
        res[target] = {
            "baselines": {"same layout": same, "with layout": other},
            "seconds_median": med,
            "cli_with_layout_over_same_layout": med["cli with layout"] / med["cli same layout"],
            "in_process_with_layout_over_same_layout": med["in-process with layout"] / med["in-process same layout"],
            "findings": found,
        }
    print(json.dumps({"reps": args.reps, "cases": res}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
