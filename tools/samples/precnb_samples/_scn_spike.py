"""Loss-spike scenarios (issue 29): one run per cause and a healthy control, dump + TrainerMon + loss log.

Each sample is one 2-rank data-parallel run of 10 steps (:mod:`precnb_samples._spike_train`):
TrainerMon (csv) monitors every step, msprobe dumps (level mix, forward and backward) the three
steps around the spike only, and ``loss_log.csv`` (``step,loss,rank``, written from the workers'
losses) holds the loss of every step and rank, as a training log would.

The spike step is defined by :data:`SPIKE_RULE` and found in the loss log; every origin (rank,
node, tensor, module) is read back from the dump and the monitor CSVs and checked against what
was injected.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import _dumps as D  # noqa: N812
from ._model import ModelConfig
from ._scenarios import Context, _check, _header, _layout, _load_all, write_json
from ._scn_diagnosis import _csv_rows, _monitor_folders, _num
from ._scn_sdc import rank_tables
from ._spike_train import LANGUAGE, NOISE, WARMUP, SpikeRun, launch

__all__ = ["GENERATORS", "SPIKE_RATIO", "spike_steps"]

PLACEMENT = {0: ("10.0.1.1", "0"), 1: ("10.0.1.1", "1")}  # spike_hardware's rank table: one host, two devices
MODEL = ModelConfig(blocks=1, attention=False, optimizer="sgd", lr=0.5, momentum=0.0, weight_decay=0.0, batch=16)
STEPS = 10
WORLD = 2
SPIKE_RATIO = 1.2
SPIKE_RULE = (f"the first step t >= {WARMUP} (after the {WARMUP}-step learning-rate warm-up) whose loss exceeds "
              f"{SPIKE_RATIO} x the loss of step t-1; the run's spike step uses the mean of the ranks' losses, "
              "rank_departures each rank's own series (loss_log.csv)")
_OPS = ["min", "max", "norm", "mean"]
_DUMP: dict[str, Any] = {"task": "statistics", "dump_path": None, "rank": [], "step": [], "level": "mix",
                         "async_dump": False,
                         "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}
_MONITOR: dict[str, Any] = {"targets": {"embed": {}, "norm_out": {}, "lm_head": {}}, "xy_distribution": True,
                            "forward_only": True,
                            "wg_distribution": True, "mv_distribution": False, "param_distribution": True,
                            "ops": _OPS, "eps": 1e-8, "format": "csv", "ndigits": 8, "start_step": 0,
                            "step_interval": 1, "collect_times": 100, "step_count_per_record": 1}

# name -> (cause, cause step, cause rank, factor, extra SpikeRun fields, dumped steps)
CASES: dict[str, dict[str, Any]] = {
    "spike_healthy": {"cause": None, "window": [5, 6, 7]},
    "spike_data": {"cause": "data", "cause_step": 6, "cause_rank": 1, "window": [5, 6, 7]},
    "spike_optimizer": {"cause": "optimizer", "cause_step": 6, "factor": 30.0, "window": [5, 6, 7]},
    "spike_hardware": {"cause": "hardware", "cause_step": 5, "cause_rank": 1, "factor": 100.0,
                       "parameter": "lm_head.weight", "window": [4, 5, 6]},
    "spike_numerics": {"cause": "numerics", "factor": 4.0, "scale_start": 4, "window": [7, 8, 9]},
    # issue 47: spike_data's fault in a model with causal attention (masked_fill(-inf) before softmax)
    "spike_data_mask": {"cause": "data", "cause_step": 6, "cause_rank": 1, "window": [5, 6, 7],
                        "model": replace(MODEL, attention=True)},
}


def spike_steps(series: list[float], ratio: float = SPIKE_RATIO, start: int = WARMUP) -> list[int]:
    """Steps whose loss exceeds ``ratio`` x the previous step's (from ``start`` on).

    >>> spike_steps([4.0, 3.5, 3.0, 2.8, 2.6, 4.1, 3.0])
    [5]
    """
    return [t for t in range(max(start, 1), len(series)) if series[t] > ratio * series[t - 1]]


def _write_loss_log(path: Path, losses: dict[int, list[float]]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["step", "loss", "rank"])
    for step in range(STEPS):
        for rank in sorted(losses):
            w.writerow([step, repr(losses[rank][step]), rank])
    path.write_text(buf.getvalue(), encoding="utf-8")


def _read_loss_log(path: Path) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for row in _csv_rows(path):
        out.setdefault(int(row["rank"]), []).append(float(row["loss"]))
    return out


def _mon(folder: Path, prefix: str, step: int, name: str) -> dict[str, float]:
    rows = {r["name"]: r for r in _csv_rows(folder / f"{prefix}_{step}-{step}.csv")}
    return {k: _num(rows[name][k]) for k in _OPS}


def _series(folders: dict[int, Path], prefix: str, name: str, stat: str, steps: range) -> dict[str, list[float]]:
    return {f"rank{r}": [_mon(f, prefix, s, name)[stat] for s in steps] for r, f in folders.items()}


def _leaf(data: dict, node: str, path: str) -> dict:
    return D.node_leaves(data[node])[path]


def _stats(leaf: dict) -> dict[str, Any]:
    return {k: leaf.get(k) for k in ("dtype", "shape", *D.STAT_KEYS)}


def _bookkeeping(data: dict) -> int:
    """Nodes TrainerMon's statistics add to the dump (Torch.min/max/norm/mean on the monitored tensors)."""
    return sum(n.split(".")[0] == "Torch" and n.split(".")[1] in _OPS for n in data)


def _optimizer_nodes(data: dict) -> list[str]:
    return [n for n in data if n.startswith("Tensor.add_.")]


PARAMS = ["embed.weight", "blocks.0.mlp_norm.weight", "blocks.0.mlp.up_proj.weight", "blocks.0.mlp.down_proj.weight",
          "norm_out.weight", "lm_head.weight"]
"""Parameter names in model.parameters() order (= the order of the gradient all-reduces)."""
MONITORED = ["embed.weight", "norm_out.weight", "lm_head.weight"]
"""The parameters TrainerMon watches (those of its targets: embed, norm_out, lm_head)."""


def _param_module(name: str) -> str:
    mod = name.rsplit(".", 1)[0]
    cls = {"embed": "Embedding", "lm_head": "Linear", "norm_out": "RMSNorm"}.get(mod) or (
        "RMSNorm" if mod.endswith("norm") else "Linear")
    return f"Module.{mod}.{cls}"


def _run(ctx: Context, sample: Path, name: str) -> dict[str, Any]:
    case = CASES[name]
    root = sample / "dump"
    cfg = sample / "configs" / "config.json"
    write_json(cfg, dict(_DUMP, dump_path=str(root), step=case["window"]))
    mon = sample / "configs" / "monitor_config.json"
    write_json(mon, _MONITOR)
    fields = {k: case[k] for k in ("cause", "cause_step", "cause_rank", "factor", "parameter", "scale_start")
              if k in case}
    run = SpikeRun(config_path=str(cfg), log_dir=str(ctx.log_dir), world_size=WORLD, steps=STEPS,
                   model=case.get("model", MODEL),
                   tag=name, monitor_config=str(mon), monitor_dir=str(sample / "monitor_output"), **fields)
    out = launch(run)
    found = D.step_dirs(root)
    _check([s for s, _ in found] == case["window"], f"{root}: dumped steps {[s for s, _ in found]}")
    losses = {r: v["losses"] for r, v in out.items()}
    _write_loss_log(sample / "loss_log.csv", losses)
    _check(_read_loss_log(sample / "loss_log.csv") == losses, "loss_log.csv does not read back")
    data = _load_all(root)
    ce = "Functional.cross_entropy.0.forward"
    for (s, r), d in data.items():
        _check(_leaf(d, ce, "output.0")["Mean"] == losses[r][s], f"step {s} rank {r}: dumped loss != loss log")
    mean = [sum(losses[r][s] for r in losses) / WORLD for s in range(STEPS)]
    per_rank = {f"rank{r}": spike_steps(v) for r, v in losses.items()}
    return {"case": case, "run": run, "root": root, "data": data, "losses": losses, "mean": mean,
            "spikes": spike_steps(mean), "rank_spikes": per_rank, "lr": {r: v["lr"] for r, v in out.items()},
            "folders": _monitor_folders(sample / "monitor_output", WORLD)}


def _spike_block(r: dict, step: int | None) -> dict[str, Any]:
    lo = max(0, (step if step is not None else 6) - 3)
    steps = list(range(lo, min(STEPS, lo + 6)))
    return {
        "step": step, "rule": SPIKE_RULE, "ratio": SPIKE_RATIO,
        "ratio_at_step": (r["mean"][step] / r["mean"][step - 1]) if step is not None else None,
        "max_step_ratio_after_warmup": max(r["mean"][t] / r["mean"][t - 1] for t in range(WARMUP, STEPS)),
        "rank_departures": r["rank_spikes"],
        "loss_around": {"steps": steps, **{f"rank{k}": [v[s] for s in steps] for k, v in r["losses"].items()},
                        "mean": [r["mean"][s] for s in steps]},
    }


def _common(sample: Path, r: dict) -> dict[str, Any]:
    case = r["case"]
    return {
        "task": "statistics", "level": "mix", "world_size": WORLD, "distributed_initialised": True,
        "steps": case["window"], "trained_steps": STEPS,
        "dump_roots": {"dump": "dump"}, "dump_files": _layout(r["root"], sample),
        "monitor_output": "monitor_output", "loss_log": "loss_log.csv",
        "monitor_folders": {f"rank{k}": str(v.relative_to(sample)) for k, v in r["folders"].items()},
        "tool_api": "PrecisionDebugger(config_path) and TrainerMon(config_path, params_have_main_grad=False)."
        "set_monitor(model, optimizer=opt, grad_acc_steps=1) in the same process; TrainerMon's output folder "
        "from env MONITOR_OUTPUT_DIR",
        "training": (f"2-rank data parallel (per-parameter gradient all_reduce + div_ by 2); batches of a noisy "
                     f"'next = token + 1 (mod {LANGUAGE})' language ({NOISE:.0%} random tokens) over tokens "
                     f"0..{LANGUAGE - 1}, distinct per rank and step; lr warm-up {WARMUP} steps (lr * (t+1)/"
                     f"{WARMUP}); TrainerMon at every step, msprobe dump of steps {case['window']} only"),
        "learning_rate": {f"rank{k}": v for k, v in r["lr"].items()},
        "losses": {str(k): v for k, v in r["losses"].items()},
        "bookkeeping_nodes_per_dump": _bookkeeping(r["data"][(case["window"][0], 0)]),
        "bookkeeping_note": "TrainerMon's statistics of the monitored tensors (Torch.min/max/norm/mean) run inside "
        "the dumped region, so msprobe records them too (parent: the monitored module or none)",
    }


# ------------------------------------------------------------------------------------ samples
def gen_spike_healthy(ctx: Context, sample: Path) -> dict:
    """The control: warm-up and normal batch noise, no step departs."""
    r = _run(ctx, sample, "spike_healthy")
    _check(r["spikes"] == [] and all(not v for v in r["rank_spikes"].values()), f"healthy spikes {r['rank_spikes']}")
    return _header(
        ctx, "spike_healthy",
        "loss-spike control: 2-rank data parallel, 10 steps with a 3-step lr warm-up, msprobe dump (steps 5-7) and "
        "TrainerMon in the same process, loss log of every step; the loss falls with normal batch noise, no spike",
        MODEL, **_common(sample, r), spike=_spike_block(r, None), faults=[], causes=[],
        checks={"spike_steps_mean": r["spikes"], "spike_steps_by_rank": r["rank_spikes"]},
    )


def check_data_spike(r: dict[str, Any], vocab: int) -> tuple[int, int, dict[str, Any]]:
    """The checks of a data-caused spike run *r*; returns (step, rank, token id statistics by rank and step).

    The cause rank's loss spikes first, at the cause step, and only its batch there holds the unseen tokens (ids
    from ``vocab // 2``).
    """
    case, data = r["case"], r["data"]
    step, rank = case["cause_step"], case["cause_rank"]
    _check(r["spikes"][:1] == [step], f"spike steps {r['spikes']}")
    _check(r["rank_spikes"][f"rank{rank}"][:1] == [step] and step not in r["rank_spikes"][f"rank{1 - rank}"],
           f"rank spikes {r['rank_spikes']}")
    node = "Functional.embedding.0.forward"
    ids = {f"rank{k}": {f"step{s}": _stats(_leaf(data[(s, k)], node, "input_args.0")) for s in case["window"]}
           for k in range(WORLD)}
    bad = ids[f"rank{rank}"][f"step{step}"]
    _check(bad["Min"] >= vocab // 2 and all(
        v[f"step{s}"]["Max"] < LANGUAGE for k, v in ids.items() for s in case["window"]
        if (k, s) != (f"rank{rank}", step)), f"token ids {ids}")
    return step, rank, ids


def data_spike_facts(model: Any, step: int, rank: int, node: str, construct: dict[str, Any], bad: dict[str, Any],
                     mon: dict[str, Any]) -> dict[str, Any]:
    """The ``faults`` and ``causes`` of a data-caused spike's ground truth (rank *rank*'s batch at *step*)."""
    return {
        "faults": [{"kind": "loss_spike", "role": "origin", "step": step, "rank": rank, "node": node,
                    "tensor": "input_args.0", "module": D.parent_of(construct, node), "origin": "batch input",
                    "cause": "data", "samples": list(range(model.batch)),
                    "dump_json": f"dump/step{step}/rank{rank}/dump.json",
                    "how": f"rank {rank}'s batch at step {step}: torch.randint({model.vocab // 2}, {model.vocab}, "
                    f"(batch, seq+1)) instead of the training language (all {model.batch} sequences)"}],
        "causes": [{"cause": "data", "text": f"rank {rank}'s batch at step {step} is an outlier (token ids "
                    f"{bad['Min']}..{bad['Max']} in the dump, mean {mon[f'rank{rank}'][step]:.1f} in the monitor; "
                    f"the training tokens are 0..{LANGUAGE - 1})"}],
    }


def gen_spike_data(ctx: Context, sample: Path) -> dict:
    """Rank 1's batch at step 6 holds unseen tokens: its loss jumps first."""
    r = _run(ctx, sample, "spike_data")
    step, rank, ids = check_data_spike(r, MODEL.vocab)
    node, bad = "Functional.embedding.0.forward", ids[f"rank{rank}"][f"step{step}"]
    mon = _series(r["folders"], "actv", "embed.input", "mean", range(STEPS))
    _check(mon[f"rank{rank}"][step] > 2 * max(mon[f"rank{rank}"][:step]), f"monitor embed.input mean {mon}")
    construct = D.load_json(r["root"] / f"step{step}" / f"rank{rank}" / "construct.json")
    return _header(
        ctx, "spike_data",
        f"loss spike from data: 2-rank data parallel; at step {step} rank {rank}'s batch holds tokens drawn "
        f"uniformly from {MODEL.vocab // 2}..{MODEL.vocab - 1} (never seen in training), so rank {rank}'s loss jumps "
        "while rank 0's does not",
        MODEL, **_common(sample, r), spike=_spike_block(r, step),
        **data_spike_facts(MODEL, step, rank, node, construct, bad, mon),
        evidence={"token_ids": ids, "monitor_embed_input_mean_by_step": mon,
                  "series": [f"dump {node} input_args.0 (Min/Max of the int64 token ids; msprobe leaves their Mean "
                             "and Norm null)",
                             "monitor actv_<step>-<step>.csv row embed.input (min/max/mean)",
                             "loss_log.csv: rank 1 jumps at the step, rank 0 does not"]},
        checks={"spike_steps_mean": r["spikes"], "spike_steps_by_rank": r["rank_spikes"]},
    )


def _grad_norms(r: dict, prefix: str, steps: range) -> dict[str, dict[str, list[float]]]:
    return {p: _series(r["folders"], prefix, p, "norm", steps) for p in MONITORED}


def gen_spike_optimizer(ctx: Context, sample: Path) -> dict:
    """The learning rate of step 6 is 30x: the update jumps, the gradient does not; the loss follows at step 7."""
    r = _run(ctx, sample, "spike_optimizer")
    case, data = r["case"], r["data"]
    step = case["cause_step"]
    _check(r["spikes"][:1] == [step + 1], f"spike steps {r['spikes']}")
    _check(all(v[:1] == [step + 1] for v in r["rank_spikes"].values()), f"rank spikes {r['rank_spikes']}")
    alphas = {f"step{s}": sorted({_leaf(data[(s, k)], n, "input_kwargs.alpha")["value"] for k in range(WORLD)
                                  for n in _optimizer_nodes(data[(s, k)])}) for s in case["window"]}
    lr = MODEL.lr
    _check(alphas == {f"step{s}": [-lr * (case["factor"] if s == step else 1.0)] for s in case["window"]},
           f"optimizer alphas {alphas}")
    steps = range(step - 2, step + 2)
    grads = _grad_norms(r, "grad_reduced", steps)
    gratio = max(v["rank0"][2] / v["rank0"][1] for v in grads.values())
    _check(gratio < 3, f"the gradient jumps too ({gratio})")
    # the update of each parameter: param_updated - param_origin of the step, seen through their statistics
    upd = {}
    for p in MONITORED:
        o = _series(r["folders"], "param_origin", p, "norm", steps)["rank0"]
        u = _series(r["folders"], "param_updated", p, "norm", steps)["rank0"]
        upd[p] = {"param_origin_norm": o, "param_updated_norm": u}
    lm = upd["lm_head.weight"]
    jump = [abs(u - o) for o, u in zip(lm["param_origin_norm"], lm["param_updated_norm"], strict=True)]
    _check(jump[2] > 10 * max(jump[0], jump[1]), f"lm_head norm change by step {jump}")
    first = _optimizer_nodes(data[(step, 0)])[0]
    return _header(
        ctx, "spike_optimizer",
        f"loss spike from the optimizer: 2-rank data parallel; the learning rate of step {step} is {case['factor']:g}x "
        f"the scheduled one (plain SGD, so every weight update is {case['factor']:g}x) while the gradients are "
        f"ordinary; the loss spikes one step later, at step {step + 1}, on both ranks",
        MODEL, **_common(sample, r), spike=_spike_block(r, step + 1),
        faults=[{"kind": "loss_spike", "role": "origin", "step": step, "rank": None, "node": first,
                 "tensor": "input_kwargs.alpha", "module": None, "origin": "optimizer",
                 "parameters": PARAMS, "cause": "optimizer", "spike_step": step + 1,
                 "dump_json": f"dump/step{step}/rank0/dump.json",
                 "how": f"param_groups[0]['lr'] = {lr} x {case['factor']:g} at step {step} only (SGD "
                 "param.add_(grad, alpha=-lr): the dumped Tensor.add_ records carry alpha = -lr)"}],
        causes=[{"cause": "optimizer", "text": f"the learning rate of step {step} is {lr * case['factor']:g} "
                 f"instead of {lr:g}: the update jumps {case['factor']:g}x without a gradient jump; the loss "
                 "follows one step later"}],
        evidence={"optimizer_alpha_by_step": alphas, "grad_reduced_norm": {"steps": list(steps), **grads},
                  "param_norms": {"steps": list(steps), **upd},
                  "series": ["dump Tensor.add_.N.forward input_kwargs.alpha (= -lr) of the SGD update, one per "
                             "parameter", "monitor grad_reduced norm (no jump)",
                             "monitor param_origin vs param_updated (the weight change of the step jumps)"]},
        checks={"spike_steps_mean": r["spikes"], "spike_steps_by_rank": r["rank_spikes"],
                "max_grad_norm_ratio_at_cause_step": gratio},
    )


def gen_spike_hardware(ctx: Context, sample: Path) -> dict:
    """Rank 1's lm_head gradient at step 5 is 100x before the all-reduce; every rank carries it after."""
    r = _run(ctx, sample, "spike_hardware")
    case, data = r["case"], r["data"]
    step, rank, param = case["cause_step"], case["cause_rank"], case["parameter"]
    _check(r["spikes"][:1] == [step + 1], f"spike steps {r['spikes']}")
    order = PARAMS
    ar = f"Distributed.all_reduce.{order.index(param)}.forward"
    mod = _param_module(param)
    pg = f"{mod}.parameters_grad.0"
    d = {k: data[(step, k)] for k in range(WORLD)}
    pre = {f"rank{k}": _leaf(d[k], ar, "input_args.0")["Norm"] for k in range(WORLD)}
    post = {f"rank{k}": _leaf(d[k], ar, "output.0")["Norm"] for k in range(WORLD)}
    pgn = {f"rank{k}": _leaf(d[k], pg, "weight.0")["Norm"] for k in range(WORLD)}
    _check(pre[f"rank{rank}"] > 30 * pre[f"rank{1 - rank}"] and pgn == pre, f"pre-reduce norms {pre} {pgn}")
    _check(post["rank0"] == post["rank1"] > 10 * pre[f"rank{1 - rank}"], f"post-reduce norms {post}")
    # its inputs are ordinary: the module's forward input and the gradient of its output
    ins = {}
    for path, node in (("input_args.0", f"{mod}.forward.0"), ("input.0", f"{mod}.backward.0")):
        v = {f"rank{k}": _leaf(d[k], node, path)["Norm"] for k in range(WORLD)}
        _check(max(v.values()) < 3 * min(v.values()), f"{node} {path} {v}")
        ins[f"{node} {path}"] = v
    others = {p: {f"rank{k}": _leaf(d[k], f"Distributed.all_reduce.{i}.forward", "input_args.0")["Norm"]
                  for k in range(WORLD)} for i, p in enumerate(order) if p != param}
    _check(all(max(v.values()) < 5 * min(v.values()) for v in others.values()), f"other gradients {others}")
    mon = {pfx: _series(r["folders"], pfx, param, "norm", range(step - 2, step + 2))
           for pfx in ("grad_unreduced", "grad_reduced")}
    _check(mon["grad_unreduced"][f"rank{rank}"][2] > 30 * mon["grad_unreduced"][f"rank{1 - rank}"][2], f"monitor {mon}")
    tables = rank_tables(sample, "rank_table", PLACEMENT)
    device = dict(zip(("host", "device"), PLACEMENT[rank], strict=True))
    return _header(
        ctx, "spike_hardware",
        f"loss spike from a faulty gradient: 2-rank data parallel; at step {step} rank {rank}'s gradient of "
        f"{param} is {case['factor']:g}x during backward, before the all-reduce, while its inputs are ordinary; after "
        f"the reduce both ranks carry it and the loss spikes at step {step + 1}",
        MODEL, **_common(sample, r), spike=_spike_block(r, step + 1), rank_tables={"rank_table": tables},
        placement={str(k): dict(zip(("host", "device"), v, strict=True)) for k, v in PLACEMENT.items()},
        faults=[{"kind": "loss_spike", "role": "origin", "step": step, "rank": rank, "node": pg, "tensor": "weight.0",
                 "module": f"{mod}.forward.0", "parameter": param, "origin": "parameter", "cause": "hardware",
                 "all_reduce": ar, "spike_step": step + 1, "device": device,
                 "dump_json": f"dump/step{step}/rank{rank}/dump.json",
                 "how": f"a tensor hook on {param} multiplies its gradient by {case['factor']:g} on rank {rank} at "
                 f"step {step} (the multiply is bound before msprobe wraps torch: the dump shows only the wrong "
                 "gradient, as from a device that computes wrongly)"}],
        causes=[{"cause": "hardware", "text": f"rank {rank}'s gradient of {param} before the all-reduce is "
                 f"{pre[f'rank{rank}'] / pre[f'rank{1 - rank}']:.0f}x the other rank's while its inputs are "
                 "ordinary; after the reduce every rank carries it"}],
        evidence={"pre_reduce_grad_norm": pre, "post_reduce_grad_norm": post, "parameters_grad_norm": pgn,
                  "inputs_norm": ins, "other_parameters_pre_reduce_norm": others,
                  "monitor_norm": {"steps": list(range(step - 2, step + 2)), **mon},
                  "series": [f"dump {ar} input_args.0 (before) / output.0 (after the reduce)", f"dump {pg} weight.0",
                             "monitor grad_unreduced / grad_reduced norm of the parameter"]},
        checks={"spike_steps_mean": r["spikes"], "spike_steps_by_rank": r["rank_spikes"]},
    )


def gen_spike_numerics(ctx: Context, sample: Path) -> dict:
    """The float16 final RMSNorm overflows at step 8: x.pow(2) = inf, the normalised output 0, the loss spikes."""
    r = _run(ctx, sample, "spike_numerics")
    case, data = r["case"], r["data"]
    start, growth = case["scale_start"], case["factor"]
    window = case["window"]
    step = next(s for s in window if any(D.first_nan_node(data[(s, k)]) or _first_inf(data[(s, k)])
                                         for k in range(WORLD)))
    before = step - 1
    _check(before in window, f"no dumped step before the overflow {step}")
    norm_only = _first_inf(data[(before, 0)], D.STAT_KEYS)
    _check(norm_only is not None and norm_only[0] == _first_inf(data[(step, 0)])[0], f"step {before}: {norm_only}")
    pre = _leaf(data[(before, 0)], *norm_only)
    _check(pre["Norm"] == math.inf and math.isfinite(pre["Max"]), f"step {before} {norm_only[0]} {pre}")
    _check(r["spikes"][:1] == [step], f"spike steps {r['spikes']} vs overflow at {step}")
    firsts = {k: _first_inf(data[(step, k)]) for k in range(WORLD)}
    node, path = firsts[0]
    _check(all(v == firsts[0] for v in firsts.values()) and node.startswith("Tensor.pow.") and path == "output.0",
           f"first overflow {firsts}")
    construct = D.load_json(r["root"] / f"step{step}" / "rank0" / "construct.json")
    module = D.parent_of(construct, node)
    _check(module == "Module.norm_out.RMSNorm.forward.0", f"overflow module {module}")
    leaf_in, leaf_out = (_leaf(data[(step, 0)], node, p) for p in ("input_args.0", "output.0"))
    _check(leaf_in["dtype"] == "torch.float16" and math.isfinite(leaf_in["Max"]) and leaf_out["Max"] == math.inf,
           f"overflow leaf {leaf_in} {leaf_out}")
    rs = next(n for n in data[(step, 0)] if n.startswith("Torch.rsqrt.") and D.parent_of(construct, n) == module)
    zeros = _leaf(data[(step, 0)], rs, "output.0")
    _check(zeros["Min"] == 0.0, f"{rs} output {zeros}")
    mon_in = _series(r["folders"], "actv", "norm_out.input", "max", range(STEPS))
    mon_out = _series(r["folders"], "actv", "norm_out.output", "norm", range(STEPS))
    lead = next(s for s in range(1, STEPS) if mon_in["rank0"][s] > 2 * mon_in["rank0"][s - 1])
    _check(lead == start + 1, f"norm_out input growth from {lead}")
    return _header(
        ctx, "spike_numerics",
        f"loss spike from numerics: 2-rank data parallel; the final RMSNorm runs in float16 and its input is scaled "
        f"by {growth:g}**max(0, step-{start}) (a power of two the norm hides exactly); at step {step} x.pow(2) "
        "overflows float16 (inf), rsqrt(inf) = 0 zeroes the normalised output of those tokens and the loss spikes "
        "on both ranks",
        MODEL, **_common(sample, r), spike=_spike_block(r, step),
        faults=[{"kind": "loss_spike", "role": "origin", "step": step, "rank": None, "node": node, "tensor": path,
                 "module": module, "origin": "op", "cause": "numerics", "dtype": "torch.float16",
                 "overflow": {"input": _stats(leaf_in), "output": _stats(leaf_out), "rsqrt_node": rs,
                              "rsqrt_output": _stats(zeros)},
                 "dump_json": f"dump/step{step}/rank0/dump.json",
                 "how": f"norm_out(x.half()) (the float32 upcast of the RMSNorm dropped) after x = x * "
                 f"{growth:g}**max(0, step - {start}) (a step-dependent scale); float16 x**2 overflows once "
                 "|x| > 255.9"}],
        causes=[{"cause": "numerics", "text": f"float16 overflow in {module.split('.')[1]}: {node} output Max = inf at "
                 f"step {step} (input Max {leaf_in['Max']:g}), rsqrt = 0, normalised output zero"}],
        evidence={"monitor_norm_out_input_max": mon_in, "monitor_norm_out_output_norm": mon_out,
                  "lead_indicator": {"module": "norm_out", "series": "actv norm_out.input max", "departs_at": lead,
                                     "steps_before_spike": step - lead},
                  "series": [f"dump {node} output.0 (float16 Max = inf)", f"dump {rs} output.0 (Min 0)",
                             "monitor actv norm_out.input max (grows 4x per step from step "
                             f"{start + 1}: the lead indicator)", "monitor actv norm_out.output norm (falls)"]},
        precursor={"step": before, "node": norm_only[0], "tensor": norm_only[1], "stats": _stats(pre),
                   "note": f"one step before the overflow the float16 x**2 reaches {pre['Max']:g} (fp16 max 65504): "
                   "no element is infinite yet, but msprobe's Norm of that float16 tensor already is (it is "
                   "computed in float16), so an infinite Norm alone does not mean an overflowed element"},
        checks={"spike_steps_mean": r["spikes"], "spike_steps_by_rank": r["rank_spikes"],
                "first_overflow_by_rank": {f"rank{k}": f"{v[0]} {v[1]}" for k, v in firsts.items()}},
    )


def _first_inf(data: dict, keys: tuple[str, ...] = ("Max", "Min")) -> tuple[str, str] | None:
    """First (node, leaf) in dump order holding an infinite element (Max or Min infinite).

    TrainerMon's own statistics are skipped. ``keys=D.STAT_KEYS`` also counts an infinite Mean or
    Norm, which msprobe computes in the tensor's dtype: a float16 tensor's Norm overflows before
    any element does.
    """
    for n, rec in data.items():
        if n.split(".")[0] == "Torch" and n.split(".")[1] in _OPS:
            continue
        for p, leaf in D.node_leaves(rec).items():
            if any(isinstance(leaf.get(k), float) and math.isinf(leaf[k]) for k in keys):
                return n, p
    return None


GENERATORS: dict[str, Callable[[Context, Path], dict[str, Any]]] = {
    "spike_healthy": gen_spike_healthy,
    "spike_data": gen_spike_data,
    "spike_optimizer": gen_spike_optimizer,
    "spike_hardware": gen_spike_hardware,
    "spike_numerics": gen_spike_numerics,
}
