"""One large dump.json in one process: precnb.open_run against the json.loads floor (throughput, peak RSS).

The file is built from a real msprobe dump's structure (``generate.generate_large``: the template's
node records repeated under renamed call counters / module paths until the file reaches the
size asked, with its causal-mask ``-Infinity`` tokens and ``null`` statistics). Each side runs in
a fresh interpreter, alternating, and reports its time and peak RSS (``ru_maxrss``):

- floor: ``json.loads`` of the file's bytes (the standard library as it comes, garbage collector
  on), and the same with the collector off (a stricter floor, for reference);
- precnb: ``precnb.open_run(folder, workers=1)`` (discovery, parsing, alignment, the Dataset), with
  orjson (the ``fast`` extra) and without it; ``precnb_pure`` / ``precnb_no_orjson_pure``: the same with
  ``PRECNB_PURE_PARSER=1`` (the pure Python parser, without the C extension ``precnb/io/_cwalk.c``);
- orjson alone: the reader's batched orjson parse of the file with nothing read from the records
  (the best this design can reach: what open_run adds to it is the work per node and tensor);
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
if mode.endswith("_pure"):  # the pure Python parser (without the C extensions precnb/io/_cwalk.c, _craw.c)
    os.environ["PRECNB_PURE_PARSER"] = "1"
    mode = mode[:-5]
if mode.endswith("_no_craw"):  # batches parsed into objects (orjson / json) and walked by _cwalk, not read as bytes
    os.environ["PRECNB_NO_CRAW"] = "1"
    mode = mode[:-8]
if mode == "precnb_no_orjson":
    sys.modules["orjson"] = None  # ImportError on import: the standard-library path
if mode == "precnb_rapidjson":  # a maintained parser that reads NaN/Infinity itself (python-rapidjson): the batches
    import rapidjson  # parsed into objects by it, without the token quoting (issue #50 item 5: the candidate)
    from precnb.io.msprobe import _json as _pj
    os.environ["PRECNB_NO_CRAW"] = "1"
    def _rj_loads(raw, nan=False):
        if raw.find(b"\\") >= 0 and _pj._SURROGATE_ESCAPE.search(raw):
            raise _pj.NotBatchableError
        try:
            return rapidjson.loads(raw, number_mode=rapidjson.NM_NAN), False
        except (rapidjson.JSONDecodeError, ValueError, RecursionError):  # 1e400, bad UTF-8: the whole-file parse
            raise _pj.NotBatchableError from None
    _pj._loads = _rj_loads
if mode.startswith(("precnb", "orjson")):
    import precnb  # imported before the clock starts on both sides: the floor imports json only
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
elif mode == "orjson_batches":  # the parser's own floor: its batched orjson parse alone, nothing read from it
    from precnb.io._gc import paused_gc
    from precnb.io.msprobe import _json
    with paused_gc():
        for doc in _json.batches(dump):
            pass
    doc = None
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


def run_child(mode: str, folder: Path, dump: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(folder), str(dump)], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=float, default=1e9, help="bytes of dump.json to generate (default 1e9)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/precnb-large"))
    ap.add_argument("--modes", default="floor,precnb,floor_gc_off,precnb_no_orjson,orjson_batches")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS_large.md")
    args = ap.parse_args(argv)
    folder = args.out / "large"
    manifest = generate.generate_large(folder, int(args.size))
    dump = folder / "step0" / "rank0" / "dump.json"
    size = dump.stat().st_size
    modes = args.modes.split(",")
    compile_precnb()  # an installed package's bytecode, not compiled inside the timed children (see _bytecode)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    t0 = time.time()
    load_start = os.getloadavg()
    for i in range(args.reps):
        order = modes if i % 2 == 0 else list(reversed(modes))
        for m in order:
            r = run_child(m, folder, dump)
            runs[m].append(r)
            print(f"rep {i} {m}: {r['seconds']:.2f} s ({r['cpu']:.2f} s CPU), peak RSS {r['rss'] / size:.2f}x file",
                  flush=True)
    med = {m: {"seconds": statistics.median(r["seconds"] for r in rs), "rss": statistics.median(r["rss"] for r in rs),
               "cpu": statistics.median(r["cpu"] for r in rs)} for m, rs in runs.items()}
    oom = subprocess.run([sys.executable, "-c", _OOM_CHILD, str(folder), str(int(size * 1.2))], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout.strip()
    res = {"bytes": size, "manifest": manifest, "reps": args.reps, "medians": med, "runs": runs, "oom": oom,
           "minutes": (time.time() - t0) / 60, "load": os.getloadavg(), "load_start": load_start,
           "python": platform.python_version()}
    write(args.results, res)
    return 0


def write(path: Path, res: dict) -> None:
    size, med = res["bytes"], res["medians"]
    mb = size / 1e6
    floor = med["floor"]["seconds"]
    lines = ["# One large dump.json: precnb.open_run vs the json.loads floor", "",
             f"Written by `benchmarks/bench_large.py` in {res['minutes']:.1f} min. dump.json of {mb:.0f} MB "
             f"({res['manifest']['nodes']} node records, {res['manifest']['copies']} copies of the real "
             f"S1 dump's records), one process per run, sides alternating, **medians** of {res['reps']} runs. "
             f"Load average {res.get('load_start', res['load'])[0]:.1f} at the start, {res['load'][0]:.1f} at the "
             "end (2 shared cores: absolute times vary, ratios much less).",
             "", "| run | time | throughput | vs json.loads floor | peak RSS | peak RSS / file |",
             "|---|---:|---:|---:|---:|---:|"]
    names = {"floor": "json.loads (gc on, the floor)", "floor_gc_off": "json.loads, gc off",
             "precnb": "precnb.open_run (orjson)", "precnb_no_orjson": "precnb.open_run without orjson",
             "orjson_batches": "orjson alone: the batched parse, nothing read (gc off)",
             "precnb_pure": "precnb.open_run (orjson), pure Python parser",
             "precnb_no_orjson_pure": "precnb.open_run without orjson, pure Python parser",
             "precnb_no_craw": "precnb.open_run (orjson), batches parsed into objects (PRECNB_NO_CRAW=1)",
             "precnb_no_orjson_no_craw": "precnb.open_run without orjson, batches parsed into objects",
             "precnb_rapidjson": "precnb.open_run, batches parsed by python-rapidjson, walked by _cwalk",
             "precnb_rapidjson_pure": "precnb.open_run, batches parsed by python-rapidjson, pure Python walk",
             "rapidjson_gc_off": "python-rapidjson alone (whole file, gc off)"}
    cpu_floor = med["floor"].get("cpu")
    for m, r in med.items():
        cpu = f" ({cpu_floor / r['cpu']:.2f}× in CPU seconds)" if cpu_floor and r.get("cpu") else ""
        lines.append(f"| {names.get(m, m)} | {r['seconds']:.2f} s | {mb / r['seconds']:.1f} MB/s | "
                     f"**{floor / r['seconds']:.2f}×**{cpu} | {r['rss'] / 1e9:.2f} GB | **{r['rss'] / size:.2f}×** |")
    p = med["precnb"]
    ratio = floor / p["seconds"]
    lines += ["", "## Targets (issue #30 item 1: ≥ 3× the floor with orjson, ≥ 2× without)", "",
              f"- open_run (orjson) ≥ 3× the json.loads floor's throughput: **{'met' if ratio >= 3 else 'NOT met'}** "
              f"({ratio:.2f}×; wall-clock medians)"]
    if "precnb_no_orjson" in med:
        r2 = floor / med["precnb_no_orjson"]["seconds"]
        lines.append(f"- open_run without orjson ≥ 2× the floor: **{'met' if r2 >= 2 else 'NOT met'}** ({r2:.2f}×)")
    for m in ("precnb", "precnb_no_orjson"):  # floor / open_run within each repetition (the same load)
        if m in res["runs"]:
            per = ", ".join(f"{f['seconds'] / r['seconds']:.2f}" for f, r in zip(res["runs"]["floor"], res["runs"][m],
                                                                                 strict=True))
            lines.append(f"- {names.get(m, m)}, per repetition: {per}")
    lines += [f"- peak RSS ≤ 3× the file: **{'met' if p['rss'] / size <= 3 else 'NOT met'}** ({p['rss'] / size:.2f}×)",
              f"- a load that cannot fit fails early (memory limited to 1.2× the file): `{res['oom'][:400]}`"]
    if "floor_gc_off" in med:
        lines.append(f"- against json.loads with the garbage collector off: "
                     f"{med['floor_gc_off']['seconds'] / p['seconds']:.2f}×")
    if "orjson_batches" in med:
        o = med["orjson_batches"]["seconds"]
        lines.append(f"- the best this design can reach (its orjson parse alone, every record read and dropped): "
                     f"{floor / o:.2f}× the floor; open_run spends {o / p['seconds']:.0%} of its time there")
    path.write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps(res, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
