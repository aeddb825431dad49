"""Ground truth of the population's fault runs, read back from the dumps (torch-free, independent of precnb).

A fault run and its healthy twin (same seed, layout, dropout, dump level) train bit-identically until the
fault acts. :func:`fault_truth` compares them step by step and rank by rank with
:func:`precnb_samples._mg_truth.first_difference` (bit-exact, undefined-by-construction leaves set aside):
the truth is the first dumped step where any rank differs; on that step the injection rank when it differs
there (a fault acts on its own rank first; the other ranks differ only through communication, later in
causal order), else the lowest differing rank, flagged. Its node's **global module** is the whole-model
module path: a module node's own path, an API node's enclosing module from construct.json, with the chunk's
local layer numbers replaced by the worker's reported ``layer_number - 1`` and, in a MoE run, a local expert
index replaced by the global one (``local_experts.i`` on EP rank ``r`` is ``r * experts_per_rank + i``, the EP
rank and the rank's experts as the worker reported them: ``expert_coords`` and its local -> global parameter
names); the truth then also names ``global_expert``.

>>> global_module("Module.1.decoder.layers.0.mlp.MLP.forward.1", {}, {"0": [1], "1": [3]})
'decoder.layers.2.mlp'
>>> expert_module("decoder.layers.1.mlp.experts.local_experts.0.linear_fc2", 1, 2)
('decoder.layers.1.mlp.experts.local_experts.2.linear_fc2', 2)
>>> c = {"Torch.matmul.0.forward": ["Module.0.decoder.layers.0.mlp.MLP.forward.0", 0]}
>>> global_module("Torch.matmul.0.forward", c, {"0": [2]})
'decoder.layers.1.mlp'
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from . import _dumps as D  # noqa: N812
from . import _mg_truth as T  # noqa: N812

__all__ = ["annotate", "expert_module", "fault_truth", "global_module"]

EXPERT = re.compile(r"^(decoder\.layers\.\d+\.mlp\.experts\.local_experts\.)(\d+)(\.|$)")


def global_module(node: str, construct: dict[str, Any], layer_numbers: dict[str, list[int]]) -> str | None:
    """Whole-model module path of a node (a module's own, an API's enclosing module); ``None`` if unknown."""
    seen = 0
    while node and seen < 64:
        key = T.module_key(node, layer_numbers)
        if key is not None:
            return key[0]
        node = D.parent_of(construct, node) or ""
        seen += 1
    return None


def expert_module(module: str | None, ep_rank: int, per_rank: int) -> tuple[str | None, int | None]:
    """(*module* with its local expert index made global, the global expert) (unchanged, ``None`` outside one)."""
    m = EXPERT.match(module or "")
    if module is None or m is None:
        return module, None
    g = ep_rank * per_rank + int(m.group(2))
    return f"{m.group(1)}{g}{module[m.end(2):]}", g


def _experts_per_rank(info: dict[str, Any]) -> int:
    """Local experts of one rank, from the worker's local -> global parameter names."""
    found = {int(m.group(1)) for k in info.get("names", {}) if (m := re.search(r"local_experts\.(\d+)\.", k))}
    return len(found)


def _rank_dir(root: Path, step: int, rank: int) -> Path:
    return root / f"step{step}" / f"rank{rank}"


def fault_truth(run: Path, twin: Path, injection: dict[str, Any]) -> dict[str, Any]:
    """The first difference between a fault run's dump and its twin's (run folders of the population)."""
    result = json.loads((run / "result.json").read_text(encoding="utf-8"))
    steps = [s for s, _ in D.step_dirs(run / "dump")]
    for step in steps:
        diffs: dict[int, tuple[str, list[str]]] = {}
        skipped = 0
        for rank in sorted(int(r) for r in result["ranks"]):
            a = D.dump_data(_rank_dir(twin / "dump", step, rank) / "dump.json")
            b = D.dump_data(_rank_dir(run / "dump", step, rank) / "dump.json")
            node, leaves, undefined = T.first_difference(a, b)
            skipped += len(undefined)
            if node is not None:
                diffs[rank] = (node, leaves)
        if not diffs:
            continue
        rank = injection["rank"] if injection["rank"] in diffs else min(diffs)
        node, leaves = diffs[rank]
        construct = D.load_json(_rank_dir(run / "dump", step, rank) / "construct.json")
        numbers = result["ranks"][str(rank)]["layer_numbers"]
        module = global_module(node, construct, numbers)
        info = result["ranks"][str(rank)]
        expert = None
        if "expert_coords" in info:
            module, expert = expert_module(module, info["expert_coords"]["ep"], _experts_per_rank(info))
        notes = []
        if rank != injection["rank"]:
            notes.append(f"first difference on rank {rank}, not on the injection rank {injection['rank']}")
        if step != injection.get("from_step", 0):
            notes.append(f"first difference at step {step}, the fault acts from step {injection.get('from_step', 0)}")
        return {"status": "ok", "step": step, "rank": rank, "node": node, "leaves": leaves[:6], "module": module,
                "layer_numbers": numbers, "coords": info["coords"],
                **({"global_expert": expert, "expert_coords": info["expert_coords"]} if "expert_coords" in info
                   else {}),
                "ranks_differing": {str(r): n for r, (n, _) in sorted(diffs.items())},
                "undefined_set_aside": skipped, "notes": notes}
    return {"status": "no_difference", "notes": ["the fault run's dumps equal its twin's on every dumped step "
                                                  "(below float resolution or outside the dump window): dropped"]}


def _stat_leaves(rec: Any, path: str = "") -> dict[str, tuple[Any, ...]]:
    """Every statistics leaf of one dump.json record: path -> (Max, Min, Mean, Norm).

    >>> _stat_leaves({"output": [{"Max": 1.0, "Min": 0.0, "Mean": 0.5, "Norm": 2.0}]})
    {'output.0': (1.0, 0.0, 0.5, 2.0)}
    """
    out: dict[str, tuple[Any, ...]] = {}
    if isinstance(rec, dict):
        if "Max" in rec:
            return {path: tuple(rec.get(k) for k in ("Max", "Min", "Mean", "Norm"))}
        for k, v in rec.items():
            out.update(_stat_leaves(v, f"{path}.{k}" if path else str(k)))
    elif isinstance(rec, list):
        for i, v in enumerate(rec):
            out.update(_stat_leaves(v, f"{path}.{i}" if path else str(i)))
    return out


def _whole(stats: tuple[Any, ...]) -> bool:
    """Whether Max, Min and Mean are whole numbers (an integer-valued tensor, not a copy of one computation).

    msprobe records no Mean of an integer tensor (null): Max and Min decide then.

    >>> _whole((3.0, 0.0, 1.0, 4.2)), _whole((61, 8, None, None)), _whole((0.5, 0.0, 0.25, 1.0))
    (True, True, False)
    """
    mx, mn, mean = stats[:3]
    return all(isinstance(v, (int, float)) and math.isfinite(v) and float(v).is_integer()
               for v in (mx, mn) + (() if mean is None else (mean,)))


def replica_truth(run: Path, twin: Path, groups: list[list[int]], injection: dict[str, Any]) -> dict[str, Any]:
    """Where a fault first makes replicas disagree: what a replica check alone can see (no twin needed).

    For each dumped step and group of replicas (TP or DP ranks that hold copies of the same tensors): a leaf
    whose copies are bit-identical in the healthy twin and differ in the fault run. The first step with one,
    then the group holding the injection rank (else the first group), then the first such node in that group's
    first member's dump order. The departing rank is the member whose copy differs from the twin's (the one a
    third replica or a clean run decides); a pair alone cannot say which. ``observable`` False: the fault never
    makes replicated copies disagree (a fault on one rank's shard is summed into every rank's all-reduce).
    """
    result = json.loads((run / "result.json").read_text(encoding="utf-8"))
    for step in [s for s, _ in D.step_dirs(run / "dump")]:
        found: list[tuple[list[int], str, str, int]] = []
        for group in groups:
            fault = [D.dump_data(_rank_dir(run / "dump", step, r) / "dump.json") for r in group]
            clean = [D.dump_data(_rank_dir(twin / "dump", step, r) / "dump.json") for r in group]
            hit = _first_departure(fault, clean, group)
            if hit is not None:
                found.append((group, *hit))
        if not found:
            continue
        group, node, leaf, departing = next((f for f in found if injection.get("rank") in f[0]), found[0])
        construct = D.load_json(_rank_dir(run / "dump", step, group[0]) / "construct.json")
        module = global_module(node, construct, result["ranks"][str(group[0])]["layer_numbers"])
        return {"observable": True, "step": step, "group": group, "departing_rank": departing, "node": node,
                "leaf": leaf, "module": module}
    return {"observable": False}


def _first_departure(fault: list[dict[str, Any]], clean: list[dict[str, Any]], group: list[int]
                     ) -> tuple[str, str, int] | None:
    """(node, leaf, departing rank) of the first leaf replicated in *clean* whose copies differ in *fault*."""
    for node, rec in fault[0].items():
        if any(node not in d for d in fault[1:] + clean):
            continue
        undefined = set(T.undefined_leaves(node, rec))
        copies = [_stat_leaves(d[node]) for d in fault]
        twins = [_stat_leaves(d[node]) for d in clean]
        for leaf in copies[0]:
            if any(leaf == u or leaf.startswith(u + ".") for u in undefined):
                continue
            ref = [t.get(leaf) for t in twins]
            mine = [c.get(leaf) for c in copies]
            if None in ref or None in mine or any(r != ref[0] for r in ref) or all(m == mine[0] for m in mine):
                continue
            if _whole(ref[0]):  # indices, token counts, masks: replicas holding other data agree by chance
                continue
            departing = next((g for g, m, r in zip(group, mine, ref, strict=True) if m != r), group[0])
            return node, leaf, departing
    return None


def annotate(manifest: dict[str, Any], out: Path) -> None:
    """Add the truth of every fault whose run and twin are finished (computed once)."""
    runs = manifest["runs"]
    truths = manifest.setdefault("truth", {})
    for draw in manifest["draws"].values():
        for f in draw["faults"]:
            if f["run"] in truths:
                continue
            if runs.get(f["run"], {}).get("status") == "ok" and runs.get(f["twin"], {}).get("status") == "ok":
                truths[f["run"]] = fault_truth(out / "runs" / f["run"], out / "runs" / f["twin"], f["injection"])
