"""Accuracy of precnb's verbs on a generated population of real Megatron-Core runs (issue 47 item 1).

The population (``tools/samples/precnb_samples/_population.py``) is drawn from ``--draw-seed``: model
seeds, layouts (tp1pp1 reference, tp2pp1, tp1pp2, tp2pp2, tp1pp2vpp2, tp2 with sequence parallelism, dp2,
tp1pp1 with 2 threads), fault kinds at random steps, layers, ranks and magnitudes, each with its healthy twin
and the tp1pp1 run of the same seed. Runs are made one at a time in the Megatron interpreter
(``PRECNB_MEGATRON_PYTHON``) and cached by a content hash under ``--out``; the ground truth of each fault is
read back from the dumps, independently of precnb. Then every case runs the *installed* ``precnb`` CLI with
``--json`` in a subprocess (what users get) and is scored by ``_acc_score.py`` (module rule there).

Usage::

    python benchmarks/bench_accuracy.py --draw-seed 1 --size small --out /work/pop      # generate + score
    python benchmarks/bench_accuracy.py --reuse --out /work/pop                          # score what exists
    python benchmarks/bench_accuracy.py --smoke --results /tmp/R.md    # the committed subset, no Megatron

Options: ``--verbs diff_ref,replicas``, ``--only KIND`` (a fault kind or ``healthy``), ``--draws 1,2`` (score
only those draws of the manifest), ``--jobs N``.

MoE draws (issue 48 item 6; ``_pop_moe.py``, draw keys ``moe<seed>``; cases and module rule in ``_acc_moe.py``)::

    python benchmarks/bench_accuracy.py --moe --draw-seed 1 --out /work/pop_moe           # generate + score
    python benchmarks/bench_accuracy.py --reuse --out /work/pop_moe --draws moe1 --jobs 2  # score what exists
    python benchmarks/bench_accuracy.py --moe --draw-seed 2 --moe-layout moe_pp2ep2dp2 --moe-repeat 1 --out DIR
                                                                                 # EP with PP (draw moe2_pp2ep2dp2)

MoE draws are scored into the MoE section at the end of ``--results`` (and ``*_moe.json``); dense draws into the
rest of the file, which keeps the MoE section.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tools" / "samples"))

from _acc_moe import is_moe_draw  # noqa: E402
from _acc_moe_report import write_moe_section  # noqa: E402
from _acc_report import write_results  # noqa: E402
from _acc_score import API_DIAGNOSE, VERBS, cases, score  # noqa: E402

SUBSET = ROOT / "data_samples" / "megatron_pop"


def precnb_exe() -> str:
    """The installed ``precnb`` next to this interpreter (else on PATH)."""
    here = Path(sys.executable).with_name("precnb")
    return str(here) if here.exists() else (shutil.which("precnb") or "precnb")


# the API's default triage of (reference, run), answered as ``diff --json`` answers: its first divergence, else
# its first finding (a false alarm of another diagnosis on a healthy pair), else nothing found
_API_CODE = """
import json, sys
import precnb
t = precnb.diagnose(sys.argv[2], baseline=sys.argv[1], workers=1)
found = [f.to_dict() for f in t.findings if f.kind not in ("none", None)]
pick = next((f for f in found if f["kind"] == "first_divergence"), found[0] if found else None)
print(json.dumps(pick or {"kind": "none", "reason": "; ".join(str(f.reason) for f in t.findings)}))
"""


def command(case: dict[str, Any], exe: str) -> list[str]:
    """The command line of one case: the CLI with ``--json``, or the API's default triage in its interpreter."""
    if case["args"][0] == API_DIAGNOSE:
        return [str(Path(exe).with_name("python")), "-c", _API_CODE, *case["args"][1:]]
    return [exe, *case["args"], "--json", "--workers", "1"]


def run_case(case: dict[str, Any], out: Path, exe: str, timeout: float) -> dict[str, Any]:
    """Run one case's precnb command in *out*; its scored row."""
    t0 = time.time()
    try:
        proc = subprocess.run(command(case, exe), cwd=out, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return score(case, None, f"timeout after {timeout:.0f} s", out) | {"seconds": round(time.time() - t0, 1)}
    answer, error = None, None
    try:
        answer = json.loads(proc.stdout)
    except ValueError:
        error = f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-600:]}"
    return score(case, answer, error, out) | {"seconds": round(time.time() - t0, 1)}


def _git_commit(path: Path) -> str:
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return proc.stdout.strip() + ("+dirty" if dirty else "")


def _code_commit(path: Path) -> str:
    """The last commit of *path*'s checkout that changed precnb's own code (``precnb/``)."""
    proc = subprocess.run(["git", "-C", str(path), "log", "-1", "--format=%h", "--", "precnb"], capture_output=True,
                          text=True, check=False)
    return proc.stdout.strip()


def precnb_source(cwd: Path) -> Path:
    """The checkout the ``precnb`` CLI imports precnb from when started in *cwd* (as the cases are)."""
    code = "import precnb, pathlib; print(pathlib.Path(precnb.__file__).resolve().parents[1])"
    python = Path(precnb_exe()).with_name("python")
    proc = subprocess.run([str(python if python.exists() else sys.executable), "-c", code], cwd=cwd,
                          capture_output=True, text=True, check=False)
    return Path(proc.stdout.strip() or ROOT)


def replica_truths(out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Per dense fault run: where its replicated copies first disagree, read back from the dumps (cached).

    :func:`precnb_samples._pop_truth.replica_truth` against the healthy twin; kept in
    ``replica_truth.json`` of the population folder (keyed by run id: a run's dumps never change).
    """
    from precnb_samples._pop_truth import replica_truth
    from precnb_samples._population import LAYOUTS

    cache_file = out / "replica_truth.json"
    cache = json.loads(cache_file.read_text(encoding="utf-8")) if cache_file.exists() else {}
    changed = False
    for key, draw in manifest["draws"].items():
        for f in draw.get("faults", []):
            if f["run"] in cache or f.get("layout") not in LAYOUTS or not (out / "runs" / f["twin"]).exists():
                continue
            tp, _pp, _vpp, dp = LAYOUTS[f["layout"]][:4]
            world = len(json.loads((out / "runs" / f["run"] / "result.json").read_text(encoding="utf-8"))["ranks"])
            size = tp if tp > 1 else dp
            if size < 2:
                continue
            groups = [list(range(g, g + size)) for g in range(0, world, size)]
            try:
                cache[f["run"]] = replica_truth(out / "runs" / f["run"], out / "runs" / f["twin"], groups,
                                                f["injection"])
            except (OSError, ValueError, KeyError) as e:  # a run without its dumps: not scored on this
                print(f"[bench_accuracy] replica truth of {f['run']} ({key}): {e}", flush=True)
                continue
            changed = True
    if changed:
        cache_file.write_text(json.dumps(cache, indent=1) + "\n", encoding="utf-8")
    return cache


def load(out: Path, manifest_name: str) -> dict[str, Any]:
    """The population's manifest (``manifest.json``, or the subset's ``ground_truth.json``)."""
    return json.loads((out / manifest_name).read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draw-seed", type=int, default=1)
    ap.add_argument("--size", choices=["small", "full"], default="small")
    ap.add_argument("--out", type=Path, default=Path("/work/pop"), help="population folder (outside the repo)")
    ap.add_argument("--verbs", default=",".join(VERBS), help=f"comma list of {', '.join(VERBS)}")
    ap.add_argument("--only", default=None, help="one fault kind, or 'healthy'")
    ap.add_argument("--draws", default=None, help="comma list of the manifest's draws to score (default: all)")
    ap.add_argument("--jobs", type=int, default=1, help="precnb commands at a time")
    ap.add_argument("--reuse", action="store_true", help="do not generate: score the runs that exist")
    ap.add_argument("--moe", action="store_true", help="generate a MoE draw (_pop_moe.draw_moe) instead of a dense one")
    ap.add_argument("--moe-layout", action="append", help="with --moe: EP layouts to draw in (repeatable; e.g. "
                                                          "moe_pp2ep2dp2; default the two of _pop_moe.EP)")
    ap.add_argument("--moe-repeat", type=int, default=2, help="with --moe: draws of each MoE fault kind")
    ap.add_argument("--smoke", action="store_true", help="score the committed subset data_samples/megatron_pop")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS_accuracy.md")
    args = ap.parse_args(argv)
    verbs = tuple(v for v in args.verbs.split(",") if v)
    if bad := set(verbs) - set(VERBS):
        ap.error(f"unknown verbs {sorted(bad)}")
    if args.smoke:
        if args.results.resolve().parent == (ROOT / "benchmarks").resolve():
            ap.error("--smoke writes its results elsewhere: give --results outside benchmarks/")
        out, manifest = SUBSET, load(SUBSET, "ground_truth.json")
    else:
        out = args.out
        if not args.reuse:
            from precnb_samples._pop_moe import draw_moe
            from precnb_samples._population import draw, generate

            kinds = None if args.only in (None, "healthy") else [args.only]
            plan = (draw_moe(args.draw_seed, args.moe_repeat, kinds, args.moe_layout) if args.moe
                    else draw(args.draw_seed, args.size, kinds))
            generate(plan, out, log=lambda m: print(m, flush=True))
        manifest = load(out, "manifest.json")
    if args.draws:
        manifest["draws"] = {k: v for k, v in manifest["draws"].items() if k in args.draws.split(",")}
    if "replicas" in verbs:
        manifest["replica_truth"] = replica_truths(out, manifest)
    todo = cases(manifest, verbs, args.only)
    print(f"[bench_accuracy] {len(todo)} cases on {sum(v['status'] == 'ok' for v in manifest['runs'].values())} runs",
          flush=True)
    exe = precnb_exe()
    source = precnb_source(out)
    commit_before = _git_commit(source)
    t0 = time.time()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rows = list(pool.map(lambda c: run_case(c, out, exe, args.timeout), todo))
    for r in rows:
        print(f"  {r['verb']:15s} {r['case']:28s} finding={r.get('finding')} step={r.get('step')} "
              f"rank={r.get('rank')} exact={r.get('exact', '-')}", flush=True)
    meta = {"draw_seeds": sorted(manifest["draws"]), "population": "data_samples/megatron_pop" if args.smoke
            else out.name, "runs": len(manifest["runs"]), "loadavg": list(os.getloadavg()),
            "precnb": {"checkout": source.name, "commit": _git_commit(source), "commit_at_start": commit_before},
            "bench_commit": _git_commit(ROOT),
            "seconds": round(time.time() - t0, 1), "verbs": list(verbs), "only": args.only, "smoke": args.smoke}
    moe = {k for k, d in manifest["draws"].items() if is_moe_draw(k, d)}
    if len(moe) < len(manifest["draws"]):
        dense = dict(manifest, draws={k: d for k, d in manifest["draws"].items() if k not in moe})
        write_results(args.results, dense, [r for r in rows if not r.get("moe")],
                      dict(meta, draw_seeds=sorted(dense["draws"])))
        print(f"[bench_accuracy] wrote {args.results} and {args.results.with_suffix('.json')}")
    if moe:
        draws = {k: manifest["draws"][k] for k in sorted(moe)}
        used = {r for d in draws.values() for x in (*d["healthy"], *d["faults"])
                for r in (x["run"], x.get("reference"), x.get("twin")) if r}
        part = dict(manifest, draws=draws, runs={r: v for r, v in manifest["runs"].items() if r in used})
        write_moe_section(args.results, part, [r for r in rows if r.get("moe")],
                          dict(meta, draw_seeds=sorted(moe), runs=len(used), jobs=args.jobs,
                               code_commit=_code_commit(source)))
        print(f"[bench_accuracy] wrote the MoE section of {args.results} and "
              f"{args.results.with_name(args.results.stem + '_moe.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
