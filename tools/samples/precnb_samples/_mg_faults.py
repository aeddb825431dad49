"""Faults injected into one rank of a Megatron-Core run (imported by ``_mg_worker.py``; torch, no precnb).

Every fault is a dict in the worker spec's ``bugs`` list with ``kind``, ``rank`` (the global rank it acts on),
``from_step`` (default 0: it acts from that training step on), ``layer`` (the whole-model layer index) and,
where a size makes sense, ``m`` (a magnitude). A fault changes module attributes, wraps a module's
``forward`` or registers a tensor hook; the arithmetic it adds goes through ``torch.ops.aten`` (which
msprobe's API dump does not hook), so a fault run dumps exactly the nodes its healthy twin dumps.

Kinds (``install`` sets up the hooks once, ``at_step`` acts at the start of every step, before msprobe
starts):

- ``softmax_scale`` (``factor``): the layer's core-attention ``softmax_scale`` times *factor* (existing);
- ``norm_eps`` (``eps``): the layer's pre-MLP RMSNorm eps (existing; eps -1 gives NaN);
- ``row_output_scale`` (``module``: ``linear_proj`` or ``linear_fc2``): that RowParallelLinear's output
  (after its TP all-reduce) times ``1 + m``;
- ``bias_grad_scale`` (``module``): the gradient of that RowParallelLinear's bias (replicated over TP,
  skip_bias_add) times ``1 + m`` (a hook on the parameter);
- ``weight_zero`` (``param``, a whole-model parameter name): 1 % of the rank's shard of that weight set to 0
  at the start of step ``from_step`` (the elements drawn from a generator seeded by rank and layer);
- ``act_noise``: N(0, m) noise added to the layer's MLP activation (the SiLU of the gated unit; the MLP gets
  its own copy of the config whose ``activation_func`` adds it);
- ``dw_only`` (``param``): that weight's gradient times ``1 + m`` (a hook; forward values unchanged);
- ``wrong_shard`` (``param``, ``loads_shard_of_tp_rank``): with ``from_step`` 0 the worker loads the other TP
  rank's shard (existing); later, that shard of the initial weights is copied into the parameter at
  ``from_step``;
- ``optimizer_state`` (``param``, ``state``: ``exp_avg`` default or ``exp_avg_sq``): that AdamW state of the
  parameter times ``1 + m`` at the start of step ``from_step`` (>= 1, the state exists after step 0); the
  step's update changes, so it shows from step ``from_step + 1``'s forward;
- ``unsynced_seed``: handled by the worker's seeding (existing);
- ``route_mask`` (``expert``: a global expert index, ``steps``; ``rank`` ``"all"``: every rank's router;
  ``value``, default -1e4): the layer's router logits of that expert set to *value* at those steps, before the
  score function (sigmoid gives exactly 0, so top-k never picks it; finite, so the dumps hold no inf from the
  mask): no rank sends it a token, the expert receives none;
- ``expert_grad_per_token`` (``expert``: global index, ``module``: ``linear_fc1`` or ``linear_fc2``): that
  expert's weight gradient divided by the number of tokens the expert received in the micro-batch (a per-token
  mean taken by hand; a hook on the weight, so msprobe's ``parameters_grad`` record holds the quotient); an
  expert with no token has an all-zero weight gradient: 0/0 = NaN;
- ``expert_fc1_scale`` (``expert``): that expert's ``linear_fc1`` output times ``1 + m``;
- ``router_logit_scale``: the layer's router logits on this rank times ``1 + m`` before the score function
  (the router's ``Torch.mm`` output is unchanged, its ``Torch.sigmoid`` input differs; under sequence or data
  parallelism each rank routes its own tokens, so only this rank's tokens are routed differently).

The expert faults act on the rank whose expert-parallel group holds the global expert (``rank`` must be it).
"""

from __future__ import annotations

import copy
from typing import Any

STATE: dict[str, int] = {"step": 0}
HOOKED = ("row_output_scale", "bias_grad_scale", "act_noise", "dw_only", "route_mask", "expert_grad_per_token",
          "expert_fc1_scale", "router_logit_scale")


def _active(b: dict[str, Any]) -> bool:
    return STATE["step"] >= b.get("from_step", 0)


def _layers(chunks: list[Any], layer: int) -> list[Any]:
    return [ly for c in chunks for ly in getattr(c.decoder, "layers", []) if ly.layer_number - 1 == layer]


def _param(chunks: list[Any], names: dict[str, str], glob: str) -> Any:
    for key, g in names.items():
        if g == glob:
            ci, local = key.split(":", 1)
            return dict(chunks[int(ci)].named_parameters())[local]
    raise RuntimeError(f"no parameter {glob} on this rank")


def _row(layer: Any, module: str) -> Any:
    return layer.self_attention.linear_proj if module == "linear_proj" else layer.mlp.linear_fc2


def _scale_output(mod: Any, b: dict[str, Any]) -> None:
    import torch

    orig = mod.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        out, bias = orig(*args, **kwargs)
        if _active(b):
            out = torch.ops.aten.mul.Scalar(out, 1.0 + b["m"])
        return out, bias

    mod.forward = forward


def _grad_hook(param: Any, b: dict[str, Any]) -> None:
    import torch

    param.register_hook(lambda g: torch.ops.aten.mul.Scalar(g, 1.0 + b["m"]) if _active(b) else g)


def _noisy_activation(mlp: Any, b: dict[str, Any], rank: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(1000 + 31 * rank + b["layer"])
    config = copy.copy(mlp.config)
    orig = config.activation_func

    def activation(x: Any) -> Any:
        y = orig(x)
        if not _active(b):
            return y
        noise = torch.ops.aten.randn.generator(list(y.shape), generator=gen, dtype=y.dtype)
        return torch.ops.aten.add.Tensor(y, torch.ops.aten.mul.Scalar(noise, b["m"]))

    config.activation_func = activation
    mlp.config = config


def _local_expert(layer: Any, glob: int) -> Any:
    experts = layer.mlp.experts
    local = glob - experts.ep_group.rank() * experts.num_local_experts
    if not 0 <= local < experts.num_local_experts:
        raise RuntimeError(f"global expert {glob} is not on this rank's expert-parallel rank")
    return experts.local_experts[local]


def _mask_route(router: Any, b: dict[str, Any]) -> None:
    import torch

    index = torch.ops.aten.scalar_tensor.default(b["expert"], dtype=torch.int64).reshape(1)
    orig = router.routing

    def routing(logits: Any, *args: Any, **kwargs: Any) -> Any:
        if STATE["step"] in b["steps"]:
            logits = torch.ops.aten.index_fill.int_Scalar(logits, -1, index, b.get("value", -1e4))
        return orig(logits, *args, **kwargs)

    router.routing = routing


def _scale_logits(router: Any, b: dict[str, Any]) -> None:
    import torch

    orig = router.routing

    def routing(logits: Any, *args: Any, **kwargs: Any) -> Any:
        if _active(b):
            logits = torch.ops.aten.mul.Scalar(logits, 1.0 + b["m"])
        return orig(logits, *args, **kwargs)

    router.routing = routing


def _grad_per_token(expert: Any, b: dict[str, Any]) -> None:
    import torch

    count = {"tokens": 0}
    orig = expert.forward

    def forward(hidden: Any, *args: Any, **kwargs: Any) -> Any:
        count["tokens"] = int(hidden.shape[0])
        return orig(hidden, *args, **kwargs)

    expert.forward = forward
    weight = getattr(expert, b["module"]).weight
    weight.register_hook(lambda g: torch.ops.aten.div.Scalar(g, float(count["tokens"])) if _active(b) else g)


def _scale_fc1(expert: Any, b: dict[str, Any]) -> None:
    import torch

    orig = expert.linear_fc1.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        out, bias = orig(*args, **kwargs)
        if _active(b):
            out = torch.ops.aten.mul.Scalar(out, 1.0 + b["m"])
        return out, bias

    expert.linear_fc1.forward = forward


def install(chunks: list[Any], bugs: list[dict[str, Any]], rank: int, names: dict[str, str]) -> list[str]:
    """Set up the hooked faults of this rank (they act from their ``from_step``); what was installed."""
    done = []
    for b in bugs:
        if b.get("rank") not in (rank, "all") or b["kind"] not in HOOKED:
            continue
        if b["kind"] == "dw_only":
            _grad_hook(_param(chunks, names, b["param"]), b)
        for layer in _layers(chunks, b["layer"]):
            if b["kind"] == "row_output_scale":
                _scale_output(_row(layer, b["module"]), b)
            elif b["kind"] == "bias_grad_scale":
                _grad_hook(_row(layer, b["module"]).bias, b)
            elif b["kind"] == "act_noise":
                _noisy_activation(layer.mlp, b, rank)
            elif b["kind"] == "route_mask":
                _mask_route(layer.mlp.router, b)
            elif b["kind"] == "router_logit_scale":
                _scale_logits(layer.mlp.router, b)
            elif b["kind"] == "expert_grad_per_token":
                _grad_per_token(_local_expert(layer, b["expert"]), b)
            elif b["kind"] == "expert_fc1_scale":
                _scale_fc1(_local_expert(layer, b["expert"]), b)
        done.append(f"{b['kind']} layer {b.get('layer')}")
    return done


def at_step(chunks: list[Any], bugs: list[dict[str, Any]], rank: int, step: int, names: dict[str, str],
            opt: Any, shards: dict[int, Any]) -> list[str]:
    """Act on this rank at the start of *step* (before msprobe starts it); return what was done.

    *shards*: ``id(bug)`` -> the tensor a late ``wrong_shard`` copies in.
    """
    import torch

    STATE["step"] = step
    done = []
    for b in bugs:
        if b.get("rank") != rank or step < b.get("from_step", 0):
            continue
        kind = b["kind"]
        if kind in ("softmax_scale", "norm_eps"):
            for layer in _layers(chunks, b["layer"]):
                if kind == "softmax_scale":  # scales the attention scores' baddbmm (alpha)
                    attn = layer.self_attention.core_attention
                    if not hasattr(attn, "_precnb_scale"):
                        attn._precnb_scale = attn.softmax_scale
                    attn.softmax_scale = attn._precnb_scale * b["factor"]
                else:  # pre-MLP RMSNorm eps (negative: rsqrt of a negative)
                    layer.pre_mlp_layernorm.eps = b["eps"]
                done.append(f"{kind} layer {b['layer']}")
        elif step != b.get("from_step", 0):
            continue
        elif kind == "weight_zero":
            p = _param(chunks, names, b["param"])
            gen = torch.Generator().manual_seed(2000 + 31 * rank + b["layer"])
            idx = torch.randperm(p.numel(), generator=gen)[:max(1, p.numel() // 100)]
            with torch.no_grad():
                p.view(-1)[idx] = 0.0
            done.append(f"weight_zero {b['param']} ({len(idx)} of {p.numel()})")
        elif kind == "optimizer_state":
            p = _param(chunks, names, b["param"])
            with torch.no_grad():
                opt.state[p][b.get("state", "exp_avg")].mul_(1.0 + b["m"])
            done.append(f"optimizer_state {b['param']} {b.get('state', 'exp_avg')}")
        elif kind == "wrong_shard" and id(b) in shards:
            with torch.no_grad():
                _param(chunks, names, b["param"]).copy_(shards[id(b)])
            done.append(f"wrong_shard {b['param']}")
    return done
