"""Write ``RESULTS_accuracy.md`` / ``.json`` of the accuracy benchmark (``bench_accuracy.py``)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from _acc_score import VERBS
from _acc_score import __doc__ as RULE  # noqa: N812

MOE_MARK = "<!-- MoE section: written by bench_accuracy.py when it scores MoE draws -->"


def _cell(r: dict[str, Any]) -> str:
    if r.get("error"):
        return "error"
    if not r.get("finding"):
        return "miss"
    if r.get("exact"):
        return "exact"
    return "step ok" if r.get("at_step") else "wrong step"


def _outcome_table(rows: list[dict[str, Any]]) -> list[str]:
    """Confusion per verb: faults exact / right step, wrong rank or module / wrong step / no finding / error."""
    out = ["| verb | fault cases | exact (step, rank, module) | right step only | wrong step | no finding | "
           "error |", "|---|---|---|---|---|---|---|"]
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["verb"]].append(r)
    for verb in VERBS:
        rs = by.get(verb, [])
        if rs:
            cells = [_cell(r) for r in rs]
            out.append(f"| {verb} | {len(rs)} | {cells.count('exact')} | {cells.count('step ok')} | "
                       f"{cells.count('wrong step')} | {cells.count('miss')} | {cells.count('error')} |")
    return out


def _healthy(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| verb | healthy cases | false alarms | error |", "|---|---|---|---|"]
    for verb in VERBS:
        rs = [r for r in rows if r["verb"] == verb]
        if rs:
            out.append(f"| {verb} | {len(rs)} | {sum(bool(r.get('finding')) for r in rs)} | "
                       f"{sum(bool(r.get('error')) for r in rs)} |")
    alarms = [r for r in rows if r.get("finding") or r.get("error")]
    if alarms:
        out += ["", "False alarms (any finding on a healthy pair), with precnb's reason:", ""]
        for r in alarms:
            what = r.get("error") or f"{r.get('finding_kind')} step {r.get('step')} rank {r.get('rank')} node " \
                                     f"`{r.get('node')}`: {r.get('reason')}"
            out.append(f"- **{r['verb']}** `{r['case']}`: {what}  \n  `{r['command']}`")
    return out


def _per_kind(rows: list[dict[str, Any]]) -> list[str]:
    verbs = [v for v in VERBS if any(r["verb"] == v for r in rows)]
    out = ["| fault | layout | " + " | ".join(verbs) + " |", "|---|---|" + "---|" * len(verbs)]
    by: dict[str, dict[str, str]] = defaultdict(dict)
    lay = {}
    for r in rows:
        by[r["case"]][r["verb"]] = _cell(r)
        lay[r["case"]] = r["layout"]
    for case in sorted(by):
        out.append(f"| {case} | {lay[case]} | " + " | ".join(by[case].get(v, "") for v in verbs) + " |")
    return out


def _truths(manifest: dict[str, Any]) -> list[str]:
    out = ["| fault | layout | injection | truth: step, rank, node | global module | notes |",
           "|---|---|---|---|---|---|"]
    for key, draw in manifest["draws"].items():
        for f in draw["faults"]:
            t = manifest.get("truth", {}).get(f["run"])
            if t is None:
                out.append(f"| {f['name']}@d{key} | {f['layout']} | {_inj(f['injection'])} | (not generated) | | |")
                continue
            where = f"{t.get('step')}, {t.get('rank')}, `{t.get('node')}`" if t["status"] == "ok" else t["status"]
            out.append(f"| {f['name']}@d{key} | {f['layout']} | {_inj(f['injection'])} | {where} | "
                       f"`{t.get('module')}` | {'; '.join(t.get('notes', []))} |")
    return out


def _inj(b: dict[str, Any]) -> str:
    keys = ("rank", "from_step", "layer", "expert", "module", "param", "m", "eps", "factor")
    return f"{b['kind']} " + ", ".join(f"{k} {b[k]}" for k in keys if b.get(k) is not None)


def _misses(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        if r.get("exact"):
            continue
        got = r.get("error") or (f"step {r.get('step')} rank {r.get('rank')} module `{r.get('module')}` = "
                                 f"`{r.get('global_module')}`" if r.get("finding") else "no finding")
        out.append(f"- **{r['verb']}** `{r['case']}` ({r['layout']}): truth step {r.get('truth_step')} rank "
                   f"{r.get('truth_rank')} `{r.get('truth_module')}`; precnb: {got}. Reason: {r.get('reason')}  \n"
                   f"  `{r['command']}`")
    return out


def write_results(path: Path, manifest: dict[str, Any], rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """The markdown report at *path* and the JSON beside it."""
    healthy = [r for r in rows if r["kind"] == "healthy"]
    faults = [r for r in rows if r["kind"] != "healthy"]
    draws = manifest["draws"]
    n_h = sum(len(d["healthy"]) for d in draws.values())
    n_f = sum(len(d["faults"]) for d in draws.values())
    lines = ["# Accuracy on a population of real Megatron-Core runs (issue 47 item 1)", "",
             f"Draw seed(s) {meta['draw_seeds']}, population `{meta['population']}`: {meta['runs']} runs, {n_h} "
             f"healthy pairs and {n_f} faults planned; precnb commit `{meta['precnb']['commit']}` (at the start "
             f"`{meta['precnb']['commit_at_start']}`; the installed "
             f"`precnb` CLI with `--json --workers 1`, one subprocess per case); benchmark commit "
             f"`{meta['bench_commit']}`; load average {[round(x, 2) for x in meta['loadavg']]} (2 cores, shared); "
             f"scoring took {meta['seconds']} s. Regenerate: "
             + "; ".join(f"`python benchmarks/bench_accuracy.py --draw-seed {s} --out POP`"
                         for s in meta["draw_seeds"] if s.isdigit())
             + " (runs are cached by content hash; draw `subset` is `python -m precnb_samples._pop_subset`).", "",
             "## Healthy pairs: false alarms", "", *_healthy(healthy), "",
             "## Faults: outcome per verb", "", *_outcome_table(faults), "",
             "Per fault (`exact`: step, rank and module right; `step ok`: right step, rank or module wrong):", "",
             *_per_kind(faults), "", "## Ground truth (read back from the dumps, independent of precnb)", "",
             "The first dumped step where the fault run's statistics differ bit-exactly from its healthy twin's "
             "(undefined-by-construction leaves set aside); on it the injection rank when it differs there, else "
             "the lowest differing rank (noted).", "", *_truths(manifest), "",
             "## Every fault case that is not exact, with precnb's reason", "", *(_misses(faults) or ["(none)"]), "",
             "## Scoring rule", "", RULE.strip().split("\n\n>>>")[0], ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    moe = old[old.index(MOE_MARK):] if MOE_MARK in old else ""  # the MoE section is written by its own runs
    history = _history(old)  # kept by hand: one row per scored commit
    path.write_text("\n".join(lines) + ("\n" + history if history else "") + ("\n" + moe if moe else ""),
                    encoding="utf-8")
    data = {"meta": meta, "rows": rows, "truth": manifest.get("truth", {}),
            "faults": [f for d in draws.values() for f in d["faults"]]}
    path.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def _history(old: str) -> str:
    """The hand-kept ``## History`` section of an earlier results file (up to the MoE section), or ''.

    >>> _history("# R\\n\\n## History\\n\\n| a |\\n" + MOE_MARK + "\\n## MoE")
    '## History\\n\\n| a |\\n'
    """
    at = old.find("\n## History")
    if at < 0:
        return ""
    end = old.find(MOE_MARK, at)
    return old[at + 1:end if end >= 0 else len(old)]
