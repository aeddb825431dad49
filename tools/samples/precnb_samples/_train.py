"""Training workers run under the real msprobe (imports torch; spawned with torch.multiprocessing).

Each run is described by a picklable :class:`RunSpec`; :func:`launch` spawns ``world_size``
processes (also for one process, so that every run gets a fresh msprobe singleton and its own
``proc<PID>`` folder) and waits for them.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F  # noqa: N812

from ._model import Faults, ModelConfig, TinyGPT, TPGroup, make_batch, make_optimizer


@dataclass(frozen=True)
class NanFault:
    """``scores + sqrt(poison)`` with ``poison = -1`` at one position (see :class:`Faults`)."""

    step: int
    rank: int
    block: int = 1
    position: tuple[int, int, int, int] = (0, 0, 5, 3)


@dataclass(frozen=True)
class ActDtypeFault:
    """Compute block ``block``'s MLP GELU in ``dtype`` on ``rank`` from ``from_step`` on."""

    rank: int
    from_step: int
    block: int = 0
    dtype: str = "bfloat16"


@dataclass(frozen=True)
class GradSpike:
    """``(loss * factor).backward()`` on ``rank`` at ``step`` (the logged loss is unscaled)."""

    step: int
    rank: int
    factor: float = 1000.0


@dataclass
class RunSpec:
    """Everything a worker process needs to run one training job."""

    tool: str  # "dump" (PrecisionDebugger) or "monitor" (TrainerMon)
    config_path: str
    world_size: int
    steps: int
    log_dir: str
    init_dist: bool = True
    parallel: str = "dp"  # "dp" or "tp"
    divide_grads: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    nan: NanFault | None = None
    act_dtype: ActDtypeFault | None = None
    act_cast_block: int | None = None  # run the (float32) cast path in this block on every rank
    spike: GradSpike | None = None
    hidden_dropout: float = 0.0  # F.dropout(p) on each block's attention and MLP outputs
    unsynced_seed_rank: int | None = None  # this rank seeds the dropout RNG with seed + rank
    monitor_dir: str | None = None
    port: int = 0
    tag: str = "run"
    freeze: tuple[str, ...] = ()  # parameter names set to requires_grad=False after the model is built
    same_batch: bool = False  # every data-parallel rank reads rank 0's batch (a data-sharding bug)
    config_check_zip: str | None = None  # tool "config_check": msprobe ConfigChecker writes this pack
    config_check_inputs: tuple[str, ...] = ()  # its shell_path (a hyper-parameter YAML / shell script)
    config_check_env: tuple[tuple[str, str], ...] = ()  # the only environment variables the pack records


@dataclass(kw_only=True)
class WorkerSpec:
    """What :func:`start_worker`, :func:`finish_worker` and :func:`launch` need of a run.

    Scenario modules with their own worker function subclass it (or use it as it is).
    """

    config_path: str
    log_dir: str
    world_size: int = 1
    steps: int = 2
    model: ModelConfig = field(default_factory=ModelConfig)
    init_dist: bool = True
    port: int = 0
    tag: str = "run"


def free_port() -> int:
    """Ask the OS for a free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redirect_output(log_path: Path) -> None:
    """Send this process's stdout/stderr (msprobe logs a lot) to ``log_path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _dtype_map(spec: RunSpec, rank: int, step: int) -> dict[int, torch.dtype]:
    out: dict[int, torch.dtype] = {}
    if spec.act_cast_block is not None:
        out[spec.act_cast_block] = torch.float32
    f = spec.act_dtype
    if f is not None and rank == f.rank and step >= f.from_step:
        out[f.block] = getattr(torch, f.dtype)
    return out


def start_worker(rank: int, spec: Any) -> None:
    """Common start of a worker: output to its log, 1 thread, deterministic, gloo if asked.

    ``spec`` is any object with ``log_dir``, ``tag``, ``init_dist``, ``port`` and ``world_size``.
    """
    _redirect_output(Path(spec.log_dir) / f"{spec.tag}_rank{rank}.log")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if spec.init_dist:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{spec.port}",
            rank=rank,
            world_size=spec.world_size,
        )


def finish_worker(rank: int, spec: Any, losses: list[float]) -> None:
    """Common end of a worker: write the losses for :func:`launch`, leave the process group."""
    path = Path(spec.log_dir) / f"{spec.tag}_losses_rank{rank}.json"
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(losses, fh)
    if spec.init_dist:
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()


def worker(rank: int, spec: RunSpec) -> None:
    """Train the tiny GPT for ``spec.steps`` steps on one rank under msprobe."""
    if spec.monitor_dir is not None:
        os.environ["MONITOR_OUTPUT_DIR"] = spec.monitor_dir
    start_worker(rank, spec)
    cfg = spec.model
    tp = TPGroup(spec.world_size, rank) if spec.parallel == "tp" else None
    faults = Faults(nan_attention_block=spec.nan.block if spec.nan else None)
    if spec.nan is not None:
        faults.nan_position = spec.nan.position
    faults.hidden_dropout = spec.hidden_dropout
    if spec.tool == "config_check":
        from msprobe.core.config_check import ConfigChecker

        ConfigChecker.apply_patches("pytorch")  # before any random call: the pack records them
    model = TinyGPT(cfg, faults, tp)
    for name, param in model.named_parameters():
        if name in spec.freeze:
            param.requires_grad_(False)
    opt = make_optimizer(model, cfg)
    if spec.hidden_dropout:
        # Megatron seeds the default generator identically on all TP ranks (the dropout on the
        # replicated residual stream must draw the same mask); the unsynced rank adds its rank
        offset = rank if rank == spec.unsynced_seed_rank else 0
        torch.manual_seed(cfg.seed + 1 + offset)

    debugger = monitor = None
    if spec.tool == "config_check":
        _start_config_check(spec, model)
    elif spec.tool == "dump":
        from msprobe.pytorch import PrecisionDebugger

        debugger = PrecisionDebugger(config_path=spec.config_path)
    else:
        from msprobe.pytorch import TrainerMon

        monitor = TrainerMon(spec.config_path, params_have_main_grad=False)
        monitor.set_monitor(model, optimizer=opt, grad_acc_steps=1)

    dp = spec.parallel == "dp" and spec.init_dist and spec.world_size > 1
    losses: list[float] = []
    for step in range(spec.steps):
        faults.nan_active = spec.nan is not None and (step, rank) == (spec.nan.step, spec.nan.rank)
        faults.mlp_act_dtype = _dtype_map(spec, rank, step)
        scale = 1.0
        if spec.spike is not None and (step, rank) == (spec.spike.step, spec.spike.rank):
            scale = spec.spike.factor
        x, y = make_batch(cfg, step, rank if spec.parallel == "dp" and not spec.same_batch else 0)
        opt.zero_grad(set_to_none=True)
        if debugger is not None:
            debugger.start(model)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), y.reshape(-1))
        (loss * scale if scale != 1.0 else loss).backward()
        if dp:
            for p in model.parameters():
                if p.grad is None:  # a frozen parameter
                    continue
                dist.all_reduce(p.grad)
                if spec.divide_grads:
                    p.grad.div_(spec.world_size)
        opt.step()
        if debugger is not None:
            debugger.stop()
            debugger.step()
        losses.append(float(loss.detach()))

    finish_worker(rank, spec, losses)


def _start_config_check(spec: RunSpec, model: torch.nn.Module) -> None:
    """Attach msprobe's ConfigChecker (its pack records only ``spec.config_check_env`` as environment).

    The pack's ``env`` entry is ``os.environ`` at this moment: the generator's own environment
    (paths, tokens, ...) must not end up in a committed sample, so it is swapped for the listed
    variables while the checker packs, then restored.
    """
    from msprobe.core.config_check import ConfigChecker

    assert spec.config_check_zip is not None
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(dict(spec.config_check_env))
    try:
        ConfigChecker(model=model, shell_path=list(spec.config_check_inputs) or None,
                      output_zip_path=spec.config_check_zip, fmk="pytorch")
    finally:
        os.environ.clear()
        os.environ.update(saved)


def launch(spec: Any, fn: Callable[[int, Any], None] | None = None) -> dict[int, list[float]]:
    """Spawn ``spec.world_size`` workers running ``fn`` (default :func:`worker`); return losses.

    ``fn(rank, spec)`` must be a module-level function (it is pickled by reference) that calls
    :func:`start_worker` first and :func:`finish_worker` last.
    """
    spec.port = free_port()
    Path(spec.log_dir).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        mp.spawn(fn or worker, args=(spec,), nprocs=spec.world_size, join=True)
    except Exception as exc:
        tails = []
        for r in range(spec.world_size):
            log = Path(spec.log_dir) / f"{spec.tag}_rank{r}.log"
            if log.exists():
                tails.append(
                    f"--- {log} (tail) ---\n" + "\n".join(log.read_text().splitlines()[-30:])
                )
        raise RuntimeError(f"sample run {spec.tag!r} failed: {exc}\n" + "\n".join(tails)) from exc
    out = {}
    for r in range(spec.world_size):
        path = Path(spec.log_dir) / f"{spec.tag}_losses_rank{r}.json"
        out[r] = json.loads(path.read_text())
    return out
