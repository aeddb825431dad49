"""The msprobe dump reader against real msprobe output: values equal the raw JSON exactly."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import precnb
from precnb.io.msprobe import discover
from precnb.io.msprobe.parse import leaves_of as _leaves_of
from precnb.naming import parse_node
from precnb.schema import validate
from tests.conftest import shared_path

S1 = ("data_samples", "msprobe", "S1_baseline")
S5 = ("data_samples", "msprobe", "S5_tp_shards")


def raw_leaves(dump_json: Path) -> dict[str, dict]:
    """Independent flattening of dump.json (compare naming), for checking the reader."""
    data = json.loads(dump_json.read_text())["data"]
    out = {}
    for node, rec in data.items():
        for label, _role, leaf in _leaves_of(node, rec, parse_node(node).kind):
            out[label] = leaf
    return out


def same(a: float, b) -> bool:
    if b is None:
        return math.isnan(a)
    b = float(b)
    return (math.isnan(a) and math.isnan(b)) or a == b


def check_exact(ds: xr.Dataset, step: int, rank: int, dump_json: Path, k: int = 300) -> int:
    leaves = raw_leaves(dump_json)
    labels = sorted(leaves)
    random.Random(0).shuffle(labels)
    checked = 0
    for label in labels[:k]:
        leaf = leaves[label]
        sel = ds.sel(step=step, rank=rank, tensor=label)
        assert bool(sel.present), label
        for stat, key in (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "Norm")):
            got = float(sel[stat])
            assert same(got, leaf.get(key)), (label, stat, got, leaf.get(key))
            bit = {"max": 1, "min": 2, "mean": 4, "norm": 8}[stat]
            assert bool(int(sel.null_stats) & bit) == (leaf.get(key) is None), (label, stat)
        assert str(sel.dtype.values) == leaf["dtype"]
        assert int(sel.numel) == int(np.prod(leaf["shape"])) if leaf["shape"] else 1
        checked += 1
    return checked


@pytest.mark.parametrize("variant", ["statistics", "md5", "md5_rerun", "tensor"])
def test_s1_values_equal_raw_json_exactly(variant):
    root = shared_path(*S1, variant)
    ds = precnb.open_run(root)
    validate(ds)
    for rd in discover(root):
        assert check_exact(ds, rd.step, rd.rank, rd.dump_file, k=250) > 100


def test_s1_masked_fill_minus_inf_preserved():
    root = shared_path(*S1, "statistics")
    ds = precnb.open_run(root, steps=[0])
    out = ds.sel(tensor="Tensor.masked_fill.0.forward.output.0", step=0, rank=0)
    assert float(out["min"]) == -np.inf
    assert float(out["mean"]) == -np.inf
    assert math.isfinite(float(out["max"]))
    inp = ds.sel(tensor="Functional.softmax.0.forward.input.0", step=0, rank=0)
    assert float(inp["min"]) == -np.inf


def test_s1_md5_crc_and_present_mask():
    ds = precnb.open_run(shared_path(*S1, "md5"))
    assert "crc" in ds
    crc = ds["crc"].sel(step=0, rank=0).values
    present = ds["present"].sel(step=0, rank=0).values
    assert all(len(c) == 8 for c in crc[present])
    raw = raw_leaves(next(iter(discover(shared_path(*S1, "md5")))).dump_file)
    lbl = "Functional.linear.0.forward.output.0"
    assert ds["crc"].sel(step=0, rank=0, tensor=lbl).item() == raw[lbl]["md5"]


def test_int_tensor_mean_is_null_not_nan():
    ds = precnb.open_run(shared_path(*S1, "statistics"), steps=[0])
    t = ds.sel(tensor="Functional.embedding.0.forward.input.0", step=0, rank=0)
    assert str(t.dtype.values) == "torch.int64"
    assert float(t["max"]) == 127.0
    assert int(t.null_stats) == 4 | 8
    # the causal mask's -inf (and the softmax reading it) are the only non-finite values; no NaN
    assert int(precnb.analysis.nonfinite(ds, kind="inf").sum()) > 0
    assert int(precnb.analysis.nonfinite(ds, kind="nan").sum()) == 0
    assert int(precnb.analysis.nonfinite(ds).sum()) == int(precnb.analysis.nonfinite(ds, kind="inf").sum())


def test_s5_tp2_two_ranks_and_absent_tensors():
    tp2 = precnb.open_run(shared_path(*S5, "tp2"))
    tp1 = precnb.open_run(shared_path(*S5, "tp1"))
    assert list(tp2["rank"].values) == [0, 1] and list(tp2.step.values) == [0, 1]
    assert list(tp1["rank"].values) == [0]
    runs = precnb.open_runs({"tp1": tp1, "tp2": tp2})
    validate(runs)
    ar = [t for t in runs.tensor.values if t.startswith("Distributed.all_reduce")]
    assert ar, "tp2 records all_reduce nodes"
    p = runs["present"].sel(tensor=ar[0])
    assert not bool(p.sel(run="tp1").any()) and bool(p.sel(run="tp2", rank=1).all())
    assert bool(np.isnan(runs["max"].sel(run="tp1", tensor=ar[0])).all())
    for rd in discover(shared_path(*S5, "tp2")):
        check_exact(tp2, rd.step, rd.rank, rd.dump_file, k=100)


def test_path_may_be_root_step_rank_or_file():
    root = shared_path(*S5, "tp2")
    a = precnb.open_run(root / "step1")
    assert list(a.step.values) == [1] and list(a["rank"].values) == [0, 1]
    b = precnb.open_run(root / "step1" / "rank1")
    assert list(b.step.values) == [1] and list(b["rank"].values) == [1]
    c = precnb.open_run(root / "step1" / "rank1" / "dump.json")
    xr.testing.assert_equal(b["max"], c["max"])


def test_execution_order_seq_and_module_tree():
    ds = precnb.open_run(shared_path(*S1, "statistics"), steps=[0])
    seq = ds["seq"].sel(step=0, rank=0)
    assert int(seq.sel(tensor="Functional.embedding.0.forward.input.0")) == 0
    # msprobe re-inserts module records after their children
    assert int(seq.sel(tensor="Module.embed.Embedding.forward.0.output.0")) > int(
        seq.sel(tensor="Functional.embedding.0.forward.output.0"))
    lin = ds.sel(tensor="Functional.linear.0.forward.output.0")
    assert str(lin.module.values) == "blocks.0.attn.q_proj"
    assert str(lin.parent.values) == "Module.blocks.0.attn.q_proj.Linear.forward.0"
    assert ds.prec.stack("Functional.linear.0.forward")[0].startswith("File ")
    assert str(ds.sel(tensor="Module.fc.Linear.parameters_grad.0.weight").kind.values) \
        if "Module.fc.Linear.parameters_grad.0.weight" in ds.tensor else True


FIXTURES = [
    "Ascend-msprobe/test/msprobe_test/mindspore_ut/compare/dump_file/mindspore_data/dump.json",
    "Ascend-msprobe/test/msprobe_test/mindspore_ut/compare/dump_file/pytorch_data/dump.json",
    "Ascend-msprobe/test/resources/layer_mapping/mindspore/dump.json",
    "Ascend-msprobe/test/resources/layer_mapping/pytorch/dump.json",
    "Ascend-msprobe/test/msprobe_test/pytorch_ut/api_accuracy_checker/run_ut/dump.json",
    "Ascend-msprobe/test/msprobe_test/pytorch_ut/api_accuracy_checker/run_ut/forward.json",
    "Ascend-msprobe/test/msprobe_test/mindspore_ut/api_accuracy_checker/files/api_info_statistics.json",
    "Ascend-msprobe/test/msprobe_test/visualization_ut/input_format_correct/step0/rank0/dump.json",
    "derived/quick_start_step0_proc2016_dump.trimmed.json",
]


@pytest.mark.parametrize("rel", FIXTURES)
def test_msprobe_repo_fixtures_load(rel):
    p = shared_path("fixtures", "msprobe_repo", *rel.split("/"))
    ds = precnb.open_run(p)
    validate(ds)
    doc = json.loads(p.read_text())
    data = doc.get("data", doc)
    leaves = {}
    for node, rec in data.items():
        for label, _r, leaf in _leaves_of(node, rec, parse_node(node).kind):
            leaves[label] = leaf
    assert set(ds.tensor.values) == set(leaves)
    for label, leaf in leaves.items():
        sel = ds.sel(tensor=label, step=ds.step[0], rank=ds["rank"][0])
        for stat, key in (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "Norm")):
            assert same(float(sel[stat]), leaf.get(key)), (label, stat)


def test_mindspore_fixture_framework_and_cells():
    p = shared_path("fixtures", "msprobe_repo", "Ascend-msprobe", "test", "msprobe_test",
                    "mindspore_ut", "compare", "dump_file", "mindspore_data")
    ds = precnb.open_run(p / "dump.json")
    assert ds.attrs["framework"] == "mindspore"
    stacks = ds.prec.stacks()
    assert stacks  # old stack format (node -> frames)
    assert any(str(m).startswith("network_with_loss") for m in ds.module.values)


def test_missing_framework_key_is_detected(tmp_path):
    d = tmp_path / "step0" / "rank"
    d.mkdir(parents=True)
    (d / "dump.json").write_text(json.dumps({"task": "statistics", "data": {
        "Mint.add.0.forward": {"input_args": [{"type": "mindspore.Tensor", "dtype": "Float32",
                                               "shape": [2], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
                                               "Norm": 1.0}], "output": []}}}))
    ds = precnb.open_run(tmp_path)
    assert ds.attrs["framework"] == "mindspore" and list(ds["rank"].values) == [0]


def test_bare_nan_tokens_megatron_construct_and_old_param_grad(tmp_path):
    d = tmp_path / "step3" / "rank2"
    d.mkdir(parents=True)
    (d / "dump.json").write_text("""{"task": "statistics", "level": "L0", "framework": "pytorch",
     "data": {"Module.layers.0.Linear.forward.0": {"input_args": [
        {"type": "torch.Tensor", "dtype": "torch.bfloat16", "shape": [2, 2],
         "Max": NaN, "Min": -Infinity, "Mean": Infinity, "Norm": null, "requires_grad": true}],
        "input_kwargs": {}, "output": [{"type": "torch.Tensor", "dtype": "torch.bool", "shape": [],
         "Max": true, "Min": false, "Mean": null, "Norm": null}]},
      "Module.layers.0.Linear.parameters_grad": {"weight": {"type": "torch.Tensor",
         "dtype": "torch.float32", "shape": [2, 2], "Max": 1, "Min": 0, "Mean": 0.5, "Norm": 1.5}}}}""")
    (d / "construct.json").write_text(json.dumps({
        "Module.layers.0.Linear.forward.0": ["Module.Model.forward.0", 1],
        "megatron_micro_step_number": 2}))
    stack = {"0": [["Module.layers.0.Linear.forward.0"], ["File a, line 1, in f, \n x"]]}
    (d / "stack.json").write_text(json.dumps(stack))
    ds = precnb.open_run(tmp_path)
    assert list(ds.step.values) == [3] and list(ds["rank"].values) == [2]
    x = ds.sel(tensor="Module.layers.0.Linear.forward.0.input.0", step=3, rank=2)
    assert math.isnan(float(x["max"])) and float(x["min"]) == -np.inf and float(x["mean"]) == np.inf
    assert int(x.null_stats) == 8 and int(x.micro_step) == 1
    b = ds.sel(tensor="Module.layers.0.Linear.forward.0.output.0", step=3, rank=2)
    assert float(b["max"]) == 1.0 and float(b["min"]) == 0.0 and int(b.numel) == 1
    g = ds.sel(tensor="Module.layers.0.Linear.parameters_grad.weight")
    assert str(g.kind.values) == "param_grad" and str(g.role.values) == "grad"
    assert ds.prec.stack("Module.layers.0.Linear.forward.0") == ["File a, line 1, in f, \n x"]


def test_proc_folders_ignored_when_rank_folders_exist(tmp_path):
    leaf = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1],
            "Max": 1.0, "Min": 1.0, "Mean": 1.0, "Norm": 1.0}
    for name in ("rank0", "rank1", "proc999"):
        d = tmp_path / "step0" / name
        d.mkdir(parents=True)
        (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "data": {
            "Torch.add.0.forward": {"input_args": [leaf], "input_kwargs": {}, "output": [leaf]}}}))
    ds = precnb.open_run(tmp_path)
    assert list(ds["rank"].values) == [0, 1]
    rep = precnb.load_report(ds)
    assert any("proc999" in p for p, _ in rep.skipped)


def test_broken_rank_file_is_reported_and_others_load(tmp_path):
    import shutil

    src = shared_path(*S5, "tp2", "step0")
    dst = tmp_path / "step0"
    shutil.copytree(src, dst)
    f = dst / "rank1" / "dump.json"
    f.write_bytes(f.read_bytes()[:5000])
    with pytest.warns(UserWarning, match="could not be read"):
        ds = precnb.open_run(tmp_path)
    assert list(ds["rank"].values) == [0, 1]
    assert bool(ds.present.sel(rank=0).any()) and not bool(ds.present.sel(rank=1).any())
    rep = precnb.load_report(ds)
    (path, reason), = rep.skipped
    assert path.endswith("rank1/dump.json") and "line" in reason and "column" in reason
    with pytest.raises(precnb.errors.DumpFormatError, match=r"rank1/dump\.json"):
        precnb.open_run(tmp_path, errors="raise")


def test_not_a_dump(tmp_path):
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(precnb.errors.NotADumpError):
        precnb.open_run(tmp_path)


def test_zarr_round_trip_identical(tmp_path):
    ds = precnb.open_run(shared_path(*S1, "md5"))
    precnb.to_zarr(ds, tmp_path / "run.zarr")
    back = precnb.open_run(tmp_path / "run.zarr")
    xr.testing.assert_identical(ds, back)
    with pytest.raises(FileExistsError):
        precnb.to_zarr(ds, tmp_path / "run.zarr")


def test_lazy_open_matches_eager():
    root = shared_path(*S5, "tp2")
    eager = precnb.open_run(root)
    lazy = precnb.open_run(root, lazy=True)
    assert lazy["max"].chunks is not None
    xr.testing.assert_identical(eager, lazy.compute())


def test_xarray_backend_entrypoint():
    root = shared_path(*S5, "tp1")
    ds = xr.open_dataset(root, engine="precnb_msprobe")
    xr.testing.assert_identical(ds, precnb.open_run(root))
