"""Diagnosis scenarios: an unhooked custom op (and the same op registered), an empty MoE expert, a drift.

Every fault location in ``ground_truth.json`` is read back from the produced dumps / CSVs and
checked against what was injected (see :mod:`precnb_samples._scenarios` for the style).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _dumps as D  # noqa: N812
from ._diag_model import DiagModel
from ._diag_train import DiagRun, launch
from ._scenarios import Context, _check, _expect_layout, _header, _layout, _load_all, write_json

__all__ = ["GENERATORS"]

_STATISTICS = {"task": "statistics", "dump_path": None, "rank": [], "step": [], "level": "mix",
               "async_dump": False,
               "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}
_OPS = ["min", "max", "norm", "zeros", "nans", "mean"]

KERNEL_MODEL = DiagModel(attention="kernel", blocks=1)
KB = f"blocks.{KERNEL_MODEL.blocks - 1}"  # the last block: its backward runs first
MOE_MODEL = DiagModel(blocks=1, experts=2, attention="none")
DRIFT_MODEL = DiagModel(blocks=1, scale_dims=(3, 11), scale_growth=2.0, scale_start=1)


def _dump_config(sample: Path, root: Path) -> Path:
    path = sample / "configs" / "config.json"
    write_json(path, dict(_STATISTICS, dump_path=str(root)))
    return path


def _monitor_config(sample: Path, targets: list[str], *, wg: bool) -> Path:
    cfg = {"targets": {t: {} for t in targets}, "xy_distribution": True, "wg_distribution": wg,
           "mv_distribution": False, "param_distribution": False, "ops": _OPS, "eps": 1e-8, "format": "csv",
           "ndigits": 8, "start_step": 0, "step_interval": 1, "collect_times": 100, "step_count_per_record": 1}
    path = sample / "configs" / "monitor_config.json"
    write_json(path, cfg)
    return path


def _leaf(data: dict, node: str, path: str) -> dict:
    return D.node_leaves(data[node])[path]


def _finite(leaf: dict) -> bool:
    return all(isinstance(leaf.get(k), (int, float)) and math.isfinite(leaf[k]) for k in D.STAT_KEYS)


def _parent(root: Path, step: int, rank: int, node: str) -> str | None:
    return D.parent_of(D.load_json(root / f"step{step}" / f"rank{rank}" / "construct.json"), node)


def _clean_before(data: dict[tuple[int, int], dict], step: int) -> bool:
    return all(D.first_nan_node(d) is None for (s, _), d in data.items() if s < step)


# ---------------------------------------------------------------------------------- custom op
def _kernel_run(ctx: Context, sample: Path, tag: str, registered: bool) -> tuple[DiagRun, dict]:
    cfg = _dump_config(sample, sample)
    run = DiagRun(tag=tag, log_dir=str(ctx.log_dir), world_size=2, steps=2, model=KERNEL_MODEL,
                  dump_config=str(cfg), register_kernel=registered, kernel_fault=(1, 1))
    losses = launch(run)
    _expect_layout(sample, 2, 2, "rank")
    return run, losses


def _kernel_fault_text(run: DiagRun) -> str:
    return ("blocks' attention core is a torch.autograd.Function (fused_attention) whose forward and backward "
            "call torch functions bound before msprobe wraps torch (a stand-in for a compiled kernel); at "
            f"step {run.kernel_fault[0]} on rank {run.kernel_fault[1]} its backward writes sqrt(-1) into one "
            "element of dS, so the query and key gradients hold NaN")


def gen_custom_op_gap(ctx: Context, sample: Path) -> dict:
    """2-rank DP; the unregistered custom attention op makes a NaN in backward at step 1, rank 1."""
    run, losses = _kernel_run(ctx, sample, "custom_op_gap", registered=False)
    data = _load_all(sample)
    step, rank = run.kernel_fault
    _check(_clean_before(data, step), "NaN before the fault step")
    d = data[(step, rank)]
    _check(not any("fused_attention" in n for n in d), "the unregistered op was recorded")
    first = D.first_nan_node(d)
    _check(first is not None and first.endswith(".backward"), f"first NaN node {first}")
    bad = [p for p in D.nan_leaf_paths(d[first]) if p.startswith("input.")]
    _check(bool(bad), f"NaN leaves {D.nan_leaf_paths(d[first])}: the incoming gradient is clean")
    fwd = first.replace(".backward", ".forward")
    fwd_parent = _parent(sample, step, rank, fwd)
    _check(fwd_parent is not None and fwd_parent.startswith(f"Module.{KB}.attn."), f"parent {fwd_parent}")
    attn_fwd = _parent(sample, step, rank, fwd_parent)
    _check(attn_fwd == f"Module.{KB}.attn.KernelAttention.forward.0", f"attention module {attn_fwd}")
    attn_bwd = f"Module.{KB}.attn.KernelAttention.backward.0"
    _check(_finite(_leaf(d, attn_bwd, "input.0")) and not _finite(_leaf(d, attn_bwd, "output.0")),
           "attention module backward: clean grad in, NaN grad out expected")
    # the gradient entering the gap: o_proj's module backward output (w.r.t. its input, the custom op's output)
    o_mod = f"Module.{KB}.attn.o_proj.Linear"
    o_in = _leaf(d, f"{o_mod}.forward.0", "input_args.0")
    o_bwd = f"{o_mod}.backward.0"
    grad_in = _leaf(d, o_bwd, "output.0")
    _check(grad_in["shape"] == o_in["shape"] and _finite(grad_in), f"{o_bwd} output.0 {grad_in}")
    names = list(d)
    _check(names.index(o_bwd) < names.index(first), "o_proj backward runs after the first NaN")
    return _header(
        ctx, "custom_op_gap",
        "2-rank data parallel; attention is an unregistered custom autograd op (invisible to msprobe) whose "
        f"backward makes a NaN in {KB} on rank 1 at step 1: the NaN first shows in a captured gradient "
        "whose producer is not in the dump",
        KERNEL_MODEL, task="statistics", level="mix", world_size=2, distributed_initialised=True, steps=[0, 1],
        dump_files=_layout(sample, sample),
        faults=[{"kind": "nan", "role": "origin", "step": step, "rank": rank, "node": first,
                 "tensor": f"{first}.{bad[0]}", "module": fwd_parent.split(".", 1)[1].rsplit(".", 3)[0],
                 "gap_module": f"{KB}.attn", "gradient_of": f"{fwd}.output.{bad[0].split('.')[1]}",
                 "last_clean": f"{o_bwd}.output.0", "module_backward": attn_bwd,
                 "missing": "fused_attention (forward and backward) between the q/k/v projections and o_proj",
                 "how": _kernel_fault_text(run)}],
        checks={"first_nan_node_by_step_rank": {f"step{s}/rank{r}": D.first_nan_node(x)
                                                for (s, r), x in sorted(data.items())},
                "recorded_nodes_step1_rank1": len(d)},
        losses={str(r): v["losses"] for r, v in losses.items()},
        digest=[f"- origin (first NaN): step {step}, rank {rank}, `{first}` {bad} (the gradient of "
                f"`{fwd}` output), inside `{KB}.attn` whose custom op is not recorded",
                f"- last clean gradient before the gap: `{o_bwd}` output.0; `{attn_bwd}`: clean input, NaN output"],
    )


def gen_custom_op_registered(ctx: Context, sample: Path) -> dict:
    """The same run with the op registered (``PrecisionDebugger.register_custom_api``): the op is captured."""
    run, losses = _kernel_run(ctx, sample, "custom_op_registered", registered=True)
    data = _load_all(sample)
    step, rank = run.kernel_fault
    _check(_clean_before(data, step), "NaN before the fault step")
    d = data[(step, rank)]
    first = D.first_nan_node(d)
    _check(first is not None and first.startswith(f"{run.kernel_prefix}.fused_attention.") and
           first.endswith(".backward"), f"first NaN node {first}")
    ins, outs = D.nan_sides(d[first])
    _check(not ins and outs, f"{first}: NaN inputs {ins}, outputs {outs}")
    parent = _parent(sample, step, rank, first)
    _check(parent == f"Module.{KB}.attn.KernelAttention.backward.0", f"parent {parent}")
    return _header(
        ctx, "custom_op_registered",
        "the custom_op_gap run with the op registered (PrecisionDebugger.register_custom_api(kernels, "
        f"'fused_attention', api_prefix='{run.kernel_prefix}')): its backward is captured and creates the NaN",
        KERNEL_MODEL, task="statistics", level="mix", world_size=2, distributed_initialised=True, steps=[0, 1],
        dump_files=_layout(sample, sample),
        faults=[{"kind": "nan", "role": "origin", "step": step, "rank": rank, "node": first,
                 "nan_leaves": D.nan_leaf_paths(d[first]), "module": f"{KB}.attn",
                 "forward_node": first.replace(".backward", ".forward"), "how": _kernel_fault_text(run)}],
        checks={"first_nan_node_by_step_rank": {f"step{s}/rank{r}": D.first_nan_node(x)
                                                for (s, r), x in sorted(data.items())}},
        losses={str(r): v["losses"] for r, v in losses.items()},
        digest=[f"- origin: step {step}, rank {rank}, `{first}` creates NaN in {D.nan_leaf_paths(d[first])} "
                f"from finite inputs (the gradient of `{first.replace('.backward', '.forward')}`)"],
    )


# ---------------------------------------------------------------------------------------- MoE
_PAD_TEXT = ("top-1 MoE with 2 experts in block 0; ExpertMean divides each expert's summed router probability by "
             "its token count; at step {s} rank {r} gets a batch of one repeated (padding) token, so every token "
             "goes to one expert and the other one receives none: 0/0 = NaN in the load-balancing term, which "
             "the loss adds (x0.01)")


def gen_moe_empty_expert(ctx: Context, sample: Path) -> dict:
    """2-rank DP MoE; one expert gets no token on rank 1 at step 1: 0/0 in the per-expert mean."""
    cfg = _dump_config(sample, sample)
    run = DiagRun(tag="moe_empty_expert", log_dir=str(ctx.log_dir), world_size=2, steps=2, model=MOE_MODEL,
                  dump_config=str(cfg), pad_batch=(1, 1))
    losses = launch(run)
    _expect_layout(sample, 2, 2, "rank")
    data = _load_all(sample)
    step, rank = run.pad_batch
    _check(_clean_before(data, step), "NaN before the fault step (an expert empty by chance?)")
    d = data[(step, rank)]
    first = D.first_nan_node(d)
    _check(first is not None and first.startswith("Tensor.__truediv__."), f"first NaN {first}")
    parent = _parent(sample, step, rank, first)
    _check(parent == "Module.blocks.0.mlp.balance.ExpertMean.forward.0", f"parent {parent}")
    num, den = _leaf(d, first, "input_args.0"), _leaf(d, first, "input_args.1")
    _check(num["Min"] == 0.0 and den["Min"] == 0.0, f"operands {num} {den}")
    return _header(
        ctx, "moe_empty_expert",
        "2-rank data parallel MoE; on rank 1 at step 1 one expert receives no token and the per-expert mean "
        "(sum / count) gives 0/0 = NaN",
        MOE_MODEL, task="statistics", level="mix", world_size=2, distributed_initialised=True, steps=[0, 1],
        dump_files=_layout(sample, sample),
        faults=[{"kind": "nan", "role": "origin", "step": step, "rank": rank, "node": first,
                 "module": "blocks.0.mlp.balance", "cause": "0/0",
                 "numerator": {k: num[k] for k in ("shape", *D.STAT_KEYS)},
                 "denominator": {k: den[k] for k in ("shape", *D.STAT_KEYS)}, "how": _PAD_TEXT.format(s=step, r=rank)}],
        checks={"first_nan_node_by_step_rank": {f"step{s}/rank{r}": D.first_nan_node(x)
                                                for (s, r), x in sorted(data.items())}},
        losses={str(r): v["losses"] for r, v in losses.items()},
        digest=[f"- origin: step {step}, rank {rank}, `{first}` in `blocks.0.mlp.balance`: numerator min "
                f"{num['Min']}, denominator (token counts) min {den['Min']} max {den['Max']} -> NaN"],
    )


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _monitor_folders(out_dir: Path, world: int) -> dict[int, Path]:
    folders = {}
    for r in range(world):
        found = sorted(p for p in out_dir.iterdir() if p.is_dir() and f"-rank{r}-" in p.name)
        _check(len(found) == 1, f"monitor folders for rank {r}: {found}")
        folders[r] = found[0]
    return folders


def _num(x: str) -> float:
    try:
        return float(x)
    except ValueError:
        return math.nan


def gen_moe_monitor(ctx: Context, sample: Path) -> dict:
    """The MoE run under TrainerMon: the empty expert's NaN in the monitor CSVs (rank 1, step 2)."""
    targets = ["blocks.0.mlp_norm", "blocks.0.mlp", "blocks.0.mlp.router", "blocks.0.mlp.balance",
               "blocks.0.mlp.experts.0", "blocks.0.mlp.experts.1", "lm_head"]
    cfg = _monitor_config(sample, targets, wg=True)
    out_dir = sample / "monitor_output"
    run = DiagRun(tag="moe_monitor", log_dir=str(ctx.log_dir), world_size=2, steps=4, model=MOE_MODEL,
                  monitor_config=str(cfg), monitor_dir=str(out_dir), pad_batch=(2, 1))
    losses = launch(run)
    folders = _monitor_folders(out_dir, 2)
    step, rank = run.pad_batch
    first: dict[int, tuple[int, str]] = {}
    for r, folder in folders.items():
        for s in range(run.steps):
            rows = _csv_rows(folder / f"actv_{s}-{s}.csv")
            bad = [row["name"] for row in rows if _num(row["nans"]) > 0 or math.isnan(_num(row["norm"]))]
            if bad:
                first[r] = (s, bad[0])
                break
    _check(first.get(rank, (None,))[0] == step, f"first NaN activation {first}")
    _check(first[rank][1].startswith("blocks.0.mlp.balance.output"), f"first NaN row {first[rank]}")
    rows = {row["name"]: row for row in _csv_rows(folders[rank] / f"actv_{step}-{step}.csv")}
    ins = {k: {o: _num(v[o]) for o in _OPS} for k, v in rows.items() if k.startswith("blocks.0.mlp.balance.input")}
    _check(len(ins) == 2 and all(v["zeros"] > 0 for v in ins.values()), f"balance inputs {ins}")
    return _header(
        ctx, "moe_monitor",
        "the MoE run under msprobe TrainerMon (v1 csv), 2 ranks, 4 steps; rank 1 gets a padding batch at step "
        "2 and an expert receives no token: 0/0 in blocks.0.mlp.balance",
        MOE_MODEL, tool_api="TrainerMon(config_path, params_have_main_grad=False).set_monitor(model, optimizer=opt, "
        "grad_acc_steps=1)", world_size=2, distributed_initialised=True, steps=list(range(run.steps)),
        monitor_output="monitor_output",
        faults=[{"kind": "nan", "role": "origin", "step": step, "rank": rank, "name": first[rank][1],
                 "module": "blocks.0.mlp.balance", "cause": "0/0", "inputs": ins,
                 "csv": str((folders[rank] / f"actv_{step}-{step}.csv").relative_to(sample)),
                 "how": _PAD_TEXT.format(s=step, r=rank)}],
        checks={"first_nan_activation": {f"rank{r}": list(v) for r, v in first.items()}},
        losses={str(r): v["losses"] for r, v in losses.items()},
        digest=[f"- origin: step {step}, rank {rank}, `{first[rank][1]}`; inputs' zero fractions "
                + ", ".join(f"{k} {v['zeros']:.3g}" for k, v in ins.items())],
    )


# -------------------------------------------------------------------------------------- drift
def _hook_called(stack: dict) -> list[str]:
    """API nodes TrainerMon's hooks called (its statistics ops recorded by the dump).

    A torch module hook call among the innermost frames, or a ``no_grad``-decorated function whose
    own (msprobe) frame is left out (gradient hooks).
    """
    pairs: list[tuple[list[str], list[str]]] = []
    for key, value in stack.items():
        if isinstance(value, list) and len(value) == 2 and isinstance(value[0], list):
            pairs.append((value[0], value[1]))  # grouped format: [[nodes], [frames]]
        else:
            pairs.append(([key], value if isinstance(value, list) else []))
    out = set()
    for nodes, frames in pairs:
        head = [str(f) for f in frames[:3]]
        if any("hook_result = hook(" in f for f in head) or (head and "torch/utils/_contextlib.py" in head[0]):
            out.update(n for n in nodes if not n.startswith(("Module.", "Cell.")))
    return sorted(out)


def gen_drift(ctx: Context, sample: Path) -> dict:
    """1 rank, 7 steps, dump and TrainerMon in one process; an RMSNorm input minimum falls from step 3."""
    cfg = _dump_config(sample, sample / "dump")
    mon = _monitor_config(sample, ["blocks.0.attn_norm"], wg=True)
    out_dir = sample / "monitor_output"
    m = DRIFT_MODEL
    run = DiagRun(tag="drift", log_dir=str(ctx.log_dir), world_size=1, steps=5, model=m, dump_config=str(cfg),
                  monitor_config=str(mon), monitor_dir=str(out_dir))
    losses = launch(run)
    root = sample / "dump"
    _expect_layout(root, run.steps, 1, "rank")
    data = _load_all(root)
    node = "Module.blocks.0.attn_norm.RMSNorm.forward.0"
    mins = [_leaf(data[(s, 0)], node, "input_args.0")["Min"] for s in range(run.steps)]
    onset = m.scale_start + 1
    _check(all(mins[i] < mins[i - 1] for i in range(onset, run.steps)), f"minimum does not fall every step {mins}")
    _check(abs(mins[onset - 1] - mins[0]) < 0.5 * abs(mins[0]), f"minimum moves before the onset {mins}")
    book = _hook_called(D.load_json(root / "step0" / "rank0" / "stack.json"))
    _check(any(n.startswith("Torch.mean.") for n in book), f"no monitor statistics recorded: {book[:5]}")
    folder = _monitor_folders(out_dir, 1)[0]
    mon_min = [_num({r["name"]: r for r in _csv_rows(folder / f"actv_{s}-{s}.csv")}
                    ["blocks.0.attn_norm.input"]["min"]) for s in range(run.steps)]
    return _header(
        ctx, "drift",
        f"1 rank, {run.steps} steps, msprobe dump (dump/) and TrainerMon (monitor_output/) in the same process; "
        f"hidden dims {list(m.scale_dims)} (after the embedding, inline in the model's forward) are multiplied "
        f"by {m.scale_growth}**(step-{m.scale_start}) from step "
        f"{onset} (a timestep scaling that uses the global step), so blocks.0.attn_norm's input minimum falls "
        "every step while the normalised output hides it",
        m, task="statistics", level="mix", world_size=1, distributed_initialised=True,
        steps=list(range(run.steps)), dump_roots={"dump": "dump"}, monitor_output="monitor_output",
        dump_files=_layout(root, sample),
        faults=[{"kind": "drift", "role": "origin", "step": onset, "rank": 0, "node": node,
                 "tensor": f"{node}.input.0", "module": "blocks.0.attn_norm", "stat": "min",
                 "dump_min_by_step": mins, "monitor_name": "blocks.0.attn_norm.input",
                 "monitor_min_by_step": mon_min,
                 "how": "x = x * (1 + (growth**max(0, step - start) - 1) * mask) after the embedding"}],
        checks={"bookkeeping_nodes_step0": len(book), "bookkeeping_examples": book[:6],
                "bookkeeping_note": "TrainerMon runs its statistics (Torch.min/max/norm/mean...) on the monitored "
                "tensors inside the dumped region, so msprobe records them too; their stacks point into "
                "msprobe/pytorch/monitor"},
        losses={"0": losses[0]["losses"]},
        digest=[f"- drift onset: step {onset}, `{node}` input.0 min by step {[round(x, 3) for x in mins]}",
                f"- monitor `blocks.0.attn_norm.input` min by step {[round(x, 3) for x in mon_min]}",
                f"- {len(book)} bookkeeping nodes per step recorded from TrainerMon's statistics"],
    )


GENERATORS: dict[str, Callable[[Context, Path], dict[str, Any]]] = {
    "custom_op_gap": gen_custom_op_gap,
    "custom_op_registered": gen_custom_op_registered,
    "moe_empty_expert": gen_moe_empty_expert,
    "moe_monitor": gen_moe_monitor,
    "drift": gen_drift,
}
