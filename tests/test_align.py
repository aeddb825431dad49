"""Alignment of runs whose names differ (issue #13), on real dumps.

* msprobe's own MindSpore/PyTorch fixture pair: the node pairs msprobe's unit test for layer
  mapping expects, with and without its layer_mapping.yaml;
* S13 (a PyTorch tiny GPT and its MindSpore port): every module pair and API pair of the ground
  truth; ``precnb diff`` finds nothing; differences injected into either side are found at the
  right module, named on both sides;
* the bundled ``renamed`` pair (Hugging Face vs Megatron names, an extra op shifting counters, a
  real fault at step 1) and ``pp_local`` (PP stages with local ``blocks.N`` names);
* mapping files round-trip through ``precnb align -o`` / ``--mapping``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import precnb
from precnb.analysis.align import align
from precnb.analysis.layout.pp import layer_containers
from precnb.mapping import load_mapping, parse_mapping
from tests._inprocess_cli import run_cli
from tests.conftest import open_quiet, sample_path, shared_path

FIXTURE = ("fixtures", "msprobe_repo", "Ascend-msprobe", "test", "msprobe_test", "mindspore_ut", "compare",
           "dump_file")
S13 = ("data_samples", "msprobe", "S13_ms_vs_pt")

# msprobe test/msprobe_test/mindspore_ut/compare/test_layer_mapping.py: MindSpore node -> PyTorch node
MSPROBE_EXPECTED = {
    "Tensor.__add__.0.forward": "N/A",
    "Tensor.__bool__.1.forward": "N/A",
    "Tensor.__add__.1.forward": "Tensor.__add__.0.forward",
    "Mint.logical_or.0.forward": "Tensor.__or__.0.forward",
    "Distributed.all_reduce.0.forward": "Distributed.all_reduce.0.forward",
    "Cell.network_with_loss.module.language_model.embedding.word_embeddings.VocabParallelEmbedding.forward.0":
        "Module.module.module.language_model.embedding.word_embeddings.VocabParallelEmbedding.forward.0",
    "Primitive.norm.RmsNorm.0.forward": "NPU.npu_rms_norm.0.forward",
    "Cell.network_with_loss.module.language_model.encoder.layers.0.ParallelTransformerLayer.forward.0":
        "Module.module.module.language_model.encoder.layers.0.ParallelTransformerLayer.forward.0",
    "Cell.network_with_loss.module.language_model.encoder.layers.0.input_norm.FusedRMSNorm.backward.0": "N/A",
    "Cell.network_with_loss.module.language_model.encoder.layers.0.attention.ParallelAttention.forward.0":
        "Module.module.module.language_model.encoder.layers.0.self_attention.ParallelAttention.forward.0",
    "Mint.cos.0.forward": "Torch.cos.0.forward",
    "Functional.flash_attention_score.0.forward": "NPU.npu_fusion_attention.0.forward",
    "Functional.flash_attention_score.0.backward": "NPU.npu_fusion_attention.0.backward",
}


def cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args)  # `python -m precnb ARGS` in this process (tests/_inprocess_cli.py)


# ------------------------------------------------------------------ msprobe's own fixture pair
@pytest.mark.shared
@pytest.mark.parametrize("with_yaml", [False, True], ids=["no-mapping", "layer_mapping.yaml"])
def test_msprobe_fixture_pairs_equal_msprobes_layer_mapping_test(with_yaml):
    d = shared_path(*FIXTURE)
    args = ["align", str(d / "pytorch_data"), str(d / "mindspore_data"), "--json"]
    if with_yaml:
        args += ["--mapping", str(d / "layer_mapping.yaml")]
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    got = {p["target"]: p["baseline"] for p in doc["nodes"]}
    for ms_node, pt_node in MSPROBE_EXPECTED.items():
        assert got.get(ms_node, "N/A") == pt_node, ms_node
    # the JSON contract
    assert set(doc) >= {"modules", "nodes", "tensors", "unpaired", "counts"}
    assert set(doc["unpaired"]) == {"baseline", "target", "glue"}
    for p in doc["modules"] + doc["nodes"] + doc["tensors"]:
        assert set(p) == {"baseline", "target", "how", "confidence"}
        assert p["how"] in {"name", "structure", "shape", "value", "user"} and 0 < p["confidence"] <= 1
    mods = {p["target"]: p["baseline"] for p in doc["modules"]}
    assert mods["network_with_loss.module.language_model.encoder.layers.0.attention"] == \
        "module.module.language_model.encoder.layers.0.self_attention"
    if with_yaml:
        assert {p["how"] for p in doc["modules"]} == {"user"}
        assert mods["network_with_loss"] == "module"  # TopLayer: network_with_loss -> module


# ------------------------------------------------------------------ S13: PyTorch vs its MindSpore port
@pytest.fixture(scope="module")
def s13():
    root = shared_path(*S13)
    gt = json.loads((root / "ground_truth.json").read_text())
    return root, open_quiet(root / "pt"), open_quiet(root / "ms_same"), gt


@pytest.mark.shared
def test_s13_every_module_and_api_pair_of_the_ground_truth(s13):
    _root, pt, ms, gt = s13
    a = align(pt, ms)
    mods = {p.baseline: p.target for p in a.modules}
    assert {b: mods.get(b) for b in gt["module_map_short"]} == gt["module_map_short"]  # all 25
    nodes = {p.baseline: p.target for p in a.nodes}
    for pr in gt["api_pairs_forward_step0"]:  # all 61
        assert nodes.get(pr["pt_api"]) == pr["ms_api"], pr
    # glue the port adds (reshape / shape primitives) is classified, never a difference
    glue = {g["node"] for g in a.unpaired["glue"] if g["side"] == "target"}
    for mod, extra in gt["unpaired_forward_apis_step0"].items():
        assert set(extra["ms"]) <= glue, mod
    assert not a.unpaired["baseline"]
    # dtype spellings and Cell/Module prefixes differ; the pairs say so
    pair = next(p for p in a.tensors if p.target == "Primitive.matmul.MatMul.0.forward.output.0")
    assert pair.baseline == "Functional.linear.0.forward.output.0" and pair.how == "value"


@pytest.mark.slow
@pytest.mark.shared
def test_s13_diff_of_the_healthy_port_finds_nothing(s13):
    root, *_ = s13
    out = cli("diff", str(root / "pt"), str(root / "ms_same"), "--json")
    assert out.returncode == 0, out.stderr
    f = json.loads(out.stdout)
    assert f["kind"] == "none", f["reason"]
    assert f["stats"]["alignment"]["modules_paired"] >= 25
    text = cli("diff", str(root / "pt"), str(root / "ms_same")).stdout
    assert "aligned" in text and "nodes" in text  # it says how many nodes it paired and how


def _inject(src: Path, dst: Path, step: int, node: str, factor: float) -> list[str]:
    """Copy a dump; at *step*, *node* computes wrongly: scale its output and what follows by *factor*.

    As a real bug propagates: every later record changes, except the inputs of the modules around
    *node* (computed before it). Returns the changed nodes.
    """
    shutil.copytree(src, dst)
    dump = next((dst / f"step{step}").glob("*/dump.json"))
    data = json.loads(dump.read_text())
    construct = json.loads(dump.with_name("construct.json").read_text())
    around = set()
    cur = node
    while construct.get(cur):
        cur = construct[cur][0] if isinstance(construct[cur], list) else construct[cur]
        around.add(cur)

    def scale(x):
        if isinstance(x, dict):
            if x.get("type", "").endswith("Tensor") and str(x.get("dtype", "")).lower().endswith(
                    ("float32", "float16", "bfloat16")):
                for k in ("Max", "Min", "Mean", "Norm"):
                    if isinstance(x.get(k), float):
                        x[k] *= factor
            for v in x.values():
                scale(v)
        elif isinstance(x, list):
            for v in x:
                scale(v)

    changed: list[str] = []
    on = False
    for name, rec in data["data"].items():
        if name == node:
            on = True
        if not on or name.endswith(".backward") or ".backward." in name or "parameters_grad" in name:
            continue
        scale(rec.get("output", []) if name == node or name in around else rec)
        changed.append(name)
    assert changed, node
    dump.write_text(json.dumps(data, indent=1))
    return changed


@pytest.mark.shared
@pytest.mark.parametrize("side", ["target", "baseline"])
def test_s13_injected_difference_found_at_its_module_named_on_both_sides(s13, tmp_path, side):
    root, _pt, _ms, gt = s13
    # layer 1's first MLP linear computes wrongly from step 1 on: its output (and all after it) changes
    ms_node, pt_node = "Primitive.matmul.MatMul.10.forward", "Functional.linear.10.forward"
    if side == "target":
        _inject(root / "ms_same", tmp_path / "ms", 1, ms_node, 1.01)
        base, targ = root / "pt", tmp_path / "ms"
    else:
        _inject(root / "pt", tmp_path / "pt", 1, pt_node, 1.01)
        base, targ = tmp_path / "pt", root / "ms_same"
    out = cli("diff", str(base), str(targ), "--json")
    assert out.returncode == 0, out.stderr
    f = json.loads(out.stdout)
    assert f["kind"] == "first_divergence" and f["step"] == 1 and f["rank"] == 0
    assert f["node"] == ms_node and f["tensor"] == ms_node + ".output.0"
    assert f["module"] == "layers.1.feed_forward.w1" and f["baseline"]["module"] == "blocks.1.mlp.up_proj"
    assert f["baseline"]["node"] == pt_node and f["baseline"]["tensor"] == pt_node + ".output.0"
    assert "inputs agree, output differs" in f["reason"]
    assert f["evidence"]["culprit"]["module"] == "layers.1.feed_forward.w1"
    assert f["evidence"]["culprit"]["baseline"]["module"] == "blocks.1.mlp.up_proj"
    assert gt["module_map_short"]["blocks.1.mlp.up_proj"] == "layers.1.feed_forward.w1"


@pytest.mark.shared
def test_s13_python_api_with_open_runs(s13):
    root, *_ = s13
    both = precnb.open_runs({"pt": root / "pt", "ms": root / "ms_same"}, progress=False)
    f = precnb.first_divergence(both)
    assert f.kind == "none"
    t = precnb.diagnose({"pt": root / "pt", "ms": root / "ms_same"}, progress=False)
    assert t.finding.kind == "none" and not t.alignment.identical


# ------------------------------------------------------------------ bundled: renamed modules, local PP names
@pytest.fixture(scope="module")
def renamed():
    root = sample_path("renamed")
    return root, json.loads((root / "ground_truth.json").read_text())


def test_renamed_pairs_every_module_and_node_of_the_ground_truth(renamed):
    root, gt = renamed
    a = align(open_quiet(root / "baseline"), open_quiet(root / "target"))
    mods = {p.baseline: p.target for p in a.modules}
    for p in gt["module_pairs"]:
        assert mods.get(p["baseline"]) == p["target"], p["baseline"]
    nodes = {p.baseline: p.target for p in a.nodes}
    for p in gt["node_pairs"]["step0_forward"] + gt["node_pairs"]["step0_backward"]:
        assert nodes.get(p["baseline"]) == p["target"], p
    # the extra x1.0 in the target shifts every later Tensor.__mul__ counter: pairs follow values, not names
    shifted = [p for p in gt["node_pairs"]["step0_forward"] if p["baseline"].startswith("Tensor.__mul__")]
    assert shifted and all(nodes[p["baseline"]] == p["target"] != p["baseline"] for p in shifted)
    extra = {e["node"] for e in gt["extra_ops"] if e["side"] == "target" and e["in_dump_json"]}
    glue = {g["node"] for g in a.unpaired["glue"] if g["side"] == "target"}
    assert extra <= glue and not a.unpaired["target"] and not a.unpaired["baseline"]


def test_renamed_diff_finds_the_real_fault_named_on_both_sides(renamed):
    root, gt = renamed
    fault = next(f for f in gt["faults"] if f["role"] == "origin")
    out = cli("diff", str(root / "baseline"), str(root / "target"), "--json")
    assert out.returncode == 0, out.stderr
    f = json.loads(out.stdout)
    assert (f["kind"], f["step"], f["rank"], f["node"]) == ("first_divergence", fault["step"], fault["rank"],
                                                            fault["node"])
    assert f["module"] == fault["module_path"] and f["baseline"]["module"] == fault["baseline"]["module_path"]
    assert f["baseline"]["node"] == fault["baseline"]["node"]
    assert not f["structural"], "renamed modules and a value-preserving extra op are no structural difference"


def test_layer_stacks_are_found_from_the_module_tree():
    assert layer_containers(["Module.h.0.Block.forward.0", "Module.h.1.Block.forward.0"]) == ["h"]
    assert layer_containers(["Module.model.decoder.layer.3.L.forward.0"]) == ["model.decoder.layer"]
    assert layer_containers(["Module.blocks.0.mlp.experts.1.E.forward.0", "Module.blocks.0.B.forward.0"]) \
        == ["blocks"]


def test_pp_stages_with_local_blocks_names_stitch_and_match_the_unsplit_run():
    root = sample_path("pp_local")
    gt = json.loads((root / "ground_truth.json").read_text())
    t = precnb.diagnose(root / "pp2", baseline=root / "pp1", target_layout="pp=2", kinds=["first_divergence"],
                        progress=False)
    assert t.finding.kind == "none", t.finding.reason
    assert not t.finding.structural
    stitched = set(t.target["module"].values.tolist())
    assert {"blocks.2", "blocks.3", "blocks.3.mlp"} <= stitched
    assert gt["world_size"]["pp2"] == 2 if isinstance(gt["world_size"], dict) else True
    out = cli("diff", str(root / "pp1"), str(root / "pp2"), "--target-layout", "pp=2", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["kind"] == "none", out.stdout[:300]


# ------------------------------------------------------------------ mapping files
def test_mapping_file_round_trip_and_user_pairs(renamed, tmp_path):
    root, _gt = renamed
    m = tmp_path / "map.json"
    out = cli("align", str(root / "baseline"), str(root / "target"), "-o", str(m))
    assert out.returncode == 0, out.stderr
    spec = load_mapping(m)
    assert spec.kind == "precnb" and spec.modules["model.layers.1.mlp"] == "decoder.layers.1.mlp"
    again = json.loads(cli("align", str(root / "baseline"), str(root / "target"), "--mapping", str(m),
                           "--json").stdout)
    mods = {p["baseline"]: p for p in again["modules"]}
    written = {p["baseline"]: p for p in json.loads(m.read_text())["modules"]}
    assert mods["model.layers.1.mlp"]["target"] == "decoder.layers.1.mlp"
    # read back, a pair keeps how it was found (issue 26): not every pair becomes "user"
    assert mods["model.layers.1.mlp"]["how"] == written["model.layers.1.mlp"]["how"] == "value"
    assert {p["how"] for p in again["modules"]} == {p["how"] for p in written.values()} and "user" not in {
        p["how"] for p in again["modules"]}
    # writing again without --overwrite is refused; with it, the precnb file is replaced
    assert cli("align", str(root / "baseline"), str(root / "target"), "-o", str(m)).returncode == 1
    assert cli("align", str(root / "baseline"), str(root / "target"), "-o", str(m), "--overwrite").returncode == 0
    user = tmp_path / "notes.json"
    user.write_text("{}")
    bad = cli("align", str(root / "baseline"), str(root / "target"), "-o", str(user), "--overwrite")
    assert bad.returncode == 1 and "not a precnb output" in bad.stderr and user.read_text() == "{}"


def test_a_partial_mapping_is_completed_and_a_user_pair_wins(renamed):
    root, _gt = renamed
    b, t = open_quiet(root / "baseline"), open_quiet(root / "target")
    doc = {"modules": [{"baseline": "model.layers.0.mlp.up_proj", "target": "decoder.layers.0.mlp.linear_fc1"}]}
    a = align(b, t, mapping=doc)
    mods = {p.baseline: (p.target, p.how) for p in a.modules}
    assert mods["model.layers.0.mlp.up_proj"] == ("decoder.layers.0.mlp.linear_fc1", "user")
    assert mods["model.layers.1.mlp"][0] == "decoder.layers.1.mlp" and mods["model.layers.1.mlp"][1] != "user"


def test_mapping_kinds_are_detected():
    assert parse_mapping({"TopLayer": {"a": "b"}}).kind == "layer"
    assert parse_mapping({"tok_embeddings.Embedding": "embed.Embedding"}).kind == "cell"
    assert parse_mapping([{"ms_api": "Mint.cos", "pt_api": "Torch.cos"}]).kind == "api"
    assert parse_mapping({"Mint.cos.0.forward.input.0": "Torch.cos.0.forward.input.0"}).kind == "data"
    with pytest.raises(precnb.errors.PrecnbError, match="not a mapping file"):
        parse_mapping([1, 2])


@pytest.mark.shared
def test_s13_msprobe_cell_and_layer_mapping_files_are_read(s13):
    root, pt, ms, gt = s13
    for name in ("cell_mapping.yaml", "layer_mapping.yaml"):
        a = align(pt, ms, mapping=root / "msprobe_mapping" / name)
        mods = {p.baseline: (p.target, p.how) for p in a.modules}
        for b_path, t_path in gt["module_map_short"].items():
            assert mods[b_path][0] == t_path, (name, b_path)
        assert any(how == "user" for _t, how in mods.values()), name


def test_identical_names_align_to_themselves_at_no_cost():
    ds = open_quiet(sample_path("healthy"))
    a = align(ds, ds)
    assert a.identical and a.apply(ds) is ds
    assert len(a.tensors) == ds.sizes["tensor"] and {p.how for p in a.nodes} == {"name"}


def test_apply_renames_the_baseline_into_the_target_names(renamed):
    root, _gt = renamed
    b, t = open_quiet(root / "baseline"), open_quiet(root / "target")
    a = align(b, t)
    moved = a.apply(b)
    tm = a.tensor_map()
    label = "Module.decoder.layers.1.mlp.MLP.forward.0.output.0"
    assert tm[label] == "Module.model.layers.1.mlp.TinyLlamaMLP.forward.0.output.0"
    assert str(moved["module"].sel(tensor=label).values) == "decoder.layers.1.mlp"
    np.testing.assert_array_equal(moved["norm"].sel(tensor=label).values,
                                  b["norm"].sel(tensor=tm[label]).values)
