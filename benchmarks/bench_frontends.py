"""The front ends against the pipeline on one large run: explore(), the report, every explorer interaction.

    python benchmarks/bench_frontends.py [--tensors 5000] [--ranks 8] [--steps 4] [--repeat 5]
                                         [--workdir /tmp/precnb-bench-frontends] [--markdown FILE]

A 5,000-tensor, 8-rank, 4-step run is built from real msprobe structure (``benchmarks/generate.py``:
the shared S1 statistics dump, else ``data_samples/healthy``, made deeper by copying its records
with renamed nodes, :func:`generate.deepen`), with a NaN from one node onward at one (step, rank)
(``nan/``) and a target whose statistics double from one node onward (``diverge/`` against
``baseline/``). On each case, in one process, the sides of every ratio alternate within each
repetition (medians; the first repetition also stands apart, as "first call", since it pays the
process's one-time costs: importing altair, building the offline JavaScript bundle):

* ``precnb.diagnose(path)`` vs ``precnb.explore(path)`` (target: explore within 1.5x);
* ``precnb.diagnose(path)`` vs ``precnb.report.to_html(path)`` (target: within 2x);
* every explorer interaction, kernel (Python) time until the handler returns with every view
  redrawn: each tab opened, each colour, rows / x / sort, a heat-map cell, a suspect link,
  next / previous finding, and for the pair Match, Unmatch and Rerun (target: each below 1 s).

Run it with ``PYTHONPATH`` pointing at another checkout to measure that code on the same trees.
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

TARGETS = {"explore": 1.5, "report": 2.0, "interaction_s": 1.0}


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


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def compare_sides(sides: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """Seconds of each side, alternating within each repetition (the first repetition included)."""
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(repeat):
        for name, fn in sides.items():
            times[name].append(_timed(fn)[0])
    return times


def interactions(ex, paired: bool, repeat: int) -> list[tuple[str, float]]:
    """(what, median seconds) of every explorer interaction, as its handler runs."""
    out: list[tuple[str, float]] = []

    def med(fns: list[Callable[[], object]]) -> float:
        fns[0]()  # warm-up (what is computed once per explorer)
        return statistics.median(_timed(f)[0] for f in fns[1:])

    f = ex.filters
    for p in ex.panels:  # open each tab (the first opening computes what the tab shows)
        t = time.perf_counter()
        ex.tabs.selected_index = ex.panels.index(p)
        out.append((f"tab {p.title} (first opening)", time.perf_counter() - t))
    ex.tabs.selected_index = 0
    for value in [v for _label, v in f.color.options]:
        t = time.perf_counter()
        f.color.value = value
        out.append((f"colour {value} (first)", time.perf_counter() - t))
    f.color.value = "first_bad"
    for what, w, values in (("rows module / node", f.rows, ["node", "module"]),
                            ("x step / rank", f.by, ["rank", "step"]),
                            ("sort value / first", f.sort, ["value", "first"])):
        seq = (values * (repeat + 1))[: repeat + 1]
        out.append((what, med([lambda w=w, v=v: setattr(w, "value", v) for v in seq])))
    frame = ex.heatmap_frame()
    cells = frame[["row", "col", "group"]].drop_duplicates().head(repeat + 1).values.tolist()
    out.append(("heat-map cell", med([lambda c=c: ex.select_cell(*c) for c in cells])))
    out.append(("next / previous finding", med([lambda i=i: ex.bar.step(1 if i % 2 else -1)
                                                for i in range(repeat + 1)])))
    links = [b for b in ex.bar.suspects.children if hasattr(b, "click")]
    if links:
        out.append(("suspect link", med([lambda b=b: b.click() for b in (links * (repeat + 1))[: repeat + 1]])))
    if paired:
        panel = ex.panel("Alignment")
        panel.on_show()
        mod = next(p for p in ex.triage.alignment.modules if p.baseline and p.target)
        panel.level.value = "modules"
        panel.pick(left=mod.baseline, right=mod.target)
        out.append(("Match (a module pair; reruns the triage)", _timed(panel.do_match)[0]))
        panel.level.value = "calls"
        call = [p for p in ex.triage.alignment.nodes if p.target.endswith(".backward")][-1]
        panel.pick(left=call.baseline, right=call.target)
        out.append(("Unmatch (a call; reruns the triage)", _timed(panel.do_unmatch)[0]))
    out.append(("Rerun (another tolerance)", _timed(lambda: ex.rerun(tolerance=1e-3))[0]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=5000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/precnb-bench-frontends"))
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("PRECNB_NO_DASK_CLIENT", "1")
    warnings.simplefilter("ignore")
    trees, n_tensors = build_trees(args.workdir, args.tensors, args.ranks, args.steps)
    import precnb
    from precnb.report import to_html

    t0 = time.perf_counter()
    lines = [f"Front ends on a {n_tensors}-tensor, {args.ranks}-rank, {args.steps}-step run "
             f"(`benchmarks/bench_frontends.py`, precnb from `{Path(precnb.__file__).parent}`): seconds, medians of "
             f"{args.repeat} alternating repetitions (first call: the first repetition, with the process's one-time "
             "costs).", "", "| case | side | first call | median | ratio to diagnose | target |",
             "|---|---|---:|---:|---:|---|"]
    rows: list[tuple[str, float]] = []
    for case, target, baseline in (("NaN run", trees / "nan", None),
                                   ("pair", trees / "diverge", trees / "baseline")):
        sides = {"diagnose": lambda t=target, b=baseline: precnb.diagnose(t, b, progress=False),
                 "explore": lambda t=target, b=baseline: precnb.explore(t, b, progress=False),
                 "report": lambda t=target, b=baseline: to_html(t, baseline=b, progress=False)}
        times = compare_sides(sides, args.repeat)
        base = statistics.median(times["diagnose"])
        for side, ts in times.items():
            ratio = statistics.median(ts) / base
            goal = TARGETS.get(side)
            lines.append(f"| {case} | {side} | {ts[0]:.2f} | {statistics.median(ts):.2f} | {ratio:.2f} | "
                         + (f"≤ {goal} ({'met' if ratio <= goal else '**not met**'})" if goal else "") + " |")
        ex = precnb.explore(target, baseline, progress=False)
        rows += [(f"{case}: {what}", s) for what, s in interactions(ex, baseline is not None, args.repeat)]
    worst = max(s for _w, s in rows)
    lines += ["", "| explorer interaction | kernel time |", "|---|---:|"]
    lines += [f"| {what} | {s * 1000:.0f} ms{'' if s < TARGETS['interaction_s'] else ' **over 1 s**'} |"
              for what, s in rows]
    lines += ["", f"Slowest interaction {worst:.2f} s (target below {TARGETS['interaction_s']:.0f} s: "
                  f"{'met' if worst < TARGETS['interaction_s'] else 'NOT met'}); whole benchmark "
                  f"{time.perf_counter() - t0:.0f} s."]
    text = "\n".join(lines)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
