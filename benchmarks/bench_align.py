"""What aligning two runs costs ``precnb diff``: with the alignment vs with it disabled, and vs msprobe.

Three pairs, each diffed end to end (``precnb diff A B --json``, interpreter start included) with the
alignment on and with it disabled (``precnb.pipeline.prepare.pair_alignment`` returning None: exact-name
comparison, what the diff costs without any alignment), alternating, niced by the caller:

``same names``
    ``--ranks`` ranks × 2 steps from the bundled ``renamed`` sample's baseline, a divergence at step 1
    (label sets equal: the identity shortcut).
``names agree, one op fewer``
    ``--small-ranks`` ranks, the faulty step of ``benchmarks/generate.py``'s default trees (the real
    S1 dump where ``../shared`` is present), the target one optimizer call fewer on every rank: the
    names agree but the label sets differ, so the calls are paired (by proof, not by n × m scores).
    ``msprobe compare -da`` runs on the same two folders when msprobe is found (``--msprobe``).
``renamed (aligned)``
    ``--ranks`` ranks × 2 steps from the bundled ``renamed`` sample (Hugging Face vs Megatron names,
    a fault at step 1): the names differ, every module and call is aligned.

The in-process cost of ``precnb.align`` on the renamed pair's first batch is measured too. Results:
medians, as ratios measured in one run; ``--markdown FILE`` writes them as a table.

    python benchmarks/bench_align.py [--ranks 64] [--small-ranks 4] [--reps 5] [--out /tmp/precnb-bench-align]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # this checkout's precnb, in process as in the children

import generate  # noqa: E402
import run  # noqa: E402

# `precnb diff` through the CLI's main, the pipeline's alignment step timed (ALIGNED) or disabled (NO_ALIGN:
# returning None, the exact-name comparison); both sides start the same way
_HEAD = "import importlib, sys, time; t = importlib.import_module('precnb.pipeline.prepare'); f = t.pair_alignment; "
_TAIL = "from precnb.cli import main; sys.exit(main(sys.argv[1:]))"
ALIGNED = (_HEAD + "s = [0.0]\n"
           "def timed(*a, **k):\n    t0 = time.perf_counter(); r = f(*a, **k); s[0] += time.perf_counter() - t0; "
           "return r\n"
           "t.pair_alignment = timed; import atexit; atexit.register(lambda: print(f'ALIGN_SECONDS {s[0]:.6f}', "
           "file=sys.stderr)); " + _TAIL)
NO_ALIGN = _HEAD + "t.pair_alignment = lambda *a, **k: None; " + _TAIL


def diff_cmd(a: Path, b: Path, *, aligned: bool) -> list[str]:
    return [sys.executable, "-c", ALIGNED if aligned else NO_ALIGN, "diff", str(a), str(b), "--json"]


def diff_run(a: Path, b: Path, *, aligned: bool) -> tuple[float, dict[str, Any], float]:
    """(wall seconds, the finding, seconds spent in the alignment step)."""
    r = run.run_measured(diff_cmd(a, b, aligned=aligned), cwd=ROOT)
    if r["rc"] != 0 or not r["stdout"].strip():
        raise SystemExit(f"precnb diff {a} {b} failed ({r['rc']}): {r['stderr'][-2000:]}")
    spent = [float(x.split()[1]) for x in r["stderr"].splitlines() if x.startswith("ALIGN_SECONDS ")]
    return r["wall"], json.loads(r["stdout"]), spent[-1] if spent else 0.0


def one_op_fewer(src: Path, dst: Path) -> str:
    """Copy a step folder, the target one optimizer call fewer on every rank; return the dropped node."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, copy_function=shutil.copyfile)  # real files: the trees hard-link their dumps
    dropped = ""
    for dump in sorted(dst.glob("rank*/dump.json")):
        doc = json.loads(dump.read_text())
        data = doc["data"]
        if not dropped:
            cands = [k for k in data if k.startswith("Tensor.addcdiv_.") and k.endswith(".forward")] or [
                k for k in data if k.startswith(("Tensor.", "Torch.")) and k.endswith(".forward")]
            dropped = cands[len(cands) // 2]
        data.pop(dropped, None)
        dump.write_text(json.dumps(doc, indent=1))
    return dropped


def msprobe_compare(ms: list[str], golden: Path, target: Path) -> tuple[float, dict[int, str]]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="msprobe-out-") as tmp:
        r = run.run_measured([*ms, "compare", "-tp", str(target), "-gp", str(golden), "-da", "-o",
                              str(Path(tmp) / "out")], cwd=Path(tmp))
        return r["wall"], run._msprobe_nodes(Path(tmp) / "out", "diff_analyze_*.json")


def build(out: Path, ranks: int, small: int) -> dict[str, tuple[Path, Path]]:
    sample = ROOT / "data_samples" / "renamed"
    generate.generate(out / "hf", ranks=ranks, steps=2, template=sample / "baseline", trees=("baseline",),
                      quiet=True)
    generate.generate(out / "mg", ranks=ranks, steps=2, template=sample / "target", trees=("baseline",),
                      quiet=True)
    generate.generate(out / "same", ranks=ranks, steps=2, template=sample / "baseline",
                      diverge_at=(1, 0, "Functional.gelu.1.forward"), trees=("baseline", "diverge"), quiet=True)
    m = generate.generate(out / "s1", ranks=small, steps=2, trees=("baseline", "diverge"), quiet=True)
    step = f"step{m['divergence']['step']}"
    root = out / "s1"
    (root / "fewer").mkdir(exist_ok=True)
    dropped = one_op_fewer(root / "diverge" / step, root / "fewer" / step)
    (root / "fewer.json").write_text(json.dumps({"dropped": dropped, "template": m["template"]}))
    return {"same names": (out / "same" / "baseline", out / "same" / "diverge"),
            "names agree, one op fewer": (root / "baseline" / step, root / "fewer" / step),
            "renamed (aligned)": (out / "hf" / "baseline", out / "mg" / "baseline")}


def fast_vs_full(a: Path, b: Path, reps: int) -> dict[str, Any]:
    """In process: ``precnb.align`` (the proof by name) vs the full programme (every pair scored), alternating."""
    import importlib

    import precnb

    al = importlib.import_module("precnb.analysis.align")
    x, y = precnb.open_run(a, progress=False), precnb.open_run(b, progress=False)
    t: dict[bool, list[float]] = {True: [], False: []}
    same = True
    for i in range(reps):
        got = {}
        for fast in ((True, False) if i % 2 == 0 else (False, True)):
            t0 = time.perf_counter()
            got[fast] = al._align(x, y, fast=fast)
            t[fast].append(time.perf_counter() - t0)
        same = same and got[True].to_dict() == got[False].to_dict()
    fast_s, full_s = statistics.median(t[True]), statistics.median(t[False])
    return {"fast_s": fast_s, "full_s": full_s, "speedup": full_s / fast_s, "same_result": same, "reps": reps}


def write_markdown(path: Path, res: dict[str, Any], argv: list[str]) -> None:
    mach = res["machine"]
    lines = [
        "# Alignment cost (benchmarks/bench_align.py)",
        "",
        f"Written on {res['date']} by `python benchmarks/bench_align.py {' '.join(argv)}` "
        f"({res['reps']} repetitions, each side alternating; medians).",
        "",
        f"Machine: {mach['cpu']}, {mach['cores']} cores (shared with other jobs; load average at start "
        f"{', '.join(f'{x:.1f}' for x in mach['load_average_at_start'] or ())}), RAM {mach['ram_gib']} GiB, "
        f"{mach['os']}, Python {mach['python']}; precnb {mach['precnb']}, msprobe {mach['mindstudio-probe']}.",
        "",
        "`aligned` is `precnb diff A B --json` as shipped (run through `precnb.cli.main`, the pipeline's alignment "
        "step timed: its *share* is the time spent in it over the whole command); `no alignment` is the same "
        "command with that step disabled (exact-name comparison). Both include interpreter start and loading. "
        "Where the names differ, the command without alignment does other work (it compares unrelated names "
        "and stops at another step), so the share, not the ratio, is the cost of aligning there.",
        "",
        "| pair | ranks | precnb diff (aligned) | alignment's share of it | no alignment | aligned / no alignment "
        "| answer (aligned) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for k, row in res["cases"].items():
        f = row["finding"]
        lines.append(f"| {k} | {row['ranks']} | {row['aligned_s']:.2f} s | {100 * row['align_share']:.1f} % | "
                     f"{row['unaligned_s']:.2f} s | "
                     f"**{row['ratio']:.2f}** | {f.get('kind')} step {f.get('step')}, rank {f.get('rank')}, "
                     f"{f.get('node')} |")
    fv = res.get("fast_vs_full")
    if fv:
        lines += ["", f"In process, on the names-agree pair ({res['small_ranks']} ranks, one step): `precnb.align` "
                  f"{fv['fast_s']:.3f} s with the proof by name, {fv['full_s']:.3f} s scoring every pair (the code "
                  f"before it): **{fv['speedup']:.1f}×**, results identical: {fv['same_result']} (median of "
                  f"{fv['reps']}, alternating)."]
    lines += ["", f"In process, `precnb.align` on the renamed pair's first batch: {res['align_seconds_median']:.3f} s "
              f"({100 * res['align_share_of_aligned_diff']:.0f} % of its aligned diff); {res['alignment']}.", ""]
    ms = res.get("msprobe")
    if ms:
        row = res["cases"]["names agree, one op fewer"]
        lines += [f"`msprobe compare -da` on the same two step folders ({row['ranks']} ranks, names agree, one op "
                  f"fewer): {ms['seconds']:.2f} s (median of {ms['reps']}); `precnb diff`: {row['aligned_s']:.2f} s: "
                  f"**{ms['speedup']:.1f}×** (`{' '.join(ms['command'])}`). msprobe's first node per rank: "
                  f"{ms['nodes']}.", ""]
    else:
        lines += ["msprobe not found here (`--msprobe PATH`): no comparison with `msprobe compare -da`.", ""]
    lines += [f"Dropped node (names agree, one op fewer): `{res['dropped']}`; template `{res['template']}`.", ""]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--small-ranks", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ms-reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/precnb-bench-align"))
    ap.add_argument("--msprobe", type=Path, help="the msprobe executable (default: beside this Python, or PATH)")
    ap.add_argument("--markdown", type=Path, help="write the results as a markdown table here")
    ap.add_argument("--inprocess-only", action="store_true",
                    help="only the in-process comparison of the proof by name with the full programme")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bytecode import compile_precnb

    compile_precnb()  # an installed package's bytecode, not compiled inside what is timed (see _bytecode)
    if args.msprobe is not None:
        run.MSPROBE = args.msprobe
    # children start like an installed precnb: bytecode cached (in a folder of our own, never in the venv)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(args.out / "pycache")
    pairs = build(args.out, args.ranks, args.small_ranks)
    fv = fast_vs_full(*pairs["names agree, one op fewer"], args.reps)
    if args.inprocess_only:
        print(json.dumps(fv, indent=2))
        return 0
    ranks = {"same names": args.ranks, "names agree, one op fewer": args.small_ranks, "renamed (aligned)": args.ranks}
    times: dict[tuple[str, bool], list[float]] = {(k, al): [] for k in pairs for al in (True, False)}
    share: dict[str, list[float]] = {k: [] for k in pairs}
    findings: dict[str, dict[str, Any]] = {}
    for k in pairs:  # warm-up (bytecode, page cache), not timed
        for al in (True, False):
            diff_run(*pairs[k], aligned=al)
    for i in range(args.reps):  # alternate the cases and the two sides
        jobs = [(k, al) for k in pairs for al in (True, False)]
        if i % 2:
            jobs.reverse()
        for k, al in jobs:
            dt, f, spent = diff_run(*pairs[k], aligned=al)
            times[(k, al)].append(dt)
            if al:
                findings[k] = f
                share[k].append(spent / dt)
    ms_res = None
    ms = run.msprobe_cmd() if args.ms_reps > 0 else None
    if ms:
        b, t = pairs["names agree, one op fewer"]
        ms_t, nodes = [], {}
        for _ in range(args.ms_reps):
            dt, nodes = msprobe_compare(ms, b, t)
            ms_t.append(dt)
        ms_res = {"seconds": statistics.median(ms_t), "reps": args.ms_reps, "nodes": nodes, "command": ms}
    # in process: the alignment of the renamed pair's loaded first batch (what the pipeline computes once)
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
    cases = {k: {"ranks": ranks[k], "aligned_s": med[(k, True)], "unaligned_s": med[(k, False)],
                 "ratio": med[(k, True)] / med[(k, False)], "align_share": statistics.median(share[k]),
                 "finding": {x: findings[k].get(x) for x in ("kind", "step", "rank", "node")}} for k in pairs}
    if ms_res:
        ms_res["speedup"] = ms_res["seconds"] / cases["names agree, one op fewer"]["aligned_s"]
    extra = json.loads((args.out / "s1" / "fewer.json").read_text())
    res = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": run.machine(),
        "ranks": args.ranks, "small_ranks": args.small_ranks, "reps": args.reps,
        "cases": cases,
        "diff_seconds_median": {k: c["aligned_s"] for k, c in cases.items()},
        "aligned_over_same_names": cases["renamed (aligned)"]["aligned_s"] / cases["same names"]["aligned_s"],
        "align_seconds_median": statistics.median(align_t),
        "align_share_of_aligned_diff": statistics.median(align_t) / cases["renamed (aligned)"]["aligned_s"],
        "alignment": al.describe(),
        "msprobe": ms_res, "fast_vs_full": fv,
        "dropped": extra["dropped"], "template": extra["template"],
        "findings": {k: c["finding"] for k, c in cases.items()},
    }
    print(json.dumps(res, indent=2, default=str))
    if args.markdown:
        write_markdown(args.markdown, res, argv)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    raise SystemExit(main())
