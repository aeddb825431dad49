"""The tiny GPT written twice, the way two code bases name the same model (imports torch).

Both variants compute exactly what :class:`~precnb_samples._model.TinyGPT` computes, op for op,
with its weights (copied from a ``TinyGPT`` built with the same seed):

* :class:`TinyLlamaForCausalLM` — Hugging Face style: ``model.embed_tokens``,
  ``model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
  mlp.{up,down}_proj}``, ``model.norm``, ``lm_head``;
* :class:`GPTModel` — Megatron style: ``embedding.word_embeddings``,
  ``decoder.layers.N.{input_layernorm, self_attention.{linear_q, linear_k, linear_v,
  linear_proj}, pre_mlp_layernorm, mlp.{linear_fc1, linear_fc2}}``, ``decoder.final_layernorm``,
  ``output_layer``, with Megatron's class names and two extra ops that change no value: the
  embedding is multiplied by ``scale_emb = 1.0`` (a ``Tensor.__mul__`` that shifts every later
  ``Tensor.__mul__`` call counter) and the decoder input is cast with ``.float()`` (float32
  already; msprobe keeps this low-risk API out of dump.json).

:class:`MLP` of the Megatron variant can compute its activation with the tanh approximation of
GELU (``F.gelu(h, approximate="tanh")``) once :attr:`MLP.tanh_gelu` is set: the injected fault of
the ``renamed`` sample. :func:`worker` trains one variant under msprobe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from ._model import (
    ColumnParallelLinear,
    ModelConfig,
    RowParallelLinear,
    TinyGPT,
    TPGroup,
    make_batch,
    make_optimizer,
)
from ._train import WorkerSpec, finish_worker, start_worker

_TP1 = TPGroup(1, 0)
MODEL = ModelConfig(blocks=2)
STEPS = 2


def _linear(src: nn.Module) -> nn.Linear:
    lin = nn.Linear(src.weight.shape[1], src.weight.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(src.weight)
    return lin


def _norm_weight(norm: nn.Module, src: nn.Module) -> nn.Module:
    with torch.no_grad():
        norm.weight.copy_(src.weight)
    return norm


def _rms(x, weight, eps):
    # the same elementary ops, in the same order, as _model.RMSNorm
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _attend(q, k, v, mask, b, s, heads, head_dim):
    q = q.view(b, s, heads, head_dim).transpose(1, 2)
    k = k.view(b, s, heads, head_dim).transpose(1, 2)
    v = v.view(b, s, heads, head_dim).transpose(1, 2)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_dim)
    scores = scores.masked_fill(mask[:s, :s], float("-inf"))
    probs = F.softmax(scores, dim=-1)
    return torch.matmul(probs, v).transpose(1, 2).reshape(b, s, heads * head_dim)


# ----------------------------------------------------------------------- Hugging Face style
class TinyLlamaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        return _rms(hidden_states, self.weight, self.variance_epsilon)


class TinyLlamaAttention(nn.Module):
    def __init__(self, src: nn.Module) -> None:
        super().__init__()
        self.num_heads = src.local_heads
        self.head_dim = src.head_dim
        self.q_proj = _linear(src.q_proj)
        self.k_proj = _linear(src.k_proj)
        self.v_proj = _linear(src.v_proj)
        self.o_proj = _linear(src.o_proj)
        self.register_buffer("causal_mask", src.causal_mask.clone(), persistent=False)

    def forward(self, hidden_states):
        b, s, _ = hidden_states.shape
        q = self.q_proj(hidden_states)
        k = self.k_proj(hidden_states)
        v = self.v_proj(hidden_states)
        out = _attend(q, k, v, self.causal_mask, b, s, self.num_heads, self.head_dim)
        return self.o_proj(out)


class TinyLlamaMLP(nn.Module):
    def __init__(self, src: nn.Module) -> None:
        super().__init__()
        self.up_proj = _linear(src.up_proj)
        self.down_proj = _linear(src.down_proj)

    def forward(self, x):
        return self.down_proj(F.gelu(self.up_proj(x)))


class TinyLlamaDecoderLayer(nn.Module):
    def __init__(self, src: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = _norm_weight(TinyLlamaRMSNorm(src.attn_norm.weight.numel()), src.attn_norm)
        self.self_attn = TinyLlamaAttention(src.attn)
        self.post_attention_layernorm = _norm_weight(TinyLlamaRMSNorm(src.mlp_norm.weight.numel()), src.mlp_norm)
        self.mlp = TinyLlamaMLP(src.mlp)

    def forward(self, hidden_states):
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states))
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class TinyLlamaModel(nn.Module):
    def __init__(self, src: TinyGPT) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(*src.embed.weight.shape)
        with torch.no_grad():
            self.embed_tokens.weight.copy_(src.embed.weight)
        self.layers = nn.ModuleList(TinyLlamaDecoderLayer(b) for b in src.blocks)
        self.norm = _norm_weight(TinyLlamaRMSNorm(src.norm_out.weight.numel()), src.norm_out)

    def forward(self, input_ids):
        hidden_states = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return self.norm(hidden_states)


class TinyLlamaForCausalLM(nn.Module):
    """Hugging Face style naming of the tiny GPT (baseline of the ``renamed`` sample)."""

    def __init__(self, src: TinyGPT) -> None:
        super().__init__()
        self.model = TinyLlamaModel(src)
        self.lm_head = _linear(src.lm_head)

    def forward(self, input_ids):
        return self.lm_head(self.model(input_ids))


# ---------------------------------------------------------------------------- Megatron style
class RMSNorm(nn.Module):
    def __init__(self, src: nn.Module) -> None:
        super().__init__()
        self.eps = src.eps
        self.weight = nn.Parameter(src.weight.detach().clone())

    def forward(self, x):
        return _rms(x, self.weight, self.eps)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, src: nn.Embedding) -> None:
        super().__init__()
        self.weight = nn.Parameter(src.weight.detach().clone())

    def forward(self, input_ids):
        return F.embedding(input_ids, self.weight)


class LanguageModelEmbedding(nn.Module):
    def __init__(self, src: nn.Embedding) -> None:
        super().__init__()
        self.word_embeddings = VocabParallelEmbedding(src)
        self.scale_emb = 1.0

    def forward(self, input_ids):
        # extra op of this code base: an embedding scale that happens to be 1.0
        return self.word_embeddings(input_ids) * self.scale_emb


class SelfAttention(nn.Module):
    def __init__(self, src: nn.Module) -> None:
        super().__init__()
        self.num_heads = src.local_heads
        self.head_dim = src.head_dim
        self.linear_q = ColumnParallelLinear(src.q_proj.weight.detach(), _TP1)
        self.linear_k = ColumnParallelLinear(src.k_proj.weight.detach(), _TP1)
        self.linear_v = ColumnParallelLinear(src.v_proj.weight.detach(), _TP1)
        self.linear_proj = RowParallelLinear(src.o_proj.weight.detach(), _TP1)
        self.register_buffer("causal_mask", src.causal_mask.clone(), persistent=False)

    def forward(self, hidden_states):
        b, s, _ = hidden_states.shape
        q = self.linear_q(hidden_states)
        k = self.linear_k(hidden_states)
        v = self.linear_v(hidden_states)
        out = _attend(q, k, v, self.causal_mask, b, s, self.num_heads, self.head_dim)
        return self.linear_proj(out)


class MLP(nn.Module):
    def __init__(self, src: nn.Module) -> None:
        super().__init__()
        self.linear_fc1 = ColumnParallelLinear(src.up_proj.weight.detach(), _TP1)
        self.linear_fc2 = RowParallelLinear(src.down_proj.weight.detach(), _TP1)
        self.tanh_gelu = False

    def forward(self, hidden_states):
        h = self.linear_fc1(hidden_states)
        h = F.gelu(h, approximate="tanh") if self.tanh_gelu else F.gelu(h)
        return self.linear_fc2(h)


class TransformerLayer(nn.Module):
    def __init__(self, src: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(src.attn_norm)
        self.self_attention = SelfAttention(src.attn)
        self.pre_mlp_layernorm = RMSNorm(src.mlp_norm)
        self.mlp = MLP(src.mlp)

    def forward(self, hidden_states):
        hidden_states = hidden_states + self.self_attention(self.input_layernorm(hidden_states))
        return hidden_states + self.mlp(self.pre_mlp_layernorm(hidden_states))


class TransformerBlock(nn.Module):
    def __init__(self, src: TinyGPT) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(b) for b in src.blocks)
        self.final_layernorm = RMSNorm(src.norm_out)

    def forward(self, hidden_states):
        hidden_states = hidden_states.float()  # extra (no-op) cast: fp32 residual stream
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return self.final_layernorm(hidden_states)


class GPTModel(nn.Module):
    """Megatron style naming of the tiny GPT (target of the ``renamed`` sample)."""

    def __init__(self, src: TinyGPT) -> None:
        super().__init__()
        self.embedding = LanguageModelEmbedding(src.embed)
        self.decoder = TransformerBlock(src)
        self.output_layer = ColumnParallelLinear(src.lm_head.weight.detach(), _TP1)

    def forward(self, input_ids):
        return self.output_layer(self.decoder(self.embedding(input_ids)))


# baseline module path -> target module path, for every module of a model with `blocks` blocks
def module_map(blocks: int) -> dict[str, str]:
    """Return the module correspondence (baseline path -> target path) by construction."""
    out = {
        "model.embed_tokens": "embedding.word_embeddings",
        "model.norm": "decoder.final_layernorm",
        "lm_head": "output_layer",
    }
    for i in range(blocks):
        b, t = f"model.layers.{i}", f"decoder.layers.{i}"
        out[b] = t
        for bs, ts in (
            ("input_layernorm", "input_layernorm"),
            ("self_attn", "self_attention"),
            ("self_attn.q_proj", "self_attention.linear_q"),
            ("self_attn.k_proj", "self_attention.linear_k"),
            ("self_attn.v_proj", "self_attention.linear_v"),
            ("self_attn.o_proj", "self_attention.linear_proj"),
            ("post_attention_layernorm", "pre_mlp_layernorm"),
            ("mlp", "mlp"),
            ("mlp.up_proj", "mlp.linear_fc1"),
            ("mlp.down_proj", "mlp.linear_fc2"),
        ):
            out[f"{b}.{bs}"] = f"{t}.{ts}"
    return out


# ------------------------------------------------------------------------------- the runs
@dataclass(kw_only=True)
class NamedSpec(WorkerSpec):
    """One run of the renamed pair (picklable; see :func:`~._train.launch`)."""

    variant: str  # "baseline" (Hugging Face names) or "target" (Megatron names)
    fault_from_step: int | None = None


def worker(rank: int, spec: NamedSpec) -> None:
    """Train one variant for ``spec.steps`` steps under msprobe (one process, gloo world of 1)."""
    start_worker(rank, spec)
    cfg = spec.model
    src = TinyGPT(cfg)  # draws the weights; both variants copy them
    model: Any = TinyLlamaForCausalLM(src) if spec.variant == "baseline" else GPTModel(src)
    del src
    opt = make_optimizer(model, cfg)
    from msprobe.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(config_path=spec.config_path)
    losses = []
    for step in range(spec.steps):
        if spec.fault_from_step is not None:
            model.decoder.layers[-1].mlp.tanh_gelu = step >= spec.fault_from_step
        x, y = make_batch(cfg, step, rank)
        opt.zero_grad(set_to_none=True)
        debugger.start(model)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        debugger.stop()
        debugger.step()
        losses.append(float(loss.detach()))
    finish_worker(rank, spec, losses)
