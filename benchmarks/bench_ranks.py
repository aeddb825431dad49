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


_OPENS = r"""
import collections, json, re, sys
seen = collections.Counter()
def hook(ev, args):
    if ev == "open" and isinstance(args[0], str) and args[0].endswith("dump.json"):
        m = re.search(r"step(\d+)", args[0]); seen[int(m.group(1)) if m else -1] += 1
sys.addaudithook(hook)
from precnb.cli import main
try:
    main(sys.argv[1:])
finally:
    print(json.dumps({"dump_json_opened_per_step": dict(sorted(seen.items()))}), file=sys.stderr)
"""


def long_run(src: Path, dst: Path, ranks: int, offset: int = 0) -> Path:
    """A 100-step copy of *src*'s baseline / diverge trees by hard links, its divergence at step 0.

    Step ``s`` links the files of the generated step ``(s + 1) % 4``: the generated divergence (at
    step 1) becomes step 0, and repeats every fourth step, as a diverged run goes on diverging.
    Rank ``r`` links the files of rank ``r + offset`` (a smaller run around the divergence's rank).
    """
    stamp = dst / "manifest.json"
    want = {"src": str(src), "ranks": ranks, "steps": LONG_STEPS, "offset": offset}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return dst
    import shutil

    shutil.rmtree(dst, ignore_errors=True)
    copies: dict[Path, Path] = {}  # a file linked more than the file system allows: linked from a fresh copy
    for tree in ("baseline", "diverge"):
        for s in range(LONG_STEPS):
            for r in range(ranks):
                rd = dst / tree / f"step{s}" / f"rank{r}"
                rd.mkdir(parents=True)
                for name in ("dump.json", "construct.json", "stack.json"):
                    _link(src / tree / f"step{(s + 1) % run.STEPS}" / f"rank{r + offset}" / name, rd / name,
                          copies, dst)
    stamp.write_text(json.dumps(want))
    return dst


def _link(src: Path, dst: Path, copies: dict[Path, Path], root: Path) -> None:
    """Hard-link *src* (or its current copy) to *dst*; a new copy of *src* when its links run out."""
    import errno
    import shutil

    try:
        os.link(copies.get(src, src), dst)
    except OSError as exc:
        if exc.errno != errno.EMLINK:
            raise
        fresh = root / "_copies" / f"{len(copies)}_{os.urandom(4).hex()}_{src.name}"
        fresh.parent.mkdir(exist_ok=True)
        shutil.copyfile(src, fresh)
        copies[src] = fresh
        os.link(fresh, dst)


def measured(cmd: list[str]) -> dict[str, Any]:
    """Run *cmd* in a fresh process (its tree's peak RSS sampled); its last stdout line as JSON, wall, peak."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = run.run_measured(cmd, cwd=HERE.parent, timeout=7200)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child and every descendant it waited for
    if r["rc"] != 0:
        raise RuntimeError(f"{cmd[:4]} failed: {r['stderr'][-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": r["wall"], "cpu_s": cpu, "peak_mb": r["peak_mb"], "stdout": r["stdout"]}


def diff_cmd(base: Path, target: Path, workers: int) -> list[str]:
    return [*run.precnb_cmd(), "diff", str(base), str(target), "--json", "--workers", str(workers)]


def measure(root: Path, long_root: Any, workers: int, *, long_only: bool = False) -> dict[str, Any]:
    """Every measurement, alternating nothing (each one is long): floor, api, diff, first answer."""
    res: dict[str, Any] = {} if not long_only else _long(long_root(), workers)
    if long_only:
        return res
    run.log("floor: json.loads of the baseline tree on all cores ...")
    fl = measured([sys.executable, "-c", _FLOOR, str(root / "baseline" / "step*" / "rank*" / "*.json")])
    res["floor"] = {**json.loads(fl["stdout"].strip().splitlines()[-1]).popitem()[1], "wall_s": fl["wall_s"],
                    "cpu_s": fl["cpu_s"], "peak_mb": fl["peak_mb"]}
    run.log(f"  {json.dumps(res['floor'])}")
    run.log("api: load + first divergence + NaN origin ...")
    api = measured([sys.executable, "-c", _API, str(root), str(workers)])
    res["api"] = {**json.loads(api["stdout"].strip().splitlines()[-1]), "wall_s": api["wall_s"],
                  "cpu_s": api["cpu_s"], "peak_mb": api["peak_mb"]}
    run.log(f"  {json.dumps(res['api'])}")
    run.log("precnb diff ...")
    d = measured(diff_cmd(root / "baseline", root / "diverge", workers))
    res["diff"] = {"wall_s": d["wall_s"], "cpu_s": d["cpu_s"], "peak_mb": d["peak_mb"],
                   "finding": _finding(d["stdout"])}
    run.log(f"  {json.dumps(res['diff'])}")
    if long_root is not None:
        res.update(_long(long_root(), workers))
    return res


def _long(long_root: Path, workers: int) -> dict[str, Any]:
    """The 100-step run: step 0's floor, ``precnb diff`` on it, and which steps' dump.json it opened."""
    res: dict[str, Any] = {}
    step = [str(long_root / t / "step0" / "rank*" / "*.json") for t in ("baseline", "diverge")]
    one = measured([sys.executable, "-c", _FLOOR, *step])
    res["floor_step0"] = {"seconds": sum(v["seconds"] for v in json.loads(one["stdout"].strip().splitlines()[-1])
                                         .values()), "cpu_s": one["cpu_s"]}
    run.log("precnb diff, 100 steps, fault at step 0 ...")
    d = measured(diff_cmd(long_root / "baseline", long_root / "diverge", workers))
    res["first_answer"] = {"wall_s": d["wall_s"], "cpu_s": d["cpu_s"], "peak_mb": d["peak_mb"],
                           "finding": _finding(d["stdout"])}
    run.log(f"  {json.dumps(res['first_answer'])}")
    r = run.run_measured([sys.executable, "-c", _OPENS, "diff", str(long_root / "baseline"),
                          str(long_root / "diverge"), "--json", "--workers", "1"], cwd=HERE.parent, timeout=7200)
    res["first_answer"]["opened"] = json.loads(r["stderr"].strip().splitlines()[-1])["dump_json_opened_per_step"]
    run.log(f"  dump.json opened per step (one process): {res['first_answer']['opened']}")
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
    ap.add_argument("--long-ranks", type=int, help="ranks of the 100-step run (default --ranks; fewer: the ones "
                    "from the divergence's rank rounded down to a multiple of this)")
    ap.add_argument("--long-only", action="store_true", help="only the 100-step run (results in RESULTS_ranks_long)")
    ap.add_argument("--results", type=Path, default=HERE / "RESULTS_ranks.md")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bytecode import compile_precnb

    compile_precnb()  # an installed package's bytecode, not compiled inside what is timed (see _bytecode)
    t0 = time.time()
    mach = run.machine()
    root, manifest = run.trees(args.out, args.ranks)
    n_long = args.long_ranks or args.ranks
    offset = min(manifest["divergence"]["rank"] // n_long * n_long, args.ranks - n_long)
    long_root = None if args.no_long else lambda: long_run(root, args.out / f"long{n_long}", n_long, offset)
    if args.long_only:
        res = {"ranks": n_long, "offset": offset, "workers": args.workers, "machine": mach,
               **measure(root, long_root, args.workers, long_only=True)}
        res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        args.results.with_name("RESULTS_ranks_long.json").write_text(json.dumps(res, indent=1, default=str))
        print(json.dumps(res, indent=1, default=str))
        return 0
    res = {"ranks": args.ranks, "steps": run.STEPS, "workers": args.workers, "manifest": manifest,
           "machine": mach, **measure(root, long_root, args.workers)}
    res["minutes"] = (time.time() - t0) / 60
    res["load_average_at_end"] = os.getloadavg()
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    write(args.results, res)
    return 0


def _row(what: str, side: dict[str, Any], floor_s: float, floor_cpu: float, note: str) -> str:
    return (f"| {what} | {side['wall_s']:.1f} s / {side['cpu_s']:.0f} s | {floor_s:.1f} s / {floor_cpu:.0f} s | "
            f"**{side['wall_s'] / floor_s:.2f}×** | **{side['cpu_s'] / floor_cpu:.2f}×** | {note} | "
            f"{side['peak_mb'] / 1024:.2f} GiB |")


def write(path: Path, res: dict[str, Any]) -> None:
    fl, api, m = res["floor"], res["api"], res["machine"]
    fs, fc = fl["seconds"], fl["cpu_s"]  # one tree: diverge/ and nan/ are the same bytes (hard links) but one file
    work = {"wall_s": sum(api[k] for k in ("load_baseline_s", "load_diverge_s", "first_divergence_s", "load_nan_s",
                                           "nan_origin_s")), "cpu_s": api["cpu_s"], "peak_mb": api["peak_mb"]}
    lines = [f"# {res['ranks']:,} ranks × {res['steps']} steps: precnb against json.loads on all cores", "",
             f"Written by `benchmarks/bench_ranks.py --ranks {res['ranks']}` on {res['date']} in "
             f"{res['minutes']:.1f} min; {m['cores']} cores, {m['ram_gib']} GiB ({m['cpu']}), **shared with other "
             f"jobs** (load average {m['load_average_at_start'][0]:.1f} at the start, "
             f"{res['load_average_at_end'][0]:.1f} at the end): one run of each; wall times say little on a machine "
             f"this loaded, the CPU seconds (user + system of the process and every worker) say more. A tree is "
             f"{fl['bytes'] / 1e9:.2f} GB of JSON in {fl['files']:,} files; its floor (every dump.json, "
             f"construct.json and stack.json read and parsed by `json.loads` in a pool of one process per core) is "
             f"measured on `baseline/` and counted once per tree read (`diverge/` and `nan/` hold the same bytes "
             f"but one file). precnb parses with {res['workers']} processes.", "",
             "| what | precnb wall / CPU | json.loads floor wall / CPU | wall ratio | CPU ratio | goal | peak RSS |",
             "|---|---:|---:|---:|---:|---|---:|",
             _row("3 loads + first divergence + NaN origin (Python API; wall: the five phases)", work, 3 * fs,
                  3 * fc, "≤ 2×, ≤ 4 GiB"),
             _row("`precnb diff baseline diverge` (end to end)", res["diff"], 2 * fs, 2 * fc, "≤ 2×")]
    if "first_answer" in res:
        f0 = res["floor_step0"]
        lines.append(_row(f"`precnb diff`, {LONG_STEPS} steps, divergence at step 0 (against step 0's floor)",
                          res["first_answer"], f0["seconds"], f0["cpu_s"], "reads step 0 only"))
    lines += ["", "Phases of the Python API run (s): " + ", ".join(f"{k[:-2]} {v:.1f}" for k, v in api.items()
                                                               if k.endswith("_s")) + ".", "",
              f"Findings: first divergence {api['divergence']} (injected {res['manifest']['divergence']}); "
              f"NaN origin {api['nan']} (injected {res['manifest']['nan']}); `precnb diff`: {res['diff']['finding']}"]
    if "first_answer" in res:
        lines += ["", f"{LONG_STEPS}-step `precnb diff`: {res['first_answer']['finding']}"]
    path.write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
