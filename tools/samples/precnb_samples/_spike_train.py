"""Training worker of the loss-spike samples (issue 29): 2-rank DP, msprobe dump and TrainerMon in one process.

Imports torch. The MLP-only tiny GPT learns a noisy "next token = token + 1 (mod 16)" language
with plain SGD after a 3-step linear learning-rate warm-up, so its loss falls smoothly from
ln(64) with a little batch noise. One cause per run makes the loss spike:

* ``data``: one rank's batch at one step holds tokens of another distribution (uniform over the
  upper half of the vocabulary, never seen in training);
* ``optimizer``: the learning rate of one step is multiplied by a factor;
* ``hardware``: on one rank at one step the gradient of one parameter is multiplied by a factor
  during backward, before the data-parallel all-reduce (a tensor hook whose multiply is bound
  before msprobe wraps torch, so the dump shows only its effect, like a device computing wrongly);
* ``numerics``: the final RMSNorm runs in float16 and its input is multiplied by
  ``growth ** max(0, step - start)``; the norm hides the (exact, power-of-two) scale until
  ``x.pow(2)`` overflows float16, then ``rsqrt(inf) = 0`` zeroes the normalised output.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812

from . import _train
from ._model import Faults, ModelConfig, TinyGPT, make_optimizer

_MUL = torch.Tensor.mul  # bound before msprobe wraps torch: the corruption records no node

WARMUP = 3  # linear learning-rate warm-up over steps 0..WARMUP-1
LANGUAGE = 16  # training tokens are 0..LANGUAGE-1
NOISE = 0.1  # fraction of tokens replaced by a random training token


@dataclass(kw_only=True)
class SpikeRun(_train.WorkerSpec):
    """One run of a loss-spike sample (``config_path`` = the dump config, or "" for none)."""

    monitor_config: str = ""
    monitor_dir: str = ""
    cause: str | None = None  # data | optimizer | hardware | numerics | None (healthy)
    cause_step: int = -1
    cause_rank: int | None = None
    factor: float = 1.0  # optimizer: lr factor; hardware: gradient factor; numerics: scale growth per step
    parameter: str = ""  # hardware: the parameter whose gradient is corrupted
    scale_start: int = 0  # numerics: the scale is growth ** max(0, step - scale_start)
    extra: dict = field(default_factory=dict)


def batch(cfg: ModelConfig, step: int, rank: int, outlier: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of one rank and step (inputs, targets); ``outlier``: tokens of another distribution."""
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + step * 10 + rank)
    if outlier:
        tokens = torch.randint(cfg.vocab // 2, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=gen)
    else:
        start = torch.randint(0, LANGUAGE, (cfg.batch, 1), generator=gen)
        tokens = (start + torch.arange(cfg.seq + 1)) % LANGUAGE
        noisy = torch.rand(tokens.shape, generator=gen) < NOISE
        tokens = torch.where(noisy, torch.randint(0, LANGUAGE, tokens.shape, generator=gen), tokens)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def learning_rate(run: SpikeRun, step: int) -> float:
    """The step's learning rate: warm-up, then constant (times ``factor`` at the optimizer fault)."""
    lr = run.model.lr * min(1.0, (step + 1) / WARMUP)
    if run.cause == "optimizer" and step == run.cause_step:
        lr *= run.factor
    return lr


def worker(rank: int, run: SpikeRun) -> None:
    """Train one rank under the msprobe dump and TrainerMon."""
    os.environ["MONITOR_OUTPUT_DIR"] = run.monitor_dir
    _train.start_worker(rank, run)
    cfg = run.model
    faults = Faults(final_norm_half=run.cause == "numerics")
    model = TinyGPT(cfg, faults)
    opt = make_optimizer(model, cfg)
    corrupt = {"on": False}
    if run.cause == "hardware":
        param = dict(model.named_parameters())[run.parameter]
        param.register_hook(lambda g: _MUL(g, run.factor) if corrupt["on"] else g)  # before msprobe's hooks

    from msprobe.pytorch import PrecisionDebugger, TrainerMon

    debugger = PrecisionDebugger(config_path=run.config_path)
    monitor = TrainerMon(run.monitor_config, params_have_main_grad=False)
    monitor.set_monitor(model, optimizer=opt, grad_acc_steps=1)
    losses: list[float] = []
    lrs: list[float] = []
    for step in range(run.steps):
        at_fault = step == run.cause_step and run.cause_rank in (None, rank)
        corrupt["on"] = run.cause == "hardware" and at_fault
        if run.cause == "numerics":
            faults.final_scale = run.factor ** max(0, step - run.scale_start)
        x, y = batch(cfg, step, rank, outlier=run.cause == "data" and at_fault)
        for group in opt.param_groups:
            group["lr"] = learning_rate(run, step)
        opt.zero_grad(set_to_none=True)
        debugger.start(model)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), y.reshape(-1))
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(run.world_size)
        opt.step()
        debugger.stop()
        debugger.step()
        losses.append(float(loss.detach()))
        lrs.append(opt.param_groups[0]["lr"])
    _train.finish_worker(rank, run, {"losses": losses, "lr": lrs})  # type: ignore[arg-type]


def launch(run: SpikeRun) -> dict[int, dict]:
    """Spawn the ranks; return each rank's ``{"losses": [...], "lr": [...]}``."""
    return _train.launch(run, worker)  # type: ignore[return-value]
