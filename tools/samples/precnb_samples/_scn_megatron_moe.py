"""The MoE roots of the ``megatron`` sample (issue 48): real Megatron-Core MoE runs with the all-to-all dispatcher.

A 2-layer GPT whose two layers are MoE layers (4 SequentialMLP experts of the local spec, top-2 sigmoid router
with the aux-loss-free expert bias, ``moe_token_dispatcher_type="alltoall"``, no linear biases) is initialised
once at world size 1 (expert weights by global expert index) and trained 3 steps in three healthy layouts
(``moe_ep1``; ``moe_tp2ep2``: TP 2 with sequence parallelism and EP 2 / ETP 1 folded onto the same 2 ranks;
``moe_tp1ep2dp2``: EP 2 over DP 2) and two faulty twins of ``moe_tp2ep2`` (an expert starved of tokens at step 1
whose weight gradient is divided by its token count: NaN; one expert's ``linear_fc1`` output scaled from step 1).
Gradients are finalised by Megatron's own ``finalize_model_grads``. Every fact below is read back from the dumps
(:func:`truth`), with the worker's token counts cross-checked against the experts' input shapes.

>>> sorted(ROOTS)[:2]
['moe_ep1', 'moe_tp1ep2dp2']
>>> global_expert(1, 0, 2)
2
"""

from __future__ import annotations

import math
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from . import _dumps as D  # noqa: N812
from . import _mg_truth as T  # noqa: N812
from ._mg_run import run_mg

MODEL: dict[str, Any] = {"layers": 2, "hidden": 16, "heads": 2, "ffn": 32, "vocab": 64, "seq": 8, "micro_batch": 2,
                         "micro_batches": 1, "lr": 1e-3, "weight_decay": 0.01, "seed": 1234, "eps": 1e-5,
                         "rope_base": 10000, "experts": 4, "topk": 2, "dispatcher": "alltoall", "score": "sigmoid",
                         "expert_bias": 1e-3, "bias": False, "finalize": True}
TRAIN_STEPS = 3
DUMP_STEPS = [0, 1, 2]
STARVED = {"layer": 1, "expert": 2, "rank": 1, "step": 1}
SCALED = {"layer": 0, "expert": 1, "rank": 0, "from_step": 1, "m": 0.01}


def _lay(tp: int = 1, dp: int = 1, ep: int = 1, pp: int = 1) -> dict[str, Any]:
    return {"tp": tp, "pp": pp, "vpp": 1, "dp": dp, "sp": tp > 1, "ep": ep, "etp": 1}


ROOTS: dict[str, dict[str, Any]] = {
    "moe_ep1": {"layout": _lay(), "dump_steps": DUMP_STEPS},
    "moe_tp2ep2": {"layout": _lay(tp=2, ep=2), "dump_steps": DUMP_STEPS},
    "moe_tp1ep2dp2": {"layout": _lay(dp=2, ep=2), "dump_steps": DUMP_STEPS},
    "moe_tp2ep2_starved": {
        "layout": _lay(tp=2, ep=2), "dump_steps": DUMP_STEPS, "healthy": "moe_tp2ep2",
        "bugs": [{"kind": "route_mask", "rank": "all", "layer": STARVED["layer"], "expert": STARVED["expert"],
                  "steps": [STARVED["step"]]},
                 {"kind": "expert_grad_per_token", "rank": STARVED["rank"], "layer": STARVED["layer"],
                  "expert": STARVED["expert"], "module": "linear_fc2", "from_step": STARVED["step"]}]},
    "moe_tp2ep2_expert_scale": {
        "layout": _lay(tp=2, ep=2), "dump_steps": DUMP_STEPS, "healthy": "moe_tp2ep2",
        "bugs": [{"kind": "expert_fc1_scale", "rank": SCALED["rank"], "layer": SCALED["layer"],
                  "expert": SCALED["expert"], "m": SCALED["m"], "from_step": SCALED["from_step"]}]},
}
HEALTHY = ("moe_ep1", "moe_tp2ep2", "moe_tp1ep2dp2")
# layouts whose experts have copies (expert data-parallel size 2), made by the population generator only
# (data_samples/megatron_moe_edp): TP 1 × DP 2 with EP 1, and TP 2 (sequence parallel) with EP 1 and ETP 1
EDP_LAYOUTS: dict[str, dict[str, Any]] = {"moe_dp2": _lay(dp=2), "moe_tp2etp1": _lay(tp=2)}
EXPERT = re.compile(r"^Module\.(\d+)\.decoder\.layers\.(\d+)\.mlp\.experts\.local_experts\.(\d+)\.")


def world(layout: dict[str, Any]) -> int:
    """World size of a layout (``tp * pp * dp``; expert parallelism folds onto it)."""
    return int(layout["tp"] * layout["pp"] * layout["dp"])


def global_expert(ep_rank: int, local: int, per_rank: int) -> int:
    """Global index of local expert *local* on expert-parallel rank *ep_rank*."""
    return ep_rank * per_rank + local


def describe() -> str:
    """One-line description of the MoE model and training."""
    m = MODEL
    return (f"Megatron-Core GPTModel, local layer spec with MoE (get_gpt_layer_local_spec(num_experts={m['experts']}, "
            f"moe_grouped_gemm=False, normalization='RMSNorm')): {m['layers']} layers, both MoE; hidden {m['hidden']}, "
            f"{m['heads']} heads, {m['experts']} SequentialMLP experts of ffn {m['ffn']} with SwiGLU, top-{m['topk']} "
            f"router with sigmoid scores and the aux-loss-free expert bias (moe_router_enable_expert_bias, update "
            f"rate {m['expert_bias']}; aux loss off, load balancing 'none'), token dispatcher "
            f"'{m['dispatcher']}', add_bias_linear=False, vocab {m['vocab']}, seq {m['seq']}, RoPE, RMSNorm, fp32, "
            f"fusions off; {m['micro_batches']} micro-batch of {m['micro_batch']} sequences per step (split along the "
            f"batch across data-parallel ranks); gradients finalised by Megatron's finalize_model_grads (TP all-reduce "
            f"of sequence-parallel gradients, expert-bias update; DP averaged by hand in each chunk's "
            f"finish_grad_sync); torch.optim.AdamW(lr={m['lr']}, weight_decay={m['weight_decay']}, fused=True); "
            f"seed {m['seed']}; {TRAIN_STEPS} steps trained, all dumped")


CPU_PATCHES = [
    "torch.cuda.Stream / current_stream / stream -> do-nothing stand-ins (the all-to-all dispatcher's side "
    "streams and events)",
    "megatron.core.transformer.moe.token_dispatcher.maybe_move_tensor_to_cpu -> also turns CPU split-size tensors "
    "into numpy arrays (on CUDA it does so after the device-to-host copy; gloo's all_to_all_single rejects tensors)",
    "TORCHDYNAMO_DISABLE=1 (the router's compiled expert-bias helpers run eagerly)",
    "WrappedTorchNorm under sequence parallelism builds torch's RMSNorm and marks its weight sequence_parallel "
    "(as for tp2sp); Megatron's finalize_model_grads all-reduces those gradients (and the router's) over TP",
    "each chunk gets a default ddp_config and a finish_grad_sync that averages gradients over DP by hand (no DDP "
    "wrapper); config.finalize_model_grads_func = finalize_model_grads",
]


# ------------------------------------------------------------------------------------------ running
def run(ctx: Any, sample: Path) -> dict[str, Any]:
    """Initialise the MoE model once and run every MoE root; the workers' results by root."""
    from ._scenarios import _STATISTICS_CONFIG, write_json

    work = ctx.log_dir / "megatron_moe"
    work.mkdir(parents=True, exist_ok=True)
    files = {"weights": str(work / "moe_init_state.pt"), "batches": str(work / "moe_batches.pt")}
    init = run_mg({"mode": "init", "model": MODEL, "steps": TRAIN_STEPS, **files}, log_dir=work, tag="moe_init")
    results: dict[str, Any] = {"_init": init}
    for name, plan in ROOTS.items():
        ctx.log(f"[precnb_samples]   megatron/{name} ...")
        if (sample / name).exists():
            shutil.rmtree(sample / name)
        cfg = sample / "configs" / f"config_{name}.json"
        write_json(cfg, dict(_STATISTICS_CONFIG, dump_path=str(sample / name), step=plan["dump_steps"]))
        spec = {"mode": "megatron", "model": MODEL, "layout": plan["layout"], "steps": TRAIN_STEPS,
                "bugs": plan.get("bugs", []), "config": str(cfg), **files}
        results[name] = run_mg(spec, log_dir=work, tag=f"mg_{name}")
    return results


# ------------------------------------------------------------------------------------------ reading
def _load(root: Path) -> dict[tuple[int, int], tuple[dict[str, Any], dict[str, Any], Path]]:
    out = {}
    for step, sdir in D.step_dirs(root):
        for rdir in D.rank_dirs(sdir):
            out[(step, int(rdir.name[4:]))] = (D.dump_data(rdir / "dump.json"), D.load_json(rdir / "construct.json"),
                                                rdir)
    return out


def _check(cond: bool, message: str) -> None:
    if not cond:
        from ._scenarios import GroundTruthError

        raise GroundTruthError(message)


def _per_rank(layout: dict[str, Any]) -> int:
    return int(MODEL["experts"] // layout["ep"])


def _expert_nodes(data: dict[str, Any]) -> dict[int, set[int]]:
    """Layer -> local expert indices named in one dump."""
    out: dict[int, set[int]] = {}
    for node in data:
        m = EXPERT.match(node)
        if m:
            out.setdefault(int(m.group(2)), set()).add(int(m.group(3)))
    return out


def _expert_module(layer: int, local: int) -> str:
    return f"Module.0.decoder.layers.{layer}.mlp.experts.local_experts.{local}.MLP.forward.0"


def _tokens_from_dump(data: dict[str, Any], per_rank: int) -> dict[str, list[int]]:
    """Layer -> tokens each local expert received (its MLP's input rows), read from the dump."""
    out = {}
    for layer in range(MODEL["layers"]):
        counts = []
        for i in range(per_rank):
            leaf = D.node_leaves(data[_expert_module(layer, i)])["input_args.0"]
            counts.append(int(leaf["shape"][0]))
        out[str(layer)] = counts
    return out


def _tokens(name: str, dumps: dict, infos: dict[int, dict[str, Any]], layout: dict[str, Any]) -> dict[str, Any]:
    """Tokens per expert per step, layer and rank; the dispatcher's counts checked against the dumps."""
    per_rank = _per_rank(layout)
    by_step: dict[str, Any] = {}
    for step in DUMP_STEPS:
        ranks = {}
        for rank, info in infos.items():
            rec = info["tokens"][str(step)]
            dumped = _tokens_from_dump(dumps[(step, rank)][0], per_rank)
            for layer, counts in dumped.items():
                got = rec[layer]["received_by_local_experts"]
                _check(got == [counts], f"{name} step {step} rank {rank} layer {layer}: dispatcher {got} vs dump "
                                        f"{counts}")
            ranks[str(rank)] = {layer: {"routed_by_this_rank": rec[layer]["routed_by_this_rank"],
                                        "received_by_local_experts": dumped[layer]} for layer in sorted(rec)}
        per_global: dict[str, list[int]] = {}
        for layer in map(str, range(MODEL["layers"])):
            routed = [sum(ranks[str(r)][layer]["routed_by_this_rank"][g] for r in infos)
                      for g in range(MODEL["experts"])]
            received = [0] * MODEL["experts"]
            for rank, info in infos.items():
                ep = info["expert_coords"]["ep"]
                for i, n in enumerate(ranks[str(rank)][layer]["received_by_local_experts"]):
                    received[global_expert(ep, i, per_rank)] += n
            _check(routed == received, f"{name} step {step} layer {layer}: routed {routed} != received {received}")
            _check(sum(routed) == MODEL["topk"] * MODEL["seq"] * MODEL["micro_batch"] * MODEL["micro_batches"],
                   f"{name} step {step} layer {layer}: {sum(routed)} assignments")
            per_global[layer] = routed
        by_step[str(step)] = {"per_global_expert": per_global, "per_rank": ranks}
    return by_step


def _undefined(dumps: dict) -> dict[str, Any]:
    count = nonfinite = 0
    for (_step, _rank), (data, _, _) in sorted(dumps.items()):
        for node, rec in data.items():
            leaves = D.node_leaves(rec)
            for path in T.undefined_leaves(node, rec):
                leaf = leaves.get(path)
                if leaf is None:
                    continue
                count += 1
                nonfinite += any(isinstance(leaf.get(k), float) and not math.isfinite(leaf[k]) for k in D.STAT_KEYS)
    return {"leaves": count, "non_finite": nonfinite}


def _first_nan(data: dict[str, Any]) -> str | None:
    for node, rec in data.items():
        undefined = T.undefined_leaves(node, rec)
        if any(not any(p == u or p.startswith(u + ".") for u in undefined) for p in D.nan_leaf_paths(rec)):
            return node
    return None


def _first_per_rank(healthy: dict, bug: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (step, rank) in sorted(bug):
        node, leaves, skipped = T.first_difference(healthy[(step, rank)][0], bug[(step, rank)][0])
        out[f"step{step}/rank{rank}"] = {"first_differing_node": node, "differing_leaves": leaves[:8],
                                         "undefined_leaves_set_aside_that_differed": len(skipped)}
    return out


def _node_set_differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[str]]:
    return {"only_in_first": [n for n in a if n not in b][:20], "only_in_second": [n for n in b if n not in a][:20]}


def _empty_records(data: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """Nodes under *prefix* with an empty tensor leaf (numel 0), with that leaf's statistics."""
    out = []
    for node, rec in data.items():
        if not node.startswith(prefix):
            continue
        for path, leaf in D.node_leaves(rec).items():
            shape = leaf.get("shape")
            if isinstance(shape, list) and 0 in shape:
                out.append({"node": node, "leaf": path, "shape": shape, "stats": {k: leaf.get(k) for k in D.STAT_KEYS}})
    return out


def _where(node: str, construct: dict[str, Any], layout: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    module = node if node.startswith("Module.") else D.parent_of(construct, node)
    out: dict[str, Any] = {"module_node": module, "global_module": None, "global_layer": None}
    if module is None:
        return out
    key = T.module_key(module, info["layer_numbers"])
    path = key[0] if key else module
    m = re.match(r"^(decoder\.layers\.(\d+)\.mlp\.experts\.local_experts\.)(\d+)(.*)$", path)
    if m:
        g = global_expert(info["expert_coords"]["ep"], int(m.group(3)), _per_rank(layout))
        path = f"{m.group(1)}{g}{m.group(4)}"
        out["global_expert"] = g
        out["local_expert"] = int(m.group(3))
    lm = T.LAYER.match(path)
    out["global_module"] = path
    out["global_layer"] = int(lm.group(1)) if lm else None
    return out


# ------------------------------------------------------------------------------------------- faults
def _fault_starved(name: str, sample: Path, dumps: dict, healthy: dict, infos: dict, tokens: dict) -> dict[str, Any]:
    plan = ROOTS[name]
    lay = plan["layout"]
    rank, layer, expert, step = STARVED["rank"], STARVED["layer"], STARVED["expert"], STARVED["step"]
    firsts = {f"step{s}/rank{r}": _first_nan(data) for (s, r), (data, _, _) in sorted(dumps.items())}
    _check(all(v is None for k, v in firsts.items() if k.startswith("step0/")), f"{name}: NaN at step 0 {firsts}")
    node = firsts[f"step{step}/rank{rank}"]
    _check(node is not None, f"{name}: no NaN on rank {rank} at step {step}")
    assert node is not None
    other = 1 - rank
    _check(firsts[f"step{step}/rank{other}"] is None, f"{name}: rank {other} has NaN at step {step} {firsts}")
    data, cons, rdir = dumps[(step, rank)]
    where = _where(node, cons, lay, infos[rank])
    local = expert - infos[rank]["expert_coords"]["ep"] * _per_rank(lay)
    want = (f"Module.0.decoder.layers.{layer}.mlp.experts.local_experts.{local}.linear_fc2.RowParallelLinear."
            "parameters_grad")
    _check(node.startswith(want) and where.get("global_expert") == expert, f"{name}: first NaN {node} {where}")
    received = tokens[str(step)]["per_global_expert"][str(layer)][expert]
    _check(received == 0, f"{name}: expert {expert} received {received} tokens at step {step}")
    _check(all(tokens[str(s)]["per_global_expert"][str(layer)][expert] > 0 for s in DUMP_STEPS if s != step),
           f"{name}: expert {expert} starved at another step")
    empty = _empty_records(data, f"Module.0.decoder.layers.{layer}.mlp.experts.local_experts.{local}.")
    _check(bool(empty) and all(all(v is None for v in e["stats"].values()) for e in empty),
           f"{name}: empty records {empty[:3]}")
    step0 = _first_per_rank(healthy, {k: v for k, v in dumps.items() if k[0] == 0})
    _check(all(v["first_differing_node"] is None for v in step0.values()), f"{name}: step 0 differs {step0}")
    nodes_vs_healthy = {f"step{s}/rank{r}": _node_set_differences(healthy[(s, r)][0], d)
                        for (s, r), (d, _, _) in sorted(dumps.items())}
    mask = {}
    router = f"Module.0.decoder.layers.{layer}.mlp.router.TopKRouter.forward.0"
    for r in (0, 1):
        d, c, _ = dumps[(step, r)]
        sig = [n for n in d if n.startswith("Torch.sigmoid.") and D.parent_of(c, n) == router]
        mm = [n for n in d if n.startswith("Torch.mm.") and n.endswith(".forward") and D.parent_of(c, n) == router]
        _check(len(sig) == 1 and len(mm) == 1, f"{name} rank {r}: router ops {sig} {mm}")
        s_in = D.node_leaves(d[sig[0]])["input_args.0"]
        m_out = D.node_leaves(d[mm[0]])["output.0"]
        _check(s_in["Min"] == -1e4 and m_out["Min"] > -1e4, f"{name} rank {r}: mask {s_in} {m_out}")
        mask[str(r)] = {"logits": {"node": mm[0], "Min": m_out["Min"]}, "sigmoid_input": {"node": sig[0],
                                                                                         "Min": s_in["Min"]}}
    infs = [(k, n) for k, (d, _, _) in dumps.items() for n, rec in d.items() if k[0] <= step
            and any(isinstance(leaf.get(x), float) and math.isinf(leaf[x]) for leaf in D.node_leaves(rec).values()
                    for x in D.STAT_KEYS)]
    _check(not infs, f"{name}: inf in the dumps up to step {step}: {infs[:3]}")
    leaves = D.node_leaves(data[node])
    return {"kind": "nan", "role": "origin", "step": step, "rank": rank, "node": node, **where,
            "module": f"decoder.layers.{layer}.mlp.experts.local_experts.{expert}.linear_fc2",
            "global_expert": expert, "local_expert": local, "layer": layer,
            "dump_json": T.rel(rdir / "dump.json", sample), "baseline_root": plan["healthy"],
            "nan_leaves": D.nan_leaf_paths(data[node]),
            "grad_stats": {p: {k: leaf.get(k) for k in ("shape", *D.STAT_KEYS)} for p, leaf in leaves.items()},
            "coords": infos[rank]["coords"], "expert_coords": infos[rank]["expert_coords"],
            "starved": {"layer": layer, "global_expert": expert, "step": step, "tokens_received": received,
                        "forced_by": f"route_mask: at step {step} every rank's router of global layer {layer} sets "
                                     f"the logit of expert {expert} to -1e4 (torch.ops.aten.index_fill, not recorded "
                                     "by msprobe; finite, so no inf enters the dumps) before the sigmoid: score "
                                     "exactly 0, top-2 never picks it, no rank sends it a token; the fault run only. "
                                     "msprobe shows it as a gap: Torch.mm's output (the router logits) is clean, "
                                     "Torch.sigmoid's input has Min -1e4"},
            "empty_records_of_the_starved_expert": empty, "route_mask_in_the_dumps": mask,
            "how": f"rank {rank} (EP rank {infos[rank]['expert_coords']['ep']}) divides the weight gradient of global "
                   f"expert {expert}'s linear_fc2 (its local expert {local}) in global layer {layer} by the number of "
                   f"tokens that expert received in the micro-batch (a per-token mean by hand: a hook on the weight "
                   f"with torch.ops.aten.div, so msprobe dumps no extra node and its parameters_grad record holds the "
                   f"quotient), from step {step}; at step {step} the expert receives no token (forced by masking its "
                   "router score on every rank), its weight gradient is all zeros and 0/0 = NaN. Its forward and "
                   "backward records at that step hold empty tensors ([0, h]) with null statistics. The NaN weight "
                   f"poisons the expert at step {step + 1} on both ranks through the all-to-all. Step 0 is "
                   "bit-identical to the healthy moe_tp2ep2 run apart from undefined buffers",
            "first_nan_node_per_step_rank": firsts, "step0_vs_healthy": step0,
            "node_names_vs_healthy": nodes_vs_healthy}


def _fault_scaled(name: str, sample: Path, dumps: dict, healthy: dict, infos: dict) -> dict[str, Any]:
    plan = ROOTS[name]
    lay = plan["layout"]
    rank, layer, expert, step = SCALED["rank"], SCALED["layer"], SCALED["expert"], SCALED["from_step"]
    per = _first_per_rank(healthy, dumps)
    _check(all(v["first_differing_node"] is None for k, v in per.items() if k.startswith("step0/")),
           f"{name}: step 0 differs {per}")
    origin = per[f"step{step}/rank{rank}"]
    node = origin["first_differing_node"]
    data, cons, rdir = dumps[(step, rank)]
    _check(node is not None, f"{name}: no difference at step {step} on rank {rank}")
    assert node is not None
    where = _where(node, cons, lay, infos[rank])
    local = expert - infos[rank]["expert_coords"]["ep"] * _per_rank(lay)
    module = (f"Module.0.decoder.layers.{layer}.mlp.experts.local_experts.{local}.linear_fc1."
              "ColumnParallelLinear.forward.0")
    _check(node == module and origin["differing_leaves"] == ["output.0"] and where.get("global_expert") == expert,
           f"{name}: first difference {node} {origin} {where}")
    other = per[f"step{step}/rank{1 - rank}"]["first_differing_node"]
    order = list(dumps[(step, 1 - rank)][0])
    _check(other is not None and not other.startswith(module.rsplit(".", 2)[0]),
           f"{name}: rank {1 - rank} first differs at {other}")
    ratio = [D.node_leaves(d[node])["output.0"]["Norm"] for d in (healthy[(step, rank)][0], data)]
    return {"kind": "divergence", "role": "origin", "step": step, "rank": rank, "node": node, **where,
            "module": f"decoder.layers.{layer}.mlp.experts.local_experts.{expert}.linear_fc1",
            "global_expert": expert, "local_expert": local, "layer": layer,
            "dump_json": T.rel(rdir / "dump.json", sample), "baseline_root": plan["healthy"],
            "differing_leaves": origin["differing_leaves"], "output_norm_healthy_vs_fault": ratio,
            "coords": infos[rank]["coords"], "expert_coords": infos[rank]["expert_coords"],
            "other_rank_first_differing_node": other, "other_rank_first_differing_index": order.index(other),
            "how": f"rank {rank} (EP rank {infos[rank]['expert_coords']['ep']}) multiplies the linear_fc1 output of "
                   f"global expert {expert} (its local expert {local}) in global layer {layer} by {1 + SCALED['m']} "
                   f"from step {step} (a wrapped forward with torch.ops.aten.mul: no extra node); the first differing "
                   "record is that ColumnParallelLinear's output.0 (the matmul inside it is unchanged); the other rank "
                   "differs first where the all-to-all brings the expert's tokens back. Step 0 is bit-identical to "
                   "the healthy moe_tp2ep2 run apart from undefined buffers",
            "first_difference_per_rank": per}


# -------------------------------------------------------------------------------------------- facts
def _partial_sums(ep1: dict, tp2: dict) -> dict[str, Any]:
    """Sequence-parallel parameter gradients of moe_tp2ep2 at step 0 against moe_ep1's."""
    out: dict[str, Any] = {}
    base = ep1[(0, 0)][0]
    for node, rec in base.items():
        if ".parameters_grad." not in node or ".experts." in node:
            continue
        if not any(k in node for k in ("layernorm", "router")):
            continue
        pieces = [D.node_leaves(tp2[(0, r)][0][node]) for r in (0, 1) if node in tp2[(0, r)][0]]
        for path, leaf in D.node_leaves(rec).items():
            rel, err = T.relation(leaf, [p[path] for p in pieces])
            out[f"{node} {path}"] = {"relation": rel, "error": err}
    return out


def _expert_outputs(ep1: dict, other: dict, infos: dict, layout: dict[str, Any]) -> dict[str, Any]:
    """Each expert's forward output at step 0: the EP run's local expert against the same global expert of ep1."""
    rels: Counter[str] = Counter()
    worst = 0.0
    for rank, info in infos.items():
        data = other[(0, rank)][0]
        for layer in range(MODEL["layers"]):
            for i in range(_per_rank(layout)):
                g = global_expert(info["expert_coords"]["ep"], i, _per_rank(layout))
                base = D.node_leaves(ep1[(0, 0)][0][_expert_module(layer, g)])
                got = D.node_leaves(data[_expert_module(layer, i)])
                for path in ("input_args.0", "output.0"):
                    rel, err = T.relation(base[path], [got[path]])
                    rels[rel] += 1
                    worst = max(worst, err)
    return {"relations": dict(rels), "max_scale_aware_error": worst,
            "note": "step 0, every expert's MLP input and output: the same tokens in another order"}


def _collectives(dumps: dict) -> dict[str, Any]:
    out = {}
    for (step, rank), (data, cons, _) in sorted(dumps.items()):
        if step != 0:
            continue
        c: Counter[str] = Counter()
        parents: dict[str, Counter[str]] = {}
        for node in data:
            if node.startswith("Distributed."):
                api = ".".join(node.split(".")[:2])
                c[api] += 1
                parent = D.parent_of(cons, node) or "(top level)"
                parent = re.sub(r"\.(forward|backward)\.\d+$", r".\1", re.sub(r"layers\.\d+", "layers.*", parent))
                parents.setdefault(api, Counter())[parent] += 1
        out[str(rank)] = {"counts": dict(c), "parents": {k: dict(v) for k, v in parents.items()}}
    return out


def _node_names(dumps: dict, layout: dict[str, Any]) -> dict[str, Any]:
    data = dumps[(0, 0)][0]
    examples = [n for n in data if EXPERT.match(n) and n.endswith(".MLP.forward.0")][:4]
    cons = dumps[(0, 0)][1]
    moe_layer = "Module.0.decoder.layers.0.mlp.MoELayer"
    children = {d: dict(Counter(".".join(n.split(".")[:2]) for n in data if not n.startswith("Module.")
                                and D.parent_of(cons, n) == f"{moe_layer}.{d}.0")) for d in ("forward", "backward")}
    a2a = next(n for n in data if n.startswith("Distributed.all_to_all_single."))
    rec = data[a2a]
    splits = {k: rec["input_kwargs"][k]["type"] for k in ("output_split_sizes", "input_split_sizes")}
    _check(rec["input_args"][0] is None and set(splits.values()) == {"numpy.ndarray"}, f"all_to_all record {rec}")
    return {"expert_modules_rank0_step0": examples,
            "all_to_all_example": {"node": a2a, "record": rec},
            "token_dispatcher": "the token dispatcher is no torch module: its permutation ops and all-to-alls are "
                                "recorded as API nodes whose parent is the MoELayer (moe_tp2ep2 rank 0, step 0, "
                                "layer 0: api_children_of_moe_layer)",
            "api_children_of_moe_layer": children,
            "moe_layer_modules": sorted({re.sub(r"layers\.\d+", "layers.*", n.rsplit(".", 2)[0]) for n in data
                                         if n.startswith("Module.") and ".mlp." in n
                                         and ".local_experts." not in n})}


def truth(sample: Path, results: dict[str, Any]) -> dict[str, Any]:
    """Everything the ground truth records about the MoE roots, read back from the dumps."""
    dumps = {name: _load(sample / name) for name in ROOTS}
    infos: dict[str, dict[int, dict[str, Any]]] = {}
    layouts, coords, expert_coords, expert_map, tokens, losses = {}, {}, {}, {}, {}, {}
    for name, plan in ROOTS.items():
        lay = plan["layout"]
        n = world(lay)
        got_steps = sorted({s for s, _ in dumps[name]})
        _check(got_steps == plan["dump_steps"], f"{name}: steps {got_steps}")
        _check(sorted({r for _, r in dumps[name]}) == list(range(n)), f"{name}: ranks")
        infos[name] = {int(r): v for r, v in results[name]["ranks"].items()}
        per_rank = _per_rank(lay)
        for (step, rank), (data, _, _) in dumps[name].items():
            seen = _expert_nodes(data)
            _check(seen == {layer: set(range(per_rank)) for layer in range(MODEL["layers"])},
                   f"{name} step {step} rank {rank}: local experts {seen}")
        coords[name] = {str(r): i["coords"] for r, i in infos[name].items()}
        expert_coords[name] = {str(r): i["expert_coords"] for r, i in infos[name].items()}
        expert_map[name] = {str(r): {f"Module.0.decoder.layers.{layer}.mlp.experts.local_experts.{i}":
                                     f"decoder.layers.{layer}.mlp.experts.local_experts."
                                     f"{global_expert(i_['expert_coords']['ep'], i, per_rank)}"
                                     for layer in range(MODEL["layers"]) for i in range(per_rank)}
                            for r, i_ in infos[name].items()}
        for r, info in infos[name].items():  # the worker's local -> global parameter names agree
            for key, g in info["names"].items():
                m = re.search(r"local_experts\.(\d+)\.", key)
                if m:
                    want = global_expert(info["expert_coords"]["ep"], int(m.group(1)), per_rank)
                    _check(f"local_experts.{want}." in g, f"{name} rank {r}: {key} -> {g}")
        tokens[name] = _tokens(name, dumps[name], infos[name], lay)
        by_rank = [v["losses"] for v in infos[name].values() if v["losses"]]
        losses[name] = [sum(r[s] for r in by_rank) / len(by_rank) for s in range(TRAIN_STEPS)]
        layouts[name] = {**lay, "world_size": n, "order": "tp-cp-ep-dp-pp", "experts_per_rank": per_rank,
                         "hidden_dropout": 0.0, "bugs": plan.get("bugs", []),
                         "healthy_counterpart": plan.get("healthy"), "train_steps": TRAIN_STEPS}
    for name in HEALTHY[1:]:
        for s in range(TRAIN_STEPS):
            err = abs(losses[name][s] - losses["moe_ep1"][s]) / abs(losses["moe_ep1"][s])
            _check(err < 1e-5, f"{name} loss at step {s}: {losses[name][s]} vs {losses['moe_ep1'][s]}")
    _check(tokens["moe_tp2ep2"]["0"]["per_global_expert"] == tokens["moe_ep1"]["0"]["per_global_expert"]
           == tokens["moe_tp1ep2dp2"]["0"]["per_global_expert"], "healthy roots route differently at step 0")
    healthy = dumps["moe_tp2ep2"]
    faults = [
        _fault_starved("moe_tp2ep2_starved", sample, dumps["moe_tp2ep2_starved"], healthy,
                       infos["moe_tp2ep2_starved"], tokens["moe_tp2ep2_starved"]),
        _fault_scaled("moe_tp2ep2_expert_scale", sample, dumps["moe_tp2ep2_expert_scale"], healthy,
                      infos["moe_tp2ep2_expert_scale"]),
    ]
    for f in faults:
        f["root"] = next(n for n in ROOTS if f["dump_json"].startswith(n + "/"))
    sp = _partial_sums(dumps["moe_ep1"], healthy)
    _check(bool(sp) and all(v["relation"] == "partial sum" for k, v in sp.items() if "parameters_grad" in k),
           f"sequence-parallel grads {[(k, v) for k, v in sp.items() if v['relation'] != 'partial sum'][:3]}")
    counters = {name: {f"step{s}": _node_set_differences(dumps[name][(s, 0)][0], dumps[name][(s, 1)][0])
                       for s in DUMP_STEPS} for name in ROOTS if world(ROOTS[name]["layout"]) == 2}
    starved = {name: [{"step": int(s), "layer": int(layer), "global_expert": g}
                      for s, t in tokens[name].items() for layer, counts in t["per_global_expert"].items()
                      for g, n in enumerate(counts) if n == 0] for name in ROOTS}
    bit_identical = {name: {"losses": losses[name] == losses["moe_ep1"],
                            "per_step": [losses[name][s] == losses["moe_ep1"][s] for s in range(TRAIN_STEPS)]}
                     for name in HEALTHY[1:]}
    return {
        "roots": list(ROOTS), "model": describe(), "train_steps": TRAIN_STEPS, "dump_steps": DUMP_STEPS,
        "cpu_patches": CPU_PATCHES, "layouts": layouts, "rank_coords": coords, "expert_coords": expert_coords,
        "expert_map": expert_map,
        "expert_index_rule": "expert i on EP rank r is global expert r * experts_per_rank + i (msprobe names the "
                             "local index: Module.0.decoder.layers.<l>.mlp.experts.local_experts.<i>.MLP...)",
        "layer_map": {name: {str(r): {f"Module.{c}.decoder.layers.{i}": f"decoder.layers.{n - 1}"
                                      for c, nums in i_["layer_numbers"].items() for i, n in enumerate(nums)}
                             for r, i_ in v.items()} for name, v in infos.items()},
        "local_to_global": {name: {str(r): {k: g for k, g in i["names"].items() if k.split(":", 1)[1] != g}
                                   for r, i in v.items()} for name, v in infos.items()},
        "tokens_per_expert": tokens,
        "tokens_per_expert_note": "per step and layer: per_global_expert = tokens routed to each global expert "
                                  "(summed over ranks); per_rank.<r>.<layer>.routed_by_this_rank = what that rank's "
                                  "router sent to each global expert (its own tokens: its sequence shard under "
                                  "sequence parallelism, its batch half under DP), received_by_local_experts = the "
                                  "rows each of its local experts got. msprobe records the received counts only as "
                                  "shapes: input_args.0 of each Module...local_experts.<i>.MLP.forward (and "
                                  "SequentialMLP's tokens_per_expert argument, whose statistics are Max/Min/Mean/Norm "
                                  "of the counts); the worker's dispatcher counts were checked against those shapes; "
                                  "the routed counts come from the worker (the router's routing_map summed)",
        "starved_experts": starved,
        "losses": losses,
        "losses_bit_identical_to_moe_ep1": bit_identical,
        "faults": faults,
        "sequence_parallel_gradients_partial_sums": sp,
        "sequence_parallel_note": "moe_tp2ep2 records the gradients of the norms' and routers' weights (marked "
                                  "sequence_parallel) per rank before finalize_model_grads all-reduces them over TP: "
                                  "the two ranks' Means add up to moe_ep1's (partial sum)",
        "experts_vs_moe_ep1_step0": {name: _expert_outputs(dumps["moe_ep1"], dumps[name], infos[name],
                                                           ROOTS[name]["layout"]) for name in HEALTHY[1:]},
        "node_names_between_ranks": counters,
        "collectives_step0": {name: _collectives(dumps[name]) for name in ROOTS},
        "node_names": _node_names(dumps["moe_tp2ep2"], ROOTS["moe_tp2ep2"]["layout"]),
        "undefined_by_construction": {name: _undefined(dumps[name]) for name in ROOTS},
    }
