"""Models of the diagnosis scenarios: a fused-attention custom op, an MoE block, a drifting scale.

Imports torch at module import (the generator's workers only).

* :class:`FusedAttention` is a ``torch.autograd.Function`` standing for a compiled attention
  kernel (FlashAttention-like). Its forward and backward call torch functions bound at import
  time (``_KERNEL_OPS``), before msprobe wraps torch's API, so msprobe records nothing of it
  unless it is registered with ``PrecisionDebugger.register_custom_api(kernels, "fused_attention",
  api_prefix=...)`` — exactly like a real custom kernel. :data:`KERNEL_FAULT` makes its backward
  produce one NaN in the query/key gradient at one (step, rank).
* :class:`MoE` is a top-1 mixture of experts whose load-balancing statistic divides each
  expert's summed router probability by its token count (:class:`ExpertMean`): an expert that
  receives no token gives 0/0 = NaN.
* :class:`DiagGPT` can multiply a few hidden dimensions by ``growth ** max(0, step - start)``
  right after the embedding (a timestep scaling written with the global step): block 0's RMSNorm
  sees its input minimum fall every step while the normalised output hides it.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from ._model import RMSNorm

# Bound before msprobe patches torch: calls through these are invisible to its hooks.
_KERNEL_OPS = {
    "matmul": torch.matmul,
    "softmax": torch.softmax,
    "masked_fill": torch.Tensor.masked_fill,
    "transpose": torch.Tensor.transpose,
    "mul": torch.mul,
    "sub": torch.sub,
    "add": torch.add,
    "sum": torch.sum,
    "sqrt": torch.sqrt,
    "zeros_like": torch.zeros_like,
    "index_put": torch.Tensor.index_put_,
}


@dataclass
class KernelFault:
    """When ``active``, the kernel's backward writes sqrt(-1) into dS at ``position``."""

    active: bool = False
    position: tuple[int, int, int, int] = (0, 1, 6, 2)


KERNEL_FAULT = KernelFault()


class FusedAttention(torch.autograd.Function):
    """Causal softmax attention in one op, with a hand-written backward."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        op = _KERNEL_OPS
        s = q.shape[-2]
        scores = op["mul"](op["matmul"](q, op["transpose"](k, -2, -1)), scale)
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        probs = op["softmax"](op["masked_fill"](scores, mask, float("-inf")), -1)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale = scale
        return op["matmul"](probs, v)

    @staticmethod
    def backward(ctx, grad):
        op = _KERNEL_OPS
        q, k, v, probs = ctx.saved_tensors
        dv = op["matmul"](op["transpose"](probs, -2, -1), grad)
        dp = op["matmul"](grad, op["transpose"](v, -2, -1))
        ds = op["mul"](probs, op["sub"](dp, op["sum"](op["mul"](dp, probs), -1, keepdim=True)))
        if KERNEL_FAULT.active:  # a kernel bug on one rank at one step: one NaN in dS
            poison = op["zeros_like"](ds)
            idx = tuple(torch.tensor([i]) for i in KERNEL_FAULT.position)
            op["index_put"](poison, idx, torch.tensor([-1.0]))
            ds = op["add"](ds, op["sqrt"](poison))
        ds = op["mul"](ds, ctx.scale)
        dq = op["matmul"](ds, k)
        dk = op["matmul"](op["transpose"](ds, -2, -1), q)
        return dq, dk, dv, None


def fused_attention(q, k, v, scale):
    """The custom op as user code calls it (looked up on this module at call time)."""
    return FusedAttention.apply(q, k, v, scale)


kernels = sys.modules[__name__]
"""The namespace holding :func:`fused_attention` (what ``register_custom_api`` patches)."""


class KernelAttention(nn.Module):
    """Causal self-attention whose core is the fused custom op."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        out = kernels.fused_attention(q, k, v, 1.0 / math.sqrt(self.head_dim))
        return self.o_proj(out.transpose(1, 2).reshape(b, s, h))


class Expert(nn.Module):
    """One expert: up projection, GELU, down projection."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.gelu(self.up_proj(x)))


class ExpertMean(nn.Module):
    """Per-expert mean router probability: summed probability / token count (0/0 when empty)."""

    def forward(self, prob_sum, tokens):
        return prob_sum / tokens


class MoE(nn.Module):
    """Top-1 mixture of experts; ``aux_loss`` is the load-balancing term of the last forward."""

    def __init__(self, hidden: int, ffn: int, experts: int) -> None:
        super().__init__()
        self.n = experts
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden, ffn) for _ in range(experts))
        self.balance = ExpertMean()
        self.aux_loss = torch.zeros(())

    def forward(self, x):
        b, s, h = x.shape
        flat = x.reshape(b * s, h)
        probs = F.softmax(self.router(flat), dim=-1)
        choice = torch.argmax(probs, dim=-1)
        onehot = F.one_hot(choice, self.n).to(probs.dtype)
        tokens = onehot.sum(0)
        mean_prob = self.balance((probs * onehot).sum(0), tokens)
        self.aux_loss = (mean_prob * tokens / (b * s)).sum() * self.n
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            idx = torch.nonzero(choice == e).flatten()
            if idx.numel():
                out = out.index_add(0, idx, expert(flat[idx]) * probs[idx, e].unsqueeze(-1))
        return out.reshape(b, s, h)


class DiagBlock(nn.Module):
    """Pre-norm block; attention ``standard`` (nn ops), ``kernel`` (custom op) or ``none``; MLP or MoE."""

    def __init__(self, hidden: int, heads: int, ffn: int, *, attention: str, experts: int = 0) -> None:
        super().__init__()
        from ._model import Attention, Faults, ModelConfig

        self.attn_norm = RMSNorm(hidden)
        self.attn: nn.Module | None
        if attention == "none":
            self.attn = None
        elif attention == "kernel":
            self.attn = KernelAttention(hidden, heads)
        else:
            self.attn = Attention(ModelConfig(hidden=hidden, heads=heads, ffn=ffn), 0, Faults(), None)
        self.mlp_norm = RMSNorm(hidden)
        self.mlp: nn.Module = MoE(hidden, ffn, experts) if experts else Expert(hidden, ffn)

    def forward(self, x):
        if self.attn is not None:
            x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


@dataclass(frozen=True)
class DiagModel:
    """Shape of the diagnosis models."""

    vocab: int = 64
    hidden: int = 16
    heads: int = 2
    ffn: int = 32
    blocks: int = 2
    seq: int = 8
    batch: int = 2
    attention: str = "standard"
    experts: int = 0
    scale_dims: tuple[int, ...] = ()
    scale_growth: float = 1.0
    scale_start: int = 0
    lr: float = 1e-2
    seed: int = 1234

    def describe(self) -> str:
        """One line for the ground truth and the README."""
        parts = [f"TinyGPT variant: vocab {self.vocab}, hidden {self.hidden}, {self.heads} heads, ffn {self.ffn}, "
                 f"{self.blocks} pre-norm block(s) (RMSNorm), seq {self.seq}, batch {self.batch} per rank"]
        if self.attention == "kernel":
            parts.append("attention core = a torch.autograd.Function custom op (fused_attention)")
        if self.attention == "none":
            parts.append("no attention (embedding -> MoE block)")
        if self.experts:
            parts.append(f"MLP = top-1 MoE with {self.experts} experts")
        if self.scale_dims:
            parts.append(f"hidden dims {list(self.scale_dims)} scaled by {self.scale_growth}**(step-"
                         f"{self.scale_start}) before block 0")
        parts.append(f"AdamW(lr={self.lr}, fused=True), seed {self.seed}")
        return "; ".join(parts)


class DiagGPT(nn.Module):
    """Embedding, optional timestep scale, blocks, final RMSNorm, lm_head."""

    def __init__(self, cfg: DiagModel) -> None:
        super().__init__()
        torch.manual_seed(cfg.seed)
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        with torch.no_grad():
            self.embed.weight.mul_(0.5)
        self.cfg = cfg
        self.step = 0
        mask = torch.zeros(cfg.hidden)
        mask[list(cfg.scale_dims)] = 1.0
        self.register_buffer("scale_mask", mask, persistent=False)
        self.blocks = nn.ModuleList(DiagBlock(cfg.hidden, cfg.heads, cfg.ffn, attention=cfg.attention,
                                              experts=cfg.experts) for _ in range(cfg.blocks))
        self.norm_out = RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        if self.cfg.scale_dims:  # a timestep scaling written with the global step (the drift's cause)
            factor = self.cfg.scale_growth ** max(0, self.step - self.cfg.scale_start)
            x = x * (1.0 + (factor - 1.0) * self.scale_mask)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_out(x))

    def aux_loss(self):
        """Sum of the MoE load-balancing terms of the last forward (0 without MoE)."""
        terms = [b.mlp.aux_loss for b in self.blocks if isinstance(b.mlp, MoE)]
        return sum(terms) if terms else None
