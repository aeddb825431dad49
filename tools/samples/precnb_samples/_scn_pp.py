"""Scenario ``pp_local``: pipeline parallelism whose stages number their layers locally.

A 4-block tiny GPT is trained unsplit (``pp1``, one rank) and as a hand-written 2-stage pipeline
(``pp2``, two ranks, one micro-batch): stage 0 holds the embedding and global blocks 0-1, stage 1
holds global blocks 2-3 — named ``blocks.0`` and ``blocks.1`` in its own module list — plus the
final norm and the LM head. Activations and their gradients cross the stage boundary with
blocking ``torch.distributed.send``/``recv`` on gloo. Same seed, weights and data; no fault. The
ground truth maps every module and API node of each stage to its pp1 counterpart (read back from
the dumps), names the p2p nodes and measures how close the stitched statistics are to pp1.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn

from . import _align_truth as A  # noqa: N812
from . import _dumps as D  # noqa: N812
from ._model import ModelConfig, TinyGPT, make_batch, make_optimizer
from ._scenarios import (
    Context,
    _check,
    _dump_config,
    _expect_layout,
    _header,
    _layout,
    _load_all,
    _rank_dir,
)
from ._train import WorkerSpec, finish_worker, launch, start_worker

MODEL = ModelConfig(blocks=4)
STEPS = 2
STAGES = 2
PER_STAGE = MODEL.blocks // STAGES


class PipelineStage(nn.Module):
    """Blocks ``[lo, hi)`` of a full TinyGPT in a module list numbered from 0.

    The first stage also holds the embedding, the last one the final norm and the LM head.
    """

    def __init__(self, full: TinyGPT, lo: int, hi: int) -> None:
        super().__init__()
        self.first = lo == 0
        self.last = hi == len(full.blocks)
        if self.first:
            self.embed = full.embed
        self.blocks = nn.ModuleList(list(full.blocks)[lo:hi])
        if self.last:
            self.norm_out = full.norm_out
            self.lm_head = full.lm_head

    def forward(self, x):
        if self.first:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_out(x)) if self.last else x


def worker(rank: int, spec: WorkerSpec) -> None:
    """Train unsplit (world size 1) or as a 2-stage pipeline (rank = stage) under msprobe."""
    start_worker(rank, spec)
    cfg = spec.model
    full = TinyGPT(cfg)
    per = cfg.blocks // spec.world_size
    model: nn.Module = full if spec.world_size == 1 else PipelineStage(full, rank * per, (rank + 1) * per)
    opt = make_optimizer(model, cfg)
    from msprobe.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(config_path=spec.config_path)
    first, last = rank == 0, rank == spec.world_size - 1
    shape = (cfg.batch, cfg.seq, cfg.hidden)
    losses = []
    for step in range(spec.steps):
        x, y = make_batch(cfg, step, 0)
        opt.zero_grad(set_to_none=True)
        debugger.start(model)
        if first:
            inp = x
        else:
            inp = torch.zeros(shape)
            dist.recv(inp, src=rank - 1)
            inp.requires_grad_()
        out = model(inp)
        if last:
            loss = F.cross_entropy(out.reshape(-1, cfg.vocab), y.reshape(-1))
            loss.backward()
            losses.append(float(loss.detach()))
        else:
            dist.send(out.detach(), dst=rank + 1)
            grad = torch.zeros(shape)
            dist.recv(grad, src=rank + 1)
            out.backward(grad)
        if not first:
            dist.send(inp.grad, dst=rank - 1)
        opt.step()
        debugger.stop()
        debugger.step()
    finish_worker(rank, spec, losses)


_BLOCK = re.compile(r"^blocks\.(\d+)(\.|$)")


def global_path(local: str, rank: int) -> str:
    """pp1 module path of a stage-local module path (``blocks.N`` shifted by the stage offset).

    >>> global_path("blocks.1.attn.q_proj", 1)
    'blocks.3.attn.q_proj'
    >>> global_path("lm_head", 1)
    'lm_head'
    """
    m = _BLOCK.match(local)
    if not m:
        return local
    return f"blocks.{int(m.group(1)) + rank * PER_STAGE}{local[m.end(1) :]}"


def _module_pairs(stage: dict, full: dict, rank: int) -> list[dict[str, Any]]:
    pairs = []
    for path, node in A.module_nodes(stage).items():
        gpath = global_path(path, rank)
        entry: dict[str, Any] = {"stage": path, "pp1": gpath}
        for kind in ("forward", "backward", "parameters_grad"):
            sn = A.module_nodes(stage, kind).get(path)
            fn = A.module_nodes(full, kind).get(gpath)
            _check((sn is None) == (fn is None), f"rank {rank} {kind} {path}: {sn} / {fn}")
            if sn is not None:
                entry[f"{kind}_nodes"] = {"stage": sn, "pp1": fn}
        entry["class"] = A.parse_module_node(node)[1]  # type: ignore[index]
        pairs.append(entry)
    return pairs


def _api_pairs(
    stage: dict, scons: dict, full: dict, fcons: dict, mods: list[tuple[str | None, str | None]], kind: str
) -> list[dict[str, Any]]:
    out = []
    for snode, fnode in mods:
        s = [n for n in A.api_children(stage, scons, snode, kind) if not n.startswith("Distributed.")]
        f = A.api_children(full, fcons, fnode, kind)
        if snode is None:  # top level: the loss (last stage) and the embedding backward (first)
            names = {A.api_kind(n)[0] for n in s}  # type: ignore[index]
            f = [n for n in f if A.api_kind(n)[0] in names]  # type: ignore[index]
        try:
            pairs = A.pair_children(s, f)
        except ValueError as exc:
            _check(False, f"{kind} APIs of {snode} / {fnode}: {exc}")
        out += [{"stage": a, "pp1": b, "stage_parent": snode, "pp1_parent": fnode} for a, b in pairs]
    return out


def _optimizer_offsets(pp2: dict) -> dict[int, int]:
    """Index of each stage's first parameter in pp1's fused AdamW lists."""
    offsets, n = {}, 0
    for r in range(STAGES):
        offsets[r] = n
        rec = pp2[(0, r)]["Torch._fused_adamw_.0.forward"]
        n += len(rec["input_args"][0])
    return offsets


def _optimizer_error(full: dict, stage: dict, offset: int) -> float:
    frec, srec = full["Torch._fused_adamw_.0.forward"], stage["Torch._fused_adamw_.0.forward"]
    err = 0.0
    for k, items in enumerate(srec["input_args"]):
        if not isinstance(items, list):
            continue
        for i, leaf in enumerate(items):
            if isinstance(leaf, dict) and "shape" in leaf:
                err = max(err, A.leaf_error(frec["input_args"][k][offset + i], leaf))
    return err


def gen_pp_local(ctx: Context, sample: Path) -> dict:
    """pp1 (unsplit, 1 rank) vs pp2 (2 stages, local ``blocks.N`` names, send/recv)."""
    model = MODEL
    losses = {}
    for variant, world in (("pp1", 1), ("pp2", STAGES)):
        root = sample / variant
        cfg = _dump_config(sample, root, f"config_{variant}.json")
        spec = WorkerSpec(
            config_path=str(cfg),
            log_dir=str(ctx.log_dir),
            world_size=world,
            steps=STEPS,
            model=MODEL,
            tag=f"pp_local_{variant}",
        )
        out = launch(spec, worker)
        losses[variant] = {str(r): v for r, v in out.items() if v}
        _expect_layout(root, STEPS, world, "rank")
    _check(losses["pp1"]["0"] == losses["pp2"][str(STAGES - 1)], f"losses {losses}")
    pp1, pp2 = _load_all(sample / "pp1"), _load_all(sample / "pp2")
    fcons = D.load_json(_rank_dir(sample / "pp1", 0, 0) / "construct.json")
    for step in range(1, STEPS):
        _check(list(pp1[(step, 0)]) == list(pp1[(0, 0)]), "pp1 nodes differ by step")
        for r in range(STAGES):
            _check(list(pp2[(step, r)]) == list(pp2[(0, r)]), f"rank {r} nodes differ by step")
    full0 = pp1[(0, 0)]
    per_rank: dict[str, Any] = {}
    counterpart: dict[int, dict[str, str]] = {}
    for r in range(STAGES):
        st0 = pp2[(0, r)]
        scons = D.load_json(_rank_dir(sample / "pp2", 0, r) / "construct.json")
        mods = _module_pairs(st0, full0, r)
        fmods: list[tuple[str | None, str | None]] = [(None, None)]
        bmods: list[tuple[str | None, str | None]] = [(None, None)]
        for m in mods:
            fmods.append((m["forward_nodes"]["stage"], m["forward_nodes"]["pp1"]))
            if "backward_nodes" in m:
                bmods.append((m["backward_nodes"]["stage"], m["backward_nodes"]["pp1"]))
        fwd = _api_pairs(st0, scons, full0, fcons, fmods, "forward")
        bwd = _api_pairs(st0, scons, full0, fcons, bmods, "backward")
        cp = {p["stage"]: p["pp1"] for p in fwd + bwd}
        for m in mods:
            for kind in ("forward", "backward", "parameters_grad"):
                if f"{kind}_nodes" in m:
                    cp[m[f"{kind}_nodes"]["stage"]] = m[f"{kind}_nodes"]["pp1"]
        rest = [n for n in st0 if n not in cp]
        _check(
            sorted(rest)
            == sorted(n for n in st0 if n.startswith("Distributed.") or n.startswith("Torch._fused_adamw_")),
            f"rank {r}: unpaired nodes {rest}",
        )
        counterpart[r] = cp
        per_rank[f"rank{r}"] = {
            "module_pairs": mods,
            "node_pairs": {"step0_forward": fwd, "step0_backward": bwd},
            "not_paired": rest,
        }
    # every pp1 node has exactly one stage counterpart (besides the optimizer)
    covered = [v for cp in counterpart.values() for v in cp.values()]
    _check(len(covered) == len(set(covered)), "a pp1 node is paired twice")
    missing = [n for n in full0 if n not in set(covered) and not n.startswith("Torch._fused")]
    _check(not missing, f"pp1 nodes without a stage counterpart: {missing}")

    # stitched statistics vs pp1
    offsets = _optimizer_offsets(pp2)
    stitching = {}
    for step in range(STEPS):
        full = pp1[(step, 0)]
        worst, where = 0.0, None
        for r in range(STAGES):
            st = pp2[(step, r)]
            for sn, fn in counterpart[r].items():
                e = A.record_error(full[fn], st[sn], ignore=("input_kwargs",))
                if e > worst:
                    worst, where = e, {"rank": r, "stage_node": sn, "pp1_node": fn}
            e = _optimizer_error(full, st, offsets[r])
            if e > worst:
                worst, where = e, {"rank": r, "stage_node": "Torch._fused_adamw_.0.forward"}
        _check(worst < 1e-6, f"step {step}: stitched error {worst} at {where}")
        stitching[f"step{step}"] = {
            "max_scale_aware_error": worst,
            "at": where,  # None: 0
            "paired_nodes": sum(len(c) for c in counterpart.values()),
        }

    # the p2p nodes: activation stage 0 -> 1 (forward), its gradient stage 1 -> 0 (backward)
    last_local = f"blocks.{PER_STAGE - 1}"
    act_src = f"Module.blocks.{PER_STAGE - 1}.Block.forward.0"
    grad_src = f"Module.blocks.{PER_STAGE}.Block.backward.0"
    p2p = []
    for step in range(STEPS):
        full = pp1[(step, 0)]
        sends = {r: [n for n in pp2[(step, r)] if n.startswith("Distributed.send.")] for r in range(STAGES)}
        recvs = {r: [n for n in pp2[(step, r)] if n.startswith("Distributed.recv.")] for r in range(STAGES)}
        _check(all(len(v) == 1 for v in (*sends.values(), *recvs.values())), f"p2p {sends}")
        for role, (src, dst), ref in (
            ("activation", (0, 1), (act_src, "output.0")),
            ("gradient", (1, 0), (grad_src, "output.0")),
        ):
            send, recv = sends[src][0], recvs[dst][0]
            sent = D.node_leaves(pp2[(step, src)][send])["input_args.0"]
            got = D.node_leaves(pp2[(step, dst)][recv])["output.0"]
            pp1_leaf = D.node_leaves(full[ref[0]])[ref[1]]
            _check(not D.leaf_differs(sent, got), f"{role}: sent != received at step {step}")
            err = A.leaf_error(pp1_leaf, sent)
            _check(err < 1e-6, f"{role} vs pp1 {ref}: {err}")
            p2p.append(
                {
                    "step": step,
                    "role": role,
                    "send": {"rank": src, "node": send, "leaf": "input_args.0"},
                    "recv": {"rank": dst, "node": recv, "leaf": "output.0"},
                    "pp1": {"node": ref[0], "leaf": ref[1]},
                    "scale_aware_error_vs_pp1": err,
                }
            )
    rel_layout = {v: _layout(sample / v, sample) for v in ("pp1", "pp2")}
    return _header(
        ctx,
        "pp_local",
        "pipeline parallelism with local layer names: a 4-block tiny GPT run unsplit (pp1, 1 "
        "rank) and as a hand-written 2-stage pipeline (pp2, 2 ranks, one micro-batch, blocking "
        "torch.distributed send/recv of activations and gradients); stage 1 holds global blocks "
        "2-3 as blocks.0 and blocks.1; same seed, weights and data; no fault",
        model,
        task="statistics",
        level="mix",
        world_size={"pp1": 1, "pp2": STAGES},
        distributed_initialised=True,
        steps=list(range(STEPS)),
        dump_roots={"pp1": "pp1", "pp2": "pp2"},
        dump_files=rel_layout,
        faults=[],
        layout={
            "pp2": f"pp={STAGES}",
            "stage_of_rank": {str(r): r for r in range(STAGES)},
            "global_blocks_of_rank": {str(r): list(range(r * PER_STAGE, (r + 1) * PER_STAGE)) for r in range(STAGES)},
            "block_offset_of_rank": {str(r): r * PER_STAGE for r in range(STAGES)},
            "local_block_names": [f"blocks.{i}" for i in range(PER_STAGE)],
            "other_modules_of_rank": {"0": ["embed"], str(STAGES - 1): ["norm_out", "lm_head"]},
            "loss_rank": STAGES - 1,
            "note": f"every stage numbers its module list from 0: pp2 rank r blocks.i = pp1 "
            f"blocks.(i + {PER_STAGE}*r); API call counters restart on every rank (rank 1's "
            "first Functional.linear is Functional.linear.0, pp1's "
            f"Functional.linear.{6 * PER_STAGE})",
        },
        stages=per_rank,
        stages_note="per rank: module_pairs (stage-local path -> pp1 path, with the forward, "
        "backward and parameters_grad node names on both sides), node_pairs (API nodes paired "
        "inside each module pair by call order and kind; stage_parent null = top level), "
        "not_paired (the p2p nodes and the rank's share of the fused optimizer). Node names are "
        "the same at every step",
        p2p=p2p,
        p2p_note=f"the last stage-0 block's output ({last_local} on rank 0 = pp1 {act_src}) is "
        "sent to rank 1; rank 1 sends the gradient of its input back (= pp1 "
        f"{grad_src} output.0, the grad of that block's input). msprobe records Distributed.recv "
        "with input_args [null] and the received tensor as output.0",
        optimizer={
            "node": "Torch._fused_adamw_.0.forward",
            "first_parameter_index_in_pp1_of_rank": {str(r): o for r, o in offsets.items()},
            "rule": "pp1's fused AdamW lists (input_args.0 params, .1 grads, .2 exp_avgs, .3 "
            "exp_avg_sqs, .5 steps) are the concatenation of the stages' lists in rank order",
        },
        stitching=stitching,
        stitching_note="max scale-aware error |pp1 - pp2| / max(|pp1|, |pp2|, max(|Max|,|Min|) "
        "of the pp1 tensor) over every tensor statistic of every paired node (and the optimizer "
        "lists); 0.0 means bit-identical",
        losses=losses,
    )


GENERATORS: dict[str, Callable[[Context, Path], dict]] = {"pp_local": gen_pp_local}
