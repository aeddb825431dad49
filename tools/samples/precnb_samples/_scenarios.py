"""The six sample scenarios: run training under msprobe, then derive ground truth from the dumps.

Every fault location written to ``ground_truth.json`` is *found in the produced dump* (and checked
against what was injected); nothing is hard-coded from expectations.
"""

from __future__ import annotations

import csv
import json
import math
import platform
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from . import _dumps as D  # noqa: N812
from ._model import ModelConfig
from ._train import ActDtypeFault, GradSpike, NanFault, RunSpec, launch

# Statistics dump configuration (written to each sample's configs/ with its real dump_path).
_STATISTICS_CONFIG: dict[str, Any] = {
    "task": "statistics",
    "dump_path": None,
    "rank": [],
    "step": [],
    "level": "mix",
    "async_dump": False,
    "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
}

# TrainerMon v1 configuration: the one of the shared S6_monitor sample, for this model.
MONITOR_CONFIG: dict[str, Any] = {
    "targets": {
        "embed": {},
        "blocks.0": {},
        "blocks.0.attn": {},
        "blocks.0.mlp": {},
        "blocks.1": {},
        "blocks.1.attn": {},
        "blocks.1.mlp": {},
        "norm_out": {},
        "lm_head": {},
    },
    "xy_distribution": True,
    "wg_distribution": True,
    "mv_distribution": True,
    "param_distribution": True,
    "ops": ["min", "max", "norm", "zeros", "nans", "mean"],
    "eps": 1e-08,
    "format": "csv",
    "ndigits": 8,
    "alert": {
        "rules": [
            {"rule_name": "AnomalyTurbulence", "args": {"threshold": 0.5}},
            {"rule_name": "AnomalyNan", "args": {}},
        ],
        "dump": True,
    },
    "start_step": 0,
    "step_interval": 1,
    "collect_times": 100,
    "step_count_per_record": 1,
}

TWO_BLOCKS = ModelConfig(blocks=2)
ONE_BLOCK = ModelConfig(blocks=1)


class GroundTruthError(RuntimeError):
    """Raised when the produced dump does not show the injected fault where expected."""


@dataclass
class Context:
    """Shared state of one generator invocation."""

    out: Path
    log_dir: Path
    command: str
    log: Callable[[str], None] = print


def versions() -> dict[str, str]:
    """Versions of the tools that produced the samples."""
    try:
        msprobe_version = metadata.version("mindstudio-probe")
    except metadata.PackageNotFoundError:  # pragma: no cover - msprobe is imported before
        msprobe_version = "unknown"
    return {
        "torch": torch.__version__,
        "mindstudio-probe (msprobe)": msprobe_version,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}, CPU only, gloo backend",
    }


def write_json(path: Path, obj: Any) -> None:
    """Write JSON with indent=1 (like msprobe) and a trailing newline."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1)
        fh.write("\n")


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise GroundTruthError(message)


def _dump_config(sample_dir: Path, dump_root: Path, name: str) -> Path:
    cfg = dict(_STATISTICS_CONFIG, dump_path=str(dump_root))
    path = sample_dir / "configs" / name
    write_json(path, cfg)
    return path


def _header(ctx: Context, scenario: str, what: str, model: ModelConfig, **extra: Any) -> dict:
    gt: dict[str, Any] = {
        "scenario": scenario,
        "what": what,
        "generated_by": {
            "command": f"{ctx.command} --only {scenario}",
            **versions(),
        },
        "model": model.describe(),
    }
    gt.update(extra)
    return gt


def _layout(root: Path, rel_to: Path) -> dict[str, dict[str, str]]:
    """``{"step0": {"0": "step0/rank0/dump.json", ...}}`` with paths relative to ``rel_to``."""
    out: dict[str, dict[str, str]] = {}
    for step, sdir in D.step_dirs(root):
        ranks = {}
        for i, rdir in enumerate(D.rank_dirs(sdir)):
            key = rdir.name[4:] if rdir.name.startswith("rank") and rdir.name[4:] else str(i)
            ranks[key] = str((rdir / "dump.json").relative_to(rel_to))
        out[f"step{step}"] = ranks
    return out


def _load_all(root: Path) -> dict[tuple[int, int], dict]:
    """``{(step, rank): data}`` for a dump root (``proc<PID>`` counts as rank 0)."""
    out = {}
    for step, sdir in D.step_dirs(root):
        for i, rdir in enumerate(D.rank_dirs(sdir)):
            rank = int(rdir.name[4:]) if rdir.name.startswith("rank") and rdir.name[4:] else i
            out[(step, rank)] = D.dump_data(rdir / "dump.json")
    return out


def _rank_dir(root: Path, step: int, rank: int) -> Path:
    named = root / f"step{step}" / f"rank{rank}"
    if named.is_dir():
        return named
    dirs = D.rank_dirs(root / f"step{step}")
    _check(len(dirs) == 1 and rank == 0, f"no rank {rank} folder in {root}/step{step}")
    return dirs[0]


def _expect_layout(root: Path, steps: int, world: int, prefix: str) -> None:
    found = D.step_dirs(root)
    _check([s for s, _ in found] == list(range(steps)), f"{root}: steps {found}")
    for _, sdir in found:
        names = [p.name for p in D.rank_dirs(sdir)]
        _check(len(names) == world and all(n.startswith(prefix) for n in names), f"{sdir}: {names}")
        for rdir in D.rank_dirs(sdir):
            for f in ("dump.json", "construct.json", "stack.json"):
                _check((rdir / f).is_file(), f"missing {rdir / f}")


def _nonfinite_nodes(data: dict) -> dict[str, list[str]]:
    out = {}
    for name, rec in data.items():
        bad = [
            p
            for p, leaf in D.node_leaves(rec).items()
            if any(
                isinstance(leaf.get(k), float) and not math.isfinite(leaf[k]) for k in D.STAT_KEYS
            )
        ]
        if bad:
            out[name] = bad
    return out


# --------------------------------------------------------------------------------------- healthy
def gen_healthy(ctx: Context, sample: Path) -> dict:
    """1 process, torch.distributed not initialised (``proc<PID>`` folders), 3 steps, no fault."""
    model = TWO_BLOCKS
    cfg = _dump_config(sample, sample, "config.json")
    spec = RunSpec(
        "dump", str(cfg), 1, 3, str(ctx.log_dir), init_dist=False, model=model, tag="healthy"
    )
    losses = launch(spec)
    _expect_layout(sample, 3, 1, "proc")
    data = _load_all(sample)
    proc = D.rank_dirs(sample / "step0")[0].name
    return _header(
        ctx,
        "healthy",
        "healthy 1-process run without torch.distributed; reference dump, no fault injected",
        model,
        task="statistics",
        level="mix",
        world_size=1,
        distributed_initialised=False,
        steps=[0, 1, 2],
        rank_dir_names=[proc],
        rank_dir_note="msprobe names the folder proc<PID> when torch.distributed is not "
        "initialised; the PID changes on every regeneration",
        dump_files=_layout(sample, sample),
        faults=[],
        checks={
            "first_nan_node_by_step": {
                f"step{s}": D.first_nan_node(d) for (s, _), d in data.items()
            },
            "nodes_by_step": {f"step{s}": len(d) for (s, _), d in data.items()},
            "nonfinite_stats_step0": _nonfinite_nodes(data[(0, 0)]),
            "nonfinite_note": "the causal mask Tensor.masked_fill(-inf) output legitimately holds "
            "-Infinity (Min/Mean) and Infinity (Norm), and so does the softmax input",
        },
        losses={"0": losses[0]},
    )


# ---------------------------------------------------------------------------------------- dp_nan
def _is_comm(node: str) -> bool:
    return node.startswith("Distributed.")


def gen_dp_nan(ctx: Context, sample: Path) -> dict:
    """2-rank DP; NaN in block 1 attention scores on rank 1 at step 1, spread by all_reduce."""
    model = TWO_BLOCKS
    fault = NanFault(step=1, rank=1, block=1, position=(0, 0, 5, 3))
    cfg = _dump_config(sample, sample, "config.json")
    spec = RunSpec("dump", str(cfg), 2, 3, str(ctx.log_dir), model=model, nan=fault, tag="dp_nan")
    losses = launch(spec)
    _expect_layout(sample, 3, 2, "rank")
    data = _load_all(sample)

    per = {}
    for (s, r), d in sorted(data.items()):
        first_comm = next((n for n in d if _is_comm(n) and D.nan_leaf_paths(d[n])), None)
        per[f"step{s}/rank{r}"] = {
            "first_nan_node": D.first_nan_node(d),
            "first_node_with_nan_output_and_nan_free_inputs": D.first_nan_origin(d),
            "first_nan_communication_node": first_comm,
        }
    # earliest step with any NaN, then the non-communication origin in that step
    nan_steps = sorted({s for (s, _), d in data.items() if D.first_nan_node(d)})
    _check(bool(nan_steps) and nan_steps[0] == fault.step, f"first NaN step {nan_steps}")
    origins = []
    for r in (0, 1):
        d = data[(fault.step, r)]
        o = D.first_nan_origin(d)
        if o and not _is_comm(o):
            origins.append((r, o))
    _check(len(origins) == 1 and origins[0][0] == fault.rank, f"origins {origins}")
    origin = origins[0][1]
    d1 = data[(fault.step, fault.rank)]
    construct = D.load_json(_rank_dir(sample, fault.step, fault.rank) / "construct.json")
    parent = D.parent_of(construct, origin)
    _check(
        origin.startswith("Torch.sqrt.")
        and parent is not None
        and ".attn." in parent
        and f"blocks.{fault.block}." in parent,
        f"origin {origin} parent {parent}",
    )
    _check(D.first_nan_node(d1) == origin, "origin is not the first NaN node on the faulty rank")
    names = list(d1)
    consumer = next(n for n in names[names.index(origin) + 1 :] if D.nan_leaf_paths(d1[n]))

    # spreading: first comm node on the faulty rank whose input holds NaN; on the healthy rank the
    # first NaN node must be a comm node with NaN-free inputs
    send = next(n for n in d1 if _is_comm(n) and D.nan_sides(d1[n])[0])
    d0 = data[(fault.step, 1 - fault.rank)]
    recv = D.first_nan_node(d0)
    _check(
        recv is not None and _is_comm(recv) and D.nan_sides(d0[recv]) == (False, True),
        f"healthy rank first NaN {recv}",
    )
    _check(recv == send, f"send {send} != recv {recv}")
    rel = lambda s, r: str((_rank_dir(sample, s, r) / "dump.json").relative_to(sample))  # noqa: E731
    return _header(
        ctx,
        "dp_nan",
        "2-rank data parallel (grad all_reduce + div_ by world size); NaN injected in block 1's "
        "attention scores on rank 1 at step 1 and spread to rank 0 by the gradient all_reduce",
        model,
        task="statistics",
        level="mix",
        world_size=2,
        distributed_initialised=True,
        steps=[0, 1, 2],
        dump_files=_layout(sample, sample),
        faults=[
            {
                "kind": "nan",
                "role": "origin",
                "step": fault.step,
                "rank": fault.rank,
                "node": origin,
                "dump_json": rel(fault.step, fault.rank),
                "nan_leaves": D.nan_leaf_paths(d1[origin]),
                "module": parent,
                "how": "block 1 attention: scores = scores + torch.sqrt(poison), poison = zeros "
                f"except -1.0 at (batch, head, query, key) = {list(fault.position)} at this "
                "step/rank (all zeros otherwise, so the same nodes exist on every rank and step). "
                "Torch.sqrt's input is finite and its output holds the NaN",
                "next_nan_node": consumer,
            },
            {
                "kind": "nan",
                "role": "spread",
                "step": fault.step,
                "rank": 1 - fault.rank,
                "node": recv,
                "dump_json": rel(fault.step, 1 - fault.rank),
                "from_rank": fault.rank,
                "how": "first gradient all_reduce (parameter order, embed.weight first): NaN-free "
                "input on rank 0, NaN output on both ranks; the same node on rank 1 has a NaN "
                "input",
                "nan_leaves": D.nan_leaf_paths(d0[recv]),
            },
        ],
        checks={
            "same_node_names_on_all_steps_and_ranks": all(
                list(d) == list(data[(0, 0)]) for d in data.values()
            ),
            "per_step_rank": per,
            "note": "step 0 is NaN-free; from step 2 on every parameter is NaN on both ranks "
            "(AdamW applied the NaN gradients at step 1)",
        },
        losses={str(r): v for r, v in losses.items()},
    )


# ------------------------------------------------------------------------------------ divergence
def _compare_roots(base: dict, target: dict) -> dict[str, dict]:
    out = {}
    for key in sorted(base):
        b, t = base[key], target[key]
        diff = [n for n in t if n in b and D.differing_leaves(b[n], t[n])]
        out[f"step{key[0]}/rank{key[1]}"] = {
            "first_differing_node": diff[0] if diff else None,
            "differing_nodes": len(diff),
            "nodes": len(t),
            "same_node_names_in_same_order": list(b) == list(t),
            "only_in_baseline": [n for n in b if n not in t],
            "only_in_target": [n for n in t if n not in b],
        }
    return out


def gen_divergence(ctx: Context, sample: Path) -> dict:
    """Baseline vs target 2-rank DP; the target's block-0 GELU is bf16 on rank 0 from step 1."""
    model = ONE_BLOCK
    fault = ActDtypeFault(rank=0, from_step=1, block=0, dtype="bfloat16")
    roots = {}
    losses = {}
    for variant in ("baseline", "target"):
        root = sample / variant
        cfg = _dump_config(sample, root, f"config_{variant}.json")
        spec = RunSpec(
            "dump",
            str(cfg),
            2,
            3,
            str(ctx.log_dir),
            model=model,
            act_cast_block=0,
            act_dtype=fault if variant == "target" else None,
            tag=f"divergence_{variant}",
        )
        losses[variant] = {str(r): v for r, v in launch(spec).items()}
        _expect_layout(root, 3, 2, "rank")
        roots[variant] = _load_all(root)
    cmp = _compare_roots(roots["baseline"], roots["target"])
    for key, c in cmp.items():
        _check(c["same_node_names_in_same_order"], f"node lists differ at {key}")
    for r in (0, 1):
        _check(cmp[f"step0/rank{r}"]["differing_nodes"] == 0, f"step 0 rank {r} differs")
    _check(cmp[f"step1/rank{1 - fault.rank}"]["first_differing_node"] is not None, "rank 1 same")
    node = cmp[f"step1/rank{fault.rank}"]["first_differing_node"]
    _check(node is not None and node.startswith("Functional.gelu."), f"first diff {node}")
    t1, b1 = roots["target"][(1, fault.rank)], roots["baseline"][(1, fault.rank)]
    names = list(t1)
    _check(
        all(not D.differing_leaves(b1[n], t1[n]) for n in names[: names.index(node)]),
        "nodes before the first differing node differ",
    )
    construct = D.load_json(_rank_dir(sample / "target", 1, fault.rank) / "construct.json")
    other = cmp[f"step1/rank{1 - fault.rank}"]["first_differing_node"]
    _check(other is not None and other.startswith("Distributed.all_reduce."), f"rank1 {other}")

    def leaf_summary(b: dict, t: dict, n: str) -> dict:
        return {
            p: {
                "baseline": {k: D.node_leaves(b[n])[p].get(k) for k in ("dtype", *D.STAT_KEYS)},
                "target": {k: D.node_leaves(t[n])[p].get(k) for k in ("dtype", *D.STAT_KEYS)},
            }
            for p in D.differing_leaves(b[n], t[n])
        }

    return _header(
        ctx,
        "divergence",
        "baseline vs target, 2-rank data parallel, same seeds and data; the target computes block "
        "0's MLP activation (GELU) in bfloat16 on rank 0 from step 1 on",
        model,
        task="statistics",
        level="mix",
        world_size=2,
        distributed_initialised=True,
        steps=[0, 1, 2],
        dump_roots={"baseline": "baseline", "target": "target"},
        dump_files={v: _layout(sample / v, sample) for v in ("baseline", "target")},
        faults=[
            {
                "kind": "divergence",
                "role": "origin",
                "step": 1,
                "rank": fault.rank,
                "node": node,
                "dump_json": str(
                    (_rank_dir(sample / "target", 1, fault.rank) / "dump.json").relative_to(sample)
                ),
                "baseline_dump_json": str(
                    (_rank_dir(sample / "baseline", 1, fault.rank) / "dump.json").relative_to(
                        sample
                    )
                ),
                "module": D.parent_of(construct, node),
                "how": "both runs call F.gelu(h.to(dtype)).to(torch.float32) in block 0's MLP; "
                "dtype is float32 (a no-op cast) in the baseline and bfloat16 in the target on "
                "rank "
                "0 for steps >= 1. Tensor.to is a low-risk API that msprobe keeps out of dump.json "
                "(it is in construct.json), so the first dumped node that differs is the GELU, "
                "whose "
                "input and output dtype/statistics differ",
                "differing_leaves": leaf_summary(b1, t1, node),
            },
            {
                "kind": "divergence",
                "role": "spread",
                "step": 1,
                "rank": 1 - fault.rank,
                "node": other,
                "dump_json": str(
                    (_rank_dir(sample / "target", 1, 1 - fault.rank) / "dump.json").relative_to(
                        sample
                    )
                ),
                "how": "rank 1 computes exactly as the baseline until the first gradient "
                "all_reduce "
                "brings in rank 0's different gradient (its output differs, its input does not)",
                "differing_leaves": leaf_summary(
                    roots["baseline"][(1, 1 - fault.rank)],
                    roots["target"][(1, 1 - fault.rank)],
                    other,
                ),
            },
        ],
        checks={
            "identical_before_first_difference": "step 0 (both ranks) and every node before the "
            "origin at step 1 on rank 0 are bit-identical (dtype, shape, Max, Min, Mean, Norm)",
            "per_step_rank": cmp,
        },
        losses=losses,
    )


# ---------------------------------------------------------------------------------------- dp_sum
def gen_dp_sum(ctx: Context, sample: Path) -> dict:
    """Baseline DP divides the all-reduced grads by world size; the target forgets to."""
    model = ONE_BLOCK
    roots = {}
    losses = {}
    for variant, divide in (("baseline", True), ("target", False)):
        root = sample / variant
        cfg = _dump_config(sample, root, f"config_{variant}.json")
        spec = RunSpec(
            "dump",
            str(cfg),
            2,
            2,
            str(ctx.log_dir),
            model=model,
            divide_grads=divide,
            tag=f"dp_sum_{variant}",
        )
        losses[variant] = {str(r): v for r, v in launch(spec).items()}
        _expect_layout(root, 2, 2, "rank")
        roots[variant] = _load_all(root)
    base, target = roots["baseline"], roots["target"]
    only_base = {}
    ratios = {}
    for (s, r), b in sorted(base.items()):
        t = target[(s, r)]
        ob = [n for n in b if n not in t]
        _check(ob and all(n.startswith("Tensor.div_.") for n in ob), f"only in baseline {ob}")
        _check(not [n for n in t if n not in b], "nodes only in target")
        only_base[f"step{s}/rank{r}"] = ob
        if s == 0:
            # target grad after all_reduce vs baseline grad after div_, per parameter
            rs = []
            for i, n in enumerate(ob):
                tb = D.node_leaves(t[f"Distributed.all_reduce.{i}.forward"])["output.0"]["Norm"]
                bb = D.node_leaves(b[n])["output.0"]["Norm"]
                rs.append(tb / bb)
            ratios[f"rank{r}"] = {"min": min(rs), "max": max(rs)}
            _check(all(abs(x - 2.0) < 1e-5 for x in rs), f"grad norm ratios {rs}")
    cmp = _compare_roots(base, target)
    n_params = len(only_base["step0/rank0"])
    return _header(
        ctx,
        "dp_sum",
        "baseline vs target, 2-rank data parallel; the target all-reduces (sums) the gradients "
        "but forgets to divide them by the world size, so the gradients the optimizer sees are 2x",
        model,
        task="statistics",
        level="mix",
        world_size=2,
        distributed_initialised=True,
        steps=[0, 1],
        dump_roots={"baseline": "baseline", "target": "target"},
        dump_files={v: _layout(sample / v, sample) for v in ("baseline", "target")},
        faults=[
            {
                "kind": "missing_op",
                "role": "origin",
                "step": 0,
                "rank": r,
                "node": only_base["step0/rank" + str(r)][0],
                "dump_json": str(
                    (_rank_dir(sample / "baseline", 0, r) / "dump.json").relative_to(sample)
                ),
                "present_in": "baseline",
                "how": "for each parameter (model.parameters() order) the baseline runs "
                "dist.all_reduce(p.grad); p.grad.div_(2); the target only the all_reduce",
            }
            for r in (0, 1)
        ],
        nodes_only_in_baseline=only_base,
        nodes_only_in_target={k: [] for k in only_base},
        checks={
            "parameters": n_params,
            "pairing": "Tensor.div_.i.forward follows Distributed.all_reduce.i.forward (i-th "
            "parameter); the baseline's div_ output is the optimizer's gradient",
            "step0_grad_norm_ratio_target_over_baseline": ratios,
            "first_common_differing_node": {k: v["first_differing_node"] for k, v in cmp.items()},
            "note": "at step 0 the forward/backward are identical; the first common node that "
            "differs is the optimizer's first use of a gradient. AdamW normalises the update, so "
            "step 1 differs only slightly",
        },
        losses=losses,
    )


# -------------------------------------------------------------------------------------------- tp
def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if math.isinf(a) or math.isinf(b) or math.isnan(a) or math.isnan(b):
        return a == b or (math.isnan(a) and math.isnan(b))
    return abs(a - b) <= rtol * max(abs(a), abs(b)) + atol


def _err(a: Any, b: Any, scale: float) -> float:
    """Return |a - b| / max(|a|, |b|, scale) (0 for equal values, non-numbers, infinities)."""
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or isinstance(a, bool):
        return 0.0
    if a == b or not (math.isfinite(a) and math.isfinite(b)):
        return 0.0
    return abs(a - b) / max(abs(a), abs(b), scale, 1e-30)


def _tp_relation(full: dict, s0: dict, s1: dict, rtol: float = 1e-4) -> tuple[str, float]:
    """Classify one tensor leaf of the TP=2 run (shards s0, s1) against the TP=1 leaf."""
    shape, a_shape, b_shape = full.get("shape"), s0.get("shape"), s1.get("shape")
    finite = [
        abs(x)
        for x in (full.get("Max"), full.get("Min"))
        if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    ]
    scale = max(finite, default=0.0)
    atol = 1e-5 * scale + 1e-12
    keys = [k for k in D.STAT_KEYS if full.get(k) is not None]
    if shape == a_shape == b_shape:
        if all(
            _close(full[k], s0.get(k), rtol, atol) and _close(full[k], s1.get(k), rtol, atol)
            for k in keys
        ):
            err = max([_err(full[k], s[k], scale) for k in keys for s in (s0, s1)] or [0.0])
            return "replicated", err
        if full.get("Mean") is not None and _close(
            full["Mean"], s0["Mean"] + s1["Mean"], rtol, atol
        ):
            return "partial_sum", _err(full["Mean"], s0["Mean"] + s1["Mean"], scale)
        return "different", math.nan
    if not (isinstance(shape, list) and isinstance(a_shape, list) and len(shape) == len(a_shape)):
        return "different", math.nan
    dims = [i for i, (x, y) in enumerate(zip(shape, a_shape, strict=True)) if x != y]
    if len(dims) != 1 or a_shape != b_shape or 2 * a_shape[dims[0]] != shape[dims[0]]:
        return "different", math.nan
    merged = {
        "Max": max(s0["Max"], s1["Max"]) if "Max" in keys else None,
        "Min": min(s0["Min"], s1["Min"]) if "Min" in keys else None,
        "Mean": (s0["Mean"] + s1["Mean"]) / 2 if "Mean" in keys else None,
        "Norm": math.sqrt(s0["Norm"] ** 2 + s1["Norm"] ** 2) if "Norm" in keys else None,
    }
    rel = f"sharded dim {dims[0] - len(shape)}"
    if all(_close(full[k], merged[k], rtol, atol) for k in keys):
        return rel, max([_err(full[k], merged[k], scale) for k in keys] or [0.0])
    return rel + " (stats do not merge)", math.nan


def gen_tp(ctx: Context, sample: Path) -> dict:
    """Hand-written Megatron TP: tp2 (2 ranks, sharded) vs tp1 (world size 1, full weights)."""
    model = ONE_BLOCK
    losses = {}
    for variant, world in (("tp1", 1), ("tp2", 2)):
        root = sample / variant
        cfg = _dump_config(sample, root, f"config_{variant}.json")
        spec = RunSpec(
            "dump",
            str(cfg),
            world,
            2,
            str(ctx.log_dir),
            model=model,
            parallel="tp",
            tag=f"tp_{variant}",
        )
        losses[variant] = {str(r): v for r, v in launch(spec).items()}
        _expect_layout(root, 2, world, "rank")
    tp1, tp2 = _load_all(sample / "tp1"), _load_all(sample / "tp2")
    per_step = {}
    tensors: dict[str, dict[str, dict[str, str]]] = {}
    for step in (0, 1):
        full, r0, r1 = tp1[(step, 0)], tp2[(step, 0)], tp2[(step, 1)]
        _check(list(r0) == list(r1), "tp2 ranks have different node lists")
        by_rel: dict[str, dict[str, Any]] = {}
        rels: dict[tuple[str, str], str] = {}
        for node, rec in full.items():
            if node not in r0:
                continue
            la, lb = D.node_leaves(r0[node]), D.node_leaves(r1[node])
            for path, leaf in D.node_leaves(rec).items():
                if "shape" not in leaf or path not in la or path not in lb:
                    continue
                rel, err = _tp_relation(leaf, la[path], lb[path])
                rels[(node, path)] = rel
                slot = by_rel.setdefault(rel, {"count": 0, "max_err": 0.0})
                slot["count"] += 1
                if not math.isnan(err):
                    slot["max_err"] = max(slot["max_err"], err)
        bad = {k: v for k, v in rels.items() if v.startswith("different") or "not merge" in v}
        _check(not bad, f"unclassified TP tensors at step {step}: {list(bad)[:10]}")
        partial = [{"node": n, "leaf": p} for (n, p), v in rels.items() if v == "partial_sum"]
        _check(
            bool(partial) and all(x["node"].startswith("Functional.linear.") for x in partial),
            f"partial sums {partial}",
        )
        per_step[f"step{step}"] = {
            "nodes_only_in_tp2": [n for n in r0 if n not in full],
            "nodes_only_in_tp1": [n for n in full if n not in r0],
            "by_relation": by_rel,
            "partial_sum_tensors": partial,
        }
        nested: dict[str, dict[str, str]] = {}
        for (n, p), v in rels.items():
            nested.setdefault(n, {})[p] = v
        tensors[f"step{step}"] = nested
    construct = D.load_json(_rank_dir(sample / "tp2", 0, 0) / "construct.json")
    nested0 = tensors["step0"]

    def rel0(node: str, leaf: str) -> str:
        return nested0[node][leaf]

    mods = []
    for b in range(model.blocks):
        for name, kind in (
            ("attn.q_proj", "column"),
            ("attn.k_proj", "column"),
            ("attn.v_proj", "column"),
            ("attn.o_proj", "row"),
            ("mlp.up_proj", "column"),
            ("mlp.down_proj", "row"),
        ):
            cls = "ColumnParallelLinear" if kind == "column" else "RowParallelLinear"
            base = f"Module.blocks.{b}.{name}.{cls}"
            fwd, bwd = f"{base}.forward.0", f"{base}.backward.0"
            inner = next(
                n for n, p in construct.items() if p == fwd and n.startswith("Functional.linear.")
            )
            inner_bwd = inner.replace(".forward", ".backward")
            entry = {
                "module": fwd,
                "kind": f"{kind}-parallel",
                "parameters.weight": rel0(fwd, "parameters.weight"),
                "parameters_grad.weight": rel0(f"{base}.parameters_grad.0", "weight.0"),
                "forward.input": rel0(fwd, "input_args.0"),
                "forward.output": rel0(fwd, "output.0"),
                "backward.input (grad of output)": rel0(bwd, "input.0"),
                "backward.output (grad of input)": rel0(bwd, "output.0"),
                "inner_api": inner,
                "inner_api.output": rel0(inner, "output.0"),
                "inner_api_backward.output (grad of the 2-D view of its output)": rel0(
                    inner_bwd, "output.0"
                ),
            }
            if kind == "column":
                entry["note"] = (
                    "weight rows [r*out/2, (r+1)*out/2) on rank r; the grad of the "
                    "input is all-reduced in _CopyToTP.backward (a "
                    "Distributed.all_reduce recorded as .forward during backward)"
                )
            else:
                entry["note"] = (
                    "weight columns [r*in/2, (r+1)*in/2) on rank r; the inner "
                    "Functional.linear output is a partial sum (msprobe takes its "
                    "statistics before the in-place all_reduce in _ReduceFromTP); the "
                    "module output is recorded after it and is replicated"
                )
            mods.append(entry)
    return _header(
        ctx,
        "tp",
        "hand-written Megatron-style tensor parallelism: tp2 = 2 ranks with column-parallel "
        "q/k/v/up and row-parallel o/down projections (+ torch.distributed.all_reduce); tp1 = "
        "world size 1 (torch.distributed initialised, so the folder is rank0) with the full "
        "weights; same seeds, weights and data; no fault",
        model,
        task="statistics",
        level="mix",
        tp_size=2,
        world_size={"tp1": 1, "tp2": 2},
        distributed_initialised=True,
        steps=[0, 1],
        dump_roots={"tp1": "tp1", "tp2": "tp2"},
        dump_files={v: _layout(sample / v, sample) for v in ("tp1", "tp2")},
        faults=[],
        shard_rule="tp1's full weights are drawn first (same seed on every rank) and sliced: "
        "ColumnParallelLinear rank r holds rows [r*out/2, (r+1)*out/2) of the full weight, "
        "RowParallelLinear rank r holds columns [r*in/2, (r+1)*in/2). Head h lives on rank h "
        "(2 heads), so attention-internal tensors [B, H, S, *] are sharded on dim -3. Embedding, "
        "RMSNorms and lm_head are replicated. Both ranks see the same batch",
        merge_rule="sharded: Max=max, Min=min, Mean=mean of the shard Means (equal shards), "
        "Norm=sqrt(sum of Norm^2); partial_sum: the shard Means add up to the TP=1 Mean",
        tolerance="rtol 1e-4 plus atol 1e-5*max(|Max|,|Min|) of the TP=1 tensor; max_err = "
        "max |tp1 - merged tp2| / max(|tp1|, |tp2|, max(|Max|,|Min|) of the TP=1 tensor)",
        module_correspondence=mods,
        checks=per_step,
        tensors=tensors,
        tensors_note="tensors[stepN][node][leaf path] = relation of that TP=2 tensor (the same "
        "node and leaf on tp2 rank0 and rank1) to the TP=1 tensor: replicated | sharded dim <d> "
        "| partial_sum. Leaf paths follow the dump.json structure (input_args.1, output.0, "
        "parameters.weight, input.0, weight.0 for parameters_grad)",
        losses=losses,
    )


# --------------------------------------------------------------------------------------- monitor
def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _f(x: str) -> float:
    try:
        return float(x)
    except ValueError:
        return math.nan


def _row_has_nan(row: dict[str, str]) -> bool:
    stats = [_f(row.get(k, "nan")) for k in ("min", "max", "norm", "mean")]
    if all(math.isnan(v) for v in stats) and math.isnan(_f(row.get("nans", "nan"))):
        return False  # no tensor behind this row (e.g. the grad of int token ids)
    return any(math.isnan(v) for v in stats) or _f(row.get("nans", "0")) > 0


def _stage(tag: str) -> int:
    """Training-stage rank of an anomaly tag (msprobe's ordering, plus param_* last)."""
    kind = tag.rsplit("/", 1)[-1]
    order = {
        "actv": 0,
        "actv_grad": 1,
        "acc_grad": 1,
        "pre_grad": 1,
        "post_grad": 1,
        "exp_avg": 2,
        "exp_avg_sq": 2,
    }
    return order.get(kind, 3)


def gen_monitor(ctx: Context, sample: Path) -> dict:
    """Msprobe TrainerMon on 2-rank DP, 5 steps; rank 1: grad spike at step 1, NaN at step 3."""
    model = TWO_BLOCKS
    spike = GradSpike(step=1, rank=1, factor=1000.0)
    nan = NanFault(step=3, rank=1, block=1, position=(0, 0, 5, 3))
    cfg = sample / "configs" / "monitor_config.json"
    write_json(cfg, MONITOR_CONFIG)
    out_dir = sample / "monitor_output"
    spec = RunSpec(
        "monitor",
        str(cfg),
        2,
        5,
        str(ctx.log_dir),
        model=model,
        nan=nan,
        spike=spike,
        monitor_dir=str(out_dir),
        tag="monitor",
    )
    losses = launch(spec)
    folders = {}
    for r in (0, 1):
        found = sorted(p for p in out_dir.iterdir() if p.is_dir() and f"-rank{r}-" in p.name)
        _check(len(found) == 1, f"monitor folders for rank {r}: {found}")
        folders[r] = found[0]
    facts: dict[str, Any] = {}
    first_nan: dict[int, tuple[int, list[str]]] = {}
    for r, folder in folders.items():
        rank_facts: dict[str, Any] = {"folder": str(folder.relative_to(sample))}
        firsts = {}
        for prefix in (
            "actv",
            "actv_grad",
            "grad_unreduced",
            "grad_reduced",
            "exp_avg",
            "exp_avg_sq",
            "param_origin",
            "param_updated",
        ):
            for step in range(5):
                path = folder / f"{prefix}_{step}-{step}.csv"
                if not path.exists():
                    continue
                names = [row["name"] for row in _read_csv(path) if _row_has_nan(row)]
                if names:
                    firsts[prefix] = {"step": step, "names": names}
                    break
        rank_facts["first_nan_step_and_names_in_csv_order"] = firsts
        if "actv" in firsts:
            first_nan[r] = (firsts["actv"]["step"], firsts["actv"]["names"])
        norms = {}
        for prefix in ("grad_unreduced", "grad_reduced"):
            per_step = {}
            for step in range(5):
                path = folder / f"{prefix}_{step}-{step}.csv"
                if path.exists():
                    per_step[str(step)] = math.sqrt(
                        sum(_f(row["norm"]) ** 2 for row in _read_csv(path))
                    )
            norms[prefix] = per_step
        rank_facts["total_grad_norm (sqrt of sum of per-param norm^2)"] = norms
        facts[f"rank{r}"] = rank_facts
    _check(nan.rank in first_nan and first_nan[nan.rank][0] == nan.step, f"first nan {first_nan}")
    first_name = first_nan[nan.rank][1][0]
    _check(first_name == f"blocks.{nan.block}.attn.output", f"first NaN activation {first_name}")
    _check(first_nan.get(1 - nan.rank, (99,))[0] > nan.step, "healthy rank NaN too early")
    gu = facts[f"rank{spike.rank}"]["total_grad_norm (sqrt of sum of per-param norm^2)"]
    ratio = gu["grad_unreduced"][str(spike.step)] / gu["grad_unreduced"][str(spike.step - 1)]
    _check(ratio > 100, f"spike ratio {ratio}")

    anomalies = {}
    for r in (0, 1):
        path = out_dir / "anomaly_detected" / f"rank{r}" / "anomaly.json"
        if not path.exists():
            anomalies[f"rank{r}"] = None
            continue
        entries = list(D.load_json(path).values())
        real_nan = sorted(
            (
                e
                for e in entries
                if "AnomalyNan" in e.get("message", "")
                and not e.get("tag_name", "").startswith("0:embed.input")
            ),
            key=lambda e: (
                e["step"],
                e.get("micro_step", 0),
                _stage(e.get("tag_name", "")),
                e.get("call_id", 0),
            ),
        )
        anomalies[f"rank{r}"] = {
            "file": str(path.relative_to(sample)),
            "entries": len(entries),
            "first_AnomalyNan_excluding_embed.input": real_nan[0] if real_nan else None,
            "ordering": "by step, micro_step, training stage (actv < actv_grad/acc_grad/"
            "post_grad < exp_avg* < param_*), call_id",
        }
    # anomaly.json keeps only the last op per tag and step; the norm messages of the spike are
    # only in the log, so summarise them from the workers' logs here
    pattern = re.compile(
        r"Rule (\w+) reports anomaly signal in \('0:([^/]+)/rank(\d+)/(\w+)', "
        r"'(\w+)'\) at step (\d+)"
    )
    turbulence: dict[str, int] = {}
    examples: list[str] = []
    for r in (0, 1):
        log_path = ctx.log_dir / f"monitor_rank{r}.log"
        for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            m = pattern.search(line)
            if not m or m.group(1) != "AnomalyTurbulence" or m.group(5) != "norm":
                continue
            if m.group(4) not in ("acc_grad", "post_grad") or int(m.group(6)) != spike.step:
                continue
            key = f"rank{m.group(3)}/{m.group(4)}/step{m.group(6)}"
            turbulence[key] = turbulence.get(key, 0) + 1
            if len(examples) < 3:
                examples.append(m.group(0))
    _check(
        turbulence.get(f"rank{spike.rank}/acc_grad/step{spike.step}", 0) > 0,
        f"no grad-norm turbulence logged at the spike: {turbulence}",
    )
    rel_folder = facts[f"rank{nan.rank}"]["folder"]
    return _header(
        ctx,
        "monitor",
        "msprobe TrainerMon (v1, csv) on a 2-rank data-parallel run, 5 steps; rank 1 gets a "
        "gradient spike (loss x1000) at step 1 and a NaN in block 1 attention at step 3",
        model,
        tool_api="TrainerMon(config_path, params_have_main_grad=False).set_monitor(model, "
        "optimizer=opt, grad_acc_steps=1); output folder from env MONITOR_OUTPUT_DIR",
        world_size=2,
        distributed_initialised=True,
        steps=[0, 1, 2, 3, 4],
        monitor_output="monitor_output",
        faults=[
            {
                "kind": "gradient_spike",
                "step": spike.step,
                "rank": spike.rank,
                "how": f"rank 1 calls (loss*{spike.factor}).backward(); the logged loss is "
                "unscaled",
                "csv": f"{facts[f'rank{spike.rank}']['folder']}/grad_unreduced_{spike.step}-"
                f"{spike.step}.csv",
                "grad_unreduced_total_norm_ratio_vs_previous_step": ratio,
                "expected": "grad_unreduced norms x1000 on rank 1 only; grad_reduced (mean of the "
                "2 "
                "ranks) ~x500 on both ranks; activations unaffected at that step",
            },
            {
                "kind": "nan",
                "step": nan.step,
                "rank": nan.rank,
                "name": first_name,
                "csv": f"{rel_folder}/actv_{nan.step}-{nan.step}.csv",
                "how": "block 1 attention: scores + torch.sqrt(poison) with poison = -1 at "
                f"(batch, head, query, key) = {list(nan.position)} (zeros on other steps/ranks)",
                "expected": "rank 1 activations NaN from blocks.1.attn.output at step 3; "
                "grad_unreduced NaN on rank 1, grad_reduced NaN on both ranks at step 3; "
                "parameters NaN after the step-3 update; everything NaN at step 4",
            },
        ],
        facts_from_csvs=facts,
        anomaly_detected_summary=anomalies,
        anomaly_log_grad_norm_turbulence_at_spike=turbulence,
        anomaly_log_examples=examples,
        anomaly_log_note="msprobe prints every rule hit to the training log; anomaly.json keeps "
        "only the last op (usually mean) per tag and step, so the norm hits of the spike are "
        "counted here from the workers' logs (the logs themselves are not kept)",
        losses={str(r): v for r, v in losses.items()},
    )


GENERATORS: dict[str, Callable[[Context, Path], dict]] = {
    "healthy": gen_healthy,
    "dp_nan": gen_dp_nan,
    "divergence": gen_divergence,
    "dp_sum": gen_dp_sum,
    "tp": gen_tp,
    "monitor": gen_monitor,
}


def generate_one(ctx: Context, name: str,
                 generator: Callable[[Context, Path], dict] | None = None) -> Path:
    """(Re)generate one sample folder under ``ctx.out`` and write its ground_truth.json.

    *generator* defaults to this module's ``GENERATORS[name]`` (other scenario modules pass theirs).
    """
    sample = ctx.out / name
    if sample.exists():
        shutil.rmtree(sample)
    sample.mkdir(parents=True)
    gen = generator or GENERATORS[name]
    gt = gen(replace(ctx), sample)
    write_json(sample / "ground_truth.json", gt)
    scrub_sample(ctx, sample)
    return sample


def scrub_sample(ctx: Context, sample: Path) -> list[Path]:
    """Rewrite the machine's absolute paths in the text files of *sample* (:mod:`precnb_samples.scrub`).

    Parameters
    ----------
    ctx : Context
        The invocation; its output folder is written ``data_samples``.
    sample : Path
        The sample folder just written (or a part of it).

    Returns
    -------
    list of Path
        The files rewritten.
    """
    from .scrub import TEXT_SUFFIXES, leftovers, scrub_tree

    changed = scrub_tree(sample, [(ctx.out, "data_samples")])
    left = [str(f) for f in sorted(sample.rglob("*")) if f.suffix in TEXT_SUFFIXES and f.is_file()
            and leftovers(f.read_text(encoding="utf-8", errors="replace"))]
    _check(not left, f"absolute paths left after scrubbing: {left}")
    return changed
