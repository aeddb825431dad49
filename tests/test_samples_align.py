"""The samples of runs whose names differ (renamed, pp_local) and of the TP replica check
(tp_unsync): their ground truth is re-checked against the committed msprobe dumps.

Neither torch nor msprobe is needed: the dumps are read with Python's json module and compared
with the small helpers here and in test_samples_generator.py (not with precnb's readers, nor with
the generator's helpers).
"""

from __future__ import annotations

import json
import math
import re
from functools import cache
from pathlib import Path

import pytest

from tests.test_samples_generator import DATA, ROOT, _have, gt, leaves

STATS = ("Max", "Min", "Mean", "Norm")


# ----------------------------------------------------------------------------------- helpers
@cache
def _load(path: str):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def load(path: Path):
    return _load(str(path))


def dump(name: str, root: str, step: int, rank: int = 0) -> dict:
    return load(DATA / name / root / f"step{step}" / f"rank{rank}" / "dump.json")["data"]


def construct(name: str, root: str, step: int, rank: int = 0) -> dict:
    return load(DATA / name / root / f"step{step}" / f"rank{rank}" / "construct.json")


def parent(cons: dict, node: str):
    p = cons.get(node)
    return (p[0] if p else None) if isinstance(p, list) else (p or None)


def tensors(record: dict) -> dict[str, dict]:
    return {p: lf for p, lf in leaves(record) if "shape" in lf}


def same_leaf(a: dict, b: dict) -> bool:
    def eq(x, y):
        return (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)) or x == y

    return all(eq(a.get(k), b.get(k)) for k in ("dtype", "shape", *STATS))


def same_tensors(a: dict, b: dict) -> bool:
    ta, tb = tensors(a), tensors(b)
    return ta.keys() == tb.keys() and all(same_leaf(ta[p], tb[p]) for p in ta)


def close(a: dict, b: dict, rel: float = 1e-4) -> bool:
    scale = max(abs(a["Max"]), abs(a["Min"]))
    return a["shape"] == b["shape"] and all(
        abs(a[k] - b[k]) <= rel * max(abs(a[k]), abs(b[k])) + 1e-5 * scale for k in STATS
    )


def api(node: str) -> tuple[str, int, str] | None:
    if node.startswith("Module."):
        return None
    head, n, direction = node.rsplit(".", 2)
    return head, int(n), direction


def module_path(node: str) -> str:
    return node[len("Module.") :].rsplit(".", 3)[0]


# ------------------------------------------------------------------------------------ renamed
def _renamed_pairs(g: dict) -> dict[str, str]:
    """target node -> baseline node, for every paired module and API node."""
    out = {p["target"]: p["baseline"] for k in ("step0_forward", "step0_backward") for p in g["node_pairs"][k]}
    for m in g["module_pairs"]:
        for kind in ("forward", "backward", "parameters_grad"):
            if f"{kind}_nodes" in m:
                out[m[f"{kind}_nodes"]["target"]] = m[f"{kind}_nodes"]["baseline"]
    return out


def test_renamed_module_pairs_hold_in_the_dumps():
    g = gt("renamed")
    b0, t0 = dump("renamed", "baseline", 0), dump("renamed", "target", 0)
    assert len(g["module_pairs"]) == 25
    pairs = {m["baseline"]: m["target"] for m in g["module_pairs"]}
    assert pairs["model.embed_tokens"] == "embedding.word_embeddings"
    assert pairs["model.layers.1.self_attn.q_proj"] == "decoder.layers.1.self_attention.linear_q"
    assert pairs["model.layers.0.mlp.up_proj"] == "decoder.layers.0.mlp.linear_fc1"
    assert pairs["model.norm"] == "decoder.final_layernorm" and pairs["lm_head"] == "output_layer"
    for m in g["module_pairs"]:
        bn, tn = m["forward_nodes"]["baseline"], m["forward_nodes"]["target"]
        assert module_path(bn) == m["baseline"] and module_path(tn) == m["target"]
        assert f".{m['baseline_class']}.forward.0" in bn and f".{m['target_class']}.forward.0" in tn
        for kind in ("forward", "backward", "parameters_grad"):
            if f"{kind}_nodes" in m:
                nodes = m[f"{kind}_nodes"]
                assert same_tensors(b0[nodes["baseline"]], t0[nodes["target"]]), nodes
    # the names really differ: no baseline module path exists in the target
    tmods = {module_path(n) for n in t0 if n.startswith("Module.")}
    assert not {m["baseline"] for m in g["module_pairs"]} & tmods
    classes = {(m["baseline_class"], m["target_class"]) for m in g["module_pairs"]}
    assert ("Linear", "ColumnParallelLinear") in classes and ("TinyLlamaMLP", "MLP") in classes


def test_renamed_node_pairs_cover_every_api_call():
    g = gt("renamed")
    b0, t0 = dump("renamed", "baseline", 0), dump("renamed", "target", 0)
    bc, tc = construct("renamed", "baseline", 0), construct("renamed", "target", 0)
    fwd, bwd = g["node_pairs"]["step0_forward"], g["node_pairs"]["step0_backward"]
    for p in fwd + bwd:
        assert api(p["baseline"])[0] == api(p["target"])[0]
        assert parent(bc, p["baseline"]) == p["baseline_parent"]
        assert parent(tc, p["target"]) == p["target_parent"]
        assert same_tensors(b0[p["baseline"]], t0[p["target"]]), p
        if "non_tensor_leaves_differ" in p:
            assert p["baseline"].startswith("Functional.embedding.")
    paired_b = {p["baseline"] for p in fwd + bwd}
    paired_t = {p["target"] for p in fwd + bwd}
    extra = {e["node"] for e in g["extra_ops"] if e["in_dump_json"]}
    assert {n for n in b0 if api(n)} == paired_b
    assert {n for n in t0 if api(n)} == paired_t | extra
    assert extra == {"Tensor.__mul__.0.forward", "Tensor.__mul__.0.backward"}
    # the extra multiply is the identity on the embedding output and shifts every later mul
    mul = tensors(t0["Tensor.__mul__.0.forward"])
    emb = tensors(t0["Module.embedding.word_embeddings.VocabParallelEmbedding.forward.0"])["output.0"]
    assert same_leaf(mul["input_args.0"], emb) and same_leaf(mul["output.0"], emb)
    muls = [p for p in fwd if p["baseline"].startswith("Tensor.__mul__.")]
    assert muls and all(api(p["target"])[1] == api(p["baseline"])[1] + 1 for p in muls)
    assert g["counter_shifts"] == [{"api": "Tensor.__mul__", "target_minus_baseline": 1}]
    # so an exact-name comparison pairs different computations
    assert not same_tensors(b0["Tensor.__mul__.0.forward"], t0["Tensor.__mul__.0.forward"])
    for e in g["extra_ops"]:
        if not e["in_dump_json"]:
            assert e["node"] in tc and e["node"] not in t0 and e["node"] not in bc


def test_renamed_fault_on_both_sides():
    g = gt("renamed")
    (f,) = g["faults"]
    assert (f["kind"], f["step"], f["rank"]) == ("divergence", 1, 0)
    b1, t1 = dump("renamed", "baseline", 1), dump("renamed", "target", 1)
    tc, bc = construct("renamed", "target", 1), construct("renamed", "baseline", 1)
    node, bnode = f["node"], f["baseline"]["node"]
    assert f["dump_json"] == "target/step1/rank0/dump.json"
    assert f["baseline"]["dump_json"] == "baseline/step1/rank0/dump.json"
    assert parent(tc, node) == f["module"] == "Module.decoder.layers.1.mlp.MLP.forward.0"
    assert parent(bc, bnode) == f["baseline"]["module"] == "Module.model.layers.1.mlp.TinyLlamaMLP.forward.0"
    assert f["module_path"] == "decoder.layers.1.mlp" and f["baseline"]["module_path"] == "model.layers.1.mlp"
    pairs = _renamed_pairs(g)
    assert pairs[node] == bnode
    tb, tt = tensors(b1[bnode]), tensors(t1[node])
    assert same_leaf(tb["input_args.0"], tt["input_args.0"])
    assert not same_leaf(tb["output.0"], tt["output.0"])
    assert t1[node]["input_kwargs"]["approximate"]["value"] == "tanh"
    # every paired node before it (target execution order) is identical; step 0 entirely
    order = [n for n in t1 if n in pairs]
    for n in order[: order.index(node)]:
        assert same_tensors(b1[pairs[n]], t1[n]), n
    b0, t0 = dump("renamed", "baseline", 0), dump("renamed", "target", 0)
    assert all(same_tensors(b0[pairs[n]], t0[n]) for n in pairs)
    # the culprit module: inputs agree, output differs
    mod_t, mod_b = f["culprit_module"]["target"], f["culprit_module"]["baseline"]
    mt, mb = tensors(t1[mod_t]), tensors(b1[mod_b])
    assert same_leaf(mt["input_args.0"], mb["input_args.0"]) and not same_leaf(mt["output.0"], mb["output.0"])


# ----------------------------------------------------------------------------------- pp_local
def test_pp_local_stage_modules_map_to_global_blocks():
    g = gt("pp_local")
    lay = g["layout"]
    assert lay["global_blocks_of_rank"] == {"0": [0, 1], "1": [2, 3]}
    # stage 1 numbers its blocks locally
    r1 = dump("pp_local", "pp2", 0, 1)
    full = dump("pp_local", "pp1", 0)
    assert "Module.blocks.0.Block.forward.0" in r1 and "Module.blocks.2.Block.forward.0" not in r1
    assert "Module.blocks.3.Block.forward.0" in full
    for rank, st in g["stages"].items():
        r = int(rank[4:])
        off = lay["block_offset_of_rank"][str(r)]
        for m in st["module_pairs"]:
            mt = re.match(r"blocks\.(\d+)(.*)", m["stage"])
            want = f"blocks.{int(mt.group(1)) + off}{mt.group(2)}" if mt else m["stage"]
            assert m["pp1"] == want
            for kind in ("forward", "backward", "parameters_grad"):
                if f"{kind}_nodes" in m:
                    assert module_path(m[f"{kind}_nodes"]["stage"]) == m["stage"]
                    assert module_path(m[f"{kind}_nodes"]["pp1"]) == m["pp1"]


@pytest.mark.parametrize("step", [0, 1])
def test_pp_local_stitched_stages_equal_pp1(step):
    g = gt("pp_local")
    full = dump("pp_local", "pp1", step)
    covered = []
    for rank, st in g["stages"].items():
        r = int(rank[4:])
        data = dump("pp_local", "pp2", step, r)
        pairs = [(p["stage"], p["pp1"]) for k in ("step0_forward", "step0_backward") for p in st["node_pairs"][k]]
        for m in st["module_pairs"]:
            pairs += [
                (m[f"{k}_nodes"]["stage"], m[f"{k}_nodes"]["pp1"])
                for k in ("forward", "backward", "parameters_grad")
                if f"{k}_nodes" in m
            ]
        for sn, fn in pairs:
            assert same_tensors(data[sn], full[fn]), (rank, sn, fn)
        covered += [fn for _, fn in pairs]
        assert sorted(set(data) - {sn for sn, _ in pairs}) == sorted(st["not_paired"])
    assert len(covered) == len(set(covered))
    assert set(full) - set(covered) == {"Torch._fused_adamw_.0.forward"}
    assert g["stitching"][f"step{step}"]["max_scale_aware_error"] == 0.0
    # the optimizer lists of pp1 are the stages' lists, concatenated in rank order
    opt = "Torch._fused_adamw_.0.forward"
    for r, off in g["optimizer"]["first_parameter_index_in_pp1_of_rank"].items():
        st = dump("pp_local", "pp2", step, int(r))[opt]["input_args"]
        for k in (0, 1, 2, 3):
            for i, leaf in enumerate(st[k]):
                assert same_leaf(leaf, full[opt]["input_args"][k][off + i])


def test_pp_local_p2p_nodes():
    g = gt("pp_local")
    assert {(p["step"], p["role"]) for p in g["p2p"]} == {(s, r) for s in (0, 1) for r in ("activation", "gradient")}
    for p in g["p2p"]:
        s, d = p["send"], p["recv"]
        assert s["node"].startswith("Distributed.send.") and d["node"].startswith("Distributed.recv.")
        sent = tensors(dump("pp_local", "pp2", p["step"], s["rank"])[s["node"]])[s["leaf"]]
        got = tensors(dump("pp_local", "pp2", p["step"], d["rank"])[d["node"]])[d["leaf"]]
        ref = tensors(dump("pp_local", "pp1", p["step"])[p["pp1"]["node"]])[p["pp1"]["leaf"]]
        assert same_leaf(sent, got) and same_leaf(sent, ref)
    assert g["losses"]["pp1"]["0"] == g["losses"]["pp2"]["1"]


# ---------------------------------------------------------------------------------- tp_unsync
def _partial_sum(full: dict, a: dict, b: dict) -> bool:
    return a["shape"] == full["shape"] and abs(a["Mean"] + b["Mean"] - full["Mean"]) <= 1e-4 * abs(full["Mean"]) + 1e-7


def test_tp_unsync_first_replica_difference():
    g = gt("tp_unsync")
    (f,) = g["faults"]
    assert (f["kind"], f["step"], f["ranks"], f["tensor"]) == ("replica_mismatch", 0, [0, 1], "output.0")
    assert f["node"].startswith("Functional.dropout.")
    assert g["replica_check"]["first_differing_replicated_tensor"] == {
        "step": 0,
        "node": f["node"],
        "tensor": f["tensor"],
        "ranks": [0, 1],
    }
    tp1 = dump("tp_unsync", "tp1", 0)
    r0, r1 = dump("tp_unsync", "tp2", 0, 0), dump("tp_unsync", "tp2", 0, 1)
    assert list(r0) == list(r1)
    a, b = tensors(r0[f["node"]]), tensors(r1[f["node"]])
    assert same_leaf(a["input_args.0"], b["input_args.0"])
    assert not close(a["output.0"], b["output.0"])
    assert parent(construct("tp_unsync", "tp2", 0), f["node"]) == f["module"]
    # every earlier tensor whose shape is the TP=1 shape is identical on both ranks, or a
    # row-parallel partial sum (the ranks' Means add up to the TP=1 Mean)
    seen = 0
    for node in list(r0)[: list(r0).index(f["node"])]:
        la, lb = tensors(r0[node]), tensors(r1[node])
        lf = tensors(tp1[node]) if node in tp1 else {}
        for path, leaf in la.items():
            if path not in lf or lf[path]["shape"] != leaf["shape"]:
                continue
            seen += 1
            assert same_leaf(leaf, lb[path]) or _partial_sum(lf[path], leaf, lb[path]), (node, path)
    assert seen > 20


def test_tp_unsync_tp1_comparison():
    g = gt("tp_unsync")
    tp1 = dump("tp_unsync", "tp1", 0)
    r0, r1 = dump("tp_unsync", "tp2", 0, 0), dump("tp_unsync", "tp2", 0, 1)
    c = g["tp1_comparison"]["replicas_checked"]
    assert c["ranks_agreeing_with_tp1"] == [0] and c["node"] == g["faults"][0]["node"]
    full = tensors(tp1[c["node"]])[c["tensor"]]
    assert close(full, tensors(r0[c["node"]])[c["tensor"]])
    assert not close(full, tensors(r1[c["node"]])[c["tensor"]])
    # taking rank 0's copy of replicated tensors, the first disagreement is a sharded output
    s = g["tp1_comparison"]["replicated_taken_from_rank0"]
    assert s["relation"] == "sharded dim -1" and s["step"] == 0
    full = tensors(tp1[s["node"]])
    a, b = tensors(r0[s["node"]]), tensors(r1[s["node"]])
    assert a[s["tensor"]]["shape"][-1] * 2 == full[s["tensor"]]["shape"][-1]
    merged = math.hypot(a[s["tensor"]]["Norm"], b[s["tensor"]]["Norm"])
    assert merged != pytest.approx(full[s["tensor"]]["Norm"], rel=1e-4)
    assert close(full["input_args.0"], a["input_args.0"])  # rank 0's input agrees with tp1
    assert not close(full["input_args.0"], b["input_args.0"])  # rank 1's does not
    assert list(r0).index(s["node"]) > list(r0).index(c["node"])


def test_tp_unsync_persists_and_weights_drift():
    g = gt("tp_unsync")
    first1 = g["replica_check"]["per_step"]["step1"]["first"]
    assert first1 == {"node": "Functional.embedding.0.forward", "tensor": "input_args.1"}
    w = [tensors(dump("tp_unsync", "tp2", s, r)[first1["node"]])[first1["tensor"]] for s in (0, 1) for r in (0, 1)]
    assert same_leaf(w[0], w[1]) and not same_leaf(w[2], w[3])
    assert g["losses"]["tp2"]["0"][0] != g["losses"]["tp1"]["0"][0]
    assert g["synced_reference_losses"]["0"] == g["losses"]["tp1"]["0"]


def test_generator_pairing_helpers_doctests():
    import doctest

    import precnb_samples._align_truth as mod

    result = doctest.testmod(mod)
    assert result.failed == 0 and result.attempted >= 5


# ------------------------------------------------------------------------------- regeneration
@pytest.mark.slow
@pytest.mark.needs_generator
@pytest.mark.skipif(not (_have("torch") and _have("msprobe")), reason="needs torch and msprobe")
@pytest.mark.parametrize("name", ["renamed", "pp_local", "tp_unsync"])
def test_regenerate_is_bit_identical(tmp_path, name):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "precnb_samples", "--out", str(tmp_path), "--only", name, "--no-readme"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    committed = DATA / name
    if not committed.exists():
        pytest.skip(f"{committed} missing")
    new_files = sorted(p.relative_to(tmp_path / name) for p in (tmp_path / name).rglob("*.json"))
    old_files = sorted(p.relative_to(committed) for p in committed.rglob("*.json"))
    assert new_files == old_files
    for rel in new_files:
        if rel.name in ("dump.json", "construct.json"):
            assert (tmp_path / name / rel).read_bytes() == (committed / rel).read_bytes(), rel
    new, old = load(tmp_path / name / "ground_truth.json"), load(committed / "ground_truth.json")
    assert {k: v for k, v in new.items() if k != "generated_by"} == {
        k: v for k, v in old.items() if k != "generated_by"
    }
