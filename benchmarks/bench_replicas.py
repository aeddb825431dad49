"""The replica check on many ranks vs loading them (issue 28: within 1.5x of the load).

The run is built from the faulty-device samples' real msprobe dumps (tp2 x dp2, 4 ranks): rank ``r``
of a ``tp=2`` job on ``N`` ranks is a hard link to ``sdc_clean``'s rank ``r % 4`` (so every TP group
holds bit-identical replicas, and every DP group its DP-replicated tensors), except the four ranks
``N/2 .. N/2+3``, which are ``sdc/job1``'s (the bit flip on rank ``N/2+1`` at steps 1 and 3, and what it
changes after). Timed in one run, medians of ``--repeat``:

* load: ``precnb.open_run`` of the whole tree;
* check: :func:`precnb.analysis.replicas.departures.check_departures` (the replica diagnosis ``precnb replicas`` runs:
  mismatches, input-free ops, events classified) on the loaded run;
* the previous check, :func:`precnb.analysis.replicas.check_replicas`, for reference.

Usage::

    python benchmarks/bench_replicas.py --ranks 1024 --repeat 3 [--out /tmp/precnb-bench-replicas]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build(out: Path, ranks: int) -> Path:
    """The tree below *out* (rebuilt when its rank count differs); returns its root."""
    clean, faulty = ROOT / "data_samples" / "sdc_clean", ROOT / "data_samples" / "sdc" / "job1"
    mark = out / "ranks.txt"
    if mark.exists() and mark.read_text() == str(ranks):
        return out
    shutil.rmtree(out, ignore_errors=True)
    bad = set(range(ranks // 2, ranks // 2 + 4))
    for step in (1, 2, 3):
        for r in range(ranks):
            src = (faulty if r in bad else clean) / f"step{step}" / f"rank{r % 4}"
            dst = out / f"step{step}" / f"rank{r}"
            dst.mkdir(parents=True)
            for f in src.iterdir():
                os.link(f, dst / f.name)
    mark.write_text(str(ranks))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/precnb-bench-replicas"))
    ap.add_argument("--workers", default=None, help="parse processes (default: precnb's)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bytecode import compile_precnb

    compile_precnb()  # an installed package's bytecode, not compiled inside what is timed (see _bytecode)

    import precnb
    from precnb.analysis.layout import Layout
    from precnb.analysis.replicas import check_replicas
    from precnb.analysis.replicas.departures import check_departures

    root = build(args.out / f"r{args.ranks}", args.ranks)
    layout = Layout.parse("tp=2", world_size=args.ranks)
    load, check, old = [], [], []
    finding = None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        ds = precnb.open_run(root, workers=args.workers, progress=False)
        t1 = time.perf_counter()
        finding = check_departures(ds, layout)
        t2 = time.perf_counter()
        check_replicas(ds, layout)
        t3 = time.perf_counter()
        load.append(t1 - t0)
        check.append(t2 - t1)
        old.append(t3 - t2)
    assert finding is not None
    med = {"load": statistics.median(load), "check": statistics.median(check), "check_replicas": statistics.median(old)}
    result = {
        "ranks": args.ranks, "steps": 3, "files": 3 * args.ranks, "repeat": args.repeat,
        "seconds_median": med, "check_over_load": med["check"] / med["load"],
        "check_replicas_over_load": med["check_replicas"] / med["load"],
        "finding": {"step": finding.step, "rank": finding.rank, "node": finding.node,
                    "cause": finding.evidence.get("departure", {}).get("cause"),
                    "events": finding.stats.get("events")},
        "all_runs": {"load": load, "check": check, "check_replicas": old},
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
