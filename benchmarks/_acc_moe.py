"""MoE cases and scoring of the accuracy benchmark (issue 48 item 6): the population's MoE draws
(``tools/samples/precnb_samples/_pop_moe.py``, draw keys ``moe<seed>``), alltoall dispatcher, layouts ``moe_ep1``
(world 1, the reference), ``moe_tp2ep2`` (TP 2 with sequence parallelism, EP 2 folded onto the same ranks,
ETP 1) and ``moe_tp1ep2dp2`` (EP 2 over DP 2); with pipeline parallelism ``moe_pp2ep2dp2`` (PP 2 × DP 2, EP 2 over
each stage's DP pair, draw keys ``moe<seed>_pp2ep2dp2``) and ``moe_tp2pp2ep2`` (TP 2 × PP 2, EP 2 folded onto TP).

**Cases.** Healthy pairs (moe_tp2ep2 and moe_tp1ep2dp2 against moe_ep1 of the same seed, and each starved
condition's twin against its masked moe_ep1 reference): ``diff_ref`` (``--target-layout`` given),
``diff_ref_infer`` (no layout), ``preflight`` (``--layout`` given), ``replicas`` (layout read from the dumps) and
``nan`` on the run, ``nan`` on each moe_ep1 reference; any finding is a false alarm. Faults: ``diff_twin``
(against the healthy twin: same seed, layout and condition), ``diff_ref`` (against moe_ep1 with the condition,
``--target-layout`` given) and ``nan`` for the starved expert (the NaN fault).

**Module rule (MoE).** The truth's module is the whole model's with the *global* expert index. precnb's module
is taken, in this order, from ``evidence.global_module`` (precnb's whole-model name), else as is when the
finding is on a merged target (``evidence.dump.rank`` names the dump rank; the merged record is the whole
model's), else mapped from the rank-local module with the worker's layer numbers and expert coordinates of
the reported rank (``local_experts.i`` on EP rank ``r`` is global ``r * experts_per_rank + i``), never with
precnb's own mapping text. It is right when it lies in the same MoE submodule as the truth's and one of the two
paths is a prefix of the other; the MoE submodule is the expert for a path inside one
(``decoder.layers.<l>.mlp.experts.local_experts.<g>``), the router or the experts container
(``decoder.layers.<l>.mlp.router``), else the dense rule's layer submodule. So truth
``decoder.layers.1.mlp.experts.local_experts.2.linear_fc2`` accepts ``...local_experts.2`` and
``...local_experts.2.linear_fc2`` but neither ``decoder.layers.1.mlp`` nor another expert.

>>> t = "decoder.layers.1.mlp.experts.local_experts.2.linear_fc2"
>>> moe_module_right("decoder.layers.1.mlp.experts.local_experts.2", t)
True
>>> moe_module_right("decoder.layers.1.mlp", t)
False
>>> moe_module_right("decoder.layers.1.mlp.experts.local_experts.3.linear_fc2", t)
False
>>> moe_module_right("decoder.layers.0.mlp.router", "decoder.layers.0.mlp.router")
True
>>> expert_global("decoder.layers.1.mlp.experts.local_experts.0.linear_fc2", 1, 2)
'decoder.layers.1.mlp.experts.local_experts.2.linear_fc2'
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

LAYOUT_TEXT = {"moe_ep1": None, "moe_tp2ep2": "tp=2,ep=2,etp=1", "moe_tp1ep2dp2": "dp=2,ep=2", "moe_dp2": "dp=2",
               "moe_tp2etp1": "tp=2,ep=1,etp=1", "moe_pp2ep2dp2": "pp=2,dp=2,ep=2",
               "moe_tp2pp2ep2": "tp=2,pp=2,ep=2,etp=1"}
EXPERT = re.compile(r"^(decoder\.layers\.\d+\.mlp\.experts\.local_experts\.)(\d+)(\.|$)")
MLP_PART = re.compile(r"^decoder\.layers\.\d+\.mlp\.(router|experts|shared_experts)(\.|$)")


def is_moe_draw(key: str, draw: dict[str, Any]) -> bool:
    """Whether a manifest draw is a MoE draw."""
    return str(key).startswith("moe") or any(f.get("moe") for f in draw.get("faults", []))


def moe_submodule(path: str) -> str:
    """The MoE submodule of a whole-model path (see the module docstring)."""
    m = EXPERT.match(path)
    if m:
        return m.group(1) + m.group(2)
    m = MLP_PART.match(path)
    if m:
        return path[:m.end(1)]
    parts = path.split(".")
    return ".".join(parts[:4] if path.startswith("decoder.layers.") else parts[:2])


def moe_module_right(found: str | None, truth: str | None) -> bool:
    """The MoE module rule of this module's docstring."""
    if not found or not truth or moe_submodule(found) != moe_submodule(truth):
        return False
    return found == truth or found.startswith(truth + ".") or truth.startswith(found + ".")


def expert_global(path: str | None, ep_rank: int, per_rank: int) -> str | None:
    """*path* with a local expert index made global (unchanged outside an expert)."""
    m = EXPERT.match(path or "")
    if path is None or m is None:
        return path
    return f"{m.group(1)}{ep_rank * per_rank + int(m.group(2))}{path[m.end(2):]}"


def _args(verb: str, run: str, other: str | None, layout: str) -> list[str]:
    text = LAYOUT_TEXT[layout]
    if verb == "diff_ref":
        return ["diff", other or "", run] + (["--target-layout", text] if text else [])
    if verb in ("diff_ref_infer", "diff_twin"):
        return ["diff", other or "", run]
    if verb == "diagnose":  # the API's default triage (_acc_score.API_DIAGNOSE)
        return ["api:diagnose", other or "", run]
    if verb == "preflight":
        return ["preflight", other or "", run] + (["--layout", text] if text else [])
    return [verb, run]


def moe_cases(key: str, draw: dict[str, Any], truths: dict[str, Any], only: str | None,
              add: Callable[..., None]) -> None:
    """Add the cases of one MoE draw through the dense ``cases``' *add* (which filters verbs and failed runs)."""
    def put(verb: str, name: str, kind: str, run: str, other: str | None, layout: str, truth: Any) -> None:
        add(verb, name, kind, run, other, layout, truth, args=_args(verb, f"runs/{run}/dump",
                                                                    other and f"runs/{other}/dump", layout))

    for h in draw["healthy"] if only in (None, "healthy") else []:
        name, lay = f"{h['name']}@d{key}", h["layout"]
        for verb in ("diff_ref", "diff_ref_infer", "preflight", "diagnose"):
            put(verb, name, "healthy", h["run"], h["reference"], lay, None)
        put("replicas", name, "healthy", h["run"], None, lay, None)
        put("nan", name, "healthy", h["run"], None, lay, None)
        ref = "moe_ep1+" + h["name"].split("+", 1)[1] if h.get("condition") else f"moe_ep1@{h['seed']}"
        put("nan", f"{ref}@d{key}", "healthy", h["reference"], None, "moe_ep1", None)
    for f in draw["faults"]:
        truth = truths.get(f["run"])
        if (only not in (None, f["kind"])) or not truth or truth.get("status") != "ok":
            continue
        name, lay = f"{f['name']}@d{key}", f["layout"]
        put("diff_twin", name, f["kind"], f["run"], f["twin"], lay, truth)
        put("diff_ref", name, f["kind"], f["run"], f["reference"], lay, truth)
        put("diagnose", name, f["kind"], f["run"], f["reference"], lay, truth)
        if f["kind"] == "starved_grad_per_token":
            put("nan", name, f["kind"], f["run"], None, lay, truth)


def moe_module(answer: dict[str, Any], result: dict[str, Any]) -> tuple[str | None, str, int | None]:
    """(whole-model module of precnb's answer, where it came from, the dump rank) by the MoE module rule."""
    from _acc_modules import global_module

    ev = answer.get("evidence") if isinstance(answer.get("evidence"), dict) else {}
    dump = ev.get("dump") if isinstance(ev.get("dump"), dict) else None
    rank = dump["rank"] if dump and dump.get("rank") is not None else answer.get("rank")
    if ev.get("global_module"):
        return str(ev["global_module"]), "evidence.global_module", rank
    if dump and dump.get("rank") is not None:
        return global_module(answer.get("module"), {}), "merged", rank
    info = result["ranks"].get(str(answer.get("rank")), {})
    gm = global_module(answer.get("module"), info.get("layer_numbers", {}))
    if "expert_coords" in info:
        locals_ = {int(m.group(1)) for k in info.get("names", {}) if (m := re.search(r"local_experts\.(\d+)\.", k))}
        gm = expert_global(gm, info["expert_coords"]["ep"], len(locals_) or 1)
    return gm, "rank-local", rank


def score_moe(row: dict[str, Any], answer: dict[str, Any], found: bool, truth: dict[str, Any],
              out: Path) -> dict[str, Any]:
    """The dense ``score``'s fault judgement with the MoE module rule (*row* has the answer's fields)."""
    result = json.loads((out / "runs" / row["run"] / "result.json").read_text(encoding="utf-8"))
    gm, source, rank = moe_module(answer, result)
    row |= {"rank": rank, "global_module": gm, "module_source": source, "truth_step": truth["step"],
            "truth_rank": truth["rank"], "truth_node": truth["node"], "truth_module": truth["module"],
            "truth_expert": truth.get("global_expert"),
            "at_step": found and answer.get("step") == truth["step"],
            "rank_ok": found and rank == truth["rank"],
            "module_ok": found and (moe_module_right(gm, truth["module"]) if truth["module"] else None)}
    row["exact"] = bool(row["at_step"] and row["rank_ok"] and row["module_ok"] is not False)
    ev = answer.get("evidence") if isinstance(answer.get("evidence"), dict) else {}
    if ev.get("starved_experts"):
        row["starved_experts"] = ev["starved_experts"]
    return row
