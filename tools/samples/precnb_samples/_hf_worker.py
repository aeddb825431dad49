"""The Hugging Face side of the Megatron samples: the same weights in ``LlamaForCausalLM``, under msprobe.

Imported by ``_mg_worker.py`` (mode ``"hf"``) in the Megatron interpreter; imports neither precnb nor the
generator package. ``LlamaForCausalLM`` computes exactly what Megatron-Core's ``GPTModel`` with the local
layer spec computes for the config the samples use (RMSNorm, SwiGLU, RoPE with ``rotate_half``, biases on
every linear layer, untied output layer, no dropout): Megatron's fused ``linear_qkv`` (per query group
``[q heads of the group; k; v]``) is split into ``q_proj`` / ``k_proj`` / ``v_proj``, its ``linear_fc1``
(``[gate; up]``) into ``gate_proj`` / ``up_proj``; every other tensor is renamed only.
"""

from __future__ import annotations

from typing import Any


def hf_name_map(model: dict[str, Any]) -> dict[str, list[tuple[str, str, int, int]]]:
    """Megatron whole-model parameter -> ``[(hf name, axis-0 slice kind, start, stop), ...]`` rows.

    The rows of a fused Megatron weight (and bias) that each Hugging Face parameter takes.
    """
    heads, groups = model["heads"], model.get("groups", model["heads"])
    hd = model["hidden"] // heads
    qpg = heads // groups
    ffn = model["ffn"]
    out: dict[str, list[tuple[str, str, int, int]]] = {
        "embedding.word_embeddings.weight": [("model.embed_tokens.weight", "all", 0, 0)],
        "decoder.final_layernorm.weight": [("model.norm.weight", "all", 0, 0)],
        "output_layer.weight": [("lm_head.weight", "all", 0, 0)],
    }
    for i in range(model["layers"]):
        mg, hf = f"decoder.layers.{i}.", f"model.layers.{i}."
        out[mg + "input_layernorm.weight"] = [(hf + "input_layernorm.weight", "all", 0, 0)]
        out[mg + "pre_mlp_layernorm.weight"] = [(hf + "post_attention_layernorm.weight", "all", 0, 0)]
        for kind in ("weight", "bias"):
            rows: list[tuple[str, str, int, int]] = []
            for g in range(groups):
                base = g * (qpg + 2) * hd
                rows.append((hf + f"self_attn.q_proj.{kind}", "rows", base, base + qpg * hd))
                rows.append((hf + f"self_attn.k_proj.{kind}", "rows", base + qpg * hd, base + (qpg + 1) * hd))
                rows.append((hf + f"self_attn.v_proj.{kind}", "rows", base + (qpg + 1) * hd, base + (qpg + 2) * hd))
            out[mg + f"self_attention.linear_qkv.{kind}"] = rows
            out[mg + f"self_attention.linear_proj.{kind}"] = [(hf + f"self_attn.o_proj.{kind}", "all", 0, 0)]
            out[mg + f"mlp.linear_fc1.{kind}"] = [(hf + f"mlp.gate_proj.{kind}", "rows", 0, ffn),
                                                  (hf + f"mlp.up_proj.{kind}", "rows", ffn, 2 * ffn)]
            out[mg + f"mlp.linear_fc2.{kind}"] = [(hf + f"mlp.down_proj.{kind}", "all", 0, 0)]
    return out


def hf_state(weights: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """The Hugging Face state dict of the Megatron whole-model state dict (rows gathered per HF tensor)."""
    import torch

    parts: dict[str, list[Any]] = {}
    for mg, rows in hf_name_map(model).items():
        for hf, kind, start, stop in rows:
            parts.setdefault(hf, []).append(weights[mg] if kind == "all" else weights[mg][start:stop])
    return {k: torch.cat(v, dim=0) if len(v) > 1 else v[0].clone() for k, v in parts.items()}


def run_hf(spec: dict[str, Any]) -> dict[str, Any]:
    """Train ``LlamaForCausalLM`` with the Megatron weights and batches for ``spec["steps"]`` steps under msprobe."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    m = spec["model"]
    cfg = LlamaConfig(
        vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=m["ffn"], num_hidden_layers=m["layers"],
        num_attention_heads=m["heads"], num_key_value_heads=m.get("groups", m["heads"]),
        max_position_embeddings=m["seq"], rms_norm_eps=m["eps"], hidden_act="silu", attention_bias=True,
        mlp_bias=True, tie_word_embeddings=False, attention_dropout=0.0, use_cache=False,
        rope_parameters={"rope_type": "default", "rope_theta": float(m.get("rope_base", 10000))})
    cfg._attn_implementation = "eager"
    torch.manual_seed(m["seed"])
    net = LlamaForCausalLM(cfg)
    weights = torch.load(spec["weights"], weights_only=True)
    state = hf_state(weights, m)
    missing, unexpected = net.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if "rotary" not in k]:
        raise RuntimeError(f"HF load: missing {missing}, unexpected {unexpected}")
    for name, p in net.named_parameters():
        if not torch.equal(p.detach(), state[name]):
            raise RuntimeError(f"{name} did not load")
    net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=m["lr"], weight_decay=m["weight_decay"], fused=True)
    tokens = torch.load(spec["batches"], weights_only=True)
    from msprobe.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(config_path=spec["config"])
    mbs, n_micro = m["micro_batch"], m["micro_batches"]
    positions = torch.arange(m["seq"]).unsqueeze(0)
    losses = []
    for step in range(spec["steps"]):
        opt.zero_grad(set_to_none=True)
        debugger.start(model=net)
        total = 0.0
        for mb in range(n_micro):
            rows = tokens[step][mb * mbs:(mb + 1) * mbs]
            x, y = rows[:, :-1], rows[:, 1:]
            logits = net(input_ids=x, position_ids=positions).logits
            loss = F.cross_entropy(logits.reshape(-1, m["vocab"]), y.reshape(-1))
            (loss / n_micro).backward()
            total += float(loss.detach())
        opt.step()
        debugger.stop()
        debugger.step()
        losses.append(total / n_micro)
    return {"losses": losses, "name_map": {k: [list(r) for r in v] for k, v in hf_name_map(m).items()},
            "hf_config": {k: v for k, v in cfg.to_dict().items() if isinstance(v, (int, float, str, bool))}}
