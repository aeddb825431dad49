"""The tiny GPT ported to MindSpore 2.10 with MindFormers-style names (imports mindspore).

Run only inside the MindSpore interpreter (``PRECNB_MINDSPORE_PYTHON``) by the worker scripts
``_ms_port_worker.py`` and ``_ms_kernel_worker.py``; precnb itself never imports this module. It
mirrors :mod:`precnb_samples._model` operation by operation so that, with the same weights and
batches, both frameworks compute the same numbers (to fp32 rounding):

======================  ===========================================
PyTorch (``_model``)     MindSpore (this module)
======================  ===========================================
``embed``                ``tok_embeddings`` (``embedding_table``)
``blocks.i``             ``layers.i`` (``DecoderLayer``)
``attn_norm``            ``attention_norm``
``attn.q_proj`` ...      ``attention.wq`` ... (``Dense``)
``mlp_norm``             ``ffn_norm``
``mlp.up_proj/down``     ``feed_forward.w1/w2``
``norm_out``, ``lm_head``  the same
======================  ===========================================

CPU notes (MindSpore 2.10): ``ops.rms_norm`` has no CPU kernel, so RMSNorm is composed from
basic ops (as in the PyTorch model); GELU is exact (``approximate="none"``, MindSpore's default
is the tanh form).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from mindspore import Parameter, Tensor, nn, ops  # type: ignore[import-not-found]

# PyTorch parameter name -> MindSpore parameter name (for a model with ``blocks`` layers)
_BLOCK_MAP = {
    "attn_norm.weight": "attention_norm.weight",
    "attn.q_proj.weight": "attention.wq.weight",
    "attn.k_proj.weight": "attention.wk.weight",
    "attn.v_proj.weight": "attention.wv.weight",
    "attn.o_proj.weight": "attention.wo.weight",
    "mlp_norm.weight": "ffn_norm.weight",
    "mlp.up_proj.weight": "feed_forward.w1.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
}


def param_name_map(blocks: int) -> dict[str, str]:
    """PyTorch state-dict name -> MindSpore parameter name."""
    out = {"embed.weight": "tok_embeddings.embedding_table"}
    for i in range(blocks):
        out.update({f"blocks.{i}.{k}": f"layers.{i}.{v}" for k, v in _BLOCK_MAP.items()})
    out["norm_out.weight"] = "norm_out.weight"
    out["lm_head.weight"] = "lm_head.weight"
    return out


class RMSNorm(nn.Cell):
    """``x * rsqrt(mean(x**2) + eps) * weight`` in elementary ops."""

    def __init__(self, dim: int, eps: float = 1e-6, init: str = "ones") -> None:
        super().__init__()
        self.eps = eps
        data = np.ones(dim, np.float32) if init == "ones" else np.zeros(dim, np.float32)
        self.weight = Parameter(Tensor(data), name="weight")

    def construct(self, x: Any) -> Any:
        var = x.pow(2).mean(-1, keep_dims=True)
        return x * ops.rsqrt(var + self.eps) * self.weight


class Attention(nn.Cell):
    """Causal multi-head self-attention (masked_fill(-inf) + softmax)."""

    def __init__(self, cfg: dict[str, int]) -> None:
        super().__init__()
        h = cfg["hidden"]
        self.heads = cfg["heads"]
        self.head_dim = h // self.heads
        self.wq = nn.Dense(h, h, has_bias=False)
        self.wk = nn.Dense(h, h, has_bias=False)
        self.wv = nn.Dense(h, h, has_bias=False)
        self.wo = nn.Dense(h, h, has_bias=False)
        self.mask = Tensor(np.triu(np.ones((cfg["seq"], cfg["seq"]), np.bool_), k=1))
        self.scale = math.sqrt(self.head_dim)

    def construct(self, x: Any) -> Any:
        b, s, _ = x.shape
        q = self.wq(x).reshape(b, s, self.heads, self.head_dim).transpose(0, 2, 1, 3)
        k = self.wk(x).reshape(b, s, self.heads, self.head_dim).transpose(0, 2, 1, 3)
        v = self.wv(x).reshape(b, s, self.heads, self.head_dim).transpose(0, 2, 1, 3)
        scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) / self.scale
        scores = ops.masked_fill(scores, self.mask, float("-inf"))
        probs = ops.softmax(scores, axis=-1)
        out = ops.matmul(probs, v).transpose(0, 2, 1, 3).reshape(b, s, self.heads * self.head_dim)
        return self.wo(out)


class FeedForward(nn.Cell):
    """w1, exact GELU, w2."""

    def __init__(self, cfg: dict[str, int]) -> None:
        super().__init__()
        self.w1 = nn.Dense(cfg["hidden"], cfg["ffn"], has_bias=False)
        self.w2 = nn.Dense(cfg["ffn"], cfg["hidden"], has_bias=False)

    def construct(self, x: Any) -> Any:
        return self.w2(ops.gelu(self.w1(x), approximate="none"))


class DecoderLayer(nn.Cell):
    """Pre-norm transformer block."""

    def __init__(self, cfg: dict[str, int], norm_eps: dict[str, float], norm_init: str) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg["hidden"], norm_eps.get("attention_norm", 1e-6), norm_init)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg["hidden"], norm_eps.get("ffn_norm", 1e-6), norm_init)
        self.feed_forward = FeedForward(cfg)

    def construct(self, x: Any) -> Any:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class TinyGPT(nn.Cell):
    """Embedding, pre-norm decoder layers, final RMSNorm, lm_head.

    Parameters
    ----------
    cfg : dict
        ``vocab, hidden, heads, ffn, blocks, seq``.
    eps : dict, optional
        ``{"layers.1.ffn_norm": 1e-2}``: a norm's epsilon (the default is 1e-6 everywhere).
    norm_init : {"ones", "zeros"}
        Initial RMSNorm weights (before a checkpoint is loaded).
    """

    def __init__(self, cfg: dict[str, int], eps: dict[str, float] | None = None,
                 norm_init: str = "ones") -> None:
        super().__init__()
        eps = eps or {}
        self.tok_embeddings = nn.Embedding(cfg["vocab"], cfg["hidden"])
        layers = []
        for i in range(cfg["blocks"]):
            own = {k.split(".")[-1]: v for k, v in eps.items() if k.startswith(f"layers.{i}.")}
            layers.append(DecoderLayer(cfg, own, norm_init))
        self.layers = nn.CellList(layers)
        self.norm_out = RMSNorm(cfg["hidden"], eps.get("norm_out", 1e-6), norm_init)
        self.lm_head = nn.Dense(cfg["hidden"], cfg["vocab"], has_bias=False)

    def construct(self, tokens: Any) -> Any:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm_out(x))


def load_torch_state(net: TinyGPT, state: dict[str, np.ndarray], blocks: int) -> dict[str, str]:
    """Copy a PyTorch state dict (numpy arrays) into *net*; assert every value is bit-equal.

    Returns the name map used.
    """
    names = param_name_map(blocks)
    params = {p.name: p for p in net.get_parameters()}
    if set(params) != set(names.values()):
        raise RuntimeError(f"parameter names differ: {sorted(set(params) ^ set(names.values()))}")
    for pt_name, ms_name in names.items():
        value = np.ascontiguousarray(state[pt_name], dtype=np.float32)
        params[ms_name].set_data(Tensor(value))
        if not np.array_equal(params[ms_name].asnumpy(), value):
            raise RuntimeError(f"{ms_name} is not bit-equal to {pt_name} after loading")
    return names


def adamw_numpy(params: list[Any], grads: list[Any], state: dict[str, Any], step: int, *,
                lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999),
                eps: float = 1e-8) -> None:
    """torch.optim.AdamW's update in float32 numpy (runs outside the dump: no ops recorded)."""
    b1, b2 = betas
    bc1 = 1 - b1 ** step
    bc2 = 1 - b2 ** step
    for p, g in zip(params, grads, strict=True):
        w = p.asnumpy().astype(np.float32)
        g = g.asnumpy().astype(np.float32)
        m = state.setdefault(f"m.{p.name}", np.zeros_like(w))
        v = state.setdefault(f"v.{p.name}", np.zeros_like(w))
        w *= np.float32(1 - lr * weight_decay)
        m += (g - m) * np.float32(1 - b1)
        v *= np.float32(b2)
        v += np.float32(1 - b2) * g * g
        denom = np.sqrt(v) / np.float32(math.sqrt(bc2)) + np.float32(eps)
        w -= np.float32(lr / bc1) * m / denom
        p.set_data(Tensor(w))


def cross_entropy_loss(logits: Any, targets: Any, vocab: int) -> Any:
    """Mean cross entropy over all positions (``Functional.cross_entropy`` in the dump)."""
    return ops.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))


__all__ = ["Attention", "DecoderLayer", "FeedForward", "RMSNorm", "TinyGPT", "adamw_numpy",
           "cross_entropy_loss", "load_torch_state", "param_name_map"]
