"""The MoE section of ``RESULTS_accuracy.md`` and ``RESULTS_accuracy_moe.json`` (``bench_accuracy.py`` on MoE draws).

The section starts at :data:`_acc_report.MOE_MARK` and runs to the end of the file; it replaces the previous MoE
section and leaves the dense results above it as they are (the dense writer keeps it in turn).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from _acc_moe import __doc__ as RULE  # noqa: N812
from _acc_report import MOE_MARK, _healthy, _inj, _outcome_table, _per_kind
from _acc_score import VERBS


def _population(manifest: dict[str, Any]) -> list[str]:
    runs = manifest["runs"]
    out = ["| run | layout | seed | bugs | status | seconds |", "|---|---|---|---|---|---|"]
    ids = {r for d in manifest["draws"].values() for x in (*d["healthy"], *d["faults"])
           for r in (x["run"], x.get("reference"), x.get("twin")) if r}
    def order(r: str) -> tuple[int, str, int]:
        return runs[r]["spec"]["seed"], runs[r]["spec"]["layout"], len(runs[r]["spec"]["bugs"])

    missing = sorted(ids - set(runs))
    for rid in sorted(ids & set(runs), key=order):
        v = runs[rid]
        bugs = "; ".join(_inj(b) if b["kind"] != "route_mask" else
                         f"route_mask all ranks, layer {b['layer']}, expert {b['expert']}, steps {b['steps']}"
                         for b in v["spec"]["bugs"]) or "(healthy)"
        out.append(f"| `{rid}` | {v['spec']['layout']} | {v['spec']['seed']} | {bugs} | {v['status']} | "
                   f"{v.get('seconds', '')} |")
    return out + ([f"| {', '.join(f'`{r}`' for r in missing)} | (planned, not generated) | | | | |"] if missing else [])


def _truths(manifest: dict[str, Any]) -> list[str]:
    out = ["| fault | layout | seed | injection (+ condition) | truth: step, rank, node | global module | notes |",
           "|---|---|---|---|---|---|---|"]
    for key, draw in manifest["draws"].items():
        for f in draw["faults"]:
            t = manifest.get("truth", {}).get(f["run"]) or {"status": "not generated"}
            cond = "".join(f" + starved: route_mask layer {c['layer']} expert {c['expert']} step {c['steps']}"
                           for c in f.get("condition", []))
            where = f"{t.get('step')}, {t.get('rank')}, `{t.get('node')}`" if t["status"] == "ok" else t["status"]
            out.append(f"| {f['name']}@d{key} | {f['layout']} | {f['seed']} | {_inj(f['injection'])}{cond} | {where} | "
                       f"`{t.get('module')}` | {'; '.join(t.get('notes', []))} |")
    return out


def _failures(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        if r.get("exact"):
            continue
        got = r.get("error") or (f"step {r.get('step')} rank {r.get('rank')} node `{r.get('node')}` module "
                                 f"`{r.get('module')}` = `{r.get('global_module')}` ({r.get('module_source')})"
                                 if r.get("finding") else "no finding")
        out.append(f"- **{r['verb']}** `{r['case']}` ({r['layout']}): truth step {r.get('truth_step')} rank "
                   f"{r.get('truth_rank')} node `{r.get('truth_node')}` module `{r.get('truth_module')}`; precnb: "
                   f"{got}. Reason: {r.get('reason')}  \n  `{r['command']}`")
    return out


def _timing(rows: list[dict[str, Any]], manifest: dict[str, Any]) -> list[str]:
    by: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.get("seconds") is not None:
            by[r["verb"]].append(r["seconds"])
    gen = [v["seconds"] for v in manifest["runs"].values() if v.get("seconds") is not None]
    out = ["| verb | cases | median s | max s |", "|---|---|---|---|"]
    out += [f"| {v} | {len(by[v])} | {statistics.median(by[v]):.1f} | {max(by[v]):.1f} |" for v in VERBS if by.get(v)]
    if gen:
        out += ["", f"Generating a run (Megatron worker, 3 steps trained and dumped): median "
                    f"{statistics.median(gen):.1f} s, max {max(gen):.1f} s over {len(gen)} runs."]
    return out


HISTORY_HEAD = ["| precnb commit | population | healthy false alarms | exact per verb (fault cases) | notes |",
                "|---|---|---|---|---|"]


def _history(old_section: str, rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """The History table: the previous section's rows (kept across rewrites) and one for this scoring.

    >>> _history("", [{"kind": "healthy", "verb": "nan", "finding": False}], {"precnb": {"commit": "abc"},
    ...          "population": "pop_moe"})[-1]
    '| `abc` | `pop_moe` | 0 / 1 | - |  |'
    """
    kept: list[str] = []
    if "### History" in old_section:
        block = old_section.split("### History", 1)[1].split("\n### ", 1)[0]
        kept = [ln for ln in block.splitlines() if ln.startswith("| ") and ln not in HISTORY_HEAD]
    healthy = [r for r in rows if r["kind"] == "healthy"]
    alarms = sum(bool(r.get("finding")) or bool(r.get("error")) for r in healthy)
    by: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        if r["kind"] != "healthy":
            by[r["verb"]].append(bool(r.get("exact")))
    exact = ", ".join(f"{v} {sum(by[v])}/{len(by[v])}" for v in VERBS if by.get(v)) or "-"
    row = (f"| `{meta['precnb']['commit']}` | `{meta['population']}` | {alarms} / {len(healthy)} | {exact} | "
           f"{meta.get('history_note', '')} |")
    return HISTORY_HEAD + kept + [row]


def _draw_args(key: str, draw: dict[str, Any]) -> str:
    """The generator's options of a MoE draw key (``moe<seed>`` or ``moe<seed>_<layouts>``) and its size.

    >>> _draw_args("moe2_pp2ep2dp2", {"size": "moe x1"})
    '--draw-seed 2 --moe-layout moe_pp2ep2dp2 --moe-repeat 1'
    >>> _draw_args("moe1", {"size": "moe x2"})
    '--draw-seed 1'
    """
    seed, *layouts = key[3:].split("_")
    out = [f"--draw-seed {seed}", *(f"--moe-layout moe_{x}" for x in layouts)]
    repeat = str(draw.get("size", "")).removeprefix("moe x")
    if repeat.isdigit() and repeat != "2":
        out.append(f"--moe-repeat {repeat}")
    return " ".join(out)


def write_moe_section(path: Path, manifest: dict[str, Any], rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Replace the MoE section of *path* (append it when there is none); the JSON to ``*_moe.json``."""
    healthy = [r for r in rows if r["kind"] == "healthy"]
    faults = [r for r in rows if r["kind"] != "healthy"]
    draws = manifest["draws"]
    lines = [MOE_MARK, "## MoE (issue 48 item 6)", "",
             f"MoE draw(s) {meta['draw_seeds']}, population `{meta['population']}`: {meta['runs']} runs, "
             f"{sum(len(d['healthy']) for d in draws.values())} healthy pairs and "
             f"{sum(len(d['faults']) for d in draws.values())} faults planned; precnb commit "
             f"`{meta['precnb']['commit']}` (at the start `{meta['precnb']['commit_at_start']}`, checkout "
             f"`{meta['precnb']['checkout']}`; its last change to `precnb/` is `{meta.get('code_commit')}`; the "
             "`precnb` CLI with `--json --workers 1`, one subprocess per case, "
             f"{meta.get('jobs', 1)} at a time); benchmark commit `{meta['bench_commit']}`; load average "
             f"{[round(x, 2) for x in meta['loadavg']]} (2 cores, shared); scoring took {meta['seconds']} s. "
             "Regenerate: " + "; ".join(f"`python benchmarks/bench_accuracy.py --moe {_draw_args(k, draws.get(k, {}))} "
                                        f"--out POP` (generate and score; `--reuse --draws {k}` scores what exists)"
                                        for k in meta["draw_seeds"]) + ".", "",
             "### Population", "", *_population(manifest), "",
             "### Healthy pairs: false alarms", "", *_healthy(healthy), "",
             "### Faults: outcome per verb", "", *_outcome_table(faults), "",
             "Per fault (`exact`: step, dump rank and module with the global expert right; `step ok`: right step, rank "
             "or module wrong):", "", *_per_kind(faults), "",
             "### Ground truth (read back from the dumps, independent of precnb)", "",
             "As for the dense draws: the first dumped step where the fault run differs bit-exactly from its twin; "
             "on it the injection rank when it differs there; the module is the whole model's with the global "
             "expert index (the worker's EP rank and local experts).", "", *_truths(manifest), "",
             "### Every fault case that is not exact: precnb's answer vs the truth", "",
             *(_failures(faults) or ["(none)"]), "",
             "### Time per case", "", *_timing(rows, manifest), "",
             "### Scoring rule (MoE)", "", RULE.strip().split("\n\n>>>")[0], ""]
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    head = old[:old.index(MOE_MARK)] if MOE_MARK in old else old.rstrip("\n") + "\n\n"
    lines += ["### History", "", *_history(old[old.index(MOE_MARK):] if MOE_MARK in old else "", rows, meta), ""]
    path.write_text(head + "\n".join(lines), encoding="utf-8")
    data = {"meta": meta, "rows": rows, "truth": manifest.get("truth", {}),
            "faults": [f for d in draws.values() for f in d["faults"]]}
    path.with_name(path.stem + "_moe.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
