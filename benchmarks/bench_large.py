"""One large dump.json in one process: precnb.open_run against the json.loads floors (throughput, peak RSS).

The file is built from a real msprobe dump's structure (``generate.generate_large``: the template's
node records repeated under renamed call counters / module paths until the file reaches the
size asked, with its causal-mask ``-Infinity`` tokens and ``null`` statistics). Each side runs in
a fresh interpreter, alternating, and reports its time, CPU seconds and peak RSS (``ru_maxrss``):

- the floors: ``json.loads`` of the file's bytes with the garbage collector on (the standard library as
  it comes) and with it paused (``floor_gc_off``: the honest floor, issue #50 item 5);
- ``precnb``: ``precnb.open_run(folder, workers=1)`` (discovery, parsing, alignment, the Dataset) on the
  parser's fast path (``precnb/io/_craw.c`` reading each batch's bytes); ``precnb_pure``: the same with
  ``PRECNB_PURE_PARSER=1`` (the pure Python reference: the standard library's json and the Python walk);
- ``precnb_sigs`` / ``precnb_sigs_pure``: the parse of the file alone with scalar-argument signatures
  (``read_rank_dir(..., signatures=True)``: what a step shared by several rank files is read with);
- ``<mode>_whole``: ``<mode>`` with ``PRECNB_JSON_WHOLE=1`` (the whole-file parse a file that cannot be read
  batch by batch gets);
- ``rapidjson_gc_off``: python-rapidjson (a maintained parser that reads NaN/Infinity itself), whole file,
  collector paused, when installed;
- ``base_<mode>``: ``<mode>`` run on another checkout (``--baseline DIR``, e.g. a worktree of the commit before a
  change), in the same alternation: before/after ratios under the same load;
- a load that cannot fit: ``open_run`` with a cgroup-like memory limit below the estimate must
  fail before parsing, naming the file and ``--steps/--ranks``.

Usage::

    python benchmarks/bench_large.py --size 1e9 --reps 3 --out /tmp/precnb-large

writes ``benchmarks/RESULTS_large.md`` and ``.json`` (ratios are medians of the repetitions).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import generate  # noqa: E402
from _bytecode import compile_precnb  # noqa: E402

_CHILD = r"""
import json, os, resource, sys, time
mode, folder, dump = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["PRECNB_NO_DASK_CLIENT"] = "1"
if mode.endswith("_whole"):  # the whole-file parse (what a file that cannot be read batch by batch gets)
    os.environ["PRECNB_JSON_WHOLE"] = "1"
    mode = mode[:-6]
if mode.endswith("_pure"):  # the pure Python parser (the standard library's json, the Python walk)
    os.environ["PRECNB_PURE_PARSER"] = "1"
    mode = mode[:-5]
if mode.startswith("precnb"):
    import precnb  # imported before the clock starts on both sides: the floor imports json only
    from precnb.io.msprobe.discover import discover
    from precnb.io.msprobe.parse import read_rank_dir
def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
c = _cpu()
t = time.perf_counter()
if mode == "floor":
    with open(dump, "rb") as fh:
        doc = json.loads(fh.read())
elif mode == "floor_gc_off":
    import gc
    gc.disable()
    with open(dump, "rb") as fh:
        doc = json.loads(fh.read())
elif mode == "rapidjson_gc_off":  # the maintained parser alone, whole file, collector paused
    import gc, rapidjson
    gc.disable()
    with open(dump, "rb") as fh:
        doc = rapidjson.loads(fh.read(), number_mode=rapidjson.NM_NAN)
elif mode == "precnb_sigs":  # the parse alone, with the scalar-argument signatures of a shared step
    doc = len(read_rank_dir(discover(folder)[0], signatures=True).labels)
else:
    ds = precnb.open_run(folder, workers=1, progress=False)
    doc = int(ds.sizes["tensor"])
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "cpu": _cpu() - c, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "tensors": doc if isinstance(doc, int) else None}))
"""

_OOM_CHILD = r"""
import sys, time
from precnb.io import _memory
_memory.available_memory = lambda: int(sys.argv[2])
import precnb
t = time.perf_counter()
try:
    precnb.open_run(sys.argv[1], workers=1, progress=False)
    print("LOADED")
except precnb.errors.InsufficientMemoryError as exc:
    print(f"{time.perf_counter() - t:.3f}", str(exc))
"""


def run_child(mode: str, folder: Path, dump: Path, baseline: Path | None = None) -> dict:
    """One timed child; ``base_<mode>`` runs ``<mode>`` with *baseline*'s precnb (its folder first on the path)."""
    cwd = ROOT
    if mode.startswith("base_"):
        if baseline is None:
            raise SystemExit(f"{mode}: --baseline DIR is needed")
        mode, cwd = mode[5:], baseline
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(folder), str(dump)], capture_output=True,
                         text=True, check=True, cwd=cwd, env={**os.environ, "PYTHONPATH": str(cwd)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=float, default=1e9, help="bytes of dump.json to generate (default 1e9)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/precnb-large"))
    ap.add_argument("--modes", default="floor,precnb,floor_gc_off,precnb_pure")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout (with its C extension built in place) for the base_<mode> modes")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS_large.md")
    args = ap.parse_args(argv)
    folder = args.out / "large"
    manifest = generate.generate_large(folder, int(args.size))
    dump = folder / "step0" / "rank0" / "dump.json"
    size = dump.stat().st_size
    modes = args.modes.split(",")
    compile_precnb()  # an installed package's bytecode, not compiled inside the timed children (see _bytecode)
    if args.baseline is not None:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(args.baseline / "precnb")], check=False,
                       stdout=subprocess.DEVNULL)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    t0 = time.time()
    load_start = os.getloadavg()
    for i in range(args.reps):
        order = modes if i % 2 == 0 else list(reversed(modes))
        for m in order:
            r = run_child(m, folder, dump, args.baseline)
            runs[m].append(r)
            print(f"rep {i} {m}: {r['seconds']:.2f} s ({r['cpu']:.2f} s CPU), peak RSS {r['rss'] / size:.2f}x file",
                  flush=True)
    med = {m: {"seconds": statistics.median(r["seconds"] for r in rs), "rss": statistics.median(r["rss"] for r in rs),
               "cpu": statistics.median(r["cpu"] for r in rs)} for m, rs in runs.items()}
    oom = subprocess.run([sys.executable, "-c", _OOM_CHILD, str(folder), str(int(size * 1.2))], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout.strip()
    res = {"bytes": size, "manifest": manifest, "reps": args.reps, "medians": med, "runs": runs, "oom": oom,
           "minutes": (time.time() - t0) / 60, "load": os.getloadavg(), "load_start": load_start,
           "python": platform.python_version(), "baseline": str(args.baseline) if args.baseline else None}
    write(args.results, res)
    return 0


_NAMES = {"floor": "json.loads, gc on (floor 1)", "floor_gc_off": "json.loads, gc paused (floor 2)",
          "precnb": "precnb.open_run, fast path (`_craw`)", "precnb_pure": "precnb.open_run, pure Python parser",
          "precnb_sigs": "parse with signatures, fast path (`_craw`)",
          "precnb_sigs_pure": "parse with signatures, pure Python parser",
          "precnb_whole": "precnb.open_run, whole-file parse (`PRECNB_JSON_WHOLE=1`)",
          "rapidjson_gc_off": "python-rapidjson alone (whole file, gc paused)"}


def _name(mode: str) -> str:
    if mode.startswith("base_"):
        return f"baseline: {_NAMES.get(mode[5:], mode[5:])}"
    return _NAMES.get(mode, mode)


def write(path: Path, res: dict) -> None:
    size, med = res["bytes"], res["medians"]
    mb = size / 1e6
    floor, floor2 = med["floor"]["seconds"], med.get("floor_gc_off", {}).get("seconds")
    start = res.get("load_start", res["load"])
    lines = ["# One large dump.json: precnb.open_run vs the json.loads floors", "",
             f"Written by `benchmarks/bench_large.py` in {res['minutes']:.1f} min. dump.json of {mb:.0f} MB "
             f"({res['manifest']['nodes']} node records, {res['manifest']['copies']} copies of the real "
             f"S1 dump's records), one process per run, sides alternating, **medians** of {res['reps']} runs. "
             f"Load average {start[0]:.1f} at the start, {res['load'][0]:.1f} at the end (2 shared cores: "
             "absolute times vary, ratios much less; CPU seconds vary least).",
             "", "| run | time | CPU s | vs json.loads, gc on | vs json.loads, gc paused | peak RSS / file |",
             "|---|---:|---:|---:|---:|---:|"]
    for m, r in med.items():
        vs2 = f"**{floor2 / r['seconds']:.2f}×**" if floor2 else "–"
        lines.append(f"| {_name(m)} | {r['seconds']:.2f} s | {r.get('cpu', float('nan')):.2f} | "
                     f"**{floor / r['seconds']:.2f}×** | {vs2} | **{r['rss'] / size:.2f}×** |")
    p = med["precnb"]
    lines += ["", "## Targets (issue #50 item 5: open_run ≥ 2× json.loads with gc paused, peak RSS ≤ 2× the file)",
              ""]
    if floor2:
        r2 = floor2 / p["seconds"]
        lines.append(f"- open_run ≥ 2× json.loads with the garbage collector paused: "
                     f"**{'met' if r2 >= 2 else 'NOT met'}** ({r2:.2f}× wall clock; "
                     f"{med['floor_gc_off']['cpu'] / p['cpu']:.2f}× in CPU seconds)")
    lines.append(f"- against json.loads with the collector on: {floor / p['seconds']:.2f}× "
                 f"({med['floor']['cpu'] / p['cpu']:.2f}× in CPU seconds)")
    for m in res["runs"]:  # floor / run within each repetition (the same load)
        if m.startswith(("precnb", "base_")):
            per = ", ".join(f"{f['seconds'] / r['seconds']:.2f}" for f, r in zip(res["runs"]["floor"], res["runs"][m],
                                                                                 strict=True))
            lines.append(f"- {_name(m)}, gc-on floor / run per repetition: {per}")
    for m in res["runs"]:  # before / after under the same load
        if m.startswith("base_") and m[5:] in med:
            b, a = med[m], med[m[5:]]
            lines.append(f"- {_NAMES.get(m[5:], m[5:])}: baseline / this checkout {b['seconds'] / a['seconds']:.2f}× "
                         f"wall clock, {b['cpu'] / a['cpu']:.2f}× CPU seconds")
    lines += [f"- peak RSS ≤ 2× the file: **{'met' if p['rss'] / size <= 2 else 'NOT met'}** ({p['rss'] / size:.2f}×)",
              f"- a load that cannot fit fails early (memory limited to 1.2× the file): `{res['oom'][:400]}`"]
    path.write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps(res, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
