"""Training worker of the faulty-device samples (issue 28): TP=2 x DP=2 on 4 ranks under msprobe (imports torch).

The tiny GPT of the ``tp`` sample (hand-written Megatron column/row-parallel linears) runs on a
world of 4 = tp2 x dp2 in Megatron's rank order (TP fastest: TP groups {0, 1} and {2, 3}, DP
groups {0, 2} and {1, 3}). Each rank is *placed* on a ``(host, device)`` by the job's rank
table. A faulty device is a property of the placement, not of the code: the process whose rank
sits on :attr:`SdcRun.faulty_device` computes ``torch.rsqrt`` wrongly on one call of chosen steps
(one bit of one output element flipped), whatever rank it serves.

``torch.rsqrt`` is replaced *before* msprobe wraps torch's API, so msprobe records the faulty
function as ``Torch.rsqrt``: its input as given, its output as (mis)computed, exactly what a
device that computes wrongly shows in a dump. The flip itself uses functions bound at import
(invisible to msprobe).

The gradients of the TP-replicated parameters (embedding, RMSNorm weights, lm_head) are averaged
over the TP group (exact for identical replicas, so a clean run is unchanged; it keeps the
replicas in sync after a departure, as Megatron's layer-norm gradient all-reduce does under
sequence parallelism), then every gradient is averaged over the DP group, so after each optimizer
step the replicated parameters are bit-identical again and a later fault meets identical inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812

from . import _train
from ._model import Faults, ModelConfig, TinyGPT, TPGroup, make_batch, make_optimizer

_RSQRT = torch.rsqrt
_DETACH = torch.Tensor.detach
_NUMPY = torch.Tensor.numpy

TP = 2
DP = 2
WORLD = TP * DP
NOISE_STD = 0.01  # NEFTune-like embedding noise, drawn from the default generator
NOISE_SEED = 1000  # the noise generator's seed is NOISE_SEED + dp_rank (identical on TP replicas)
TP_SEED_OFFSET = 2718  # Megatron's tensor-model-parallel RNG offset (the seed bug of ``sdc_rank``)


def tp_rank(rank: int) -> int:
    """The TP rank of a global rank (TP fastest)."""
    return rank % TP


def dp_rank(rank: int) -> int:
    """The DP rank of a global rank."""
    return rank // TP


def tp_groups() -> list[list[int]]:
    """Ranks of each TP group."""
    return [[d * TP + t for t in range(TP)] for d in range(DP)]


def dp_groups() -> list[list[int]]:
    """Ranks of each DP group."""
    return [[d * TP + t for d in range(DP)] for t in range(TP)]


@dataclass(frozen=True)
class DeviceFault:
    """The faulty device's wrong result: bit ``bit`` of output element ``position`` of ``torch.rsqrt``.

    ``call`` counts the ``torch.rsqrt`` calls of one training step from 0 (the RMSNorms of the
    MLP-only model: 0 = blocks.0.mlp_norm, 1 = norm_out), ``steps`` the steps at which the device
    errs.
    """

    steps: tuple[int, ...]
    call: int = 0
    position: tuple[int, int, int] = (1, 5, 0)
    bit: int = 22


class _FaultState:
    """Per-process state of the faulty ``torch.rsqrt`` (armed on the faulty device only)."""

    def __init__(self) -> None:
        self.fault: DeviceFault | None = None
        self.step = -1
        self.calls = 0
        self.flipped: list[dict] = []

    def begin_step(self, step: int) -> None:
        self.step = step
        self.calls = 0


STATE = _FaultState()


def faulty_rsqrt(input, *args, **kwargs):
    """``torch.rsqrt`` as the faulty device computes it (correct except the armed call)."""
    out = _RSQRT(input, *args, **kwargs)
    f = STATE.fault
    if f is not None and STATE.step in f.steps and STATE.calls == f.call:
        view = _NUMPY(_DETACH(out)).view("int32")  # shares memory with ``out``
        before = float(_NUMPY(_DETACH(out))[f.position])
        view[f.position] ^= 1 << f.bit
        STATE.flipped.append({"step": STATE.step, "call": STATE.calls, "position": list(f.position),
                              "bit": f.bit, "correct": before,
                              "computed": float(_NUMPY(_DETACH(out))[f.position])})
    STATE.calls += 1
    return out


@dataclass(kw_only=True)
class SdcRun(_train.WorkerSpec):
    """One job of the faulty-device samples."""

    placement: dict[int, tuple[str, str]] = field(default_factory=dict)  # rank -> (host, device)
    faulty_device: tuple[str, str] | None = None
    fault: DeviceFault | None = None
    tp_seeded_noise: bool = False  # the noise generator seeded with + TP_SEED_OFFSET * tp_rank (a bug)
    stop_before_sync: bool = False  # end the dumped region after backward (before the grad sync and optimizer)


def _replicated(name: str) -> bool:
    """Whether a parameter is replicated across the TP ranks (not column/row-parallel)."""
    return not any(k in name for k in ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"))


def _grad_buffer(model: torch.nn.Module) -> tuple[torch.Tensor, int]:
    """One zeroed gradient buffer whose slices are the parameters' ``.grad`` (replicated ones first).

    Backward accumulates into the views in place, so one all-reduce per group syncs every
    gradient (as Megatron's DDP buckets do) and the dump holds a handful of collectives.
    """
    params = sorted(model.named_parameters(), key=lambda kv: not _replicated(kv[0]))
    buffer = torch.zeros(sum(p.numel() for _, p in params))
    offset = n_replicated = 0
    for name, p in params:
        p.grad = buffer[offset: offset + p.numel()].view_as(p)
        offset += p.numel()
        if _replicated(name):
            n_replicated = offset
    return buffer, n_replicated


def worker(rank: int, run: SdcRun) -> None:
    """Train one rank of the tp2 x dp2 job under msprobe."""
    _train.start_worker(rank, run)
    on_faulty = run.faulty_device is not None and run.placement[rank] == run.faulty_device
    STATE.fault = run.fault if on_faulty else None
    torch.rsqrt = faulty_rsqrt  # before msprobe wraps torch: the device's own rsqrt
    groups = {}
    for ranks in tp_groups() + dp_groups():  # every rank creates every group, in the same order
        groups[tuple(ranks)] = dist.new_group(ranks=ranks)
    tp_group = next(g for r, g in groups.items() if rank in r and list(r) in tp_groups())
    dp_group = next(g for r, g in groups.items() if rank in r and list(r) in dp_groups())
    cfg: ModelConfig = run.model
    faults = Faults(embed_noise_std=NOISE_STD)
    model = TinyGPT(cfg, faults, TPGroup(TP, tp_rank(rank), tp_group))
    opt = make_optimizer(model, cfg)
    offset = TP_SEED_OFFSET * tp_rank(rank) if run.tp_seeded_noise else 0
    torch.manual_seed(NOISE_SEED + dp_rank(rank) + offset)

    buffer, n_replicated = _grad_buffer(model)

    from msprobe.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(config_path=run.config_path)
    losses: list[float] = []
    for step in range(run.steps):
        STATE.begin_step(step)
        x, y = make_batch(cfg, step, dp_rank(rank))
        buffer.zero_()  # the gradients are views of one buffer (Megatron's contiguous grad buffer)
        debugger.start(model)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), y.reshape(-1))
        loss.backward()
        if run.stop_before_sync:
            debugger.stop()
        replicated = buffer[:n_replicated]
        dist.all_reduce(replicated, group=tp_group)
        replicated.div_(TP)
        dist.all_reduce(buffer, group=dp_group)
        buffer.div_(DP)
        opt.step()
        if not run.stop_before_sync:
            debugger.stop()
        debugger.step()
        _check_views(model, buffer)
        losses.append(float(loss.detach()))
    _train.finish_worker(rank, run, {"losses": losses, "flipped": STATE.flipped})  # type: ignore[arg-type]


def _check_views(model: torch.nn.Module, buffer: torch.Tensor) -> None:
    """Every gradient still lives in the buffer (backward accumulated in place)."""
    base = buffer.data_ptr()
    end = base + buffer.numel() * buffer.element_size()
    for name, p in model.named_parameters():
        if p.grad is None or not base <= p.grad.data_ptr() < end:
            raise RuntimeError(f"the gradient of {name} left the gradient buffer")


def launch(run: SdcRun) -> dict[int, dict]:
    """Spawn the 4 ranks; return each rank's ``{"losses": [...], "flipped": [...]}``."""
    return _train.launch(run, worker)  # type: ignore[return-value]
