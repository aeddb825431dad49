"""Explorer responsiveness on a synthetic 1,000-rank run (a real dump tiled along ``rank``).

    python benchmarks/bench_explorer.py [--ranks 1000] [--repeat 15] [--sample PATH]

Prints medians (ms) of: building the heat-map frame (x = step and x = rank buckets), the
heat-map chart, and the Python side of a heat-map cell selection (series + detail frames,
line chart, detail table) — the budget for the last one is 200 ms. No browser is involved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PRECNB_SHARED", ROOT.parent / "shared"))
CANDIDATES = [ROOT / "data_samples" / "dp_nan", ROOT / "data_samples" / "healthy",
              SHARED / "data_samples" / "msprobe" / "S1_baseline" / "statistics"]


def tile_ranks(ds: xr.Dataset, n: int, *, seed: int = 0) -> xr.Dataset:
    """Repeat the ranks of *ds* until there are *n*, with a small per-rank jitter."""
    reps = -(-n // ds.sizes["rank"])
    rng = np.random.default_rng(seed)
    data = {}
    for name, var in ds.data_vars.items():
        arr = np.tile(var.values, (1, reps, 1))[:, :n]
        if var.dtype.kind == "f":
            arr = arr * (1 + 1e-3 * rng.standard_normal((1, n, 1)))
        data[name] = (var.dims, arr)
    coords = {k: v for k, v in ds.coords.items() if k != "rank"}
    coords["rank"] = np.arange(n, dtype=np.int64)
    return xr.Dataset(data, coords=coords, attrs=ds.attrs)


def _median_ms(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--sample", type=Path, default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("PRECNB_NO_DASK_CLIENT", "1")
    import precnb
    import precnb.viz as viz
    from precnb.widgets import explore

    sample = args.sample or next((p for p in CANDIDATES if p.exists()), None)
    if sample is None:
        print("no sample found (data_samples/ or ../shared)", file=sys.stderr)
        return 1
    base = precnb.open_run(sample)
    ds = tile_ranks(base, args.ranks)
    # a NaN on one rank so the explorer opens at a NaN origin, as in an incident
    t = next(str(x) for x in ds["tensor"].values if ".output" in str(x) and "linear" in str(x).lower()) \
        if any("linear" in str(x).lower() for x in ds["tensor"].values) else str(ds["tensor"].values[-1])
    ds["max"].loc[dict(step=int(ds.step[-1]), rank=args.ranks // 2 + 3, tensor=t)] = np.nan
    print(f"sample {sample} tiled to {dict(ds.sizes)} ({ds.nbytes / 2**20:.0f} MiB)")

    t0 = time.perf_counter()
    ex = explore(ds)
    print(f"open explorer (incl. NaN-origin search): {(time.perf_counter() - t0) * 1000:.0f} ms "
          f"→ step {ex.step}, rank {ex.rank}, {ex.tensor}")
    values = ex.data.values("stat", "norm")
    frame_step = _median_ms(lambda: viz.heatmap_frame(ds, values=values), args.repeat)
    frame_rank = _median_ms(lambda: viz.heatmap_frame(ds, by="rank", values=values), args.repeat)
    f = viz.heatmap_frame(ds, by="rank", values=values)
    chart = _median_ms(lambda: viz.heatmap_chart(f).to_dict(), args.repeat)
    print(f"heat-map frame x=step: {frame_step:.1f} ms   x=rank buckets: {frame_rank:.1f} ms "
          f"({len(f)} cells)   chart spec: {chart:.1f} ms")

    cells = ex.frame[["row", "col"]].drop_duplicates().to_dict("records")
    rng = np.random.default_rng(1)
    picks = [cells[i] for i in rng.integers(0, len(cells), args.repeat + 1)]
    it = iter(picks)
    sel_step = _median_ms(lambda: ex.select_cells([next(it)]), args.repeat)
    with ex.filters.quiet():
        ex.filters.by.value = "rank"
    ex.refresh()
    cells = ex.frame[["row", "col"]].drop_duplicates().to_dict("records")
    it = iter([cells[i] for i in rng.integers(0, len(cells), args.repeat + 1)])
    sel_rank = _median_ms(lambda: ex.select_cells([next(it)]), args.repeat)
    # the full observer path: a simulated Vega selection event through JupyterChart's traits
    it = iter([cells[i] for i in rng.integers(0, len(cells), args.repeat + 1)])

    def through_traits() -> None:
        c = next(it)
        ex._pinned = None
        ex.heatmap.chart._vl_selections = {"cell": {"value": {"vlPoint": {"or": [c]}}, "store": []}}

    sel_traits = _median_ms(through_traits, args.repeat)
    refresh = _median_ms(ex.refresh, max(3, args.repeat // 3))
    print(f"cell selection, Python side (median of {args.repeat}): x=step {sel_step:.1f} ms, "
          f"x=rank {sel_rank:.1f} ms, via JupyterChart selection traits {sel_traits:.1f} ms "
          f"(budget 200 ms)")
    print(f"heat-map refresh after a filter change: {refresh:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
