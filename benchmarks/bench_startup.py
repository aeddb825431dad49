"""Command-line start-up: the parser alone, as a ratio to a bare interpreter; and precnb's deferral of ``dask.array``.

``precnb --version``, ``--help`` and ``COMMAND --help`` import neither xarray nor pandas (issue #50: the
diagnosis registry, the readers' names and the options' defaults are read without them): their time is given as
a ratio to ``python -c pass``, alternating in fresh processes.

The deferral of ``dask.array`` (``precnb/io/_lazy_dask.py``):

xarray imports ``dask.array`` the first time it wraps an array, only to learn that a numpy array
is not a dask one; precnb answers that question without the import until dask.array is loaded.
This measures what that saves on a real command (``precnb info`` of a bundled sample, interpreter
start included): the two sides alternate, in fresh processes; medians.

Usage::

    python benchmarks/bench_startup.py --reps 9

writes ``benchmarks/RESULTS_startup.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS_startup.md")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bytecode import compile_precnb

    compile_precnb()  # an installed package's bytecode, not compiled inside what is timed (see _bytecode)
    base = {k: v for k, v in os.environ.items() if k != "PRECNB_NO_LAZY_DASK"}
    cmds = {"precnb info data_samples/healthy": [sys.executable, "-m", "precnb", "info", "data_samples/healthy"],
            "precnb nan data_samples/dp_nan": [sys.executable, "-m", "precnb", "nan", "data_samples/dp_nan"]}
    rows = []
    for label, cmd in cmds.items():
        with_t, without_t = [], []
        one(cmd, base)  # warm the page cache
        for i in range(args.reps):
            for side in (("with", "without") if i % 2 == 0 else ("without", "with")):
                if side == "with":
                    with_t.append(one(cmd, base))
                else:
                    without_t.append(one(cmd, {**base, "PRECNB_NO_LAZY_DASK": "1"}))
        w, wo = statistics.median(with_t), statistics.median(without_t)
        rows.append({"command": label, "with_s": w, "without_s": wo, "saved_s": wo - w, "saved_frac": (wo - w) / wo})
    lines = ["# Command-line start-up: the dask.array deferral", "",
             f"Written by `benchmarks/bench_startup.py`; medians of {args.reps} alternating runs per side "
             f"(fresh interpreter each, load average {os.getloadavg()[0]:.1f} on 2 shared cores).", "",
             "| command | with the deferral | without (PRECNB_NO_LAZY_DASK=1) | saved |", "|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| `{r['command']}` | {r['with_s']:.2f} s | {r['without_s']:.2f} s | "
                     f"**{r['saved_s']:.2f} s ({100 * r['saved_frac']:.0f} %)** |")
    keep = all(r["saved_frac"] >= 0.1 for r in rows)
    lines += ["", f"Verdict: {'keep' if keep else 'drop'} the deferral (kept while it saves at least 10 % of a "
              "command-line call)."]
    floor_cmd = [sys.executable, "-c", "pass"]
    parser_cmds = {"precnb --version": ["--version"], "precnb --help": ["--help"],
                   "precnb diff --help": ["diff", "--help"]}
    times: dict[str, list[float]] = {"python -c pass": [], **{k: [] for k in parser_cmds}}
    for _ in range(args.reps):
        times["python -c pass"].append(one(floor_cmd, base))
        for label, extra in parser_cmds.items():
            times[label].append(one([sys.executable, "-m", "precnb", *extra], base))
    floor = statistics.median(times["python -c pass"])
    startup = [{"command": k, "median_s": statistics.median(v), "ratio": statistics.median(v) / floor}
               for k, v in times.items()]
    lines += ["", "## The parser alone (no xarray, no pandas)", "",
              f"Medians of {args.reps} runs each, fresh interpreter, load average {os.getloadavg()[0]:.1f}.", "",
              "| command | median | ratio to `python -c pass` |", "|---|---:|---:|"]
    lines += [f"| `{r['command']}` | {r['median_s']:.2f} s | {r['ratio']:.1f}x |" for r in startup]
    args.results.write_text("\n".join(lines) + "\n")
    args.results.with_suffix(".json").write_text(json.dumps({"dask_deferral": rows, "parser": startup}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
