"""Train a tiny Megatron-Core GPTModel on CPU under msprobe, in one parallel layout; a standalone script.

Run by the sample generator with the Megatron interpreter (``PRECNB_MEGATRON_PYTHON``: a venv with
``torch==2.13.0``, ``mindstudio-probe==26.2.0``, ``triton``, ``megatron-core==0.19.2`` and ``transformers``,
see :data:`precnb_samples._mg_run.RECIPE`)::

    $PRECNB_MEGATRON_PYTHON tools/samples/precnb_samples/_mg_worker.py spec.json

It imports neither precnb nor the generator package. ``spec.json`` keys:

- ``mode``: ``"init"`` (build the whole model once at world size 1 and save its state dict and the
  batches), ``"megatron"`` (train one layout under msprobe) or ``"hf"`` (train the same weights in a
  Hugging Face ``LlamaForCausalLM`` under msprobe, one process);
- ``model``: sizes (``layers``, ``hidden``, ``heads``, ``ffn``, ``vocab``, ``seq``, ``micro_batch``,
  ``micro_batches``, ``lr``, ``weight_decay``, ``seed``, ``hidden_dropout``, MoE fields);
- ``layout``: ``tp``, ``pp``, ``vpp``, ``dp``, ``sp``, ``ep``, ``etp`` (world size = tp*pp*dp; see _scn_megatron_moe);
- ``bugs``: a list of injected faults (kinds and fields in ``_mg_faults.py``); ``steps`` (trained; the
  config's step list decides which are dumped); ``threads`` (``torch.set_num_threads``, default 1);
  ``config`` (msprobe config.json); ``weights`` and ``batches`` (written by ``init``); ``log_dir``; ``result``.

Run-time patches for CPU (``../shared/docs/megatron_cpu.md``): ``torch.cuda.current_device`` returns the
CPU device, ``torch.cuda.synchronize`` is a no-op, the schedules' token counter is made on the CPU, the
CUDA RNG tracker's ``fork`` is a no-op context, the default causal mask is built on the CPU, and for
sequence parallelism ``WrappedTorchNorm`` builds its torch norm (whose weight grads are then all-reduced
over the TP group, as Megatron's ``finalize_model_grads`` does for ``sequence_parallel`` weights).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Any


def _patch_megatron(cuda_streams: bool = False) -> None:
    """The CPU patches (apply after importing Megatron, before building the model).

    *cuda_streams*: also stand in for ``torch.cuda.Stream`` (the MoE all-to-all token dispatcher makes one).
    """
    import types

    import torch

    if cuda_streams:
        class _Stream:
            def __init__(self, *a: Any, **k: Any) -> None:
                pass

            def wait_stream(self, *a: Any) -> None:
                pass

            def synchronize(self) -> None:
                pass

            def record_event(self, *a: Any) -> Any:
                return self

        torch.cuda.Stream = _Stream  # type: ignore[assignment,misc]
        torch.cuda.current_stream = lambda *a, **k: _Stream()  # type: ignore[assignment]
        torch.cuda.stream = lambda s: contextlib.nullcontext()  # type: ignore[assignment]
        from megatron.core.transformer.moe import token_dispatcher

        to_host = token_dispatcher.maybe_move_tensor_to_cpu

        def maybe_move(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
            # on CUDA the split sizes become host numpy arrays; gloo's all_to_all_single rejects tensors
            if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
                return tensor.numpy()
            return to_host(tensor, as_numpy=as_numpy, record_stream=record_stream)

        token_dispatcher.maybe_move_tensor_to_cpu = maybe_move

    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.tensor_parallel import random as mg_random
    from megatron.core.transformer import torch_norm
    from megatron.core.transformer import utils as mg_utils

    def _cpu(device: Any) -> Any:
        return "cpu" if str(device).startswith("cuda") else device

    class _Torch(types.SimpleNamespace):
        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

    stand_in = _Torch()
    stand_in.zeros = lambda *a, device=None, **k: torch.zeros(*a, device=_cpu(device), **k)
    schedules.torch = stand_in
    mg_random.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()  # type: ignore

    def causal(sq: int) -> Any:
        return torch.triu(torch.ones(sq, sq), diagonal=1).bool()

    mg_utils.get_default_causal_mask = causal
    original_new = torch_norm.WrappedTorchNorm.__new__

    def new(cls: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
        if not config.sequence_parallel:
            return original_new(cls, config, *args, **kwargs)
        import dataclasses

        norm = original_new(cls, dataclasses.replace(config, sequence_parallel=False), *args, **kwargs)
        for p in norm.parameters():
            p.sequence_parallel = True  # type: ignore[attr-defined]
        return norm

    torch_norm.WrappedTorchNorm.__new__ = new  # type: ignore[method-assign]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redirect(log_path: Path) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


# ------------------------------------------------------------------------------------------ model
def _config(model: dict[str, Any], layout: dict[str, Any]) -> Any:
    import torch
    import torch.nn.functional as F  # noqa: N812
    from megatron.core.transformer.transformer_config import TransformerConfig

    moe = {}
    if model.get("experts"):
        moe = {"num_moe_experts": model["experts"], "moe_router_topk": model["topk"],
               "moe_token_dispatcher_type": model.get("dispatcher", "alltoall"),
               "moe_aux_loss_coeff": 0.0, "moe_router_load_balancing_type": "none",
               "expert_model_parallel_size": layout.get("ep", 1),
               "moe_ffn_hidden_size": model.get("moe_ffn", model["ffn"])}
        if model.get("moe_layer_freq"):
            moe["moe_layer_freq"] = model["moe_layer_freq"]
        if "etp" in layout:
            moe["expert_tensor_parallel_size"] = layout["etp"]
        if model.get("score"):  # "sigmoid" / "softmax"
            moe["moe_router_score_function"] = model["score"]
        if model.get("expert_bias"):  # the router's expert-bias update rate (aux-loss-free balancing)
            moe["moe_router_enable_expert_bias"] = True
            moe["moe_router_bias_update_rate"] = model["expert_bias"]
    return TransformerConfig(
        num_layers=model["layers"], hidden_size=model["hidden"], num_attention_heads=model["heads"],
        num_query_groups=model.get("groups", model["heads"]), ffn_hidden_size=model["ffn"],
        tensor_model_parallel_size=layout["tp"], pipeline_model_parallel_size=layout["pp"],
        virtual_pipeline_model_parallel_size=layout["vpp"] if layout["vpp"] > 1 else None,
        sequence_parallel=bool(layout.get("sp")), use_cpu_initialization=True,
        params_dtype=torch.float32, pipeline_dtype=torch.float32, normalization="RMSNorm",
        layernorm_epsilon=model["eps"], add_bias_linear=model.get("bias", True), gated_linear_unit=True,
        activation_func=F.silu,
        hidden_dropout=model.get("hidden_dropout", 0.0), attention_dropout=0.0, bias_activation_fusion=False,
        bias_dropout_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, init_method_std=0.02,
        deallocate_pipeline_outputs=False, **moe)


def _chunks(model: dict[str, Any], layout: dict[str, Any]) -> list[Any]:
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = _config(model, layout)
    spec = get_gpt_layer_local_spec(num_experts=model.get("experts"), normalization="RMSNorm")
    vpp = layout["vpp"]
    out = []
    for vp in range(vpp):
        stage = vp if vpp > 1 else None
        if model.get("moe_layer_freq"):  # dense and MoE layers mixed: the local specs, per layer
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

            spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm",
                                              vp_stage=stage)
        out.append(GPTModel(
            config=config, transformer_layer_spec=spec, vocab_size=model["vocab"],
            max_sequence_length=model["seq"],
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            share_embeddings_and_output_weights=False, position_embedding_type="rope",
            rotary_base=model.get("rope_base", 10000), vp_stage=stage))
    return out


def global_name(chunk: Any, local: str) -> str:
    """The whole-model (world 1) parameter name of a chunk's local parameter name."""
    parts = local.split(".")
    if parts[:2] == ["decoder", "layers"]:
        layer = chunk.decoder.layers[int(parts[2])]
        parts[2] = str(layer.layer_number - 1)
        if parts[4:6] == ["experts", "local_experts"]:  # expert parallel: local -> global expert index
            experts = layer.mlp.experts
            parts[6] = str(experts.ep_group.rank() * experts.num_local_experts + int(parts[6]))
    return ".".join(parts)


def _shard(full: Any, param: Any, name: str, tp: int, tp_rank: int, glu: bool) -> Any:
    """The shard of a whole-model tensor that TP rank *tp_rank* holds (along the parameter's ``partition_dim``)."""
    if not getattr(param, "tensor_model_parallel", False) or tp == 1:
        return full
    dim = param.partition_dim
    if glu and "linear_fc1" in name:  # [gate; up]: each rank holds [gate_r; up_r]
        gate, up = full.chunk(2, dim=0)
        return __import__("torch").cat([gate.chunk(tp, dim=0)[tp_rank], up.chunk(tp, dim=0)[tp_rank]], dim=0)
    return full.chunk(tp, dim=dim)[tp_rank]


def _load(chunks: list[Any], weights: dict[str, Any], tp: int, tp_rank: int, bugs: list[dict[str, Any]],
          rank: int, shards: dict[int, Any], etp: int = 1, etp_rank: int = 0) -> dict[str, str]:
    """Load every chunk's parameters from the whole-model state dict; return local -> global names.

    A ``wrong_shard`` fault from a later step leaves its shard in *shards* (``id(bug)`` -> tensor). Expert
    parameters are taken by global expert index and sharded over the expert-TP group (*etp*, *etp_rank*);
    persistent buffers (the router's ``expert_bias``) are loaded by global name too.
    """
    import torch

    names = {}
    for ci, chunk in enumerate(chunks):
        state = {}
        params = dict(chunk.named_parameters())
        for local in chunk.state_dict():
            if local not in params and not local.endswith("_extra_state"):
                state[local] = weights[global_name(chunk, local)].clone()
        for local, param in params.items():
            g = global_name(chunk, local)
            names[f"{ci}:{local}"] = g
            if ".experts.local_experts." in local:
                value = _shard(weights[g], param, g, etp, etp_rank, glu=True)
                if tuple(value.shape) != tuple(param.shape):
                    raise RuntimeError(f"{g}: shard {tuple(value.shape)} != parameter {tuple(param.shape)}")
                state[local] = value
                continue
            shard_rank = tp_rank
            for b in bugs:
                if b["kind"] == "wrong_shard" and b["rank"] == rank and b["param"] == g:
                    if b.get("from_step", 0) > 0:  # copied in at that step by _mg_faults.at_step
                        shards[id(b)] = _shard(weights[g], param, g, tp, b["loads_shard_of_tp_rank"], glu=True)
                    else:
                        shard_rank = b["loads_shard_of_tp_rank"]
            value = _shard(weights[g], param, g, tp, shard_rank, glu=True)
            if tuple(value.shape) != tuple(param.shape):
                raise RuntimeError(f"{g}: shard {tuple(value.shape)} != parameter {tuple(param.shape)}")
            state[local] = value
        missing, unexpected = chunk.load_state_dict(state, strict=False)
        missing = [m for m in missing if not m.endswith("_extra_state")]
        if missing or unexpected:
            raise RuntimeError(f"chunk {ci}: missing {missing}, unexpected {unexpected}")
        with torch.no_grad():
            for local, param in list(chunk.named_parameters()) + list(chunk.named_buffers()):
                if local in state and not torch.equal(param, state[local]):
                    raise RuntimeError(f"chunk {ci} {local} did not load")
    return names


# ------------------------------------------------------------------------------------------- data
def _batches(model: dict[str, Any], steps: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(model["seed"] + 7)
    n = model["micro_batch"] * model["micro_batches"]
    return torch.randint(0, model["vocab"], (steps, n, model["seq"] + 1), generator=g)


def _micro_batches(tokens: Any, model: dict[str, Any], dp: int, dp_rank: int) -> list[tuple[Any, Any]]:
    """The micro-batches of DP rank *dp_rank* in one step: micro-batch m of the global batch, split along batch."""
    mbs = model["micro_batch"]
    if mbs % dp:
        raise RuntimeError(f"micro batch {mbs} is not divisible by dp={dp}")
    part = mbs // dp
    out = []
    for m in range(model["micro_batches"]):
        rows = tokens[m * mbs + dp_rank * part: m * mbs + (dp_rank + 1) * part]
        out.append((rows[:, :-1].contiguous(), rows[:, 1:].contiguous()))
    return out


# ------------------------------------------------------------------------------------------ train
def _rank_worker(rank: int, spec: dict[str, Any]) -> None:
    log_dir = Path(spec["log_dir"])
    _redirect(log_dir / f"{spec['tag']}_rank{rank}.log")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(spec.get("threads", 1)))  # 2 vs 1: a healthy pair that differs in bits
    torch.use_deterministic_algorithms(True)
    lay, model, steps, bugs = spec["layout"], spec["model"], spec["steps"], spec.get("bugs", [])
    world = lay["tp"] * lay["pp"] * lay["dp"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank, world_size=world)
    from megatron.core import parallel_state as ps

    _patch_megatron(cuda_streams=model.get("dispatcher") == "alltoall")
    ps.initialize_model_parallel(
        tensor_model_parallel_size=lay["tp"], pipeline_model_parallel_size=lay["pp"],
        virtual_pipeline_model_parallel_size=lay["vpp"] if lay["vpp"] > 1 else None,
        expert_model_parallel_size=lay.get("ep", 1),
        **({"expert_tensor_parallel_size": lay["etp"]} if "etp" in lay else {}))
    from megatron.core.pipeline_parallel import get_forward_backward_func

    torch.manual_seed(model["seed"])
    chunks = _chunks(model, lay)
    weights = torch.load(spec["weights"], weights_only=True)
    tp_rank, dp_rank = ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_rank()
    shards: dict[int, Any] = {}
    moe = bool(model.get("experts"))
    etp = lay.get("etp", lay["tp"]) if moe else 1
    etp_rank = ps.get_expert_tensor_parallel_rank() if moe else 0
    names = _load(chunks, weights, lay["tp"], tp_rank, bugs, rank, shards, etp=etp, etp_rank=etp_rank)
    import _mg_faults  # type: ignore[import-not-found]

    installed = _mg_faults.install(chunks, bugs, rank, names)
    finalize = bool(model.get("finalize"))
    if finalize:
        _use_finalize_model_grads(chunks, lay)
    routed = _record_tokens(chunks) if moe else None
    for c in chunks:
        c.train()
    params = [p for c in chunks for p in c.parameters()]
    opt = torch.optim.AdamW(params, lr=model["lr"], weight_decay=model["weight_decay"], fused=True)
    # Megatron seeds the default generator alike on every TP rank (dropout on the replicated residual
    # stream must draw the same mask); the "unsynced_seed" bug seeds one rank with its TP rank added
    seed = model["seed"] + 100
    for b in bugs:
        if b["kind"] == "unsynced_seed" and b["rank"] == rank:
            seed += tp_rank + 1
    torch.manual_seed(seed)
    tokens = torch.load(spec["batches"], weights_only=True)
    seq = model["seq"]
    mask = torch.triu(torch.ones(1, 1, seq, seq), diagonal=1).bool()
    positions = torch.arange(seq).unsqueeze(0)
    from msprobe.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(config_path=spec["config"])
    fb = get_forward_backward_func()
    losses: list[float] = []
    applied: dict[str, list[str]] = {}

    def forward_step(data_iterator: Any, chunk: Any) -> Any:
        x, y = next(data_iterator)
        out = chunk(x, positions, mask, labels=y)

        def loss_func(output_tensor: Any) -> Any:
            loss = output_tensor.float().mean()
            return loss, {"loss": loss.detach().clone()}  # the schedule divides *loss* in place

        return out, loss_func

    for step in range(steps):
        applied[str(step)] = _mg_faults.at_step(chunks, bugs, rank, step, names, opt, shards)
        mbs = _micro_batches(tokens[step], model, lay["dp"], dp_rank)
        its: Any = [iter(mbs) for _ in chunks] if len(chunks) > 1 else iter(mbs)
        opt.zero_grad(set_to_none=True)
        debugger.start(model=chunks)  # a list, as Megatron's training loop holds it: Module.<chunk>.<path>
        out = fb(forward_step_func=forward_step, data_iterator=its, model=chunks if len(chunks) > 1 else chunks[0],
                 num_microbatches=model["micro_batches"], seq_length=seq,
                 micro_batch_size=model["micro_batch"] // lay["dp"], forward_only=False)
        if lay.get("sp") and not finalize:  # sequence-parallel norm weights: each TP rank saw part of the sequence
            for p in params:
                if getattr(p, "sequence_parallel", False) and p.grad is not None:
                    dist.all_reduce(p.grad, group=ps.get_tensor_model_parallel_group())
        if _grad_sync(lay) and not finalize:
            _dp_average(params)
        opt.step()
        debugger.stop()
        debugger.step()
        if out:
            losses.append(float(sum(float(d["loss"]) for d in out) / len(out)))
        if routed is not None:
            routed.close_step(step)
    info = {"losses": losses, "names": names, "applied": applied, "installed": installed,
            "coords": {"tp": tp_rank, "pp": ps.get_pipeline_model_parallel_rank(), "dp": dp_rank},
            "layer_numbers": {str(ci): [ly.layer_number for ly in getattr(c.decoder, "layers", [])]
                              for ci, c in enumerate(chunks)}}
    if moe:
        info["expert_coords"] = {"ep": ps.get_expert_model_parallel_rank(), "etp": etp_rank,
                                 "edp": ps.get_expert_data_parallel_rank()}
        info["tokens"] = routed.steps if routed is not None else {}
    (log_dir / f"{spec['tag']}_info_rank{rank}.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()


def _grad_sync(lay: dict[str, Any]) -> bool:
    """Whether gradients need a data-parallel reduction: dense replicas (dp > 1) or expert copies (edp > 1).

    Experts have copies without dense data parallelism when ETP < TP (TP 2, EP 1, ETP 1: every expert whole on
    both TP ranks, each with its own tokens under sequence parallelism).
    """
    from megatron.core import parallel_state as ps

    return lay["dp"] > 1 or (bool(lay.get("ep") or lay.get("etp")) and
                             ps.get_expert_data_parallel_world_size() > 1)


def _dp_average(params: list[Any]) -> None:
    """Average gradients over data parallelism by hand (no DDP wrapper), as Megatron's DDP does.

    Expert weights (``allreduce=False``) are summed over the expert-data-parallel group, the others over the
    data-parallel group; both are divided by the data-parallel size (Megatron's DDP scales expert gradients by
    ``1 / dp`` too, not ``1 / edp``: an expert's gradient already sums the losses of the ``dp / edp`` replicas
    whose tokens it received).
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    dp = dist.get_world_size(ps.get_data_parallel_group())
    for p in params:
        if p.grad is None:
            continue
        expert = not getattr(p, "allreduce", True)
        group = ps.get_expert_data_parallel_group() if expert else ps.get_data_parallel_group()
        if dist.get_world_size(group) > 1:
            dist.all_reduce(p.grad, group=group)
        if dp > 1:
            p.grad.div_(dp)


def _use_finalize_model_grads(chunks: list[Any], lay: dict[str, Any]) -> None:
    """Let Megatron's schedule call its own ``finalize_model_grads`` after the backward passes.

    Without the DDP wrapper each chunk gets a default ``ddp_config`` and a ``finish_grad_sync`` that averages
    the gradients over data parallelism by hand (what DDP's would do); ``finalize_model_grads`` then all-reduces
    the sequence-parallel gradients over TP and updates the router's expert bias.
    """
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    for c in chunks:
        c.ddp_config = DistributedDataParallelConfig()
        params = list(c.parameters())
        c.finish_grad_sync = (lambda ps_=params, **_: _dp_average(ps_)) if _grad_sync(lay) else (lambda **_: None)
    chunks[0].config.finalize_model_grads_func = finalize_model_grads


class _Tokens:
    """Tokens per expert of every MoE layer, kept with aten ops (msprobe dumps no extra node) during a step.

    ``steps[str(step)][str(global layer)]``: ``routed_by_this_rank`` (tokens this rank's router sent to each
    global expert, summed over the step's micro-batches) and ``received_by_local_experts`` (the
    ``tokens_per_expert`` the token dispatcher hands to this rank's SequentialMLP, one list per micro-batch).
    """

    def __init__(self) -> None:
        self.steps: dict[str, dict[str, dict[str, Any]]] = {}
        self.pending: list[tuple[str, str, Any]] = []

    def wrap(self, layer: Any) -> None:
        import torch

        aten = torch.ops.aten
        glob = str(layer.layer_number - 1)
        router, experts = layer.mlp.router, layer.mlp.experts
        router_forward, experts_forward = router.forward, experts.forward

        def routed(*args: Any, **kwargs: Any) -> Any:
            probs, routing_map = router_forward(*args, **kwargs)
            self.pending.append((glob, "routed", aten.sum.dim_IntList(routing_map, [0])))
            return probs, routing_map

        def received(hidden: Any, tokens_per_expert: Any, probs: Any) -> Any:
            self.pending.append((glob, "received", aten.clone.default(tokens_per_expert)))
            return experts_forward(hidden, tokens_per_expert, probs)

        router.forward = routed
        experts.forward = received

    def close_step(self, step: int) -> None:
        out: dict[str, dict[str, Any]] = {}
        for glob, what, t in self.pending:
            slot = out.setdefault(glob, {"routed_by_this_rank": None, "received_by_local_experts": []})
            values = [int(v) for v in t.tolist()]
            if what == "routed":
                prev = slot["routed_by_this_rank"]
                if prev is not None:
                    values = [a + b for a, b in zip(prev, values, strict=True)]
                slot["routed_by_this_rank"] = values
            else:
                slot["received_by_local_experts"].append(values)
        self.steps[str(step)] = out
        self.pending = []


def _record_tokens(chunks: list[Any]) -> _Tokens:
    rec = _Tokens()
    for c in chunks:
        for layer in getattr(c.decoder, "layers", []):
            if hasattr(layer.mlp, "router"):
                rec.wrap(layer)
    return rec


def _init(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the whole model at world size 1, save its state dict and the batches."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    from megatron.core import parallel_state as ps

    _patch_megatron(cuda_streams=spec["model"].get("dispatcher") == "alltoall")
    ps.initialize_model_parallel()
    torch.manual_seed(spec["model"]["seed"])
    chunk = _chunks(spec["model"], {"tp": 1, "pp": 1, "vpp": 1, "dp": 1})[0]
    state = {k: v.detach().clone() for k, v in chunk.state_dict().items() if not k.endswith("_extra_state")}
    torch.save(state, spec["weights"])
    torch.save(_batches(spec["model"], spec["steps"]), spec["batches"])
    dist.destroy_process_group()
    return {"parameters": {k: list(v.shape) for k, v in state.items()}}


def _versions() -> dict[str, str]:
    import platform

    return {k: metadata.version(k) for k in ("torch", "megatron-core", "mindstudio-probe", "transformers",
                                              "triton")} | {"python": platform.python_version()}


def main(spec_path: str) -> int:
    """Run one job described by *spec_path*."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if spec.get("model", {}).get("experts"):  # the router's compiled expert-bias helpers run eagerly on CPU
        os.environ["TORCHDYNAMO_DISABLE"] = "1"
    mode = spec["mode"]
    if mode == "init":
        result = _init(spec)
    elif mode == "megatron":
        import subprocess

        lay = spec["layout"]
        world = lay["tp"] * lay["pp"] * lay["dp"]
        spec["port"] = _free_port()
        Path(spec_path).write_text(json.dumps(spec, indent=1), encoding="utf-8")
        procs = [subprocess.Popen([sys.executable, __file__, spec_path, str(r)]) for r in range(world)]
        codes = [p.wait() for p in procs]
        log_dir = Path(spec["log_dir"])
        if any(codes):
            tails = "".join(f"--- rank {r} ---\n" + "\n".join(
                (log_dir / f"{spec['tag']}_rank{r}.log").read_text(errors="replace").splitlines()[-25:]) + "\n"
                for r in range(world))
            raise SystemExit(f"{spec['tag']}: ranks exited with {codes}\n{tails}")
        result = {"ranks": {str(r): json.loads((log_dir / f"{spec['tag']}_info_rank{r}.json").read_text())
                            for r in range(world)}}
    elif mode == "hf":
        from _hf_worker import run_hf  # type: ignore[import-not-found]

        result = run_hf(spec)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    result["versions"] = _versions()
    Path(spec["result"]).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if len(sys.argv) == 3:  # one rank of a "megatron" job (started by main)
        _rank_worker(int(sys.argv[2]), json.loads(Path(sys.argv[1]).read_text(encoding="utf-8")))
        sys.exit(0)
    sys.exit(main(sys.argv[1]))
