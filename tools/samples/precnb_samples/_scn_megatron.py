"""Sample ``megatron``: real Megatron-Core 0.19.2 GPTModel runs in several parallel layouts, healthy and buggy.

One tiny GPT (local layer spec, fp32, RMSNorm, SwiGLU, RoPE, biases, 4 layers) is initialised once at world
size 1; every layout loads the same weights (TP shards along each parameter's ``partition_dim``, PP/VPP
layers by Megatron's ``layer_number``) and trains on the same batches (2 micro-batches per step) with
Megatron's own schedules (no pipelining, 1F1B, interleaved) on CPU/gloo, dumped by msprobe 26.2.0
(statistics, level mix). The runs happen in the Megatron interpreter (``PRECNB_MEGATRON_PYTHON``, see
:mod:`precnb_samples._mg_run`); this module only plans them and reads the ground truth back from the dumps
(:mod:`precnb_samples._mg_truth`): healthy layouts merge to the whole-model run, each bug shows where it was
injected and nowhere earlier, and the Megatron-specific facts of the dumps are listed.

>>> sorted(ROOTS)[:3]
['hf_llama', 'tp1pp1', 'tp1pp1_dropout']
>>> world(ROOTS["tp2pp2"]["layout"])
4
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from . import _dumps as D  # noqa: N812
from . import _mg_truth as T  # noqa: N812
from . import _scn_megatron_moe as M  # noqa: N812
from ._mg_run import megatron_versions, require_megatron, run_mg

REQUIRES = require_megatron
MODEL: dict[str, Any] = {"layers": 4, "hidden": 32, "heads": 4, "ffn": 64, "vocab": 64, "seq": 8, "micro_batch": 2,
                         "micro_batches": 2, "lr": 1e-3, "weight_decay": 0.01, "seed": 1234, "eps": 1e-5,
                         "rope_base": 10000}
TRAIN_STEPS = 2
DROPOUT = 0.1


def _lay(tp: int = 1, pp: int = 1, vpp: int = 1, dp: int = 1, sp: bool = False) -> dict[str, Any]:
    return {"tp": tp, "pp": pp, "vpp": vpp, "dp": dp, "sp": sp, "ep": 1}


def world(layout: dict[str, Any]) -> int:
    """World size of a layout (``tp * pp * dp``)."""
    return int(layout["tp"] * layout["pp"] * layout["dp"])


# dump root -> what runs there; "dump_steps": the steps msprobe writes (every run trains TRAIN_STEPS steps)
ROOTS: dict[str, dict[str, Any]] = {
    "tp1pp1": {"layout": _lay(), "dump_steps": [0, 1]},
    "tp2pp1": {"layout": _lay(tp=2), "dump_steps": [0]},
    "tp1pp2": {"layout": _lay(pp=2), "dump_steps": [0, 1]},
    "tp2pp2": {"layout": _lay(tp=2, pp=2), "dump_steps": [0]},
    "tp1pp2vpp2": {"layout": _lay(pp=2, vpp=2), "dump_steps": [0]},
    "tp1pp1dp2": {"layout": _lay(dp=2), "dump_steps": [0]},
    "tp2sp": {"layout": _lay(tp=2, sp=True), "dump_steps": [0]},
    "tp2pp2_scaled": {"layout": _lay(tp=2, pp=2), "dump_steps": [0], "healthy": "tp2pp2",
                      "bugs": [{"kind": "softmax_scale", "rank": 3, "layer": 2, "factor": 2.0}]},
    "tp2pp1_wrong_shard": {"layout": _lay(tp=2), "dump_steps": [0], "healthy": "tp2pp1",
                           "bugs": [{"kind": "wrong_shard", "rank": 1, "layer": 1,
                                     "param": "decoder.layers.1.mlp.linear_fc1.weight", "loads_shard_of_tp_rank": 0}]},
    "tp1pp1_dropout": {"layout": _lay(), "dump_steps": [0], "dropout": DROPOUT},
    "tp2pp1_dropout_unsync": {"layout": _lay(tp=2), "dump_steps": [0], "dropout": DROPOUT, "healthy": "tp1pp1_dropout",
                              "bugs": [{"kind": "unsynced_seed", "rank": 1}]},
    "tp1pp2_nan": {"layout": _lay(pp=2), "dump_steps": [0, 1], "healthy": "tp1pp2",
                   "bugs": [{"kind": "norm_eps", "rank": 1, "layer": 2, "eps": -1.0, "from_step": 1}]},
    "hf_llama": {"layout": _lay(), "dump_steps": [0], "hf": True},
}
STEPS = [0, 1]  # union of the dumped steps of the dense roots (the MoE roots add step 2)
WHAT = ("real Megatron-Core 0.19.2 GPTModel (local layer spec, fp32, 4 layers) on CPU/gloo under msprobe "
        "26.2.0: the same weights and batches in layouts tp1pp1, tp2pp1, tp1pp2, tp2pp2, tp1pp2vpp2, tp1pp1dp2 "
        "and tp2 with sequence parallelism (healthy); four bugs (a scaled op on one rank of tp2pp2, a wrong TP "
        "shard loaded, an unsynchronised dropout seed on the TP-replicated residual stream, a NaN from one layer "
        "from step 1); and the same weights in a Hugging Face LlamaForCausalLM")
MOE_WHAT = ("; plus a 2-layer MoE GPT (4 experts, top-2 sigmoid router with expert bias, all-to-all token "
            "dispatcher; issue 48) in layouts ep1, tp2ep2 (expert parallelism folded onto TP, sequence parallel) "
            "and tp1ep2dp2 (healthy), and two faults on tp2ep2 (an expert starved of tokens at step 1 whose "
            "gradient divided by its token count turns NaN; one expert's linear_fc1 output scaled from step 1)")

CPU_PATCHES = [
    "torch.cuda.current_device -> the CPU device (p2p receive/shape buffers, Megatron's global memory buffer)",
    "torch.cuda.synchronize -> no-op (p2p code)",
    "megatron.core.pipeline_parallel.schedules.torch -> a stand-in whose zeros() maps a cuda device to cpu "
    "(the schedules' token counter)",
    "CudaRNGStatesTracker.fork -> a no-op context manager (attention dropout is 0; the hidden dropout of the "
    "dropout runs is outside the TP-RNG region and uses the default generator, seeded per rank by the worker)",
    "megatron.core.transformer.utils.get_default_causal_mask -> built on the CPU (the worker passes an explicit "
    "causal mask anyway)",
    "WrappedTorchNorm (sequence parallelism only): builds torch.nn.RMSNorm although config.sequence_parallel "
    "is set (Megatron asserts it off for torch norms) and marks the weight sequence_parallel; the worker "
    "all-reduces those weight grads over the TP group as Megatron's finalize_model_grads does",
]


def _config(sample: Path, name: str, steps: list[int]) -> Path:
    from ._scenarios import _STATISTICS_CONFIG, write_json

    path = sample / "configs" / f"config_{name}.json"
    write_json(path, dict(_STATISTICS_CONFIG, dump_path=str(sample / name), step=steps))
    return path


def _run_all(ctx: Any, sample: Path, only: list[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Initialise the weights once, then run every dump root (or those in *only*); (init info, results by root)."""
    work = ctx.log_dir / "megatron"
    work.mkdir(parents=True, exist_ok=True)
    files = {"weights": str(work / "init_state.pt"), "batches": str(work / "batches.pt")}
    init = run_mg({"mode": "init", "model": MODEL, "steps": TRAIN_STEPS, **files}, log_dir=work, tag="mg_init")
    results = {}
    for name, plan in ROOTS.items():
        if only is not None and name not in only:
            continue
        ctx.log(f"[precnb_samples]   megatron/{name} ...")
        model = dict(MODEL, hidden_dropout=plan.get("dropout", 0.0))
        spec = {"mode": "hf" if plan.get("hf") else "megatron", "model": model, "layout": plan["layout"],
                "steps": TRAIN_STEPS, "bugs": plan.get("bugs", []),
                "config": str(_config(sample, name, plan["dump_steps"])), **files}
        results[name] = run_mg(spec, log_dir=work, tag=f"mg_{name}")
    return init, results


# ------------------------------------------------------------------------------------------ reading
def _load(root: Path) -> dict[tuple[int, int], tuple[dict[str, Any], dict[str, Any], Path]]:
    out = {}
    for step, sdir in D.step_dirs(root):
        for i, rdir in enumerate(D.rank_dirs(sdir)):
            rank = int(rdir.name[4:]) if rdir.name.startswith("rank") and rdir.name[4:] else i
            out[(step, rank)] = (D.dump_data(rdir / "dump.json"), D.load_json(rdir / "construct.json"), rdir)
    return out


def _check(cond: bool, message: str) -> None:
    if not cond:
        from ._scenarios import GroundTruthError

        raise GroundTruthError(message)


def _ranks_info(res: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(r): v for r, v in res["ranks"].items()}


_INFOS: dict[int, dict[int, dict[str, Any]]] = {}  # id(dumps of a root) -> its rank infos


def _ranks_info_of(dumps: dict) -> dict[str, Any]:
    """Rank 0's worker info of a root's dumps (registered by :func:`gen_megatron`)."""
    return _INFOS[id(dumps)][0]


def _layer_map(info: dict[str, Any]) -> dict[str, str]:
    return {f"Module.{c}.decoder.layers.{i}": f"decoder.layers.{n - 1}"
            for c, nums in info["layer_numbers"].items() for i, n in enumerate(nums)}


def _check_layer_map(name: str, dumps: dict, infos: dict[int, dict[str, Any]]) -> None:
    """The local layer names in each rank's dump are exactly the chunks' layers the worker reported."""
    for (step, rank), (data, _, _) in dumps.items():
        seen = {".".join(n.split(".")[:5]) for n in data if n.startswith("Module.") and ".decoder.layers." in n}
        want = set(_layer_map(infos[rank]))
        _check(seen == want, f"{name} step {step} rank {rank}: layers {sorted(seen)} != {sorted(want)}")


def _compare(base: dict, target: dict, infos_b: dict, infos_t: dict, layout: dict[str, Any]) -> dict[str, Any]:
    """Every module leaf of the whole-model run against the merged pieces of the target layout."""
    rels: Counter[str] = Counter()
    worst: dict[str, float] = {}
    bad: list[dict[str, Any]] = []
    steps = sorted({s for s, _ in target} & {s for s, _ in base})
    for step in steps:
        bdata = base[(step, 0)][0]
        bkeys = T.module_records(bdata, infos_b[0]["layer_numbers"])
        holders: dict[tuple, list[tuple[int, str]]] = {}
        for (s, rank), (data, _, _) in sorted(target.items()):
            if s == step:
                for key, node in T.module_records(data, infos_t[rank]["layer_numbers"]).items():
                    holders.setdefault(key, []).append((rank, node))
        for key, bnode in bkeys.items():
            if key[0] == "decoder" and (layout["pp"] > 1 or layout["vpp"] > 1):
                continue  # each stage's (chunk's) TransformerBlock holds only its own layers
            got = holders.get(key)
            _check(bool(got), f"step {step}: {bnode} has no counterpart")
            assert got is not None
            bleaves = D.node_leaves(bdata[bnode])
            tleaves = [D.node_leaves(target[(step, r)][0][n]) for r, n in got]
            for path, leaf in bleaves.items():
                if "shape" not in leaf:
                    continue
                pieces = [t[path] for t in tleaves if path in t]
                _check(len(pieces) == len(tleaves), f"step {step}: {got[0][1]} lacks {path}")
                r, err = T.relation(leaf, pieces)
                shape = leaf.get("shape")
                if r == "differs" and isinstance(shape, list) and len(shape) == 3 and layout.get("sp"):
                    r2, err2 = T.relation(dict(leaf, shape=[shape[1], shape[0], shape[2]]), pieces)
                    if r2.startswith("sharded") and "not merge" not in r2:  # SP embedding: [b, s, h] -> [s/tp, b, h]
                        r, err = r2 + " of the transposed [s, b, h] (sequence parallel)", err2
                if (r == "differs" or "not merge" in r) and layout["dp"] > 1 and key[2] == "backward":
                    r2, err2 = T.relation(leaf, pieces, scale_by=layout["dp"])
                    if r2.startswith("sharded") and "not merge" not in r2:
                        r, err = r2 + " (x dp: each rank's loss is the mean over its part of the batch)", err2
                rels[r] += 1
                if math.isfinite(err):
                    worst[r] = max(worst.get(r, 0.0), err)
                if r == "differs" or "not merge" in r:
                    bad.append({"step": step, "module": key[0], "node_baseline": bnode,
                                "nodes": [f"rank{rk}:{n}" for rk, n in got], "leaf": path})
    return {"steps": steps, "relations": dict(rels), "max_scale_aware_error": worst, "unexplained": bad[:20],
            "unexplained_count": len(bad)}


def _glue(base: dict, target: dict, infos_b: dict, infos_t: dict) -> dict[str, Any]:
    """API calls per module (whole-model names, layer numbers as ``*``) that only one layout makes, step 0."""
    bdata, bcons, _ = base[(0, 0)]
    bkids = T.api_children(bdata, bcons, infos_b[0]["layer_numbers"])
    extra: dict[str, Counter[str]] = {}
    missing: dict[str, Counter[str]] = {}
    seen: set[tuple] = set()
    for (step, rank), (data, cons, _) in sorted(target.items()):
        if step != 0:
            continue
        for key, kids in T.api_children(data, cons, infos_t[rank]["layer_numbers"]).items():
            if key in seen or key[3] != 0:
                continue
            seen.add(key)
            pattern = T.LAYER.sub("decoder.layers.*.", key[0] + ".").rstrip(".") + f".{key[1]}.{key[2]}"
            more, less = kids - bkids.get(key, Counter()), bkids.get(key, Counter()) - kids
            if more:
                extra.setdefault(pattern, Counter()).update(more)
            if less:
                missing.setdefault(pattern, Counter()).update(less)
    top_b = Counter(".".join(n.split(".")[:-2]) for n in bdata if not n.startswith("Module.")
                    and D.parent_of(bcons, n) is None)
    top_t: Counter[str] = Counter()
    for (step, rank), (data, cons, _) in target.items():
        if step == 0 and rank == 0:
            top_t = Counter(".".join(n.split(".")[:-2]) for n in data if not n.startswith("Module.")
                            and D.parent_of(cons, n) is None)
    return {"only_in_target_per_module": {k: dict(v) for k, v in sorted(extra.items())},
            "only_in_baseline_per_module": {k: dict(v) for k, v in sorted(missing.items())},
            "top_level_only_in_target_rank0": dict(top_t - top_b),
            "top_level_only_in_baseline": dict(top_b - top_t),
            "note": "micro-batch 0 of step 0; counts summed over the modules matching the pattern (one rank per "
                    "module); top level = API nodes without a parent module in construct.json"}


def _scalar_differences(dumps: dict, infos: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """API nodes whose scalar arguments differ between the ranks of one TP group (step 0)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for rank, info in infos.items():
        groups.setdefault((info["coords"]["pp"], info["coords"]["dp"]), []).append(rank)
    found: dict[str, dict[str, Any]] = {}
    for ranks in groups.values():
        if len(ranks) < 2:
            continue
        datas = [dumps[(0, r)][0] for r in sorted(ranks)]
        for node in datas[0]:
            if node.startswith("Module.") or any(node not in d for d in datas[1:]):
                continue
            leaves = [D.node_leaves(d[node]) for d in datas]
            for path, leaf in leaves[0].items():
                if "value" not in leaf or "shape" in leaf:
                    continue
                values = [lv.get(path, {}).get("value") for lv in leaves]
                if len(set(map(repr, values))) > 1:
                    api = ".".join(node.split(".")[:-2])
                    slot = found.setdefault(api, {"count": 0, "example": None})
                    slot["count"] += 1
                    if slot["example"] is None:
                        parent = D.parent_of(dumps[(0, sorted(ranks)[0])][1], node)
                        slot["example"] = {"node": node, "leaf": path, "parent": parent,
                                           "values_by_rank": dict(zip(map(str, sorted(ranks)), values, strict=True))}
    return found


def _undefined(dumps: dict) -> dict[str, Any]:
    """Count the undefined leaves and how many of them hold a non-finite statistic."""
    count = nonfinite = 0
    examples = []
    for (step, rank), (data, _, _) in sorted(dumps.items()):
        for node, rec in data.items():
            for path in T.undefined_leaves(node, rec):
                leaves = D.node_leaves(rec)
                leaf = leaves.get(path)
                if leaf is None:
                    continue
                count += 1
                bad = any(isinstance(leaf.get(k), float) and not math.isfinite(leaf[k]) for k in D.STAT_KEYS)
                nonfinite += bad
                if bad and len(examples) < 3:
                    examples.append({"step": step, "rank": rank, "node": node, "leaf": path,
                                     "stats": {k: leaf.get(k) for k in D.STAT_KEYS}})
    return {"leaves": count, "non_finite": nonfinite, "examples": examples}


# -------------------------------------------------------------------------------------------- faults
def _global(node: str, info: dict[str, Any], construct: dict[str, Any]) -> dict[str, Any]:
    """The node's module (its own for a module node, its parent's for an API) in whole-model names."""
    module = node if node.startswith("Module.") else D.parent_of(construct, node)
    key = T.module_key(module, info["layer_numbers"]) if module else None
    out: dict[str, Any] = {"module_node": module, "global_module": key[0] if key else None}
    if key:
        m = T.LAYER.match(key[0])
        out["global_layer"] = int(m.group(1)) if m else None
        out["micro_batch"] = key[3]
    return out


def _first_per_rank(healthy: dict, bug: dict, steps: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for step in steps:
        for (s, rank) in sorted(k for k in bug if k[0] == step):
            node, leaves, skipped = T.first_difference(healthy[(s, rank)][0], bug[(s, rank)][0])
            out[f"step{s}/rank{rank}"] = {"first_differing_node": node, "differing_leaves": leaves[:8],
                                          "undefined_leaves_set_aside_that_differed": len(skipped),
                                          "undefined_examples": [f"{n} {p}" for n, p in skipped[:3]]}
    return out


def _fault_scaled(name: str, sample: Path, dumps: dict, healthy: dict, infos: dict) -> dict[str, Any]:
    bug = ROOTS[name]["bugs"][0]
    per = _first_per_rank(healthy, dumps, [0])
    origin = per[f"step0/rank{bug['rank']}"]
    node = origin["first_differing_node"]
    data, cons, rdir = dumps[(0, bug["rank"])]
    where = _global(node, infos[bug["rank"]], cons)
    _check(node is not None and node.startswith("Torch.baddbmm.") and where["global_layer"] == bug["layer"]
           and origin["differing_leaves"] == ["input_kwargs.alpha", "output.0"],
           f"{name}: first difference {node} {origin} {where}")
    # the other ranks differ only later: rank 2 (TP peer) first at a collective, stage 0 in backward
    for r in (0, 1, 2):
        other = per[f"step0/rank{r}"]["first_differing_node"]
        _check(other is not None and not other.startswith("Torch.baddbmm."), f"{name}: rank {r} first {other}")
    alpha = data[node]["input_kwargs"]["alpha"]["value"]
    return {"kind": "divergence", "role": "origin", "step": 0, "rank": bug["rank"], "node": node, **where,
            "dump_json": T.rel(rdir / "dump.json", sample), "baseline_root": ROOTS[name]["healthy"],
            "differing_leaves": origin["differing_leaves"], "alpha": alpha,
            "coords": infos[bug["rank"]]["coords"],
            "how": f"rank {bug['rank']} (tp 1 of pipeline stage 1) multiplies the core-attention softmax_scale of "
                   f"global layer {bug['layer']} (its local layer 0) by {bug['factor']} from step 0: "
                   "Torch.baddbmm's alpha doubles; every tensor input is identical to the healthy run",
            "first_difference_per_rank": per}


def _fault_wrong_shard(name: str, sample: Path, dumps: dict, healthy: dict, infos: dict) -> dict[str, Any]:
    bug = ROOTS[name]["bugs"][0]
    per = _first_per_rank(healthy, dumps, [0])
    _check(per["step0/rank0"]["first_differing_node"] is not None, f"{name}: rank 0 never differs")
    origin = per[f"step0/rank{bug['rank']}"]
    node = origin["first_differing_node"]
    data, cons, rdir = dumps[(0, bug["rank"])]
    where = _global(node, infos[bug["rank"]], cons)
    module = f"Module.0.decoder.layers.{bug['layer']}.mlp.linear_fc1.ColumnParallelLinear.forward.0"
    _check(where["global_layer"] == bug["layer"] and where["module_node"] == module,
           f"{name}: first difference {node} {where}")
    w = D.node_leaves(data[module])["parameters.weight"]
    w0 = D.node_leaves(dumps[(0, 0)][0][module])["parameters.weight"]
    _check(all(w[k] == w0[k] for k in D.STAT_KEYS), f"{name}: rank 1's fc1 weight is not rank 0's shard")
    first_rank0 = per["step0/rank0"]["first_differing_node"]
    return {"kind": "divergence", "role": "origin", "step": 0, "rank": bug["rank"], "node": node, **where,
            "parameter": bug["param"], "dump_json": T.rel(rdir / "dump.json", sample),
            "baseline_root": ROOTS[name]["healthy"], "differing_leaves": origin["differing_leaves"],
            "module": module, "coords": infos[bug["rank"]]["coords"],
            "rank0_first_differing_node": first_rank0,
            "how": f"TP rank 1 loads TP rank 0's shard of {bug['param']} ([gate_0; up_0] instead of [gate_1; up_1]); "
                   "its statistics equal rank 0's exactly; the first differing node on rank 1 is the first use of "
                   "that weight inside global layer 1's linear_fc1",
            "first_difference_per_rank": per}


def _first_module_off(base: dict[str, Any], data: dict[str, Any], info_b: dict, info: dict) -> str | None:
    """First module node (dump order) with a leaf whose shape matches the whole-model run but whose value does not."""
    bkeys = T.module_records(base, info_b["layer_numbers"])
    for node in data:
        key = T.module_key(node, info["layer_numbers"])
        if key is None or key not in bkeys:
            continue
        bleaves = D.node_leaves(base[bkeys[key]])
        for path, leaf in D.node_leaves(data[node]).items():
            b = bleaves.get(path)
            if b is not None and "shape" in leaf and b.get("shape") == leaf.get("shape") \
                    and T.relation(b, [leaf])[0] != "replicated":
                return node
    return None


def _fault_dropout(name: str, sample: Path, dumps: dict, healthy: dict, infos: dict) -> dict[str, Any]:
    bug = ROOTS[name]["bugs"][0]
    base, info_b = healthy[(0, 0)][0], _ranks_info_of(healthy)
    firsts = {r: _first_module_off(base, dumps[(0, r)][0], info_b, infos[r]) for r in (0, 1)}
    module = firsts[bug["rank"]]
    data, cons, rdir = dumps[(0, bug["rank"])]
    _check(module == "Module.0.embedding.embedding_dropout.Dropout.forward.0"
           and (firsts[0] is None or list(data).index(firsts[0]) > list(data).index(module)),
           f"{name}: first module off the whole-model run per rank {firsts}")
    node = next(n for n in data if not n.startswith("Module.") and D.parent_of(cons, n) == module)
    d0 = dumps[(0, 0)][0]
    leaves = D.differing_leaves(d0[node], data[node])
    _check(node.startswith("Functional.dropout.") and leaves == ["output.0"], f"{name}: {node} {leaves}")
    where = _global(node, infos[bug["rank"]], cons)
    return {"kind": "replica_mismatch", "role": "origin", "step": 0, "rank": bug["rank"], "node": node, **where,
            "dump_json": T.rel(rdir / "dump.json", sample), "replica_of_rank": 0, "differing_leaves": leaves,
            "baseline_root": ROOTS[name]["healthy"], "coords": infos[bug["rank"]]["coords"],
            "first_module_off_the_baseline_per_rank": {str(r): v for r, v in firsts.items()},
            "how": "hidden dropout 0.1 (the embedding dropout and every bias-dropout-add act on the residual stream, "
                   "which TP replicates; Megatron draws these masks from the default generator, outside the "
                   "TP-RNG region, so all TP ranks must seed it alike); TP rank 1 seeds it with its TP rank added. "
                   "The first replicated tensor that differs between the TP ranks is the embedding dropout's output "
                   "(its input is identical on both ranks); rank 0 matches the tp1pp1_dropout run there, rank 1 "
                   "does not"}


def _fault_nan(name: str, sample: Path, dumps: dict, healthy: dict, infos: dict) -> dict[str, Any]:
    bug = ROOTS[name]["bugs"][0]
    firsts = {}
    for (step, rank), (data, _, _) in sorted(dumps.items()):
        first = None
        for node, rec in data.items():
            undefined = T.undefined_leaves(node, rec)
            paths = [p for p in D.nan_leaf_paths(rec) if not any(p == u or p.startswith(u + ".") for u in undefined)]
            if paths:
                first = (node, paths)
                break
        firsts[f"step{step}/rank{rank}"] = first[0] if first else None
    _check(firsts["step0/rank0"] is None and firsts["step0/rank1"] is None, f"{name}: NaN at step 0: {firsts}")
    node = firsts[f"step1/rank{bug['rank']}"]
    data, cons, rdir = dumps[(1, bug["rank"])]
    _check(node is not None, f"{name}: no NaN on rank {bug['rank']} at step 1")
    assert node is not None
    where = _global(node, infos[bug["rank"]], cons)
    ins, outs = D.nan_sides(data[node])
    _check(where["global_module"] == f"decoder.layers.{bug['layer']}.pre_mlp_layernorm" and outs and not ins,
           f"{name}: first NaN {node} {where} inputs NaN {ins}")
    per = _first_per_rank(healthy, dumps, [0])
    _check(all(v["first_differing_node"] is None for v in per.values()), f"{name}: step 0 differs {per}")
    spread = firsts[f"step1/rank{1 - bug['rank']}"]
    return {"kind": "nan", "role": "origin", "step": 1, "rank": bug["rank"], "node": node, **where,
            "dump_json": T.rel(rdir / "dump.json", sample), "baseline_root": ROOTS[name]["healthy"],
            "nan_leaves": D.nan_leaf_paths(data[node]), "coords": infos[bug["rank"]]["coords"],
            "how": f"from step 1 the pre-MLP RMSNorm of global layer {bug['layer']} (pipeline stage 1's local "
                   f"layer 0) runs with eps {bug['eps']}: rsqrt(mean(x^2) + eps) of a negative number. msprobe "
                   "does not hook torch's rms_norm, so the first NaN node is the RMSNorm module itself (finite "
                   "input, NaN output). Step 0 is bit-identical to the healthy tp1pp2 run apart from undefined "
                   "buffers",
            "first_nan_node_per_step_rank": firsts, "spread_to_stage0_first_nan_node": spread,
            "step0_vs_healthy": per}


# --------------------------------------------------------------------------------------- megatron facts
def _facts(sample: Path, dumps: dict[str, dict], infos: dict[str, dict]) -> dict[str, Any]:
    vpp = dumps["tp1pp2vpp2"]
    d = vpp[(0, 1)][0]
    p2p = []
    for root in ("tp1pp2", "tp1pp2vpp2"):
        for (step, rank), (data, cons, _) in sorted(dumps[root].items()):
            if step != 0:
                continue
            for node in data:
                parent = cons.get(node)
                if node.startswith("Distributed.") and isinstance(parent, list) and parent[0] \
                        and ".backward." in parent[0]:
                    p2p.append({"root": root, "rank": rank, "node": node, "construct": parent})
    tp2 = dumps["tp2pp1"][(0, 0)][0]
    qkv = "Module.0.decoder.layers.0.self_attention.linear_qkv.ColumnParallelLinear.forward.0"
    proj = "Module.0.decoder.layers.0.self_attention.linear_proj.RowParallelLinear.forward.0"
    pleaves = D.node_leaves(tp2[proj])
    send = next(n for n in dumps["tp1pp2"][(0, 0)][0] if n.startswith("Distributed.batch_isend_irecv."))
    stage_modules = {}
    for root in ("tp1pp2", "tp1pp2vpp2", "tp2pp2"):
        stage_modules[root] = {
            str(rank): sorted({f"{m.group(1)}:{m.group(2)}" for m in map(T.MODULE.match, data)
                               if m and not m.group(2).startswith("decoder.layers.")})
            for (step, rank), (data, _, _) in sorted(dumps[root].items()) if step == 0}
    return {
        "node_names": "Module.<chunk>.<path inside the chunk>.<Class>.<forward|backward>.<micro-batch>, chunk = the "
                      "virtual pipeline stage (0 without VPP: the worker passes the list of chunks to "
                      "debugger.start, as Megatron's training loop holds them); parameter grads "
                      "Module.<chunk>.<path>.<Class>.parameters_grad.<micro-batch>",
        "vpp_rank1_module_examples": [n for n in d if n.startswith("Module.") and "TransformerLayer" in n][:4],
        "local_layer_numbers": "layers are numbered from 0 in every chunk; global layer = Megatron's "
                               "layer_number - 1 (see layer_map)",
        "micro_batches": "each micro-batch is its own call: .forward.0/.forward.1 (also for VPP chunks); "
                         "construct.json values are [parent, micro_step] and it has megatron_micro_step_number",
        "megatron_micro_step_number": {root: {str(r): cons.get("megatron_micro_step_number")
                                              for (s, r), (_, cons, _) in sorted(dumps[root].items()) if s == 0}
                                       for root in ("tp1pp1", "tp1pp2", "tp1pp2vpp2")},
        "apis_parented_to_a_backward_module": p2p[:8],
        "apis_parented_to_a_backward_module_note": "in 1F1B msprobe's current module is still a backward module of "
                                                   "an earlier micro-batch when the next P2P exchange (and, on the "
                                                   "last stage, the next forward's cross-entropy all_reduces) runs",
        "fused_linear_qkv": {"shape_tp2_rank0": D.node_leaves(tp2[qkv])["parameters.weight"]["shape"],
                             "layout": "rows per query group g: [q heads of g (heads/groups x head_dim); k (head_dim); "
                                       "v (head_dim)], groups in order; TP rank r holds groups "
                                       "[r*groups/tp, (r+1)*groups/tp)"},
        "fused_linear_fc1": "rows [gate (ffn); up (ffn)]; TP rank r holds [gate_r; up_r] (Megatron's swiglu sharding)",
        "row_parallel_bias": {"node": proj, "output.1": {k: pleaves["output.1"].get(k) for k in ("shape", "Norm")},
                              "parameters.bias": {k: pleaves["parameters.bias"].get(k) for k in ("shape", "Norm")},
                              "note": "linear_proj/linear_fc2 skip the bias add (skip_bias_add): output.0 is the "
                                      "all-reduced matmul, output.1 the replicated bias, added after the reduce in "
                                      "the bias-dropout-add (Tensor.__add__ under the TransformerLayer)"},
        "p2p": {"example_node": send,
                "example_record": dumps["tp1pp2"][(0, 0)][0][send],
                "note": "Distributed.batch_isend_irecv: input_args.0 / output.0 are lists of P2POp records "
                        "(class_type torch.distributed.P2POp, tensor, op isend|irecv, peer, tag, group_id); "
                        "irecv tensors are recorded before the wait"},
        "stage_only_modules": stage_modules,
    }


def _hf_pairs(sample: Path, mg: dict, hf: dict) -> dict[str, Any]:
    """Megatron tp1pp1 modules vs the Llama modules, step 0: fused tensors against the merged HF pieces."""
    mdata = mg[(0, 0)][0]
    hdata = hf[(0, 0)][0]
    layer_numbers = {"0": [1, 2, 3, 4]}
    mkeys = T.module_records(mdata, layer_numbers)
    pairs: list[dict[str, Any]] = []
    rels: Counter[str] = Counter()
    worst = 0.0

    def hf_node(path: str, cls: str, direction: str, index: int) -> str:
        return f"Module.{path}.{cls}.{direction}.{index}"

    table = {"embedding.word_embeddings": [("model.embed_tokens", "Embedding")],
             "decoder.final_layernorm": [("model.norm", "LlamaRMSNorm")],
             "output_layer": [("lm_head", "Linear")]}
    for i in range(MODEL["layers"]):
        mgl, hfl = f"decoder.layers.{i}.", f"model.layers.{i}."
        table.update({
            mgl + "input_layernorm": [(hfl + "input_layernorm", "LlamaRMSNorm")],
            mgl + "pre_mlp_layernorm": [(hfl + "post_attention_layernorm", "LlamaRMSNorm")],
            mgl + "self_attention.linear_qkv": [(hfl + f"self_attn.{p}_proj", "Linear") for p in "qkv"],
            mgl + "self_attention.linear_proj": [(hfl + "self_attn.o_proj", "Linear")],
            mgl + "self_attention": [(hfl + "self_attn", "LlamaAttention")],
            mgl + "mlp.linear_fc1": [(hfl + "mlp.gate_proj", "Linear"), (hfl + "mlp.up_proj", "Linear")],
            mgl + "mlp.linear_fc2": [(hfl + "mlp.down_proj", "Linear")],
            mgl + "mlp": [(hfl + "mlp", "LlamaMLP")],
            mgl.rstrip("."): [(hfl.rstrip("."), "LlamaDecoderLayer")]})
    for (path, _cls, direction, index), mnode in sorted(mkeys.items()):
        if direction != "forward" or path not in table:
            continue
        hnodes = [hf_node(p, c, direction, index) for p, c in table[path]]
        _check(all(h in hdata for h in hnodes), f"hf: {hnodes} missing")
        mleaf = D.node_leaves(mdata[mnode])["output.0"]
        pieces = [D.node_leaves(hdata[h])["output.0"] for h in hnodes]
        if mleaf["shape"] != pieces[0]["shape"] and len(mleaf["shape"]) == 3 and len(pieces) == 1:
            r, err = T.relation(mleaf, [dict(pieces[0], shape=mleaf["shape"])])  # [s, b, h] vs [b, s, h]
            r += " ([s, b, h] vs [b, s, h])"
        elif len(pieces) > 1:  # Megatron's fused output [s, b, n*h] vs HF [b, s, h] pieces: same stats layout-free
            flat = [dict(p, shape=[int(p["shape"][1]), int(p["shape"][0]), int(p["shape"][2])]) for p in pieces]
            r, err = T.relation(mleaf, flat)
            r += " (fused vs separate projections)"
        else:
            r, err = T.relation(mleaf, pieces)
        rels[r] += 1
        worst = max(worst, err if math.isfinite(err) else worst)
        _check(r not in ("differs",) and "not merge" not in r, f"hf: {mnode} vs {hnodes}: {r} {err}")
        if index == 0:
            pairs.append({"megatron": mnode, "hf": hnodes, "relation": r, "scale_aware_error": err})
    return {"module_pairs_step0_micro_batch0": pairs, "relations_forward_outputs": dict(rels),
            "max_scale_aware_error": worst}


# ----------------------------------------------------------------------------------------------- main
def gen_megatron(ctx: Any, sample: Path) -> dict[str, Any]:
    """Run every layout and bug, then derive the ground truth from the dumps."""
    from ._scenarios import _header, _layout

    init, results = _run_all(ctx, sample)
    dumps = {name: _load(sample / name) for name in ROOTS}
    infos: dict[str, dict[int, dict[str, Any]]] = {}
    for name, plan in ROOTS.items():
        got = sorted({s for s, _ in dumps[name]})
        _check(got == plan["dump_steps"], f"{name}: steps {got}")
        n = 1 if plan.get("hf") else world(plan["layout"])
        _check(sorted({r for _, r in dumps[name]}) == list(range(n)), f"{name}: ranks")
        if not plan.get("hf"):
            infos[name] = _ranks_info(results[name])
            _INFOS[id(dumps[name])] = infos[name]
            _check_layer_map(name, dumps[name], infos[name])
    base = dumps["tp1pp1"]
    healthy = {}
    for name, plan in ROOTS.items():
        if plan.get("bugs") or plan.get("hf") or name == "tp1pp1" or name.endswith("_dropout"):
            continue
        cmp = _compare(base, dumps[name], infos["tp1pp1"], infos[name], plan["layout"])
        _check(cmp["unexplained_count"] == 0, f"{name} vs tp1pp1: {cmp['unexplained'][:3]}")
        cmp["glue"] = _glue(base, dumps[name], infos["tp1pp1"], infos[name])
        healthy[name] = cmp
    dropout_cmp = _compare(dumps["tp1pp1_dropout"], dumps["tp2pp1_dropout_unsync"], infos["tp1pp1_dropout"],
                           infos["tp2pp1_dropout_unsync"], ROOTS["tp2pp1_dropout_unsync"]["layout"])
    faults = [
        _fault_scaled("tp2pp2_scaled", sample, dumps["tp2pp2_scaled"], dumps["tp2pp2"], infos["tp2pp2_scaled"]),
        _fault_wrong_shard("tp2pp1_wrong_shard", sample, dumps["tp2pp1_wrong_shard"], dumps["tp2pp1"],
                           infos["tp2pp1_wrong_shard"]),
        _fault_dropout("tp2pp1_dropout_unsync", sample, dumps["tp2pp1_dropout_unsync"], dumps["tp1pp1_dropout"],
                       infos["tp2pp1_dropout_unsync"]),
        _fault_nan("tp1pp2_nan", sample, dumps["tp1pp2_nan"], dumps["tp1pp2"], infos["tp1pp2_nan"]),
    ]
    for f in faults:
        f["root"] = next(n for n in ROOTS if f["dump_json"].startswith(n + "/"))
    losses = {}
    for name, res in results.items():
        if ROOTS[name].get("hf"):
            losses[name] = res["losses"]
            continue
        by_rank = [v["losses"] for v in res["ranks"].values() if v["losses"]]
        losses[name] = [sum(r[s] for r in by_rank) / len(by_rank) for s in range(TRAIN_STEPS)]
    for name in ("tp2pp1", "tp1pp2", "tp2pp2", "tp1pp2vpp2", "tp1pp1dp2", "tp2sp", "hf_llama"):
        for s in range(TRAIN_STEPS):
            err = abs(losses[name][s] - losses["tp1pp1"][s]) / abs(losses["tp1pp1"][s])
            _check(err < 1e-5, f"{name} loss at step {s}: {losses[name][s]} vs {losses['tp1pp1'][s]}")
    scalars = {name: _scalar_differences(dumps[name], infos[name]) for name in ("tp2pp1", "tp2pp2", "tp2sp")}
    _check("Tensor.__lt__" in scalars["tp2pp1"], f"tp2pp1 scalar differences {sorted(scalars['tp2pp1'])}")
    undefined = {name: _undefined(dumps[name]) for name in ROOTS}
    versions = megatron_versions()
    gt = _header(
        ctx, "megatron", WHAT,
        SimpleNamespace(describe=_describe),
        megatron_interpreter={"env": "PRECNB_MEGATRON_PYTHON", **versions},
        task="statistics", level="mix", world_size={n: (1 if p.get("hf") else world(p["layout"]))
                                                    for n, p in ROOTS.items()},
        steps=STEPS, dump_steps={n: p["dump_steps"] for n, p in ROOTS.items()}, train_steps=TRAIN_STEPS,
        dump_roots={n: n for n in ROOTS},
        dump_files={n: _layout(sample / n, sample) for n in ROOTS},
        layouts={n: {**p["layout"], "world_size": 1 if p.get("hf") else world(p["layout"]),
                     "order": "tp-cp-ep-dp-pp", "hidden_dropout": p.get("dropout", 0.0),
                     "bugs": p.get("bugs", []), "healthy_counterpart": p.get("healthy")}
                 for n, p in ROOTS.items()},
        rank_coords={n: {str(r): i["coords"] for r, i in v.items()} for n, v in infos.items()},
        layer_map={n: {str(r): _layer_map(i) for r, i in v.items()} for n, v in infos.items()},
        parameters={"count": len(init["parameters"]), "shapes": init["parameters"],
                    "local_to_global": {n: {str(r): {k: g for k, g in i["names"].items() if k.split(":", 1)[1] != g}
                                            for r, i in v.items()} for n, v in infos.items()}},
        cpu_patches=CPU_PATCHES,
        faults=faults,
        healthy_vs_tp1pp1=healthy,
        dropout_unsync_vs_tp1pp1_dropout=dropout_cmp,
        scalar_arguments_differing_between_tp_ranks=scalars,
        undefined_by_construction=undefined,
        megatron_specifics=_facts(sample, dumps, infos),
        hf=dict(_hf_pairs(sample, base, dumps["hf_llama"]), name_map=results["hf_llama"]["name_map"],
                config=results["hf_llama"]["hf_config"]),
        losses=losses,
        losses_note="mean over the micro-batches (and data-parallel ranks) of each step, from the last pipeline "
                    "stage; every healthy layout and the Llama run agree with tp1pp1 to 1e-5 relative",
    )
    merge_moe(gt, sample, M.truth(sample, M.run(ctx, sample)))
    (sample / "README.md").write_text(readme(gt), encoding="utf-8")
    return gt


def merge_moe(gt: dict[str, Any], sample: Path, moe: dict[str, Any]) -> None:
    """Put the MoE roots' ground truth into the sample's: per-root tables, faults and the ``moe`` section."""
    from ._scenarios import _layout

    gt.pop("moe_expert_parallel", None)  # the probe of the alltoall dispatcher, superseded by the MoE roots
    gt["what"] = WHAT + MOE_WHAT
    for name in moe["roots"]:
        lay = moe["layouts"][name]
        gt["world_size"][name] = lay["world_size"]
        gt["dump_steps"][name] = moe["dump_steps"]
        gt["dump_roots"][name] = name
        gt["dump_files"][name] = _layout(sample / name, sample)
        gt["layouts"][name] = lay
        gt["rank_coords"][name] = moe["rank_coords"][name]
        gt["layer_map"][name] = moe["layer_map"][name]
        gt["parameters"]["local_to_global"][name] = moe["local_to_global"][name]
        gt["losses"][name] = moe["losses"][name]
    gt["steps"] = sorted(set(gt["steps"]) | set(moe["dump_steps"]))
    gt["faults"] = [f for f in gt["faults"] if f["root"] not in moe["roots"]] + moe["faults"]
    gt["moe"] = {k: v for k, v in moe.items() if k not in ("layer_map", "local_to_global")}
    gt["moe"]["generated_by"] = f"{gt['generated_by']['command']} --megatron-moe-only (or with the whole sample)"


def update_moe(ctx: Any, sample: Path) -> dict[str, Any]:
    """Regenerate only the MoE roots; every other root's files stay byte for byte, its ground truth is kept."""
    gt = D.load_json(sample / "ground_truth.json")
    for name in M.ROOTS:
        if name in gt.get("dump_roots", {}):
            for table in ("world_size", "dump_steps", "dump_roots", "dump_files", "layouts", "rank_coords",
                          "layer_map", "losses"):
                gt[table].pop(name, None)
            gt["parameters"]["local_to_global"].pop(name, None)
    merge_moe(gt, sample, M.truth(sample, M.run(ctx, sample)))
    (sample / "README.md").write_text(readme(gt), encoding="utf-8")
    return gt


def _describe() -> str:
    m = MODEL
    return (f"Megatron-Core GPTModel, local layer spec (get_gpt_layer_local_spec(normalization='RMSNorm')): "
            f"{m['layers']} layers, hidden {m['hidden']}, {m['heads']} heads ({m['heads']} query groups), ffn "
            f"{m['ffn']} with SwiGLU (gated_linear_unit, silu), vocab {m['vocab']}, seq {m['seq']}, RoPE (base "
            f"{m['rope_base']}), RMSNorm eps {m['eps']}, biases on every linear layer (add_bias_linear; Megatron "
            f"initialises them to 0), untied output layer, fp32, attention dropout 0, fusions off; "
            f"{m['micro_batches']} micro-batches of {m['micro_batch']} sequences per step (split along the batch "
            f"across data-parallel ranks); torch.optim.AdamW(lr={m['lr']}, weight_decay={m['weight_decay']}, "
            f"fused=True) over each rank's parameters, gradients averaged over DP by hand; seed {m['seed']}")


def digest(gt: dict[str, Any]) -> list[str]:
    """README lines for this sample."""
    out = ["- layouts: " + ", ".join(f"`{n}` (world {w})" for n, w in gt["world_size"].items())]
    for name, c in gt["healthy_vs_tp1pp1"].items():
        rel = ", ".join(f"{k} {v}" for k, v in sorted(c["relations"].items()))
        out.append(f"- healthy `{name}` vs `tp1pp1`, steps {c['steps']}: every module leaf merges ({rel}); "
                   f"max error {max(c['max_scale_aware_error'].values(), default=0):.1e}")
    for f in gt["faults"]:
        layer = f" (layer {f['global_layer']})" if f.get("global_layer") is not None else ""
        out.append(f"- **{f['kind']} ({f['role']})** in `{f['root']}`: step {f['step']}, rank {f['rank']}, "
                   f"`{f['node']}` in `{f['module_node']}` = global `{f['global_module']}`{layer}")
    u = gt["undefined_by_construction"]
    out.append("- undefined by construction (baddbmm input with beta=0, irecv buffers): "
               + ", ".join(f"{n} {v['non_finite']}/{v['leaves']} non-finite" for n, v in u.items() if v["leaves"]))
    moe = gt.get("moe")
    if moe:
        out.append("- MoE (issue 48), alltoall dispatcher, steps " + str(moe["dump_steps"]) + ": losses "
                   + ", ".join(f"`{n}` {[round(x, 6) for x in moe['losses'][n]]}" for n in moe["roots"])
                   + "; starved experts " + ", ".join(f"`{n}` {v}" for n, v in moe["starved_experts"].items() if v))
    return out


def readme(gt: dict[str, Any]) -> str:
    """``megatron/README.md``: the layouts, the bugs and what msprobe writes that is Megatron-specific."""
    m = gt["megatron_specifics"]
    lines = ["# megatron: real Megatron-Core runs under msprobe", "",
             f"Generated by `{gt['generated_by']['command']}` (Megatron interpreter: `$PRECNB_MEGATRON_PYTHON`, "
             + ", ".join(f"{k} {v}" for k, v in gt["megatron_interpreter"].items() if k != "env") + ").", "",
             gt["what"] + ".", "", f"Model: {gt['model']}", "", "## Dump roots", "",
             "| root | layout | world | steps dumped | bug | healthy counterpart |", "|---|---|---|---|---|---|"]
    for name, lay in gt["layouts"].items():
        desc = "Hugging Face LlamaForCausalLM" if name == "hf_llama" else (
            f"tp{lay['tp']} pp{lay['pp']} vpp{lay['vpp']} dp{lay['dp']}" + (" sp" if lay["sp"] else "")
            + (f" ep{lay['ep']} etp{lay['etp']} (MoE)" if "etp" in lay else "")
            + (f", hidden dropout {lay['hidden_dropout']}" if lay["hidden_dropout"] else ""))
        bug = "; ".join(f"{b['kind']} rank {b.get('rank')}" + (f" layer {b['layer']}" if "layer" in b else "")
                        for b in lay["bugs"]) or "-"
        lines.append(f"| `{name}` | {desc} | {lay['world_size']} | {gt['dump_steps'][name]} | {bug} | "
                     f"{lay['healthy_counterpart'] or '-'} |")
    lines += ["", f"Every dense run trains {gt['train_steps']} steps, every MoE run "
              f"{gt.get('moe', {}).get('train_steps', '-')} (losses in `losses`); msprobe's `step` list decides "
              "which are dumped. Megatron's rank order is tp-cp-ep-dp-pp (consecutive ranks form a TP group, "
              "the pipeline stage varies slowest); `rank_coords` and `layer_map` give each rank's coordinates "
              "and its local-to-global layer names.", "", "## Faults (ground truth read back from the dumps)", ""]
    for f in gt["faults"]:
        lines.append(f"- **{f['kind']}** in `{f['root']}`: step {f['step']}, rank {f['rank']} (coords {f['coords']}), "
                     f"node `{f['node']}` in `{f['module_node']}` = whole-model `{f['global_module']}`"
                     + (f" (global layer {f['global_layer']})" if f.get("global_layer") is not None else "")
                     + f". {f['how']}.")
    lines += ["", "## What msprobe writes that is Megatron-specific", "",
              f"- Node names: {m['node_names']}. E.g. on `tp1pp2vpp2` rank 1: "
              + ", ".join(f"`{n}`" for n in m["vpp_rank1_module_examples"][:3]) + ".",
              f"- Layer numbers: {m['local_layer_numbers']}.",
              f"- Micro-batches: {m['micro_batches']}; `megatron_micro_step_number` per root and rank: "
              f"{m['megatron_micro_step_number']}.",
              f"- {m['apis_parented_to_a_backward_module_note']}; e.g. "
              + ", ".join(f"`{x['node']}` → `{x['construct'][0]}` (micro step {x['construct'][1]}, "
                          f"{x['root']} rank {x['rank']})" for x in m["apis_parented_to_a_backward_module"][:3]) + ".",
              f"- Fused `linear_qkv` (weight {m['fused_linear_qkv']['shape_tp2_rank0']} on a tp2 rank): "
              f"{m['fused_linear_qkv']['layout']}. Fused `linear_fc1`: {m['fused_linear_fc1']}.",
              f"- RowParallelLinear: {m['row_parallel_bias']['note']}.",
              f"- P2P: {m['p2p']['note']} (example `{m['p2p']['example_node']}`).",
              "- Stage-only modules: the embedding exists on the first stage (chunk 0) only, the final norm and "
              "output layer (with the vocab-parallel cross entropy) on the last; see `stage_only_modules`.",
              "- TP glue: ops that exist only with TP > 1 (VocabParallelEmbedding's vocabulary-range masking "
              "`Tensor.__lt__/__ge__/__or__/__sub__/__setitem__` and its all_reduce; the all-reduces of "
              "RowParallelLinear forward and ColumnParallelLinear backward; sequence parallelism's "
              "all_gather_into_tensor / reduce_scatter_tensor): `healthy_vs_tp1pp1.<root>.glue`. Ops whose scalar "
              "arguments differ between TP ranks (the vocabulary offset): "
              "`scalar_arguments_differing_between_tp_ranks`.",
              "- Undefined by construction: `Torch.baddbmm`'s input (Megatron's `torch.empty` attention buffer, "
              "`beta=0`) and irecv tensors of `Distributed.batch_isend_irecv` (recorded before the wait) hold "
              "arbitrary statistics, NaN or not, and differ between identical runs: `undefined_by_construction`.",
              "", "## Healthy layouts merge to tp1pp1", ""]
    for name, c in gt["healthy_vs_tp1pp1"].items():
        lines.append(f"- `{name}` (steps {c['steps']}): " + ", ".join(
            f"{k} {v}" for k, v in sorted(c["relations"].items())) + " module leaves")
    lines += [*moe_readme(gt.get("moe")), "## Hugging Face", "",
              f"`hf_llama`: the tp1pp1 weights in LlamaForCausalLM ({len(gt['hf']['module_pairs_step0_micro_batch0'])} "
              "module pairs at step 0, micro-batch 0, in `hf.module_pairs_step0_micro_batch0`; fused linear_qkv / "
              "linear_fc1 outputs equal the merged q/k/v and gate/up outputs); `hf.name_map` maps each Megatron "
              "parameter to the rows each HF parameter takes. Losses agree with tp1pp1 to 1e-5 at every step.", ""]
    return "\n".join(lines)


def moe_readme(moe: dict[str, Any] | None) -> list[str]:
    """README lines of the MoE roots (issue 48)."""
    if not moe:
        return [""]
    lines = ["", "## MoE roots (issue 48): the all-to-all token dispatcher, expert parallelism folded onto TP", "",
             f"Model: {moe['model']}.", "",
             "Layouts (Megatron's order tp-cp-ep-dp-pp; every rank's dense coordinates in `rank_coords`, its expert "
             "coordinates ep/etp/edp in `moe.expert_coords`):", ""]
    for name in moe["roots"]:
        lay = moe["layouts"][name]
        coords = ", ".join(f"rank {r}: tp {c['tp']} dp {c['dp']} / ep {moe['expert_coords'][name][r]['ep']} etp "
                           f"{moe['expert_coords'][name][r]['etp']}" for r, c in moe["rank_coords"][name].items())
        lines.append(f"- `{name}`: world {lay['world_size']}, tp{lay['tp']} dp{lay['dp']} ep{lay['ep']} etp{lay['etp']}"
                     + (" sequence parallel" if lay["sp"] else "") + f", {lay['experts_per_rank']} experts per rank "
                     f"({coords}); losses {moe['losses'][name]}")
    same = {n: v["losses"] for n, v in moe["losses_bit_identical_to_moe_ep1"].items()}
    lines += ["", f"Healthy losses agree with `moe_ep1` to 1e-5 relative; bit-identical: {same}. Every expert's "
              "input and output at step 0 equals moe_ep1's same global expert (`moe.experts_vs_moe_ep1_step0`).", "",
              "Faults (read back from the dumps):", ""]
    for f in moe["faults"]:
        lines.append(f"- **{f['kind']}** in `{f['root']}`: step {f['step']}, rank {f['rank']}, global expert "
                     f"{f['global_expert']} (local {f['local_expert']}) of global layer {f['layer']}, "
                     f"node `{f['node']}`. {f['how']}." + (f" How: {f['starved']['forced_by']}." if "starved" in f
                                                            else ""))
    per = moe["tokens_per_expert"]
    lines += ["", "Tokens per global expert (per step, per layer; `moe.tokens_per_expert` also per rank): "
              + "; ".join(f"`{n}` " + ", ".join(f"step {s} {t['per_global_expert']}" for s, t in per[n].items())
                          for n in moe["roots"]) + ".", "",
              f"Starved experts (no token): {dict((n, v) for n, v in moe['starved_experts'].items() if v)}.", "",
              "What msprobe writes for MoE:", "",
              f"- Expert modules: {moe['expert_index_rule']}; `moe.expert_map` maps each rank's local names to "
              "global ones. E.g. " + ", ".join(f"`{n}`" for n in moe["node_names"]["expert_modules_rank0_step0"][:2])
              + ".",
              f"- The dispatcher: {moe['node_names']['token_dispatcher']}: "
              f"{moe['node_names']['api_children_of_moe_layer']}. Its all-to-all exchanges are "
              "`Distributed.all_to_all_single` nodes: input_args.0 (the output buffer) is null, the split sizes are "
              "input kwargs of type numpy.ndarray with statistics; counts and parent modules per rank at step 0 "
              "in `moe.collectives_step0`.",
              f"- {moe['sequence_parallel_note']} (`moe.sequence_parallel_gradients_partial_sums`).",
              "- An expert that receives no token still runs: its MLP, linear_fc1/linear_fc2 and their ops are "
              "recorded with empty tensors ([0, h]) whose statistics are null "
              "(`faults[...].empty_records_of_the_starved_expert`).",
              "- Node names between the two ranks of a root, and between a fault run and its healthy twin: "
              "`moe.node_names_between_ranks` and `faults[...].node_names_vs_healthy` (nodes only on one side; "
              "empty lists: no call-counter shift).",
              f"- CPU patches: {'; '.join(moe['cpu_patches'])}.", ""]
    return lines


GENERATORS = {"megatron": gen_megatron}
