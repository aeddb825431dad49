"""precnb benchmarks: ratios measured side by side in one run, written to ``benchmarks/RESULTS.md``.

What is measured (medians of repeated runs; the two sides of every ratio alternate within
each repetition, so a busy machine slows both):

1. **Load throughput** (MB/s of dump.json + construct.json + stack.json) of ``precnb.open_run``
   against the floor, ``json.loads`` of the same files, in-process (one core) and on a dask
   ``LocalCluster`` of 1 and 2 worker processes (the floor then runs as the same per-file
   tasks on the same cluster).
2. **End to end CLI** (interpreter start included, wall time, peak RSS of the process tree):
   ``precnb diff`` vs ``msprobe compare -da`` and ``precnb nan`` vs ``msprobe overflow_check``
   on the same folders, and whether they name the same node.
3. **Scale**: the 1,024-rank run loaded, searched for the first divergence and the NaN origin,
   and drawn as a heat map (``precnb.viz``), in a fresh process whose peak RSS is recorded;
   plus the streaming ``precnb.to_zarr`` conversion and lazy analysis of the store.

Trees come from ``benchmarks/generate.py`` (real msprobe structure) and are kept in
``--workdir`` between runs (regenerated when the generator or template changes).

Usage::

    python benchmarks/run.py                       # 4, 64 and 1,024 ranks (~15-20 min)
    python benchmarks/run.py --sizes 4,64          # quicker
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate  # noqa: E402

STEPS = 4
TARGETS = {"load_ratio": 0.5, "diff_4": 5.0, "diff_64": 20.0, "rss_gb": 4.0}


# ------------------------------------------------------------------------------- helpers
def log(msg: str) -> None:
    print(msg, flush=True)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = 0.0
    with contextlib.suppress(OSError), open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal"):
                ram = int(line.split()[1]) / 1024**2
    return {
        "cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(ram, 1),
        "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        **{p: version(p) for p in ("numpy", "xarray", "pandas", "dask", "distributed", "zarr", "orjson",
                                    "precnb", "mindstudio-probe", "torch")},
    }


def tree_files(root: Path) -> list[list[Path]]:
    """Per (step, rank) folder: its dump.json, construct.json, stack.json."""
    out = []
    for dump in sorted(root.glob("step*/rank*/dump.json")):
        out.append([p for p in (dump, dump.parent / "construct.json", dump.parent / "stack.json") if p.exists()])
    return out


def json_floor(paths: list[Path]) -> int:
    """The floor: read and ``json.loads`` each file (what any JSON-based loader must do)."""
    n = 0
    for p in paths:
        raw = p.read_bytes()
        json.loads(raw)
        n += len(raw)
    return n


def run_measured(cmd: list[str], *, cwd: Path | None = None, timeout: float = 1800) -> dict[str, Any]:
    """Run *cmd*; wall time, exit code, stdout, and the peak RSS (MB) of its process tree."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    peak = 0
    ps = psutil.Process(proc.pid)
    import threading

    out: dict[str, str] = {}

    def pump() -> None:
        out["stdout"], out["stderr"] = proc.communicate(timeout=timeout)

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    while th.is_alive():
        rss = 0
        try:
            for p in [ps, *ps.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    rss += p.memory_info().rss
        except psutil.Error:
            pass
        peak = max(peak, rss)
        th.join(0.02)
    wall = time.perf_counter() - t0
    return {"wall": wall, "rc": proc.returncode, "stdout": out.get("stdout", ""), "stderr": out.get("stderr", ""),
            "peak_mb": peak / 1024**2}


def precnb_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "precnb"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "precnb"]


MSPROBE: Path | None = None  # --msprobe PATH


def msprobe_cmd() -> list[str] | None:
    """The msprobe command: ``--msprobe PATH``, else beside this interpreter, else on ``PATH``."""
    if MSPROBE is not None:
        return [str(MSPROBE)]
    exe = Path(sys.executable).parent / "msprobe"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("msprobe")
    return [found] if found else None


def warm_worker() -> None:
    """Import the parser in a dask worker (the first task pays no import)."""
    import precnb.io.msprobe.parse  # noqa: F401


# ---------------------------------------------------------------------------- the trees
def trees(workdir: Path, ranks: int) -> tuple[Path, dict[str, Any]]:
    """Generate (or reuse) the trees for *ranks*."""
    out = workdir / f"r{ranks}"
    stamp = hashlib.sha1((HERE / "generate.py").read_bytes()).hexdigest()[:12] + str(generate.default_template())
    m_path = out / "manifest.json"
    if m_path.exists():
        m = json.loads(m_path.read_text())
        if m.get("stamp") == stamp and m.get("ranks") == ranks and m.get("steps") == STEPS:
            return out, m
    log(f"generating {ranks} ranks × {STEPS} steps in {out} ...")
    m = generate.generate(out, ranks=ranks, steps=STEPS, quiet=True)
    m["stamp"] = stamp
    m_path.write_text(json.dumps(m, indent=2))
    log(f"  {m['bytes_per_tree'] / 1e6:.0f} MB per tree, {m['seconds']:.0f} s")
    return out, m


# ----------------------------------------------------------------------- load throughput
def bench_load(root: Path, reps: int, workers: tuple[int, ...]) -> dict[str, Any]:
    import warnings

    import precnb

    groups = tree_files(root)
    nbytes = sum(p.stat().st_size for g in groups for p in g)
    mb = nbytes / 1e6
    res: dict[str, Any] = {"mb": mb, "files": sum(len(g) for g in groups), "rows": []}
    warnings.simplefilter("ignore")
    os.environ["PRECNB_NO_DASK_CLIENT"] = "1"
    floor_t, precnb_t = [], []
    precnb.open_run(root, progress=False)  # imports and caches warm
    for i in range(reps):
        for side in (("floor", "precnb") if i % 2 == 0 else ("precnb", "floor")):
            t0 = time.perf_counter()
            if side == "floor":
                for g in groups:
                    json_floor(g)
                floor_t.append(time.perf_counter() - t0)
            else:
                ds = precnb.open_run(root, progress=False)
                precnb_t.append(time.perf_counter() - t0)
                del ds
    res["rows"].append({"where": "in-process (1 core)", "floor_s": median(floor_t), "precnb_s": median(precnb_t),
                        "reps": reps})
    for n in workers:  # local worker processes (precnb's default on the command line), no dask
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        chunk = max(1, min(16, len(groups) // (4 * n)))
        with ProcessPoolExecutor(n, mp_context=mp.get_context("fork")) as pool:
            list(pool.map(json_floor, groups[: 2 * n], chunksize=1))  # workers started
            precnb.open_run(root, progress=False, workers=n)  # precnb's pool started
            f_t, p_t = [], []
            for i in range(reps):
                for side in (("floor", "precnb") if i % 2 == 0 else ("precnb", "floor")):
                    t0 = time.perf_counter()
                    if side == "floor":
                        list(pool.map(json_floor, groups, chunksize=chunk))
                        f_t.append(time.perf_counter() - t0)
                    else:
                        ds = precnb.open_run(root, progress=False, workers=n)
                        p_t.append(time.perf_counter() - t0)
                        del ds
        res["rows"].append({"where": f"workers={n} ({n} local processes)" if n > 1 else "workers=1 (in this process)",
                            "floor_s": median(f_t), "precnb_s": median(p_t), "reps": reps, "pool": "local",
                            "n": n})
    from precnb.io import _pool

    _pool.shutdown()
    if workers:
        import logging

        from distributed import Client, LocalCluster

        for n in workers:
            with LocalCluster(n_workers=n, threads_per_worker=1, dashboard_address=None, processes=True,
                              silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
                client.run(warm_worker)
                precnb.open_run(root, client=client, progress=False)  # warm the workers
                f_t, p_t = [], []
                for i in range(reps):
                    for side in (("floor", "precnb") if i % 2 == 0 else ("precnb", "floor")):
                        t0 = time.perf_counter()
                        if side == "floor":
                            futs = client.map(json_floor, groups, pure=False)
                            client.gather(futs)
                            del futs
                            f_t.append(time.perf_counter() - t0)
                        else:
                            ds = precnb.open_run(root, client=client, progress=False)
                            p_t.append(time.perf_counter() - t0)
                            del ds
                res["rows"].append({"where": f"LocalCluster, {n} worker process{'es' if n > 1 else ''}",
                                    "floor_s": median(f_t), "precnb_s": median(p_t), "reps": reps,
                                    "pool": "dask", "n": n})
    for row in res["rows"]:
        row["floor_mbps"] = mb / row["floor_s"]
        row["precnb_mbps"] = mb / row["precnb_s"]
        row["ratio"] = row["precnb_mbps"] / row["floor_mbps"]
    return res


# ---------------------------------------------------------------------------- CLI end to end
def _finding(stdout: str) -> dict[str, Any]:
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        return {}


def _msprobe_nodes(outdir: Path, pattern: str) -> dict[int, str]:
    files = sorted(outdir.glob(pattern))
    if not files:
        return {}
    doc = json.loads(files[-1].read_text())
    out = {}
    for k, v in doc.items():
        if k.startswith("rank_") and v:
            out[int(k[5:])] = v[0].get("op_name", "")
    return out


def bench_cli(root: Path, m: dict[str, Any], reps: int, ms_reps: int, use_msprobe: bool) -> dict[str, Any]:
    """precnb diff / nan vs msprobe compare -da / overflow_check on the same folders.

    Two questions per case: the faulty step folder only (same input on both sides), and the
    whole run: precnb searches every step in one call; msprobe works on one step folder per
    call, so a user runs it on step 0, 1, ... until it reports the fault (the sum of the
    per-step medians; msprobe is not charged for the steps after the fault).
    """
    ms = msprobe_cmd() if use_msprobe else None
    rows: list[dict[str, Any]] = []
    for case, truth, p_tree, m_args, pattern in (
        ("diff", m["divergence"], ("baseline", "diverge"),
         lambda k, o: ["compare", "-tp", str(root / "diverge" / f"step{k}"), "-gp",
                       str(root / "baseline" / f"step{k}"), "-da", "-o", str(o)], "diff_analyze_*.json"),
        ("nan", m["nan"], ("nan",),
         lambda k, o: ["overflow_check", "-i", str(root / "nan" / f"step{k}"), "-o", str(o)],
         "anomaly_analyze_*.json"),
    ):
        fault = truth["step"]

        def p_cmd(step: int | None, *, case: str = case, p_tree: tuple[str, ...] = p_tree) -> list[str]:
            paths = [str(root / t / f"step{step}") if step is not None else str(root / t) for t in p_tree]
            return [*precnb_cmd(), case, *paths, "--json"]

        p_step, p_run, m_step = [], [], {k: [] for k in range(fault + 1)}
        m_nodes: dict[int, dict[int, str]] = {}
        answers: dict[str, dict[str, Any]] = {}
        for i in range(max(reps, ms_reps if ms else 0)):
            jobs = []
            if i < reps:
                jobs += [("p_step", p_cmd(fault)), ("p_run", p_cmd(None))]
            if ms and i < ms_reps:
                jobs += [(f"m{k}", k) for k in range(fault + 1)]
            if i % 2:
                jobs.reverse()
            for name, job in jobs:
                if name.startswith("p_"):
                    r = run_measured(job)
                    if r["rc"] != 0:
                        raise SystemExit(f"precnb {case} failed: {r['stderr'][-2000:]}")
                    (p_step if name == "p_step" else p_run).append(r)
                    answers[name] = _finding(r["stdout"])
                else:
                    with tempfile.TemporaryDirectory(prefix="msprobe-out-") as tmp:
                        r = run_measured([*ms, *m_args(job, Path(tmp) / "out")], cwd=Path(tmp))
                        m_nodes[job] = _msprobe_nodes(Path(tmp) / "out", pattern)
                    m_step[job].append(r)
        want = (truth["step"], truth["rank"], truth["node"])
        for scope in ("step", "run"):
            runs = p_step if scope == "step" else p_run
            ans = answers["p_step" if scope == "step" else "p_run"]
            got = (ans.get("step"), ans.get("rank"), ans.get("node"))
            row: dict[str, Any] = {
                "case": case, "ranks": m["ranks"], "scope": scope,
                "folder": f"step{fault}" if scope == "step" else f"whole run ({m['steps']} steps)",
                "truth": f"step {want[0]}, rank {want[1]}, {want[2]}",
                "precnb_s": median([r["wall"] for r in runs]), "precnb_mb": max(r["peak_mb"] for r in runs),
                "precnb_answer": f"step {got[0]}, rank {got[1]}, {got[2]}" + (
                    f" (steps {', '.join(map(str, skipped))} not read)"
                    if (skipped := ans.get("stats", {}).get("steps_not_searched")) else ""),
                "precnb_correct": got == want,
                "reps": reps,
            }
            if ms:
                steps = [fault] if scope == "step" else list(range(fault + 1))
                ok = all(r["rc"] == 0 for k in steps for r in m_step[k])
                row["msprobe_s"] = sum(median([r["wall"] for r in m_step[k]]) for k in steps)
                row["msprobe_mb"] = max(r["peak_mb"] for k in steps for r in m_step[k])
                row["msprobe_calls"] = len(steps)
                row["msprobe_reps"] = ms_reps
                nodes = m_nodes.get(fault, {})
                row["msprobe_answer"] = ("; ".join(f"rank {k}: {v}" for k, v in sorted(nodes.items())[:3])
                                         + (f"; … ({len(nodes)} ranks)" if len(nodes) > 3 else "")) or "none"
                if scope == "run":
                    early = [k for k in range(fault) if m_nodes.get(k)]
                    if early:
                        row["msprobe_answer"] = (f"step {early[0]}: " + "; ".join(
                            f"rank {k}: {v}" for k, v in sorted(m_nodes[early[0]].items())[:3]))
                row["agree"] = nodes.get(want[1]) == got[2] and got[1] == want[1] and (
                    scope == "step" or not any(m_nodes.get(k) for k in range(fault)))
                row["speedup"] = row["msprobe_s"] / row["precnb_s"]
                if not ok:
                    bad = [r for k in steps for r in m_step[k] if r["rc"] != 0]
                    row["msprobe_error"] = bad[-1]["stderr"][-500:]
            rows.append(row)
    return {"rows": rows}


# --------------------------------------------------------------------------- scale (child)
def scale_task(root: Path, out: Path, manifest: dict[str, Any]) -> None:
    """In a fresh process: load, first divergence, NaN origin, heat map, selection; phase times."""
    import warnings

    warnings.simplefilter("ignore")
    os.environ["PRECNB_NO_DASK_CLIENT"] = "1"
    res: dict[str, Any] = {}
    t0 = time.perf_counter()
    import precnb

    res["import_s"] = time.perf_counter() - t0

    def timed(name: str, fn: Any) -> Any:
        t = time.perf_counter()
        v = fn()
        res[name] = time.perf_counter() - t
        return v

    runs = {"baseline": timed("load_baseline_s", lambda: precnb.open_run(root / "baseline", progress=False))}
    runs["diverge"] = timed("load_diverge_s", lambda: precnb.open_run(root / "diverge", progress=False))
    res["sizes"] = dict(runs["baseline"].sizes)
    f = timed("first_divergence_s", lambda: precnb.first_divergence(runs["baseline"], runs["diverge"]))
    res["divergence"] = {"step": f.step, "rank": f.rank, "node": f.node}
    runs.clear()
    nan = timed("load_nan_s", lambda: precnb.open_run(root / "nan", progress=False))
    g = timed("nan_origin_s", lambda: precnb.nan_origin(nan))
    res["nan"] = {"step": g.step, "rank": g.rank, "node": g.node}
    try:
        import precnb.viz as viz

        frame = timed("heatmap_frame_s", lambda: viz.heatmap_frame(nan, by="rank", color="events"))
        spec = timed("heatmap_chart_s", lambda: viz.heatmap_chart(frame).to_dict())
        res["heatmap_cells"] = len(frame)
        res["heatmap_spec_kb"] = len(json.dumps(spec, default=str)) / 1024
        hot = frame.sort_values("nonfinite", ascending=False).iloc[0]

        def select() -> Any:
            tensor, step, rank = str(hot["tensor"]), int(hot["worst_step"]), int(hot["worst_rank"])
            s = viz.series_frame(nan, tensor, keep_ranks=[rank])
            d = viz.detail_frame(nan, step=step, rank=rank)
            return len(s) + len(d)

        timed("selection_s", select)
        frame2 = timed("heatmap_frame_by_step_s", lambda: viz.heatmap_frame(nan, by="step"))
        res["heatmap_by_step_cells"] = len(frame2)
    except Exception as exc:  # reported, not fatal (viz is being built elsewhere)
        res["viz_error"] = f"{type(exc).__name__}: {exc}"
    res["total_s"] = time.perf_counter() - t0
    out.write_text(json.dumps(res, indent=2, default=str))


def stream_task(root: Path, out: Path) -> None:
    """In a fresh process: stream the NaN tree into zarr, reopen lazily, NaN origin and anomalies on it."""
    import warnings

    warnings.simplefilter("ignore")
    os.environ["PRECNB_NO_DASK_CLIENT"] = "1"
    import precnb

    res: dict[str, Any] = {}
    store = root.parent / "nan.zarr"
    t = time.perf_counter()
    precnb.to_zarr(root / "nan", store, mode="w", progress=False)
    res["to_zarr_s"] = time.perf_counter() - t
    t = time.perf_counter()
    lazy = precnb.open_run(store, lazy=True)
    res["open_lazy_s"] = time.perf_counter() - t
    res["chunks"] = str(lazy["max"].data.chunksize)
    t = time.perf_counter()
    g = precnb.nan_origin(lazy)
    res["nan_origin_lazy_s"] = time.perf_counter() - t
    res["nan"] = {"step": g.step, "rank": g.rank, "node": g.node}
    t = time.perf_counter()
    a = precnb.anomalies(lazy)
    res["anomalies_lazy_s"] = time.perf_counter() - t
    res["anomaly"] = {"step": a.step, "rank": a.rank, "node": a.node}
    res["store_mb"] = sum(p.stat().st_size for p in store.rglob("*") if p.is_file()) / 1e6
    out.write_text(json.dumps(res, indent=2, default=str))


def bench_scale(root: Path, m: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "scale.json"
        r = run_measured([sys.executable, str(Path(__file__).resolve()), "--scale-task", str(root),
                          "--task-out", str(out)])
        if r["rc"] != 0:
            return {"error": r["stderr"][-3000:]}
        res = json.loads(out.read_text())
        res["wall_s"], res["peak_mb"] = r["wall"], r["peak_mb"]
        out2 = Path(tmp) / "stream.json"
        r2 = run_measured([sys.executable, str(Path(__file__).resolve()), "--stream-task", str(root),
                           "--task-out", str(out2)])
        if r2["rc"] == 0:
            res["stream"] = json.loads(out2.read_text())
            res["stream"]["wall_s"], res["stream"]["peak_mb"] = r2["wall"], r2["peak_mb"]
        else:
            res["stream"] = {"error": r2["stderr"][-3000:]}
    res["truth"] = {"divergence": m["divergence"], "nan": m["nan"]}
    return res


# ------------------------------------------------------------------------------- report
def _loadavg(v: Any) -> str:
    return "n/a" if not v else ", ".join(f"{x:.1f}" for x in v)


def _fmt_s(x: float) -> str:
    return "–" if x != x else (f"{x:.2f} s" if x < 100 else f"{x:.0f} s")


def write_report(path: Path, res: dict[str, Any]) -> str:
    mach = res["machine"]
    lines = [
        "# precnb benchmark results",
        "",
        f"Written by `benchmarks/run.py` on {time.strftime('%Y-%m-%d %H:%M', time.localtime(res['started']))}"
        f" in {res['elapsed_s'] / 60:.1f} min (sizes {', '.join(map(str, res['sizes']))} ranks × {STEPS} steps).",
        "Every ratio compares two things measured in the same run; each figure is the **median** of the "
        "repetitions shown, and the two sides alternate within each repetition.",
        "",
        "## Machine",
        "",
        f"- CPU: {mach['cpu']}, {mach['cores']} cores; RAM {mach['ram_gib']} GiB; {mach['os']}",
        f"- Python {mach['python']}; numpy {mach['numpy']}, xarray {mach['xarray']}, pandas {mach['pandas']}, "
        f"dask {mach['dask']}, distributed {mach['distributed']}, zarr {mach['zarr']}, orjson {mach['orjson']}",
        f"- precnb {mach['precnb']}; msprobe (mindstudio-probe) {mach['mindstudio-probe']}, torch {mach['torch']}",
        f"- load average (1, 5, 15 min) at start {_loadavg(mach['load_average_at_start'])}, at the end "
        f"{_loadavg(res.get('load_average_at_end'))}: the 2 cores are shared with other jobs, so absolute "
        "times vary between runs (ratios much less: both sides of each ratio alternate)",
        "",
        "Inputs: synthetic trees from `benchmarks/generate.py`: the real msprobe S1 statistics dump "
        "(2-block GPT, 367 nodes, 913 tensors per file, ~300 KB dump.json with `-Infinity` causal-mask tokens) "
        "repeated over ranks and steps with per-(step, rank) values; `nan/` has NaN from "
        "the output of one node onward at one (step, rank), `diverge/` has every statistic ×2 from one node "
        "onward at one (step, rank). Files are read from the page cache (warm) on both sides.",
        "",
    ]
    lines += ["## 1. Load throughput (precnb.open_run vs json.loads of the same bytes)", ""]
    lines += ["| tree | where | MB | json.loads floor | precnb | precnb / floor | reps |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for size, lb in res["load"].items():
        for row in lb["rows"]:
            lines.append(f"| {size} ranks | {row['where']} | {lb['mb']:.0f} | {row['floor_mbps']:.1f} MB/s "
                         f"({_fmt_s(row['floor_s'])}) | {row['precnb_mbps']:.1f} MB/s ({_fmt_s(row['precnb_s'])}) "
                         f"| **{row['ratio']:.2f}** | {row['reps']} |")
    lines += ["", "precnb's time includes discovery, parsing, alignment into the (step, rank, tensor) arrays "
              "and the xarray Dataset; the floor only reads and parses (plain `json.loads`, garbage collector "
              "on; precnb pauses the cyclic collector while it parses a file). On a cluster each side runs "
              "one task per (step, rank) folder on the same workers. *Local worker processes* is "
              "`open_run(..., workers=N)` (what the command line uses, `--workers auto`): a process pool "
              "without dask, against the floor mapped over the same number of forked processes. This "
              "machine has 2 cores for the scheduler, the client and the workers together: dask's "
              "per-task overhead (~1.5 ms of scheduler time per task here) and the client's share of the "
              "cores limit what a second worker adds, for the floor as much as for precnb.", ""]
    lines += ["## 2. End to end on the command line (interpreter start included)", ""]
    lines += ["| task | ranks | folder | precnb | msprobe | speed-up | peak RSS precnb / msprobe | "
              "precnb answer | msprobe answer | same node |",
              "|---|---:|---|---:|---:|---:|---:|---|---|---|"]
    for size, cb in res["cli"].items():
        for row in cb["rows"]:
            ms_name = "compare -da" if row["case"] == "diff" else "overflow_check"
            calls = f" ({row['msprobe_calls']} calls)" if row.get("msprobe_calls", 1) > 1 else ""
            if "msprobe_s" in row:
                lines.append(
                    f"| `precnb {row['case']}` vs `msprobe {ms_name}` | {size} | {row['folder']} | "
                    f"{_fmt_s(row['precnb_s'])} | {_fmt_s(row['msprobe_s'])}{calls} | **{row['speedup']:.1f}×** | "
                    f"{row['precnb_mb']:.0f} / {row['msprobe_mb']:.0f} MB | {row['precnb_answer']}"
                    f"{' ✓' if row['precnb_correct'] else ' ✗'} | {row['msprobe_answer']} | "
                    f"{'yes' if row['agree'] else 'no'} |")
            else:
                lines.append(f"| `precnb {row['case']}` | {size} | {row['folder']} | {_fmt_s(row['precnb_s'])} | "
                             f"not run | – | {row['precnb_mb']:.0f} MB / – | {row['precnb_answer']} | – | – |")
    reps = next((r for cb in res["cli"].values() for r in cb["rows"]), {})
    lines += ["", f"Medians of {reps.get('reps', '?')} precnb runs and {reps.get('msprobe_reps', '?')} msprobe runs. "
              "Peak RSS is summed over the process tree, sampled every 20 ms: precnb's forked parsing "
              "workers share most pages with their parent, so its figure counts those pages two or "
              "three times (an upper bound). "
              "*stepN*: both tools read the same step folder (the faulty one). *whole run*: precnb searches all "
              "steps in one call, reading them in order and stopping at the first step that diverges "
              "(`stats.steps_not_searched` in its JSON; the answer is the whole-run answer), with "
              "`--workers auto` (2 processes here) parsing; msprobe reads one step folder per call, so its "
              "figure is the sum of its "
              "per-step medians for steps 0..N (a user stops at the step where it reports the fault). "
              "✓: precnb named the injected (step, rank, node). msprobe's answer is the first node it lists "
              "for each rank (`same node`: msprobe names the injected node on the injected rank). "
              "`msprobe overflow_check` reports the causal mask's `-inf` "
              "(`Tensor.masked_fill`, present in every healthy step) as the first anomaly on every rank and "
              "every step; precnb treats those infinities as benign and names the injected NaN.", ""]
    sc = res.get("scale")
    if sc:
        n_scale = res.get("scale_ranks", 1024)
        lines += [f"## 3. Scale: {n_scale:,} ranks × {STEPS} steps", ""]
        if "error" in sc:
            lines += ["The scale task failed:", "", "```", sc["error"], "```", ""]
        else:
            sz = sc.get("sizes", {})
            lines += [f"Dataset: {sz.get('step')} steps × {sz.get('rank')} ranks × {sz.get('tensor')} tensors per run; "
                      f"{res['sizes_mb'].get(n_scale, 0):.0f} MB of JSON per tree. One fresh process, in memory:", "",
                      "| phase | time |", "|---|---:|"]
            for key, label in (("import_s", "import precnb"), ("load_baseline_s", "load baseline"),
                               ("load_diverge_s", "load diverge"), ("first_divergence_s", "first divergence"),
                               ("load_nan_s", "load nan"), ("nan_origin_s", "NaN origin"),
                               ("heatmap_frame_s", "heat-map data (rows × rank buckets)"),
                               ("heatmap_chart_s", "heat-map chart spec (altair to_dict)"),
                               ("selection_s", "cell selection (line series + detail table)"),
                               ("heatmap_frame_by_step_s", "heat-map data (rows × steps)"),
                               ("total_s", "total")):
                if key in sc:
                    lines.append(f"| {label} | {_fmt_s(sc[key])} |")
            if "viz_error" in sc:
                lines.append(f"| heat map | skipped: `{sc['viz_error']}` |")
            t = sc["truth"]
            lines += ["", f"Peak RSS of the process: **{sc['peak_mb'] / 1024:.2f} GB** (wall {_fmt_s(sc['wall_s'])}). "
                      f"First divergence found: {sc['divergence']} (injected {t['divergence']}); "
                      f"NaN origin: {sc['nan']} (injected {t['nan']}).", ""]
            st = sc.get("stream", {})
            if "error" in st:
                lines += ["Streaming conversion failed:", "", "```", st["error"], "```", ""]
            elif st:
                lines += [f"Out of core: `precnb.to_zarr(nan/, store)` streamed one step at a time in "
                          f"{_fmt_s(st['to_zarr_s'])} ({st['store_mb']:.0f} MB store, chunks {st['chunks']}); "
                          f"`open_run(store, lazy=True)` {_fmt_s(st['open_lazy_s'])}; `nan_origin` on the lazy "
                          f"dataset {_fmt_s(st['nan_origin_lazy_s'])} → {st['nan']}"
                          + (f"; `anomalies` on it (blocks of ranks, all steps) {_fmt_s(st['anomalies_lazy_s'])}"
                             f" → first anomaly {st['anomaly']}" if "anomalies_lazy_s" in st else "")
                          + f"; peak RSS {st['peak_mb'] / 1024:.2f} GB.", ""]
    lines += ["## Targets", ""] + res["targets"] + [""]
    text = "\n".join(lines)
    path.write_text(text)
    return text


def targets(res: dict[str, Any]) -> list[str]:
    out = []
    for size, lb in res["load"].items():
        one = lb["rows"][0]
        out.append(f"- Load on one core ≥ {TARGETS['load_ratio']} × json.loads ({size} ranks): "
                   f"**{'met' if one['ratio'] >= TARGETS['load_ratio'] else 'NOT met'}** "
                   f"({one['precnb_mbps']:.1f} vs {one['floor_mbps']:.1f} MB/s, ratio {one['ratio']:.2f}).")
        for pool, label in (("local", "local worker processes"), ("dask", "LocalCluster workers")):
            by_n = {r["n"]: r for r in lb["rows"][1:] if r.get("pool") == pool}
            w1, w2 = by_n.get(1), by_n.get(2)
            if w2 is not None and w1 is not None:
                grows = w2["precnb_mbps"] > w1["precnb_mbps"]
                out.append(f"- Throughput grows with {label} ({size} ranks): **{'met' if grows else 'NOT met'}** "
                           f"(1 → 2: {w1['precnb_mbps']:.1f} → {w2['precnb_mbps']:.1f} MB/s, "
                           f"×{w2['precnb_mbps'] / w1['precnb_mbps']:.2f}; the json.loads floor on the same "
                           f"workers ×{w2['floor_mbps'] / w1['floor_mbps']:.2f}; in-process "
                           f"{one['precnb_mbps']:.1f} MB/s).")
            elif w2 is not None:
                out.append(f"- {size} ranks with 2 {label} (1 not run at this size): "
                           f"{w2['precnb_mbps']:.1f} MB/s vs {one['precnb_mbps']:.1f} MB/s in-process; ratio to "
                           f"the floor on the same workers {w2['ratio']:.2f}.")
    for size, key in ((4, "diff_4"), (64, "diff_64")):
        for row in res["cli"].get(size, {"rows": []})["rows"]:
            if row["case"] != "diff":
                continue
            what = "the faulty step folder" if row["scope"] == "step" else "the whole run"
            if "speedup" in row:
                ok = row["speedup"] >= TARGETS[key]
                out.append(f"- `precnb diff` ≥ {TARGETS[key]:.0f}× faster than `msprobe compare -da` ({size} ranks, "
                           f"{what}): **{'met' if ok else 'NOT met'}** ({_fmt_s(row['precnb_s'])} vs "
                           f"{_fmt_s(row['msprobe_s'])}, {row['speedup']:.1f}×; same node: "
                           f"{'yes' if row['agree'] else 'no'}).")
            else:
                out.append(f"- `precnb diff` vs `msprobe compare -da` ({size} ranks, {what}): msprobe not run here.")
    sc = res.get("scale")
    n_scale = res.get("scale_ranks", 1024)
    if sc and "peak_mb" in sc:
        ok = sc["peak_mb"] / 1024 <= TARGETS["rss_gb"] and "viz_error" not in sc
        out.append(f"- {n_scale:,} ranks loaded, first divergence, NaN origin and heat map within "
                   f"{TARGETS['rss_gb']:.0f} GB: **{'met' if ok else 'NOT met'}** (peak "
                   f"{sc['peak_mb'] / 1024:.2f} GB, {_fmt_s(sc['total_s'])} in total"
                   f"{'; heat map skipped' if 'viz_error' in sc else ''}).")
    elif sc:
        out.append(f"- {n_scale:,}-rank scale task: **failed** (see above).")
    return out


# --------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="precnb benchmarks (see the module docstring)")
    ap.add_argument("--sizes", default="4,64,1024", help="rank counts (default 4,64,1024)")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "precnb-bench")
    ap.add_argument("--reps", type=int, default=5, help="repetitions for small cases")
    ap.add_argument("--msprobe-reps", type=int, default=3)
    ap.add_argument("--no-msprobe", action="store_true")
    ap.add_argument("--msprobe", type=Path, metavar="PATH",
                    help="the msprobe executable (e.g. /work/venvs/gen/bin/msprobe); default: beside this "
                         "interpreter, else on PATH")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny end-to-end run of every code path (4 and 8 ranks, 1 repetition; the 8-rank "
                         "tree takes the scale path) into --out, for make test: figures mean nothing")
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    ap.add_argument("--scale-task", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--stream-task", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--task-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--render", action="store_true",
                    help="rewrite RESULTS.md from RESULTS.json (no measurement)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bytecode import compile_precnb

    compile_precnb()  # an installed package's bytecode, not compiled inside what is timed (see _bytecode)
    if args.render:
        res = json.loads(args.out.with_suffix(".json").read_text())
        for key in ("load", "cli", "sizes_mb"):
            res[key] = {int(k): v for k, v in res[key].items()}
        res["targets"] = targets(res)
        log(write_report(args.out, res))
        return 0
    if args.scale_task:
        scale_task(args.scale_task, args.task_out, {})
        return 0
    if args.stream_task:
        stream_task(args.stream_task, args.task_out)
        return 0
    global MSPROBE
    if args.msprobe is not None:
        if not (args.msprobe.is_file() and os.access(args.msprobe, os.X_OK)):
            ap.error(f"--msprobe {args.msprobe}: not an executable file")
        MSPROBE = args.msprobe
    if args.smoke and args.out == HERE / "RESULTS.md":
        ap.error("--smoke writes meaningless figures: give --out outside benchmarks/")
    started = time.time()
    sizes = [4, 8] if args.smoke else [int(s) for s in args.sizes.split(",") if s]
    large_from = 8 if args.smoke else 65  # sizes from here take the scale path
    workers_at = max([n for n in sizes if n < large_from], default=None)  # the worker / LocalCluster rows
    if args.smoke:
        args.reps = args.msprobe_reps = 1
    args.workdir.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"started": started, "sizes": sizes, "machine": machine(), "load": {}, "cli": {},
                           "sizes_mb": {}}
    mach = res["machine"]
    log(f"machine: {mach['cpu']}, {mach['cores']} cores, load {mach['load_average_at_start']}")
    roots = {}
    for n in sizes:
        roots[n] = trees(args.workdir, n)
        res["sizes_mb"][n] = roots[n][1]["bytes_per_tree"] / 1e6
    use_ms = not args.no_msprobe and msprobe_cmd() is not None
    if not use_ms:
        log("msprobe not found (or --no-msprobe): msprobe rows are skipped")
    for n in sizes:
        root, m = roots[n]
        if n < large_from:
            log(f"[{n} ranks] load throughput ...")
            res["load"][n] = bench_load(root / "baseline", args.reps, workers=(1, 2) if n == workers_at else ())
            for row in res["load"][n]["rows"]:
                log(f"  {row['where']}: precnb {row['precnb_mbps']:.1f} MB/s, floor {row['floor_mbps']:.1f} MB/s, "
                    f"ratio {row['ratio']:.2f}")
            log(f"[{n} ranks] CLI end to end ...")
            res["cli"][n] = bench_cli(root, m, args.reps, args.msprobe_reps, use_ms)
            for row in res["cli"][n]["rows"]:
                log(f"  {row['case']} ({row['scope']}): precnb {_fmt_s(row['precnb_s'])} "
                    f"msprobe {_fmt_s(row.get('msprobe_s', float('nan')))}"
                    f" speed-up {row.get('speedup', float('nan')):.1f}× agree {row.get('agree')}")
        else:
            log(f"[{n} ranks] load throughput ({min(3, args.reps)} reps) ...")
            res["load"][n] = bench_load(root / "baseline", min(3, args.reps), workers=(2,))
            for row in res["load"][n]["rows"]:
                log(f"  {row['where']}: precnb {row['precnb_mbps']:.1f} MB/s, floor {row['floor_mbps']:.1f} MB/s, "
                    f"ratio {row['ratio']:.2f}")
            log(f"[{n} ranks] scale task (fresh process) ...")
            res["scale"] = bench_scale(root, m)
            res["scale_ranks"] = n
            log(f"  {json.dumps({k: v for k, v in res['scale'].items() if k.endswith('_s') or k == 'peak_mb'})}")
    res["elapsed_s"] = time.time() - started
    res["load_average_at_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    res["targets"] = targets(res)
    text = write_report(args.out, res)
    (args.out.with_suffix(".json")).write_text(json.dumps(res, indent=2, default=str))
    log("")
    log(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
