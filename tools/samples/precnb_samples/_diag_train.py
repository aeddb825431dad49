"""Training workers of the diagnosis scenarios (real msprobe dump and/or TrainerMon; imports torch)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812

from . import _diag_model as M  # noqa: N812
from . import _train


@dataclass
class DiagRun:
    """One training job of a diagnosis scenario."""

    tag: str
    log_dir: str
    world_size: int
    steps: int
    model: M.DiagModel
    dump_config: str | None = None  # PrecisionDebugger(config_path=...)
    monitor_config: str | None = None  # TrainerMon(config_path)
    monitor_dir: str | None = None
    register_kernel: bool = False  # PrecisionDebugger.register_custom_api(kernels, "fused_attention")
    kernel_prefix: str = "Custom"
    kernel_fault: tuple[int, int] | None = None  # (step, rank) whose attention backward makes a NaN
    pad_batch: tuple[int, int] | None = None  # (step, rank) whose batch is one repeated token
    aux_weight: float = 0.01
    port: int = 0
    init_dist: bool = True
    extra: dict = field(default_factory=dict)


def batch(cfg: M.DiagModel, step: int, rank: int, pad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic batch; ``pad`` gives a batch of one repeated token (padding)."""
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + step * 10 + rank)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=gen)
    if pad:
        tokens = torch.zeros_like(tokens)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def worker(rank: int, run: DiagRun) -> None:
    """Train one rank under msprobe and write its losses and result."""
    if run.monitor_dir is not None:
        os.environ["MONITOR_OUTPUT_DIR"] = run.monitor_dir
    _train.start_worker(rank, run)
    cfg = run.model
    model = M.DiagGPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, fused=True)
    debugger = monitor = None
    if run.dump_config is not None:
        from msprobe.pytorch import PrecisionDebugger

        debugger = PrecisionDebugger(config_path=run.dump_config)
        if run.register_kernel:
            PrecisionDebugger.register_custom_api(M.kernels, "fused_attention", api_prefix=run.kernel_prefix)
    if run.monitor_config is not None:
        from msprobe.pytorch import TrainerMon

        monitor = TrainerMon(run.monitor_config, params_have_main_grad=False)
        monitor.set_monitor(model, optimizer=opt, grad_acc_steps=1)
    losses: list[float] = []
    for step in range(run.steps):
        M.KERNEL_FAULT.active = run.kernel_fault == (step, rank)
        model.step = step
        x, y = batch(cfg, step, rank, run.pad_batch == (step, rank))
        opt.zero_grad(set_to_none=True)
        if debugger is not None:
            debugger.start(model)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), y.reshape(-1))
        aux = model.aux_loss()
        total = loss + run.aux_weight * aux if aux is not None else loss
        total.backward()
        for p in model.parameters():
            if p.grad is None:  # an expert that received no token (DDP's unused parameters)
                p.grad = torch.zeros_like(p)
            if run.world_size > 1:
                dist.all_reduce(p.grad)
                p.grad.div_(run.world_size)
        opt.step()
        if debugger is not None:
            debugger.stop()
            debugger.step()
        losses.append(float(loss.detach()))
    _train.finish_worker(rank, run, losses)


def launch(run: DiagRun) -> dict[int, dict]:
    """Spawn the ranks, wait, and return each rank's result (``{"losses": [...]}``)."""
    return {r: {"losses": v} for r, v in _train.launch(run, worker).items()}
