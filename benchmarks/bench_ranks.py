"""Thousands of ranks: load + first divergence + NaN origin against ``json.loads`` of the same files on all cores.

The trees are ``generate.generate``'s (real msprobe structure: the S1 template's records,
``-Infinity`` / ``null`` tokens and layout; construct.json / stack.json hard-linked), by default
4,096 ranks × 4 steps. Each measurement runs in a fresh interpreter; the peak RSS is that of the
process tree (workers included):

- floor: every dump.json / construct.json / stack.json of a tree read and parsed with
  ``json.loads`` in a process pool of one process per core (the files listed before the clock);
- api: ``open_run(baseline)``, ``open_run(diverge)``, ``first_divergence``, then
  ``open_run(nan)``, ``nan_origin`` (``workers=`` one per core), the three trees' floors summed;
- diff: ``precnb diff baseline diverge`` end to end (interpreter start included), against the
  floor of those two trees;
- first answer: ``precnb diff`` on a 100-step run whose first divergence is at step 0 (the
  steps beyond the generated four are hard links to them: only discovery may look at them),
  against the floor of one step of the two trees.

Usage::

    python benchmarks/bench_ranks.py --ranks 4096 --out /tmp/precnb-ranks

writes ``benchmarks/RESULTS_ranks.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (its tree cache, process-tree RSS sampling, machine facts)

LONG_STEPS = 100

_FLOOR = r"""
import glob, json, os, sys, time
from multiprocessing import Pool
def parse(paths):
    n = 0
    for p in paths:
        with open(p, "rb") as fh:
            raw = fh.read()
        json.loads(raw)
        n += len(raw)
    return n
if __name__ == "__main__":
    out = {}
    with Pool(os.cpu_count()) as pool:
        for pattern in sys.argv[1:]:  # a tree's files: <tree>/step*/rank*/*.json
            files = sorted(glob.glob(pattern))
            chunks = [files[i:i + 16] for i in range(0, len(files), 16)]
            t = time.perf_counter()
            n = sum(pool.imap_unordered(parse, chunks))
            out[pattern] = {"seconds": time.perf_counter() - t, "bytes": n, "files": len(files)}
    print(json.dumps(out))
"""

_API = r"""
import json, os, sys, time
os.environ["PRECNB_NO_DASK_CLIENT"] = "1"
import warnings; warnings.simplefilter("ignore")
import precnb
root, workers = sys.argv[1], int(sys.argv[2])
res = {}
def timed(name, fn):
    t = time.perf_counter(); v = fn(); res[name] = time.perf_counter() - t; return v
b = timed("load_baseline_s", lambda: precnb.open_run(root + "/baseline", progress=False, workers=workers))
d = timed("load_diverge_s", lambda: precnb.open_run(root + "/diverge", progress=False, workers=workers))
f = timed("first_divergence_s", lambda: precnb.first_divergence(b, d))
res["divergence"] = {"step": f.step, "rank": f.rank, "node": f.node}
res["sizes"] = dict(b.sizes); res["dataset_mb"] = b.nbytes / 1e6
del b, d
n = timed("load_nan_s", lambda: precnb.open_run(root + "/nan", progress=False, workers=workers))
g = timed("nan_origin_s", lambda: precnb.nan_origin(n))
res["nan"] = {"step": g.step, "rank": g.rank, "node": g.node}
print(json.dumps(res, default=str))
"""


def long_run(src: Path, dst: Path, ranks: int) -> Path:
    """A 100-step copy of *src*'s baseline / diverge trees by hard links, its divergence at step 0.

    Step ``s`` links the files of the generated step ``(s + 1) % 4``: the generated divergence (at
    step 1) becomes step 0, and repeats every fourth step, as a diverged run goes on diverging.
    """
    stamp = dst / "manifest.json"
    want = {"src": str(src), "ranks": ranks, "steps": LONG_STEPS}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return dst
    import shutil

    shutil.rmtree(dst, ignore_errors=True)
    for tree in ("baseline", "diverge"):
        for s in range(LONG_STEPS):
            for r in range(ranks):
                rd = dst / tree / f"step{s}" / f"rank{r}"
                rd.mkdir(parents=True)
                for name in ("dump.json", "construct.json", "stack.json"):
                    os.link(src / tree / f"step{(s + 1) % run.STEPS}" / f"rank{r}" / name, rd / name)
    stamp.write_text(json.dumps(want))
    return dst


def measured(cmd: list[str]) -> dict[str, Any]:
    """Run *cmd* in a fresh process (its tree's peak RSS sampled); its last stdout line as JSON, wall, peak."""
    r = run.run_measured(cmd, cwd=HERE.parent, timeout=7200)
    if r["rc"] != 0:
        raise RuntimeError(f"{cmd[:4]} failed: {r['stderr'][-2000:]}")
    return {"wall_s": r["wall"], "peak_mb": r["peak_mb"], "stdout": r["stdout"]}


def diff_cmd(base: Path, target: Path, workers: int) -> list[str]:
    return [*run.precnb_cmd(), "diff", str(base), str(target), "--json", "--workers", str(workers)]


def measure(root: Path, long_root: Path | None, workers: int) -> dict[str, Any]:
    """Every measurement, alternating nothing (each one is long): floor, api, diff, first answer."""
    trees = [str(root / t / "step*" / "rank*" / "*.json") for t in ("baseline", "diverge", "nan")]
    res: dict[str, Any] = {}
    run.log("floor: json.loads of the three trees on all cores ...")
    fl = measured([sys.executable, "-c", _FLOOR, *trees])
    res["floor"] = json.loads(fl["stdout"].strip().splitlines()[-1])
    res["floor_peak_mb"] = fl["peak_mb"]
    run.log(f"  {json.dumps(res['floor'])}")
    run.log("api: load + first divergence + NaN origin ...")
    api = measured([sys.executable, "-c", _API, str(root), str(workers)])
    res["api"] = {**json.loads(api["stdout"].strip().splitlines()[-1]), "wall_s": api["wall_s"],
                  "peak_mb": api["peak_mb"]}
    run.log(f"  {json.dumps(res['api'])}")
    run.log("precnb diff ...")
    d = measured(diff_cmd(root / "baseline", root / "diverge", workers))
    res["diff"] = {"wall_s": d["wall_s"], "peak_mb": d["peak_mb"], "finding": _finding(d["stdout"])}
    run.log(f"  {json.dumps(res['diff'])}")
    if long_root is not None:
        step = [str(long_root / t / "step0" / "rank*" / "*.json") for t in ("baseline", "diverge")]
        one = measured([sys.executable, "-c", _FLOOR, *step])
        res["floor_step0"] = json.loads(one["stdout"].strip().splitlines()[-1])
        run.log("precnb diff, 100 steps, fault at step 0 ...")
        d = measured(diff_cmd(long_root / "baseline", long_root / "diverge", workers))
        res["first_answer"] = {"wall_s": d["wall_s"], "peak_mb": d["peak_mb"], "finding": _finding(d["stdout"])}
        run.log(f"  {json.dumps(res['first_answer'])}")
    return res


def _finding(stdout: str) -> dict[str, Any]:
    try:
        doc = json.loads(stdout)
    except ValueError:
        return {"unparsed": stdout[-500:]}
    keys = ("kind", "step", "rank", "node")
    return {k: doc.get(k) for k in keys}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=Path("/tmp/precnb-ranks"))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parse processes (default: all cores)")
    ap.add_argument("--no-long", action="store_true", help="skip the 100-step time-to-first-answer run")
    ap.add_argument("--results", type=Path, default=HERE / "RESULTS_ranks.md")
    args = ap.parse_args(argv)
    t0 = time.time()
    mach = run.machine()
    root, manifest = run.trees(args.out, args.ranks)
    long_root = None if args.no_long else long_run(root, args.out / f"long{args.ranks}", args.ranks)
    res = {"ranks": args.ranks, "steps": run.STEPS, "workers": args.workers, "manifest": manifest,
           "machine": mach, **measure(root, long_root, args.workers)}
    res["minutes"] = (time.time() - t0) / 60
    res["load_average_at_end"] = os.getloadavg()
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    write(args.results, res)
    return 0


def write(path: Path, res: dict[str, Any]) -> None:
    fl = res["floor"]
    f_b, f_d, f_n = (v["seconds"] for v in fl.values())  # baseline, diverge, nan (the order measured)
    gb = sum(v["bytes"] for v in fl.values()) / 1e9
    api = res["api"]
    work = sum(api[k] for k in ("load_baseline_s", "load_diverge_s", "first_divergence_s", "load_nan_s",
                                "nan_origin_s"))
    floor3 = f_b + f_d + f_n
    lines = [f"# {res['ranks']:,} ranks × {res['steps']} steps: precnb against json.loads on all cores", "",
             f"Written by `benchmarks/bench_ranks.py --ranks {res['ranks']}` on {res['date']} in "
             f"{res['minutes']:.1f} min; {res['machine']['cores']} cores, {res['machine']['ram_gib']} GiB "
             f"({res['machine']['cpu']}), shared with other jobs (load average {res['load_average_at_end'][0]:.1f} "
             f"at the end): one run of each, absolute times are rough, ratios less so. {gb:.1f} GB of JSON in "
             f"the three trees ({sum(v['files'] for v in fl.values()):,} files); parse processes: {res['workers']}.",
             "", "| what | precnb | json.loads floor (all cores) | ratio | goal | peak RSS |",
             "|---|---:|---:|---:|---:|---:|",
             f"| load ×3 + first divergence + NaN origin (Python API) | {work:.1f} s | {floor3:.1f} s | "
             f"**{work / floor3:.2f}×** | ≤ 2× | {api['peak_mb'] / 1024:.2f} GiB |",
             f"| `precnb diff baseline diverge` (end to end) | {res['diff']['wall_s']:.1f} s | {f_b + f_d:.1f} s | "
             f"**{res['diff']['wall_s'] / (f_b + f_d):.2f}×** | ≤ 2× | {res['diff']['peak_mb'] / 1024:.2f} GiB |"]
    if "first_answer" in res:
        f0 = sum(v["seconds"] for v in res["floor_step0"].values())
        fa = res["first_answer"]
        lines.append(f"| `precnb diff`, {LONG_STEPS} steps, divergence at step 0 (time to first answer) | "
                     f"{fa['wall_s']:.1f} s | {f0:.1f} s (step 0 only) | **{fa['wall_s'] / f0:.2f}×** | reads step 0 "
                     f"only | {fa['peak_mb'] / 1024:.2f} GiB |")
    lines += ["", "Phases of the Python API run (s): " + ", ".join(f"{k[:-2]} {v:.1f}" for k, v in api.items()
                                                               if k.endswith("_s")) + ".",
              f"Findings: first divergence {api['divergence']} (injected {res['manifest']['divergence']}); "
              f"NaN origin {api['nan']} (injected {res['manifest']['nan']}); `precnb diff`: {res['diff']['finding']}",
              ""]
    if "first_answer" in res:
        lines += [f"100-step `precnb diff`: {res['first_answer']['finding']}", ""]
    path.write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
