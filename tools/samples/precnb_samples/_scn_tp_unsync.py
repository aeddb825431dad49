"""Scenario ``tp_unsync``: TP=2 whose replicated dropout draws different masks on the TP ranks.

The hand-written Megatron-style TP model of the ``tp`` sample gets Megatron's "hidden" dropout
(``F.dropout(p=0.1)`` on each block's attention and MLP outputs, the replicated residual stream).
Its mask must be the same on every TP rank, so the default generator must be seeded identically
on them; in ``tp2`` rank 1 seeds it with ``seed + rank`` (the per-rank seed that belongs to the
model-parallel RNG only), so the dropout outputs differ across the TP ranks from step 0 on.
``tp1`` (world size 1) seeds like rank 0. The ground truth names the first replicated tensor
(step, then execution order) whose statistics differ across the TP ranks, and what a TP=1
comparison after merging shows; which tensors are replicated is read from a synced TP=2 rerun
(same everything, rank 1 seeded like rank 0), which is not kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _dumps as D  # noqa: N812
from ._model import ModelConfig
from ._scenarios import (
    Context,
    _check,
    _close,
    _dump_config,
    _expect_layout,
    _header,
    _layout,
    _load_all,
    _tp_relation,
    write_json,
)
from ._train import RunSpec, launch

MODEL = ModelConfig(blocks=1)
STEPS = 2
DROPOUT = 0.1
UNSYNCED_RANK = 1


def _run(ctx: Context, root: Path, config: Path, world: int, unsynced: int | None, tag: str) -> dict[str, list[float]]:
    spec = RunSpec(
        "dump",
        str(config),
        world,
        STEPS,
        str(ctx.log_dir),
        model=MODEL,
        parallel="tp",
        hidden_dropout=DROPOUT,
        unsynced_seed_rank=unsynced,
        tag=tag,
    )
    losses = {str(r): v for r, v in launch(spec).items()}
    _expect_layout(root, STEPS, world, "rank")
    return losses


def _tensor_order(data: dict) -> list[tuple[str, str]]:
    """``(node, leaf path)`` of every tensor leaf, in dump (execution) order."""
    return [(n, p) for n, rec in data.items() for p, leaf in D.node_leaves(rec).items() if "shape" in leaf]


def _stats(leaf: dict) -> dict[str, Any]:
    return {k: leaf.get(k) for k in ("dtype", "shape", *D.STAT_KEYS)}


def _replica_close(a: dict, b: dict) -> bool:
    finite = [abs(x) for x in (a.get("Max"), a.get("Min")) if isinstance(x, (int, float)) and math.isfinite(x)]
    atol = 1e-5 * max(finite, default=0.0) + 1e-12
    return a.get("shape") == b.get("shape") and all(
        _close(a.get(k), b.get(k), 1e-4, atol) for k in D.STAT_KEYS if a.get(k) is not None
    )


def gen_tp_unsync(ctx: Context, sample: Path) -> dict:
    """TP=1 vs TP=2 with dropout on the replicated stream; rank 1's dropout seed is unsynced."""
    model = MODEL
    losses = {}
    for variant, world in (("tp1", 1), ("tp2", 2)):
        root = sample / variant
        cfg = _dump_config(sample, root, f"config_{variant}.json")
        losses[variant] = _run(ctx, root, cfg, world, UNSYNCED_RANK if world > 1 else None, f"tp_unsync_{variant}")
    # synced reference (not kept): which TP=2 tensors are replicated, sharded or partial sums
    ref_root = ctx.log_dir / "tp_unsync_synced_reference"
    ref_cfg = ctx.log_dir / "tp_unsync_synced_reference_config.json"
    write_json(ref_cfg, dict(D.load_json(sample / "configs" / "config_tp2.json"), dump_path=str(ref_root)))
    ref_losses = _run(ctx, ref_root, ref_cfg, 2, None, "tp_unsync_synced")
    tp1, tp2, ref = _load_all(sample / "tp1"), _load_all(sample / "tp2"), _load_all(ref_root)

    relation: dict[int, dict[tuple[str, str], str]] = {}
    for step in range(STEPS):
        full, r0, r1 = tp1[(step, 0)], ref[(step, 0)], ref[(step, 1)]
        _check(
            list(r0) == list(r1) == list(tp2[(step, 0)]) == list(tp2[(step, 1)]),
            f"step {step}: node lists differ between runs or ranks",
        )
        rels = {}
        for node, path in _tensor_order(r0):
            if node not in full:
                continue
            fl, l0, l1 = (D.node_leaves(d[node]).get(path) for d in (full, r0, r1))
            if fl is None or l1 is None:
                continue
            rels[(node, path)] = _tp_relation(fl, l0, l1)[0]
        bad = [k for k, v in rels.items() if v.startswith("different") or "not merge" in v]
        _check(not bad, f"synced reference, step {step}: unclassified tensors {bad[:5]}")
        replicated = [k for k, v in rels.items() if v == "replicated"]
        differs = [
            k for k in replicated if D.leaf_differs(D.node_leaves(r0[k[0]])[k[1]], D.node_leaves(r1[k[0]])[k[1]])
        ]
        _check(not differs, f"synced reference, step {step}: replicas differ {differs[:5]}")
        relation[step] = rels

    # 1. the replica check: first replicated tensor whose copies differ across the TP ranks
    first = None
    per_step: dict[str, Any] = {}
    for step in range(STEPS):
        r0, r1 = tp2[(step, 0)], tp2[(step, 1)]
        bad = []
        for key in _tensor_order(r0):
            if relation[step].get(key) != "replicated":
                continue
            a, b = D.node_leaves(r0[key[0]])[key[1]], D.node_leaves(r1[key[0]])[key[1]]
            if D.leaf_differs(a, b):
                bad.append(key)
        per_step[f"step{step}"] = {
            "replicated_tensors": sum(v == "replicated" for v in relation[step].values()),
            "replicated_tensors_differing_across_ranks": len(bad),
            "first": {"node": bad[0][0], "tensor": bad[0][1]} if bad else None,
        }
        if bad and first is None:
            first = (step, *bad[0])
    _check(first is not None, "no replicated tensor differs across the TP ranks")
    step, node, tensor = first  # type: ignore[misc]
    _check(
        step == 0 and node.startswith("Functional.dropout.") and tensor == "output.0",
        f"first replica difference {first}",
    )
    rec0, rec1 = tp2[(0, 0)][node], tp2[(0, 1)][node]
    _check(
        not _replica_close(D.node_leaves(rec0)[tensor], D.node_leaves(rec1)[tensor]),
        f"{node} {tensor} differs across ranks only within tolerance",
    )
    _check(
        not D.leaf_differs(D.node_leaves(rec0)["input_args.0"], D.node_leaves(rec1)["input_args.0"]),
        f"{node} input differs across ranks",
    )
    construct = D.load_json(sample / "tp2" / "step0" / "rank0" / "construct.json")

    # 2. TP=1 vs the merged TP=2 run
    def first_merge_failure(take_rank0: bool) -> dict[str, Any] | None:
        for st in range(STEPS):
            full, r0, r1 = tp1[(st, 0)], tp2[(st, 0)], tp2[(st, 1)]
            for key in _tensor_order(r0):
                want = relation[st].get(key)
                if want is None:
                    continue
                fl = D.node_leaves(full[key[0]])[key[1]]
                l0, l1 = (D.node_leaves(d[key[0]])[key[1]] for d in (r0, r1))
                if want == "replicated" and take_rank0:
                    got = _tp_relation(fl, l0, l0)[0]
                else:
                    got = _tp_relation(fl, l0, l1)[0]
                if got != want:
                    agree = [r for r, lf in ((0, l0), (1, l1)) if want == "replicated" and _replica_close(fl, lf)]
                    return {
                        "step": st,
                        "node": key[0],
                        "tensor": key[1],
                        "relation": want,
                        "merged_relation_found": got,
                        "module": D.parent_of(construct, key[0]),
                        **({"ranks_agreeing_with_tp1": agree} if want == "replicated" else {}),
                    }
        return None

    checked = first_merge_failure(take_rank0=False)
    rank0_copy = first_merge_failure(take_rank0=True)
    _check(
        checked is not None
        and (checked["step"], checked["node"], checked["tensor"]) == (step, node, tensor)
        and checked["ranks_agreeing_with_tp1"] == [0],
        f"tp1 comparison (replicas checked): {checked}",
    )
    _check(
        rank0_copy is not None and rank0_copy["relation"] != "replicated", f"tp1 comparison (rank 0 copy): {rank0_copy}"
    )
    rel = lambda v, r: f"{v}/step{step}/rank{r}/dump.json"  # noqa: E731
    return _header(
        ctx,
        "tp_unsync",
        "hand-written Megatron-style TP=2 vs TP=1 (the tp sample's model) with hidden dropout "
        f"(F.dropout p={DROPOUT}) on the replicated residual stream; in tp2, rank 1 seeds the "
        "default generator with seed + rank, so its dropout masks differ from rank 0's from "
        "step 0 on; tp1 seeds like rank 0; same weights and data",
        model,
        task="statistics",
        level="mix",
        tp_size=2,
        world_size={"tp1": 1, "tp2": 2},
        distributed_initialised=True,
        steps=list(range(STEPS)),
        dump_roots={"tp1": "tp1", "tp2": "tp2"},
        dump_files={v: _layout(sample / v, sample) for v in ("tp1", "tp2")},
        faults=[
            {
                "kind": "replica_mismatch",
                "role": "origin",
                "step": step,
                "rank": UNSYNCED_RANK,
                "ranks": [0, 1],
                "node": node,
                "tensor": tensor,
                "module": D.parent_of(construct, node),
                "dump_json": rel("tp2", UNSYNCED_RANK),
                "other_dump_json": rel("tp2", 0),
                "how": "Block applies F.dropout(h, p=0.1, training=True) to the attention and "
                "MLP outputs (replicated after the row-parallel all_reduce). After building the "
                "model every rank calls torch.manual_seed(seed + 1 + offset) with offset 0 on "
                f"rank 0 and offset = rank on rank {UNSYNCED_RANK}: the masks differ",
                "stats": {"rank0": _stats(D.node_leaves(rec0)[tensor]), "rank1": _stats(D.node_leaves(rec1)[tensor])},
                "input_identical_across_ranks": True,
            }
        ],
        replica_check={
            "first_differing_replicated_tensor": {"step": step, "node": node, "tensor": tensor, "ranks": [0, 1]},
            "per_step": per_step,
            "replicated_from": "a synced TP=2 rerun (same model, data, both ranks seeded like "
            "rank 0; not kept) classified against tp1 like the tp sample: replicated / sharded "
            "dim d / partial_sum; its replicated tensors are bit-identical on both ranks",
        },
        tp1_comparison={
            "replicas_checked": checked,
            "replicated_taken_from_rank0": rank0_copy,
            "note": "replicas_checked: the first tensor (step, execution order) whose TP=2 "
            "merge disagrees with tp1 when a replicated tensor must agree on both ranks (rank 0 "
            "agrees with tp1, rank 1 does not). replicated_taken_from_rank0: the first "
            "disagreement when the merge takes rank 0's copy of replicated tensors without "
            "checking the replicas (rank 1's wrong residual first shows in a sharded or "
            "partial-sum tensor)",
        },
        losses=losses,
        synced_reference_losses=ref_losses,
    )


GENERATORS: dict[str, Callable[[Context, Path], dict]] = {"tp_unsync": gen_tp_unsync}
