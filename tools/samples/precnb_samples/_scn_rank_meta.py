"""Scenarios where the same label is not the same op everywhere, or where replicas are not replicas.

``rank_shift``
    2-rank data parallel, 1 block, 2 steps. Rank 0's first RMSNorm also computes the activation
    RMS for logging (``torch.sqrt(x.pow(2).mean())``) on every step, so on rank 0 every later
    ``Torch.sqrt`` / ``Tensor.pow`` / ``Tensor.mean`` call counter is one ahead of rank 1's. At
    step 1 rank 1 gets a NaN in block 0's attention scores (``scores + torch.sqrt(poison)``, as
    in ``dp_nan``): on rank 1 that op is ``Torch.sqrt.0.forward``, on rank 0 the same label is
    the logging op (another module, shape and stack line).
``tp_noise``
    hand-written Megatron-style TP=2 vs TP=1 (the ``tp`` sample's model, 1 block, 1 step) whose
    embedding adds Gaussian noise (``torch.normal(0, 0.02, size)``, NEFTune style) on the
    replicated residual stream; in ``tp2`` rank 1 seeds the default generator with ``seed +
    rank``, so its noise differs from rank 0's. The op has no tensor input.

Every location in ``ground_truth.json`` is read back from the produced dumps (their own
construct.json / stack.json) and checked against what was injected.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn

from . import _dumps as D  # noqa: N812
from ._model import Faults, ModelConfig, RMSNorm, TinyGPT, TPGroup, make_batch, make_optimizer
from ._scenarios import Context, _check, _dump_config, _expect_layout, _header, _layout, _load_all
from ._train import WorkerSpec, finish_worker, launch, start_worker

__all__ = ["GENERATORS"]

SHIFT_MODEL = ModelConfig(blocks=1)
NOISE_MODEL = ModelConfig(blocks=1)
NOISE_STD = 0.02


def _logged_rms_forward(self: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm's forward that also computes the input's RMS for a log line (an extra op on one rank)."""
    self.last_rms = torch.sqrt(x.pow(2).mean())
    return RMSNorm.forward(self, x)


def _noisy_embedding_forward(self: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
    """Embedding with additive Gaussian noise (NEFTune style), drawn from the default generator."""
    x = nn.Embedding.forward(self, tokens)
    return x + torch.normal(0.0, NOISE_STD, size=tuple(x.shape))


@dataclass(kw_only=True)
class MetaSpec(WorkerSpec):
    """A run of this module's worker."""

    parallel: str = "dp"
    log_rank: int | None = None  # rank whose first RMSNorm logs its input RMS
    nan_step: int | None = None
    nan_rank: int | None = None
    noise: bool = False
    unsynced_seed_rank: int | None = None


def meta_worker(rank: int, spec: MetaSpec) -> None:
    """Train the tiny GPT under msprobe with this module's variations."""
    start_worker(rank, spec)
    cfg = spec.model
    tp = TPGroup(spec.world_size, rank) if spec.parallel == "tp" else None
    faults = Faults(nan_attention_block=0 if spec.nan_step is not None else None)
    model = TinyGPT(cfg, faults, tp)
    # the instance's own forward (the class name, hence msprobe's module node names, stays the same)
    if spec.log_rank == rank:
        norm = model.blocks[0].attn_norm
        norm.forward = types.MethodType(_logged_rms_forward, norm)
    if spec.noise:
        model.embed.forward = types.MethodType(_noisy_embedding_forward, model.embed)
    opt = make_optimizer(model, cfg)
    if spec.noise:  # Megatron seeds the default generator alike on every TP rank; the unsynced rank adds its rank
        torch.manual_seed(cfg.seed + 1 + (rank if rank == spec.unsynced_seed_rank else 0))
    from msprobe.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(config_path=spec.config_path)
    dp = spec.parallel == "dp" and spec.world_size > 1
    losses: list[float] = []
    for step in range(spec.steps):
        faults.nan_active = (step, rank) == (spec.nan_step, spec.nan_rank)
        x, y = make_batch(cfg, step, rank if spec.parallel == "dp" else 0)
        opt.zero_grad(set_to_none=True)
        debugger.start(model)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), y.reshape(-1))
        loss.backward()
        if dp:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(spec.world_size)
        opt.step()
        debugger.stop()
        debugger.step()
        losses.append(float(loss.detach()))
    finish_worker(rank, spec, losses)


def _rank_file(root: Path, step: int, rank: int, name: str) -> Path:
    return root / f"step{step}" / f"rank{rank}" / name


def _stack_of(root: Path, step: int, rank: int, node: str) -> list[str]:
    """The frames of *node* in that rank's own stack.json (either stack.json format)."""
    raw = D.load_json(_rank_file(root, step, rank, "stack.json"))
    if isinstance(raw, dict) and "0" in raw:  # the grouped format: id -> [[nodes], [frames]]
        for nodes, frames in raw.values():
            if node in nodes:
                return list(frames)
        return []
    return list(raw.get(node, []))


def _user_line(frames: list[str]) -> str:
    """The innermost frame in this package's model code (the line that called the op)."""
    return next((f for f in frames if "precnb_samples" in f and "_dumps" not in f), frames[0] if frames else "")


def _meta(root: Path, step: int, rank: int, node: str, leaf: str) -> dict[str, Any]:
    data = D.dump_data(_rank_file(root, step, rank, "dump.json"))
    construct = D.load_json(_rank_file(root, step, rank, "construct.json"))
    lf = D.node_leaves(data[node])[leaf]
    frames = _stack_of(root, step, rank, node)
    return {"parent": D.parent_of(construct, node), "shape": lf.get("shape"), "dtype": lf.get("dtype"),
            "stack_line": _user_line(frames)}


def gen_rank_shift(ctx: Context, sample: Path) -> dict:
    """2-rank DP; rank 0 runs one extra op early; a NaN on rank 1 in an op whose label is another op on rank 0."""
    steps, nan_step, nan_rank, log_rank = 2, 1, 1, 0
    cfg = _dump_config(sample, sample, "config.json")
    spec = MetaSpec(config_path=str(cfg), log_dir=str(ctx.log_dir), world_size=2, steps=steps, model=SHIFT_MODEL,
                    tag="rank_shift", log_rank=log_rank, nan_step=nan_step, nan_rank=nan_rank)
    losses = launch(spec, meta_worker)
    _expect_layout(sample, steps, 2, "rank")
    data = _load_all(sample)
    d1 = data[(nan_step, nan_rank)]
    origin = D.first_nan_origin(d1)
    _check(origin is not None and origin == D.first_nan_node(d1), f"rank {nan_rank} first NaN {origin}")
    assert origin is not None
    _check(origin.startswith("Torch.sqrt."), f"origin {origin}")
    _check(not any(D.first_nan_node(data[(s, r)]) for s in range(nan_step) for r in (0, 1)), "NaN before the fault")
    here = _meta(sample, nan_step, nan_rank, origin, "output.0")
    other = _meta(sample, nan_step, log_rank, origin, "output.0")
    _check(here["parent"] is not None and ".attn." in here["parent"], f"origin parent {here['parent']}")
    _check(other["parent"] is not None and "attn_norm" in other["parent"], f"rank {log_rank}: {other['parent']}")
    _check(here["shape"] != other["shape"] and here["stack_line"] != other["stack_line"], f"{here} vs {other}")
    same_names = {r: sorted(n for n in data[(nan_step, r)] if n.startswith("Torch.sqrt.")) for r in (0, 1)}
    recv = D.first_nan_node(data[(nan_step, log_rank)])
    _check(recv is not None and recv.startswith("Distributed.all_reduce"), f"rank {log_rank} first NaN {recv}")
    input_meta = {r: _meta(sample, nan_step, r, origin, "input_args.0") for r in (0, 1)}
    return _header(
        ctx, "rank_shift",
        "2-rank data parallel; rank 0's first RMSNorm also computes the activation RMS for a log line "
        "(torch.sqrt(x.pow(2).mean())), so its later Torch.sqrt / Tensor.pow / Tensor.mean call counters are one "
        "ahead of rank 1's; NaN injected in block 0's attention scores on rank 1 at step 1 (an op whose label "
        "names the logging op on rank 0), spread to rank 0 by the gradient all_reduce",
        SHIFT_MODEL, task="statistics", level="mix", world_size=2, distributed_initialised=True,
        steps=list(range(steps)), dump_files=_layout(sample, sample),
        faults=[
            {"kind": "nan", "role": "origin", "step": nan_step, "rank": nan_rank, "node": origin,
             "dump_json": f"step{nan_step}/rank{nan_rank}/dump.json", "module": here["parent"],
             "shape": here["shape"], "dtype": here["dtype"], "stack_line": here["stack_line"],
             "input_shape": input_meta[nan_rank]["shape"],
             "how": "block 0 attention: scores = scores + torch.sqrt(poison), poison = zeros except -1.0 at "
                    "(0, 0, 5, 3) at this step/rank; Torch.sqrt's input is finite and its output holds the NaN"},
            {"kind": "nan", "role": "spread", "step": nan_step, "rank": log_rank, "node": recv,
             "dump_json": f"step{nan_step}/rank{log_rank}/dump.json", "from_rank": nan_rank,
             "how": "the first gradient all_reduce: NaN-free input on rank 0, NaN output"},
        ],
        checks={
            "same_label_other_rank": {"rank": log_rank, "node": origin, "module": other["parent"],
                                      "shape": other["shape"], "dtype": other["dtype"],
                                      "stack_line": other["stack_line"],
                                      "input_shape": input_meta[log_rank]["shape"]},
            "torch_sqrt_nodes": {f"rank{r}": v for r, v in same_names.items()},
            "note": "the label is the same on both ranks; what it names is each rank's own construct.json, "
                    "dump.json and stack.json",
        },
        losses={str(r): v for r, v in losses.items()},
    )


def gen_tp_noise(ctx: Context, sample: Path) -> dict:
    """TP=2 vs TP=1 with a per-rank-seeded torch.normal on the replicated stream (no tensor input)."""
    steps, unsynced = 1, 1
    losses: dict[str, Any] = {}
    for variant, world in (("tp1", 1), ("tp2", 2)):
        root = sample / variant
        cfg = _dump_config(sample, root, f"config_{variant}.json")
        spec = MetaSpec(config_path=str(cfg), log_dir=str(ctx.log_dir), world_size=world, steps=steps,
                        model=NOISE_MODEL, tag=f"tp_noise_{variant}", parallel="tp", noise=True,
                        unsynced_seed_rank=unsynced if world > 1 else None)
        losses[variant] = {str(r): v for r, v in launch(spec, meta_worker).items()}
        _expect_layout(root, steps, world, "rank")
    tp1, tp2 = _load_all(sample / "tp1"), _load_all(sample / "tp2")
    node = next(n for n in tp2[(0, 0)] if n.startswith("Torch.normal."))
    leaves = {r: D.node_leaves(tp2[(0, r)][node]) for r in (0, 1)}
    _check("output.0" in leaves[0] and not any(k.startswith("input_args") and "shape" in v
                                               for k, v in leaves[0].items()), f"{node}: {sorted(leaves[0])}")
    _check(D.leaf_differs(leaves[0]["output.0"], leaves[1]["output.0"]), f"{node} is the same on both TP ranks")
    full = D.node_leaves(tp1[(0, 0)][node])["output.0"]
    _check(full.get("shape") == leaves[0]["output.0"].get("shape"), "the noise is not the full tensor")
    _check(not D.leaf_differs(full, leaves[0]["output.0"]), "tp1's noise differs from tp2 rank 0's")
    construct = D.load_json(_rank_file(sample / "tp2", 0, 0, "construct.json"))
    pick = lambda lf: {k: lf.get(k) for k in ("shape", "Max", "Min", "Mean", "Norm")}  # noqa: E731
    return _header(
        ctx, "tp_noise",
        "hand-written Megatron-style TP=2 vs TP=1 (the tp sample's model, 1 block) whose embedding adds "
        f"torch.normal(0, {NOISE_STD}, size) noise on the replicated residual stream; in tp2 rank 1 seeds the "
        "default generator with seed + rank, so its noise differs from rank 0's (tp1 seeds like rank 0)",
        NOISE_MODEL, task="statistics", level="mix", tp_size=2, world_size={"tp1": 1, "tp2": 2},
        distributed_initialised=True, steps=list(range(steps)), dump_roots={"tp1": "tp1", "tp2": "tp2"},
        dump_files={v: _layout(sample / v, sample) for v in ("tp1", "tp2")},
        faults=[{"kind": "replica_mismatch", "role": "origin", "step": 0, "rank": unsynced, "ranks": [0, 1],
                 "node": node, "tensor": "output.0", "module": D.parent_of(construct, node),
                 "dump_json": f"tp2/step0/rank{unsynced}/dump.json", "other_dump_json": "tp2/step0/rank0/dump.json",
                 "tensor_inputs": 0,
                 "how": "NoisyEmbedding returns embedding(tokens) + torch.normal(0, std, size): no tensor input; "
                        f"every rank calls torch.manual_seed(seed + 1 + offset) with offset {unsynced} on rank "
                        f"{unsynced}, 0 elsewhere",
                 "stats": {"tp1": pick(full), "rank0": pick(leaves[0]["output.0"]),
                           "rank1": pick(leaves[1]["output.0"])}}],
        checks={"note": "a merge that sums the copies' means (a partial sum) invents a value no rank holds; "
                        "the copies of a replicated tensor differ"},
        losses=losses,
    )


GENERATORS: dict[str, Callable[[Context, Path], dict]] = {"rank_shift": gen_rank_shift, "tp_noise": gen_tp_noise}
