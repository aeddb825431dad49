"""Cases and scoring of the accuracy benchmark (``bench_accuracy.py``): which precnb commands run on which
pairs of a Megatron-Core population, and how an answer is judged against the ground truth read back from
the dumps (``tools/samples/precnb_samples/_pop_truth.py``).

The module rule (a finding's rank-local module against the truth's whole-model one) is in :mod:`_acc_modules`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _acc_modules import global_module, module_right
from _acc_moe import is_moe_draw, moe_cases, score_moe

SHARDED = {"tp2pp1", "tp2pp2", "tp2sp", "dp2", "tp1pp2", "tp1pp2vpp2"}
REPLICATED = {"tp2pp1", "tp2pp2", "tp2sp", "dp2"}  # layouts with replicas (TP or DP groups)
LAYOUT_TEXT = {"tp1pp1": None, "tp2pp1": "tp=2", "tp1pp2": "pp=2", "tp2pp2": "tp=2,pp=2",
               "tp1pp2vpp2": "pp=2,vpp=2", "tp2sp": "tp=2", "dp2": "dp=2", "tp1pp1t2": None}
VERBS = ("diff_ref", "diff_ref_infer", "diff_twin", "replicas", "nan", "preflight", "spike", "diagnose")
# ``diagnose``: the Python API's default triage, ``precnb.diagnose(run, baseline=reference)`` with nothing given
# (the layout read from the dumps, every diagnosis: the whole read, where ``diff`` reads step-wise), what a
# notebook template, the explorer and the report get; scored on its first divergence (any finding on a healthy
# pair is a false alarm)
API_DIAGNOSE = "api:diagnose"


def breaks_replicas(fault: dict[str, Any]) -> bool:
    """Whether a fault is expected to break replica agreement, where the dumps were not read for it
    (``replica_truth`` decides from the data otherwise): any fault on one rank of a TP group; on dp2 only
    faults on replicated state (a parameter or its optimizer state).
    """
    if fault["layout"] == "dp2":
        return fault["kind"] in ("weight_zero", "optimizer_state")
    return fault["layout"] in REPLICATED


def replicas_truth(seen: dict[str, Any]) -> dict[str, Any]:
    """The truth a replica check is judged on: the first departure of replicated copies (``replica_truth``).

    Its rank is the departing copy's; a group of two cannot say which copy departs (nothing decides between
    them), so there any member of the group is right (``rank_any``).
    """
    return {"status": "ok", "step": seen["step"], "rank": seen["departing_rank"], "node": seen["node"],
            "module": seen["module"], "group": seen["group"], "rank_any": len(seen["group"]) < 3,
            "notes": [f"first replica departure: leaf {seen['leaf']} of {seen['node']}, group {seen['group']}"]}


def _args(verb: str, run: str, other: str | None, layout: str) -> list[str]:
    text = LAYOUT_TEXT[layout]
    if verb == "diff_ref":
        return ["diff", other or "", run] + (["--target-layout", text] if text else [])
    if verb == "diff_ref_infer":
        return ["diff", other or "", run]
    if verb == "diagnose":
        return [API_DIAGNOSE, other or "", run]
    if verb == "diff_twin":
        return ["diff", other or "", run]
    if verb == "preflight":
        return ["preflight", other or "", run] + (["--layout", text] if text else [])
    return [verb, run]


def cases(manifest: dict[str, Any], verbs: tuple[str, ...] = VERBS, only: str | None = None) -> list[dict[str, Any]]:
    """Every (verb, pair) to run: healthy pairs (any finding is a false alarm) and faults (scored).

    Healthy pairs: each layout against the unsharded run of its seed, and each fault's healthy twin against
    the fault's reference (same seed, dropout and dump level: the unsynchronised-seed faults' twins run with
    dropout 0.1, the L1 faults' at level L1), a pair listed once however often it is drawn.
    """
    runs, truths, out = manifest["runs"], manifest.get("truth", {}), []
    seen: set[tuple[str, str, str | None]] = set()

    def ok(*ids: str) -> bool:
        return all(runs.get(i, {}).get("status") == "ok" for i in ids)

    def add(verb: str, name: str, kind: str, run: str, other: str | None, layout: str, truth: Any,
            args: list[str] | None = None) -> None:
        if verb in verbs and ok(run, *([other] if other else [])) and (verb, run, other) not in seen:
            seen.add((verb, run, other))
            out.append({"verb": verb, "case": name, "kind": kind, "run": run, "other": other, "layout": layout,
                        "truth": truth, "moe": args is not None,
                        "args": args or _args(verb, f"runs/{run}/dump", other and f"runs/{other}/dump", layout)})

    for key, draw in manifest["draws"].items():
        if is_moe_draw(key, draw):  # MoE draws: their own cases and module rule (_acc_moe.py)
            moe_cases(key, draw, truths, only, add)
            continue
        for h in draw["healthy"] if only in (None, "healthy") else []:
            lay = h["layout"]
            add("diff_ref", h["name"], "healthy", h["run"], h["reference"], lay, None)
            add("diagnose", h["name"], "healthy", h["run"], h["reference"], lay, None)
            if lay in SHARDED:
                add("diff_ref_infer", h["name"], "healthy", h["run"], h["reference"], lay, None)
                add("preflight", h["name"], "healthy", h["run"], h["reference"], lay, None)
            if lay in REPLICATED:
                add("replicas", h["name"], "healthy", h["run"], None, lay, None)
            add("nan", h["name"], "healthy", h["run"], None, lay, None)
            add("spike", h["name"], "healthy", h["run"], None, lay, None)
        for f in draw["faults"]:
            truth = truths.get(f["run"])
            if (only not in (None, f["kind"])) or not truth or truth.get("status") != "ok":
                continue
            lay, f = f["layout"], dict(f, name=f"{f['name']}@d{key}")  # fault names repeat across draws
            add("diff_twin", f["name"], f["kind"], f["run"], f["twin"], lay, truth)
            if only in (None, "healthy") and f["twin"] != f["reference"] and not (
                    f["kind"] == "unsynced_seed" and lay == "tp2sp"):
                # the twin and the reference: a healthy pair too, with the fault's dropout and dump level
                for verb in ("diff_ref", "diagnose"):
                    add(verb, f"twin of {f['name']}", "healthy", f["twin"], f["reference"], lay, None)
            if not (f["kind"] == "unsynced_seed" and lay == "tp2sp"):  # SP dropout masks differ from tp1pp1's
                add("diff_ref", f["name"], f["kind"], f["run"], f["reference"], lay, truth)
                add("diagnose", f["name"], f["kind"], f["run"], f["reference"], lay, truth)
            seen_by_replicas = manifest.get("replica_truth", {}).get(f["run"])
            if seen_by_replicas is not None and lay in REPLICATED:  # read back from the dumps (_pop_truth)
                if seen_by_replicas.get("observable"):
                    add("replicas", f["name"], f["kind"], f["run"], None, lay, replicas_truth(seen_by_replicas))
                else:  # no replicated copies disagree in the data: a replica check must stay quiet
                    add("replicas", f"{f['name']} (no replica departs)", "healthy", f["run"], None, lay, None)
            elif breaks_replicas(f):
                add("replicas", f["name"], f["kind"], f["run"], None, lay, truth)
            if f["kind"] == "nan":
                add("nan", f["name"], f["kind"], f["run"], None, lay, truth)
            if f["kind"] == "wrong_shard" and f["injection"].get("from_step", 0) == 0:  # preflight sees step 0
                add("preflight", f["name"], f["kind"], f["run"], f["reference"], lay, truth)
    return out


def finding_of(verb: str, answer: dict[str, Any]) -> bool:
    """Whether precnb's JSON answer reports something."""
    if verb == "preflight":
        return answer.get("status") in ("fail", "warn")
    return answer.get("kind") not in ("none", None)


def score(case: dict[str, Any], answer: dict[str, Any] | None, error: str | None, out: Path) -> dict[str, Any]:
    """Judge one answer: ``finding``; for faults ``at_step``, ``rank_ok``, ``module_ok``, ``exact``.

    A finding on a merged target (a diff across layouts) names a whole-model record: its dump rank is
    ``evidence.dump.rank`` and its module is already the whole model's.
    """
    row = {k: case[k] for k in ("verb", "case", "kind", "layout", "run", "other")} | (
        {"moe": True} if case.get("moe") else {})
    row["command"] = (f"precnb.diagnose({case['args'][2]!r}, baseline={case['args'][1]!r})"
                      if case["args"][0] == API_DIAGNOSE else "precnb " + " ".join(case["args"]) + " --json")
    if answer is None:
        return row | {"error": error, "finding": None, "exact": False, "at_step": False}
    found = finding_of(case["verb"], answer)
    row |= {"finding": found, "reason": answer.get("reason") or _preflight_reason(answer),
            "step": answer.get("step"), "rank": answer.get("rank"), "node": answer.get("node"),
            "module": answer.get("module"), "finding_kind": answer.get("kind") or answer.get("status")}
    truth = case["truth"]
    if truth is None:
        return row
    if case.get("moe"):
        return score_moe(row, answer, found, truth, out)
    result = json.loads((out / "runs" / case["run"] / "result.json").read_text(encoding="utf-8"))
    dump = (answer.get("evidence") or {}).get("dump") if isinstance(answer.get("evidence"), dict) else None
    if isinstance(dump, dict) and dump.get("rank") is not None:
        # a merged target's finding: its record is the whole model's, evidence.dump names the dump rank
        row["rank"] = dump["rank"]
        gm = global_module(answer.get("module"), {})
    else:
        numbers = result["ranks"].get(str(answer.get("rank")), {}).get("layer_numbers", {})
        gm = global_module(answer.get("module"), numbers)
    row |= {"global_module": gm, "truth_step": truth["step"], "truth_rank": truth["rank"],
            "truth_node": truth["node"], "truth_module": truth["module"],
            "at_step": found and answer.get("step") == truth["step"],
            "rank_ok": found and (row["rank"] == truth["rank"] or (
                bool(truth.get("rank_any")) and row["rank"] in truth.get("group", []))),
            "module_ok": found and (module_right(gm, truth["module"]) if truth["module"] else None)}
    row["exact"] = bool(row["at_step"] and row["rank_ok"] and row["module_ok"] is not False)
    return row


def _preflight_reason(answer: dict[str, Any]) -> str | None:
    bad = [c for c in answer.get("checks", []) if c.get("status") in ("fail", "warn")]
    return "; ".join(f"{c.get('name')}: {c.get('status')}: {c.get('message') or ''}"
                     for c in bad)[:600] or None
