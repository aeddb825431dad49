"""Tiny GPT-like model used by the sample generator (imports torch at module import).

The model is deliberately small (a few thousand parameters) so that msprobe statistics dumps of
all samples stay small. The attention and MLP linears can be plain ``nn.Linear`` (data-parallel
samples) or hand-written Megatron-style column/row-parallel linears (tensor-parallel sample).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the tiny GPT."""

    vocab: int = 64
    hidden: int = 16
    heads: int = 2
    ffn: int = 32
    blocks: int = 2
    seq: int = 8
    batch: int = 2
    lr: float = 1e-2
    weight_decay: float = 0.01
    seed: int = 1234
    lm_head_bias: bool = False  # an extra parameter (``lm_head.bias``, zero-initialised)
    fused_adamw: bool = True  # False: torch's single-tensor AdamW (about nine in-place ops per parameter)
    attention: bool = True  # False: MLP-only blocks (x + mlp(mlp_norm(x))), fewer nodes per dump
    optimizer: str = "adamw"  # "sgd": torch's single-tensor SGD with momentum (three in-place ops per parameter)
    momentum: float = 0.9  # of the SGD optimizer

    def describe(self) -> str:
        """Return a one-line description for ground-truth files and the README."""
        if self.optimizer == "sgd":
            opt = f"SGD(lr={self.lr}, momentum={self.momentum}, weight_decay={self.weight_decay}, foreach=False)"
        else:
            opt = (f"AdamW(lr={self.lr}, weight_decay={self.weight_decay}, "
                   f"{'fused=True' if self.fused_adamw else 'foreach=False, fused=False'})")
        blocks = "pre-norm blocks (RMSNorm)" if self.attention else "pre-norm MLP-only blocks (RMSNorm, no attention)"
        return (
            f"TinyGPT: vocab {self.vocab}, hidden {self.hidden}, {self.heads} heads, "
            f"ffn {self.ffn}, {self.blocks} {blocks}, seq {self.seq}, "
            f"batch {self.batch} per rank, "
            f"{'a zero-initialised lm_head bias' if self.lm_head_bias else 'no biases'}, {opt}, "
            f"no grad clipping, seed {self.seed}"
        )


@dataclass
class Faults:
    """Mutable per-step switches read by the model's forward (set by the training loop).

    Attributes
    ----------
    nan_attention_block:
        Block index whose attention scores get ``+ sqrt(poison)``, where ``poison`` is zero
        everywhere except ``-1`` at ``nan_position`` while ``nan_active`` is true (so the
        ``Torch.sqrt`` output holds exactly one NaN and its input is finite). The position is
        assigned (``Tensor.__setitem__``) on every step so all ranks and steps record the same
        nodes. ``None`` disables the extra ops altogether.
    nan_active:
        Whether the poison holds the ``-1`` in this step (otherwise it is all zeros and the
        extra ops change nothing).
    nan_position:
        ``(batch, head, query, key)`` of the NaN in the scores.
    mlp_act_dtype:
        Per-block dtype in which the MLP activation (GELU) is computed; the activation input is
        cast with ``Tensor.to`` and the result cast back to float32. float32 casts are no-ops.
    hidden_dropout:
        Probability of the (Megatron "hidden") dropout applied with ``F.dropout`` to each block's
        attention and MLP outputs before the residual adds; 0 leaves the ops out altogether.
    residual_scale:
        Per-block factor applied to the attention branch before the residual add
        (``x + attn(norm(x)) * scale``); blocks not listed add the branch unscaled and record no
        extra op. A healthy run lists the block with 1.0, a buggy one with another factor, so
        both record the same nodes.
    embed_noise_std:
        Standard deviation of the (NEFTune-like) noise ``torch.normal(0, std, size)`` added to
        the embedding output, drawn from the default generator; 0 leaves the ops out.
    final_scale:
        Factor the hidden states are multiplied by before the final RMSNorm (set per step by the
        training loop); ``None`` leaves the op out.
    final_norm_half:
        Compute the final RMSNorm in float16 (its input cast with ``Tensor.half``), as a port that
        drops the float32 upcast of the norm: ``x.pow(2)`` overflows once ``|x| > 255.9``.
    """

    nan_attention_block: int | None = None
    nan_active: bool = False
    nan_position: tuple[int, int, int, int] = (0, 0, 5, 3)
    mlp_act_dtype: dict[int, torch.dtype] = field(default_factory=dict)
    hidden_dropout: float = 0.0
    residual_scale: dict[int, float] = field(default_factory=dict)
    embed_noise_std: float = 0.0
    final_scale: float | None = None
    final_norm_half: bool = False


class TPGroup:
    """Tensor-parallel context: ``size`` ranks, ``rank`` within them (None = no TP).

    ``group`` is the torch.distributed process group of the TP ranks; ``None`` means the default
    group (the TP=2 samples whose world is the TP group). Only a real group is passed on to the
    collectives, so the default-group samples record the same nodes and arguments as before.
    """

    def __init__(self, size: int, rank: int, group: object | None = None) -> None:
        self.size = size
        self.rank = rank
        self.group = group


def _all_reduce(x: torch.Tensor, group: object | None) -> None:
    if group is None:
        dist.all_reduce(x)
    else:
        dist.all_reduce(x, group=group)


class _CopyToTP(torch.autograd.Function):
    """Identity in forward, all-reduce of the input gradient in backward (Megatron ``f``)."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        _all_reduce(grad, ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """In-place all-reduce of the partial sums in forward, identity in backward (Megatron ``g``)."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.mark_dirty(x)
        _all_reduce(x, group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    """Linear whose weight is split along the output dim; the output stays sharded."""

    def __init__(self, full_weight: torch.Tensor, tp: TPGroup) -> None:
        super().__init__()
        out_features = full_weight.shape[0]
        per = out_features // tp.size
        shard = full_weight[tp.rank * per : (tp.rank + 1) * per].clone()
        self.weight = nn.Parameter(shard)
        self.tp = tp

    def forward(self, x):
        if self.tp.size > 1:
            x = _CopyToTP.apply(x, self.tp.group)
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    """Linear whose weight is split along the input dim; the partial output is all-reduced."""

    def __init__(self, full_weight: torch.Tensor, tp: TPGroup) -> None:
        super().__init__()
        in_features = full_weight.shape[1]
        per = in_features // tp.size
        shard = full_weight[:, tp.rank * per : (tp.rank + 1) * per].clone()
        self.weight = nn.Parameter(shard)
        self.tp = tp

    def forward(self, x):
        partial = F.linear(x, self.weight)
        if self.tp.size > 1:
            return _ReduceFromTP.apply(partial, self.tp.group)
        return partial


class RMSNorm(nn.Module):
    """Root-mean-square norm written out in elementary ops (as in many LLM code bases)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _make_linear(in_f: int, out_f: int, kind: str, tp: TPGroup | None) -> nn.Module:
    """Create a linear drawn from the global RNG; TP variants slice the same full weight."""
    full = nn.Linear(in_f, out_f, bias=False)
    if tp is None:
        return full
    cls = ColumnParallelLinear if kind == "column" else RowParallelLinear
    return cls(full.weight.detach(), tp)


class Attention(nn.Module):
    """Causal multi-head self-attention (masked_fill(-inf) + softmax)."""

    def __init__(self, cfg: ModelConfig, index: int, faults: Faults, tp: TPGroup | None) -> None:
        super().__init__()
        self.index = index
        self.faults = faults
        self.head_dim = cfg.hidden // cfg.heads
        tp_size = tp.size if tp is not None else 1
        self.local_heads = cfg.heads // tp_size
        self.q_proj = _make_linear(cfg.hidden, cfg.hidden, "column", tp)
        self.k_proj = _make_linear(cfg.hidden, cfg.hidden, "column", tp)
        self.v_proj = _make_linear(cfg.hidden, cfg.hidden, "column", tp)
        self.o_proj = _make_linear(cfg.hidden, cfg.hidden, "row", tp)
        mask = torch.triu(torch.ones(cfg.seq, cfg.seq, dtype=torch.bool), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.local_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.local_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.local_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        if self.faults.nan_attention_block == self.index:
            poison = torch.zeros_like(scores)
            # same ops on every step and rank; only the value differs when the fault is active
            poison[self.faults.nan_position] = -1.0 if self.faults.nan_active else 0.0
            scores = scores + torch.sqrt(poison)
        scores = scores.masked_fill(self.causal_mask[:s, :s], float("-inf"))
        probs = F.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    """Up projection, GELU, down projection."""

    def __init__(self, cfg: ModelConfig, index: int, faults: Faults, tp: TPGroup | None) -> None:
        super().__init__()
        self.index = index
        self.faults = faults
        self.up_proj = _make_linear(cfg.hidden, cfg.ffn, "column", tp)
        self.down_proj = _make_linear(cfg.ffn, cfg.hidden, "row", tp)

    def forward(self, x):
        h = self.up_proj(x)
        dtype = self.faults.mlp_act_dtype.get(self.index)
        h = F.gelu(h) if dtype is None else F.gelu(h.to(dtype)).to(torch.float32)
        return self.down_proj(h)


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, cfg: ModelConfig, index: int, faults: Faults, tp: TPGroup | None) -> None:
        super().__init__()
        self.attn_norm: RMSNorm | None = RMSNorm(cfg.hidden) if cfg.attention else None
        self.attn: Attention | None = Attention(cfg, index, faults, tp) if cfg.attention else None
        self.mlp_norm = RMSNorm(cfg.hidden)
        self.mlp = MLP(cfg, index, faults, tp)
        self.index = index
        self.faults = faults

    def _dropout(self, h):
        p = self.faults.hidden_dropout
        return F.dropout(h, p=p, training=True) if p else h

    def forward(self, x):
        if self.attn is not None:
            branch = self._dropout(self.attn(self.attn_norm(x)))
            scale = self.faults.residual_scale.get(self.index)
            x = x + (branch if scale is None else branch * scale)
        return x + self._dropout(self.mlp(self.mlp_norm(x)))


class TinyGPT(nn.Module):
    """Embedding, pre-norm blocks, final RMSNorm, lm_head."""

    def __init__(self, cfg: ModelConfig, faults: Faults | None = None, tp: TPGroup | None = None):
        super().__init__()
        self.faults = faults if faults is not None else Faults()
        torch.manual_seed(cfg.seed)
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        with torch.no_grad():
            self.embed.weight.mul_(0.5)
        self.blocks = nn.ModuleList(Block(cfg, i, self.faults, tp) for i in range(cfg.blocks))
        self.norm_out = RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=cfg.lm_head_bias)
        if cfg.lm_head_bias:  # created last: every other parameter is initialised as without it
            with torch.no_grad():
                self.lm_head.bias.zero_()

    def forward(self, tokens):
        x = self.embed(tokens)
        f = self.faults
        if f.embed_noise_std:
            x = x + torch.normal(0.0, f.embed_noise_std, size=tuple(x.shape))
        for block in self.blocks:
            x = block(x)
        if f.final_scale is not None:
            x = x * f.final_scale
        if f.final_norm_half:
            return self.lm_head(self.norm_out(x.half()).float())
        return self.lm_head(self.norm_out(x))


def make_batch(cfg: ModelConfig, step: int, data_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic token batch for one step and data-parallel rank (inputs, targets)."""
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + step * 10 + data_rank)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def make_optimizer(model: nn.Module, cfg: ModelConfig) -> torch.optim.Optimizer:
    """AdamW with the fused implementation (one ``Torch._fused_adamw_`` record per step).

    The CPU default (single-tensor, ``foreach=False``) records about nine in-place ops per
    parameter, which would make the committed dumps ~40% larger; the shared S1 sample already
    shows that form (``cfg.fused_adamw=False`` selects it: the ``preflight/lr10`` sample).
    """
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay, foreach=False)
    if not cfg.fused_adamw:
        return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=False)
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True
    )
