"""Scenario ``renamed``: the same model in two code bases (Hugging Face vs Megatron names).

Both runs train the same tiny GPT (same seed, weights, data, op sequence) under msprobe on one
process; only the module names, the class names and two value-preserving extra ops of the target
differ, plus the injected fault: from step 1 on the target's last block computes its MLP
activation with the tanh approximation of GELU. The ground truth pairs every module and API node
of the two runs (read back from the dumps: paired records are bit-identical at step 0) and
locates the fault on both sides.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _align_truth as A  # noqa: N812
from . import _dumps as D  # noqa: N812
from ._named_models import MODEL, STEPS, NamedSpec, module_map, worker
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
from ._train import launch

FAULT_FROM_STEP = 1


def _pairs_in(
    kind: str,
    bdata: dict,
    tdata: dict,
    bcons: dict,
    tcons: dict,
    mods: list[tuple[str | None, str | None]],
    skip: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """API node pairs of one direction inside every module pair (None = top level).

    Target nodes in ``skip`` (the backward records of the target's extra ops) are left out.
    """
    out = []
    for bnode, tnode in mods:
        b = A.api_children(bdata, bcons, bnode, kind)
        t = [n for n in A.api_children(tdata, tcons, tnode, kind) if n not in skip]
        try:
            pairs = A.pair_children(b, t)
        except ValueError as exc:
            raise_gt(f"{kind} APIs of {bnode} / {tnode}: {exc}")
        for bn, tn in pairs:
            _check(A.tensors_equal(bdata[bn], tdata[tn]), f"step 0 {bn} != {tn}")
            entry = {"baseline": bn, "target": tn, "baseline_parent": bnode, "target_parent": tnode}
            other = D.differing_leaves(bdata[bn], tdata[tn])
            if other:  # non-tensor arguments only (tensors are checked above)
                entry["non_tensor_leaves_differ"] = other
            out.append(entry)
    return out


def raise_gt(message: str) -> None:
    """Raise :class:`GroundTruthError` (via ``_check``) with ``message``."""
    _check(False, message)


def _module_pairs(b0: dict, t0: dict, blocks: int) -> tuple[list[dict], dict[str, list]]:
    bmods, tmods = A.module_nodes(b0), A.module_nodes(t0)
    mapping = module_map(blocks)
    _check(set(mapping) <= set(bmods), f"baseline modules missing: {set(mapping) - set(bmods)}")
    _check(set(mapping.values()) <= set(tmods), "target modules missing")
    pairs = []
    for bp, tp in mapping.items():
        entry: dict[str, Any] = {"baseline": bp, "target": tp}
        for kind in ("forward", "backward", "parameters_grad"):
            bn = A.module_nodes(b0, kind).get(bp)
            tn = A.module_nodes(t0, kind).get(tp)
            _check((bn is None) == (tn is None), f"{kind} of {bp} / {tp}: {bn} / {tn}")
            if bn is None:
                continue
            _check(A.tensors_equal(b0[bn], t0[tn]), f"step 0 module {kind} {bn} != {tn}")
            entry[f"{kind}_nodes"] = {"baseline": bn, "target": tn}
        entry["baseline_class"] = A.parse_module_node(bmods[bp])[1]  # type: ignore[index]
        entry["target_class"] = A.parse_module_node(tmods[tp])[1]  # type: ignore[index]
        pairs.append(entry)
    unpaired = {
        "baseline": [bmods[p] for p in bmods if p not in mapping],
        "target": [tmods[p] for p in tmods if p not in mapping.values()],
    }
    return pairs, unpaired


def gen_renamed(ctx: Context, sample: Path) -> dict:
    """Hugging Face names (baseline) vs Megatron names + 2 extra ops + a late fault (target)."""
    model = MODEL
    roots, losses = {}, {}
    for variant in ("baseline", "target"):
        root = sample / variant
        cfg = _dump_config(sample, root, f"config_{variant}.json")
        spec = NamedSpec(
            variant=variant,
            config_path=str(cfg),
            log_dir=str(ctx.log_dir),
            steps=STEPS,
            model=MODEL,
            tag=f"renamed_{variant}",
            fault_from_step=FAULT_FROM_STEP if variant == "target" else None,
        )
        losses[variant] = {str(r): v for r, v in launch(spec, worker).items()}
        _expect_layout(root, STEPS, 1, "rank")
        roots[variant] = _load_all(root)
    cons = {v: {s: D.load_json(_rank_dir(sample / v, s, 0) / "construct.json") for s in range(STEPS)} for v in roots}
    b0, t0 = roots["baseline"][(0, 0)], roots["target"][(0, 0)]
    bc, tc = cons["baseline"][0], cons["target"][0]
    for v in roots:
        for s in range(1, STEPS):
            _check(list(roots[v][(s, 0)]) == list(roots[v][(0, 0)]), f"{v}: nodes differ by step")

    # modules (by construction), then the API calls inside each module pair (by order and kind)
    mod_pairs, unpaired_mods = _module_pairs(b0, t0, model.blocks)
    _check(
        [A.parse_module_node(n)[0] for n in unpaired_mods["baseline"]] == ["model"]  # type: ignore[index]
        and sorted(A.parse_module_node(n)[0] for n in unpaired_mods["target"])  # type: ignore[index]
        == ["decoder", "embedding"],
        f"unpaired modules {unpaired_mods}",
    )
    # top level (None) and msprobe's "optimizer" pseudo-parent of Torch._fused_adamw_
    forward_mods: list[tuple[str | None, str | None]] = [(None, None), ("optimizer", "optimizer")]
    backward_mods: list[tuple[str | None, str | None]] = [(None, None)]
    for m in mod_pairs:
        forward_mods.append((m["forward_nodes"]["baseline"], m["forward_nodes"]["target"]))
        if "backward_nodes" in m:
            backward_mods.append((m["backward_nodes"]["baseline"], m["backward_nodes"]["target"]))
    fwd = _pairs_in("forward", b0, t0, bc, tc, forward_mods)
    # the extra ops: every target forward API without a counterpart (their backward records
    # are left out of the backward pairing), and none in the baseline
    paired_t = {p["target"] for p in fwd}
    extra_fwd = [n for n in t0 if n.endswith(".forward") and A.api_kind(n) and n not in paired_t]
    extra_bwd = [n[: -len("forward")] + "backward" for n in extra_fwd]
    extra_bwd = [n for n in extra_bwd if n in t0]
    bwd = _pairs_in("backward", b0, t0, bc, tc, backward_mods, frozenset(extra_bwd))
    paired_t = {p["target"] for p in fwd + bwd}
    paired_b = {p["baseline"] for p in fwd + bwd}
    extra = [n for n in t0 if A.api_kind(n) and n not in paired_t]
    _check(
        extra == [*extra_fwd, *extra_bwd] or sorted(extra) == sorted(extra_fwd + extra_bwd),
        f"unpaired target APIs {extra}",
    )
    _check(not [n for n in b0 if A.api_kind(n) and n not in paired_b], "unpaired baseline APIs")
    _check(
        [A.api_kind(n)[0] for n in extra] == ["Tensor.__mul__", "Tensor.__mul__"],  # type: ignore[index]
        f"extra target APIs {extra}",
    )
    emb_node = next(m for m in mod_pairs if m["target"] == "embedding.word_embeddings")
    emb_out = D.node_leaves(t0[emb_node["forward_nodes"]["target"]])["output.0"]
    mul_fwd = next(n for n in extra if n.endswith(".forward"))
    mul_leaves = D.node_leaves(t0[mul_fwd])
    _check(
        not D.leaf_differs(mul_leaves["input_args.0"], emb_out)
        and not D.leaf_differs(mul_leaves["output.0"], emb_out)
        and mul_leaves["input_args.1"].get("value") == 1.0,
        f"{mul_fwd} is not the identity on the embedding output",
    )
    float_nodes = [n for n in tc if n.startswith("Tensor.float.") and n not in t0]
    _check(
        float_nodes == ["Tensor.float.0.forward", "Tensor.float.0.backward"],
        f"Tensor.float in target construct.json: {float_nodes}",
    )
    _check(not [n for n in bc if n.startswith("Tensor.float.")], "Tensor.float in baseline")
    shifts = sorted(
        {
            (A.api_kind(p["baseline"])[0], A.api_kind(p["target"])[1] - A.api_kind(p["baseline"])[1])  # type: ignore[index]
            for p in fwd
        }
    )
    # the fault: first paired node (target dump order, step 1) whose record differs
    s = FAULT_FROM_STEP
    b1, t1 = roots["baseline"][(s, 0)], roots["target"][(s, 0)]
    counterpart = {p["target"]: p["baseline"] for p in fwd + bwd}
    for m in mod_pairs:
        for kind in ("forward", "backward", "parameters_grad"):
            if f"{kind}_nodes" in m:
                counterpart[m[f"{kind}_nodes"]["target"]] = m[f"{kind}_nodes"]["baseline"]
    order = [n for n in t1 if n in counterpart]
    diff = [n for n in order if not A.tensors_equal(b1[counterpart[n]], t1[n])]
    _check(bool(diff), "no difference at the fault step")
    node = diff[0]
    tmod = D.parent_of(cons["target"][s], node)
    bnode = counterpart[node]
    bmod = D.parent_of(cons["baseline"][s], bnode)
    last = model.blocks - 1
    _check(
        node.startswith("Functional.gelu.")
        and bnode.startswith("Functional.gelu.")
        and tmod == f"Module.decoder.layers.{last}.mlp.MLP.forward.0"
        and bmod == f"Module.model.layers.{last}.mlp.TinyLlamaMLP.forward.0",
        f"first difference {node} in {tmod} (baseline {bnode} in {bmod})",
    )
    leaves_diff = D.differing_leaves(b1[bnode], t1[node])
    _check(
        not [p for p in leaves_diff if p.startswith("input_args")] and "output.0" in leaves_diff,
        f"differing leaves of {node}: {leaves_diff}",
    )
    # culprit module: first paired module forward whose inputs agree and whose output differs
    culprit = None
    for n in order:
        parsed = A.parse_module_node(n)
        if not parsed or parsed[2] != "forward":
            continue
        dl = A.differing_tensor_leaves(b1[counterpart[n]], t1[n])
        if dl and not [p for p in dl if p.startswith("input")] and "output.0" in dl:
            culprit = n
            break
    _check(culprit == tmod, f"culprit module {culprit} != {tmod}")
    out_b = D.node_leaves(b1[bnode])["output.0"]
    out_t = D.node_leaves(t1[node])["output.0"]
    err = A.leaf_error(out_b, out_t)
    _check(1e-6 < err < 1e-1, f"GELU output error {err}")
    first_diff_by_step = {}
    for step in range(STEPS):
        bb, tt = roots["baseline"][(step, 0)], roots["target"][(step, 0)]
        dd = [n for n in tt if n in counterpart and not A.tensors_equal(bb[counterpart[n]], tt[n])]
        first_diff_by_step[f"step{step}"] = {
            "first_differing_target_node": dd[0] if dd else None,
            "differing_paired_nodes": len(dd),
            "paired_nodes": len(counterpart),
        }
    _check(first_diff_by_step["step0"]["differing_paired_nodes"] == 0, "step 0 differs")
    rel = lambda v, st: str((_rank_dir(sample / v, st, 0) / "dump.json").relative_to(sample))  # noqa: E731
    path_of = lambda n: A.parse_module_node(n)[0]  # type: ignore[index]  # noqa: E731
    return _header(
        ctx,
        "renamed",
        "the same tiny GPT in two code bases, one process each, same seed, weights and data: "
        "baseline with Hugging Face names (model.embed_tokens, model.layers.N.self_attn.q_proj, "
        "mlp.up_proj, ...), target with Megatron names and classes (embedding.word_embeddings, "
        "decoder.layers.N.self_attention.linear_q, mlp.linear_fc1, ColumnParallelLinear, ...) "
        "and two extra value-preserving ops; from step 1 on the target's last block computes its "
        "MLP GELU with the tanh approximation",
        model,
        task="statistics",
        level="mix",
        world_size=1,
        distributed_initialised=True,
        steps=list(range(STEPS)),
        dump_roots={"baseline": "baseline", "target": "target"},
        dump_files={v: _layout(sample / v, sample) for v in ("baseline", "target")},
        naming={
            "baseline": "Hugging Face style: TinyLlamaForCausalLM > model (TinyLlamaModel) > "
            "embed_tokens (Embedding), layers.N (TinyLlamaDecoderLayer: input_layernorm, "
            "self_attn (TinyLlamaAttention: q_proj/k_proj/v_proj/o_proj Linear), "
            "post_attention_layernorm, mlp (TinyLlamaMLP: up_proj, down_proj)), norm "
            "(TinyLlamaRMSNorm); lm_head (Linear)",
            "target": "Megatron style: GPTModel > embedding (LanguageModelEmbedding > "
            "word_embeddings VocabParallelEmbedding), decoder (TransformerBlock > layers.N "
            "TransformerLayer: input_layernorm (RMSNorm), self_attention (SelfAttention: "
            "linear_q/linear_k/linear_v ColumnParallelLinear, linear_proj RowParallelLinear), "
            "pre_mlp_layernorm, mlp (MLP: linear_fc1, linear_fc2); final_layernorm); "
            "output_layer (ColumnParallelLinear); TP=1, the parallel linears are plain "
            "F.linear",
        },
        module_pairs=mod_pairs,
        module_pairs_note="module paths as in the dataset's module coordinate; every pair's "
        "forward, backward and parameters_grad records are bit-identical at step 0 (checked). "
        "The root modules are not recorded by msprobe",
        unpaired_modules={
            "baseline": [
                {
                    "node": n,
                    "module": path_of(n),
                    "note": "container of embed_tokens, "
                    "layers and norm: no single target module holds the same children",
                }
                for n in unpaired_mods["baseline"]
            ],
            "target": [
                {"node": n, "module": path_of(n), "note": note}
                for n in unpaired_mods["target"]
                for note in [
                    (
                        "wrapper of word_embeddings holding the extra scale_emb "
                        "multiply; its output equals model.embed_tokens' output"
                    )
                    if path_of(n) == "embedding"
                    else (
                        "container of layers and final_layernorm (baseline: "
                        "model also holds the embedding); output equals "
                        "model.norm's and decoder.final_layernorm's output"
                    )
                ]
            ],
        },
        node_pairs={"step0_forward": fwd, "step0_backward": bwd},
        node_pairs_note="API nodes paired inside each module pair by call order and API kind "
        "(baseline_parent/target_parent: the construct.json parents; null = top level, e.g. "
        "Functional.cross_entropy and the optimizer's Torch._fused_adamw_). Every pair is "
        "bit-identical at step 0. The node names are the same at step 1 (same node lists)",
        counter_shifts=[{"api": k, "target_minus_baseline": v} for k, v in shifts if v],
        counter_shifts_note="call-counter offset (target minus baseline) of the paired forward "
        "API nodes, per API kind; every other API kind has the same counters on both sides",
        extra_ops=[
            {
                "side": "target",
                "node": n,
                "in_dump_json": True,
                "module": D.parent_of(tc, n),
                "how": "LanguageModelEmbedding multiplies the embedding by scale_emb = 1.0 (value "
                "preserving); every later Tensor.__mul__ counter of the target is one higher",
            }
            for n in extra
        ]
        + [
            {
                "side": "target",
                "node": n,
                "in_dump_json": False,
                "module": D.parent_of(tc, n),
                "how": "TransformerBlock casts its input with .float() (already float32); msprobe "
                "records this low-risk API in construct.json only",
            }
            for n in float_nodes
        ],
        faults=[
            {
                "kind": "divergence",
                "role": "origin",
                "step": s,
                "rank": 0,
                "node": node,
                "module": tmod,
                "module_path": path_of(tmod),
                "dump_json": rel("target", s),
                "baseline": {
                    "node": bnode,
                    "module": bmod,
                    "module_path": path_of(bmod),
                    "dump_json": rel("baseline", s),
                },
                "baseline_dump_json": rel("baseline", s),
                "culprit_module": {"target": tmod, "baseline": bmod},
                "how": "from step 1 on the target's last block calls F.gelu(h, "
                "approximate='tanh') instead of F.gelu(h) (a wrong activation variant, as when a "
                "port maps hidden_act 'gelu' to the tanh approximation)",
                "differing_leaves": {
                    p: {"baseline": D.node_leaves(b1[bnode]).get(p), "target": D.node_leaves(t1[node]).get(p)}
                    for p in leaves_diff
                },
                "output_scale_aware_error": err,
            }
        ],
        checks={
            "per_step": first_diff_by_step,
            "identical_before_first_difference": "every paired node before the origin (target "
            "dump order) is bit-identical at the fault step, and every paired node at step 0",
            "healthy_agreement": "max scale-aware error of paired records at step 0: 0.0 (bit "
            "identical: same ops in the same order)",
            "loss_bit_identical_by_step": [
                lb == lt for lb, lt in zip(losses["baseline"]["0"], losses["target"]["0"], strict=True)
            ],
            "loss_note": "the tanh GELU changes the step-1 activations; "
            + (
                "the float32 loss of that step is nevertheless bit-identical: a loss curve does not show the fault"
                if losses["baseline"]["0"][s] == losses["target"]["0"][s]
                else "the loss of that step differs"
            ),
        },
        losses=losses,
    )


GENERATORS: dict[str, Callable[[Context, Path], dict]] = {"renamed": gen_renamed}
