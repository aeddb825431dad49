"""What aligning runs whose names differ costs ``precnb diff``, at 64 ranks.

Two 64-rank, 2-step trees are built from the bundled ``renamed`` sample (Hugging Face names vs
Megatron names, same weights and data, a fault at step 1) with ``benchmarks/generate.py`` (the
same per-(step, rank) factors on both sides), plus a same-name pair from the baseline template
with a divergence at the same node. ``precnb diff`` end to end (interpreter start included) runs
on both pairs, alternating, and the in-process cost of ``precnb.align`` on the loaded first batch
is measured next to the whole diff. Results: medians, as ratios measured in one run.

    python benchmarks/bench_align.py [--ranks 64] [--reps 5] [--out /tmp/precnb-bench-align]
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
sys.path.insert(0, str(ROOT / "benchmarks"))

import generate  # noqa: E402


def diff_seconds(a: Path, b: Path) -> tuple[float, dict]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "precnb", "diff", str(a), str(b), "--json"], cwd=ROOT,
                       capture_output=True, text=True, check=False)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(p.stderr)
    return dt, json.loads(p.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("/tmp/precnb-bench-align"))
    args = ap.parse_args(argv)
    sample = ROOT / "data_samples" / "renamed"
    out = args.out
    generate.generate(out / "hf", ranks=args.ranks, steps=2, template=sample / "baseline", trees=("baseline",),
                      quiet=True)
    generate.generate(out / "mg", ranks=args.ranks, steps=2, template=sample / "target", trees=("baseline",),
                      quiet=True)
    generate.generate(out / "same", ranks=args.ranks, steps=2, template=sample / "baseline",
                      diverge_at=(1, 0, "Functional.gelu.1.forward"), trees=("baseline", "diverge"), quiet=True)
    pairs = {"renamed (aligned)": (out / "hf" / "baseline", out / "mg" / "baseline"),
             "same names": (out / "same" / "baseline", out / "same" / "diverge")}
    times: dict[str, list[float]] = {k: [] for k in pairs}
    findings: dict[str, dict] = {}
    for _ in range(args.reps):  # alternate the two cases
        for k, (a, b) in pairs.items():
            dt, f = diff_seconds(a, b)
            times[k].append(dt)
            findings[k] = f
    # in process: the alignment of the loaded first batch (what the pipeline computes once)
    import precnb
    from precnb.analysis.align import align

    a_ds = precnb.open_run(pairs["renamed (aligned)"][0], steps=[0], progress=False)
    b_ds = precnb.open_run(pairs["renamed (aligned)"][1], steps=[0], progress=False)
    align_t = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        al = align(a_ds, b_ds)
        align_t.append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {
        "ranks": args.ranks, "reps": args.reps,
        "diff_seconds_median": med,
        "aligned_over_same_names": med["renamed (aligned)"] / med["same names"],
        "align_seconds_median": statistics.median(align_t),
        "align_share_of_aligned_diff": statistics.median(align_t) / med["renamed (aligned)"],
        "alignment": al.describe(),
        "findings": {k: {x: f.get(x) for x in ("kind", "step", "rank", "node")} for k, f in findings.items()},
    }
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
