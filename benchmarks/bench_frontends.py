"""The front ends against the pipeline on one large run: explore(), the report, every explorer interaction.

    python benchmarks/bench_frontends.py [--tensors 5000] [--ranks 8] [--steps 4] [--repeat 5]
                                         [--workdir /tmp/precnb-bench-frontends] [--markdown FILE]
                                         [--only edits [--profile PREFIX] | --only explorer | --only ratio]

A 5,000-tensor, 8-rank, 4-step run is built from real msprobe structure (``benchmarks/generate.py``:
the shared S1 statistics dump, else ``data_samples/healthy``, made deeper by copying its records
with renamed nodes, :func:`generate.deepen`), with a NaN from one node onward at one (step, rank)
(``nan/``) and a target whose statistics double from one node onward (``diverge/`` against
``baseline/``). On each case, in one process, the sides of every ratio alternate within each
repetition (medians; the first repetition also stands apart, as "first call", since it pays the
process's one-time costs: importing altair, building the offline JavaScript bundle):

* ``precnb.diagnose(path)`` vs ``precnb.explore(path)`` (target: explore within 1.2x, issue 51);
* ``precnb.diagnose(path)`` vs ``precnb.report.to_html(path)`` (target: within 2x);
* every explorer interaction, kernel (Python) time until the handler returns with every view
  redrawn: each tab opened, each colour, rows / x / sort, a heat-map cell, a suspect link,
  next / previous finding, a tab switch (tabs already opened), Export (the HTML report written from the
  Export tab), and for the pair Match, Unmatch and Rerun (target: each below 0.5 s, issue 51).
  Both the CPU time the kernel process spent (``time.process_time``: what the interaction costs,
  whatever else the machine runs) and the wall time are given; the target is read on the CPU time.

``--only explorer``: the explorer alone (``Explorer(runs, triage=t)``) after the NaN run's triage, ``--repeat``
times: what ``explore()`` costs beyond ``diagnose``, in CPU seconds.

``--only ratio``: ``diagnose`` and ``explore()`` alone on the NaN run, ``--repeat`` alternating pairs after a
warm-up pair in one process (median CPU seconds and their ratio: the 1.2x target read without the rest).

``--only edits``: the pair's Match and Unmatch alone, on ``--repeat`` fresh explorers (medians and each
value; ``--profile PREFIX`` writes a cProfile of the last ones). Run it with ``PYTHONPATH`` pointing at
another checkout to measure that code on the same trees.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import generate  # noqa: E402

TARGETS = {"explore": 1.2, "report": 2.0, "interaction_s": 0.5}  # issue 51: explore within 1.2x, below 0.5 s


def build_trees(work: Path, tensors: int, ranks: int, steps: int) -> tuple[Path, int]:
    """(trees folder, tensors per file): ``baseline/``, ``nan/``, ``diverge/`` below *work*."""
    import json

    template = generate.default_template()
    per = _tensors_of(template)
    copies = max(1, -(-tensors // per))
    deep = generate.deepen(template, copies, work / f"template_x{copies}")
    out = work / f"r{ranks}_s{steps}_x{copies}"
    manifest = out / "manifest.json"
    if not (manifest.exists() and json.loads(manifest.read_text()).get("template") == str(deep)):
        generate.generate(out, ranks=ranks, steps=steps, template=deep, quiet=True)
    return out, per * copies


def _tensors_of(template: Path) -> int:
    import precnb

    first = sorted(p for p in template.iterdir() if p.name.startswith("step"))[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return int(precnb.open_run(first, progress=False).sizes["tensor"])


def _load() -> str:
    """The load averages as ``uptime`` prints them (1, 5, 15 minutes)."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def _cpu(fn: Callable[[], object]) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) of one call."""
    c, t = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c, time.perf_counter() - t


def compare_sides(sides: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[tuple[float, float]]]:
    """(CPU, wall) seconds of each side, alternating within each repetition (the first repetition included)."""
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
    for _ in range(repeat):
        for name, fn in sides.items():
            times[name].append(_cpu(fn))
    return times


def interactions(ex, paired: bool, repeat: int) -> list[tuple[str, float, float]]:
    """(what, CPU seconds, wall seconds) of every explorer interaction, as its handler runs (medians)."""
    out: list[tuple[str, float, float]] = []

    def once(what: str, fn: Callable[[], object]) -> None:
        out.append((what, *_cpu(fn)))

    def med(what: str, fns: list[Callable[[], object]]) -> None:
        fns[0]()  # warm-up (what is computed once per explorer)
        got = [_cpu(f) for f in fns[1:]]
        out.append((what, statistics.median(c for c, _w in got), statistics.median(w for _c, w in got)))

    f = ex.filters
    for p in ex.panels:  # open each tab (the first opening computes what the tab shows)
        once(f"tab {p.title} (first opening)", lambda p=p: setattr(ex.tabs, "selected_index", ex.panels.index(p)))
    ex.tabs.selected_index = 0
    order = list(range(len(ex.panels))) * (repeat + 1)
    med("tab switch (every tab opened before)", [lambda i=i: setattr(ex.tabs, "selected_index", i)
                                                 for i in order[1: repeat + 2]])
    ex.tabs.selected_index = 0
    export = ex.panel("Export")
    if export is not None:
        import tempfile

        tmp = Path(tempfile.mkdtemp(prefix="precnb-bench-export-"))

        def write(k: int) -> None:
            export.path.value = str(tmp / f"report{k}.html")
            assert export.export() is not None, export.status.value

        med("Export (the HTML report, from the Export tab)", [lambda k=k: write(k) for k in range(max(repeat, 2))])
    for value in [v for _label, v in f.color.options]:
        once(f"colour {value} (first)", lambda v=value: setattr(f.color, "value", v))
    f.color.value = "first_bad"
    for what, w, values in (("rows module / node", f.rows, ["node", "module"]),
                            ("x step / rank", f.by, ["rank", "step"]),
                            ("sort value / first", f.sort, ["value", "first"])):
        seq = (values * (repeat + 1))[: repeat + 1]
        med(what, [lambda w=w, v=v: setattr(w, "value", v) for v in seq])
    frame = ex.heatmap_frame()
    cells = frame[["row", "col", "group"]].drop_duplicates().head(repeat + 1).values.tolist()
    med("heat-map cell", [lambda c=c: ex.select_cell(*c) for c in cells])
    med("next / previous finding", [lambda i=i: ex.bar.step(1 if i % 2 else -1) for i in range(repeat + 1)])
    links = [b for b in ex.bar.suspects.children if hasattr(b, "click")]
    if links:
        med("suspect link", [lambda b=b: b.click() for b in (links * (repeat + 1))[: repeat + 1]])
    if paired:
        out += edits(ex)
    once("Rerun (another tolerance)", lambda: ex.rerun(tolerance=1e-3))
    return out


def edits(ex, profile: Path | None = None) -> list[tuple[str, float, float]]:
    """(what, CPU seconds, wall seconds) of one Match (a module pair) then one Unmatch (a call) on *ex*.

    *profile*: also write a cProfile of each (``PROFILE.match``, ``PROFILE.unmatch``; the times then
    include the profiler's cost).
    """
    import cProfile

    def timed(fn: Callable[[], object], name: str) -> tuple[float, float]:
        if profile is None:
            return _cpu(fn)
        prof = cProfile.Profile()
        got = _cpu(lambda: prof.runcall(fn))
        prof.dump_stats(f"{profile}.{name}")
        return got

    panel = ex.panel("Alignment")
    ex.tabs.selected_index = ex.panels.index(panel)  # as a person does it: on the tab, which redraws
    mod = next(p for p in ex.triage.alignment.modules if p.baseline and p.target)
    panel.level.value = "modules"
    panel.pick(left=mod.baseline, right=mod.target)
    out = [("Match (a module pair; reruns the triage, redraws the tab)", *timed(panel.do_match, "match"))]
    panel.level.value = "calls"
    call = [p for p in ex.triage.alignment.nodes if p.target.endswith(".backward")][-1]
    panel.pick(left=call.baseline, right=call.target)
    out.append(("Unmatch (a call; reruns the triage, redraws the tab)", *timed(panel.do_unmatch, "unmatch")))
    assert "first finding now" in panel.output.value, panel.output.value
    ex.tabs.selected_index = 0
    return out


def edits_only(trees: Path, repeat: int, profile: Path | None) -> list[str]:
    """Match / Unmatch on *repeat* fresh explorers of the pair (medians): ``--only edits``."""
    import precnb

    runs = []
    for i in range(repeat):
        ex = precnb.explore(trees / "diverge", baseline=trees / "baseline", progress=False)
        runs.append(edits(ex, profile if i == repeat - 1 else None))
    lines = ["| explorer interaction (pair) | median kernel CPU | CPU of each | median wall |", "|---|---:|---|---:|"]
    for j, (what, _c, _w) in enumerate(runs[0]):
        cs, ws = [r[j][1] for r in runs], [r[j][2] for r in runs]
        lines.append(f"| {what} | {statistics.median(cs) * 1000:.0f} ms | "
                     f"{', '.join(f'{c * 1000:.0f}' for c in cs)} | {statistics.median(ws) * 1000:.0f} ms |")
    return lines


def explorer_only(trees: Path, repeat: int) -> list[str]:
    """CPU seconds of the explorer alone (``Explorer(runs, triage=t)`` after the triage) on the NaN run: ``--only
    explorer``, what ``explore()`` costs beyond ``diagnose`` (the first explorer of the process left out)."""
    import precnb
    from precnb.widgets._inputs import runs_for
    from precnb.widgets.explorer import Explorer

    target = trees / "nan"
    precnb.explore(target, progress=False)  # the process's one-time costs
    cs = []
    for _ in range(repeat):
        runs, t = runs_for(target, None, auto=True, options={"progress": False})
        c = time.process_time()
        Explorer(runs, triage=t)
        cs.append(time.process_time() - c)
    return [f"explorer alone (NaN run), CPU s: median {statistics.median(cs):.3f} "
            f"({', '.join(f'{c:.3f}' for c in cs)}); load {_load()}"]


def ratio_only(trees: Path, repeat: int) -> list[str]:
    """``diagnose`` then ``explore()`` on the NaN run, *repeat* alternating pairs after a warm-up pair, in one
    process: median CPU seconds of each and their ratio (``--only ratio``; target: explore within 1.2x)."""
    import precnb

    target = trees / "nan"
    precnb.diagnose(target, progress=False)
    precnb.explore(target, progress=False)
    times = compare_sides({"diagnose": lambda: precnb.diagnose(target, progress=False),
                           "explore": lambda: precnb.explore(target, progress=False)}, repeat)
    d, e = (statistics.median(c for c, _w in times[k]) for k in ("diagnose", "explore"))
    return [f"NaN run, median CPU s of {repeat} alternating pairs: diagnose {d:.3f}, explore {e:.3f}, "
            f"ratio {e / d:.3f} (target {TARGETS['explore']}); load {_load()}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=5000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/precnb-bench-frontends"))
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument("--only", choices=["all", "edits", "explorer", "ratio"], default="all",
                    help="edits: only the pair's Match and Unmatch, on --repeat fresh explorers; explorer: the "
                         "explorer alone after the NaN run's triage, --repeat times")
    ap.add_argument("--profile", type=Path, default=None,
                    help="with --only edits: cProfile the last Match / Unmatch into PROFILE.match / .unmatch")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bytecode import compile_precnb

    compile_precnb()  # an installed package's bytecode, not compiled inside what is timed (see _bytecode)
    os.environ.setdefault("PRECNB_NO_DASK_CLIENT", "1")
    warnings.simplefilter("ignore")
    trees, n_tensors = build_trees(args.workdir, args.tensors, args.ranks, args.steps)
    if args.only == "edits":
        print("\n".join(edits_only(trees, args.repeat, args.profile)))
        return 0
    if args.only == "explorer":
        print("\n".join(explorer_only(trees, args.repeat)))
        return 0
    if args.only == "ratio":
        print("\n".join(ratio_only(trees, args.repeat)))
        return 0
    import precnb
    from precnb.report import to_html

    t0 = time.perf_counter()
    load_before = _load()
    lines = [f"Front ends on a {n_tensors}-tensor, {args.ranks}-rank, {args.steps}-step run "
             f"(`benchmarks/bench_frontends.py`, precnb from `{Path(precnb.__file__).parent}`): seconds, medians of "
             f"{args.repeat} alternating repetitions (first call: the first repetition, with the process's one-time "
             "costs); the ratio is read on the wall times, the CPU times (this process) beside them.", "",
             "| case | side | first call | median wall | ratio to diagnose | median CPU | CPU ratio | target |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    rows: list[tuple[str, float, float]] = []
    for case, target, baseline in (("NaN run", trees / "nan", None),
                                   ("pair", trees / "diverge", trees / "baseline")):
        sides = {"diagnose": lambda t=target, b=baseline: precnb.diagnose(t, baseline=b, progress=False),
                 "explore": lambda t=target, b=baseline: precnb.explore(t, baseline=b, progress=False),
                 "report": lambda t=target, b=baseline: to_html(t, baseline=b, progress=False)}
        times = compare_sides(sides, args.repeat)
        base = statistics.median(w for _c, w in times["diagnose"])
        base_cpu = statistics.median(c for c, _w in times["diagnose"])
        for side, ts in times.items():
            wall, cpu = statistics.median(w for _c, w in ts), statistics.median(c for c, _w in ts)
            ratio = wall / base
            goal = TARGETS.get(side)
            lines.append(f"| {case} | {side} | {ts[0][1]:.2f} | {wall:.2f} | {ratio:.2f} | {cpu:.2f} | "
                         f"{cpu / base_cpu:.2f} | "
                         + (f"≤ {goal} ({'met' if ratio <= goal else '**not met**'})" if goal else "") + " |")
        ex = precnb.explore(target, baseline=baseline, progress=False)
        rows += [(f"{case}: {what}", c, w) for what, c, w in interactions(ex, baseline is not None, args.repeat)]
    worst = max(c for _w, c, _t in rows)
    lines += ["", "| explorer interaction | kernel CPU time | wall time |", "|---|---:|---:|"]
    cap = TARGETS["interaction_s"]
    lines += [f"| {what} | {c * 1000:.0f} ms{'' if c < cap else f' **over {cap:g} s**'} | "
              f"{w * 1000:.0f} ms |" for what, c, w in rows]
    lines += ["", f"Slowest interaction {worst:.2f} s of CPU (target below {cap:g} s: "
                  f"{'met' if worst < cap else 'NOT met'}); whole benchmark {time.perf_counter() - t0:.0f} s; "
                  f"machine load (`uptime` load averages 1/5/15 min, {os.cpu_count()} cores): {load_before} before, "
                  f"{_load()} after."]
    text = "\n".join(lines)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
