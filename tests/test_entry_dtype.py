"""Per-entry dtypes: an op cast to bfloat16 from step 1 on one rank is seen at that entry.

The ``dtype`` coordinate is the tensor's first-seen dtype; ``attrs["dtype_changes"]`` lists the
entries that differ, and :func:`precnb.schema.entry_dtype` gives every entry's dtype exactly as
the dump file wrote it.
"""

from __future__ import annotations

import json
import shutil

import pytest
import xarray as xr

import precnb
from precnb.analysis import first_divergence, merge_shards
from precnb.combine import combine_runs, concat_steps, select_run
from precnb.io.msprobe import discover
from precnb.schema import dtype_changes, encode_dtype_changes, entry_dtype
from tests.conftest import open_quiet as _open
from tests.conftest import sample_path
from tests.test_io_msprobe import raw_leaves


@pytest.mark.parametrize("name", ["divergence/target", "dp_nan", "tp/tp2"])
def test_every_entry_dtype_equals_the_dump_file(name):
    root = sample_path(*name.split("/"))
    ds = _open(root)
    changes = dtype_changes(ds)
    checked = 0
    for rd in discover(root):
        for label, leaf in raw_leaves(rd.dump_file).items():
            if "dtype" not in leaf:
                continue
            assert entry_dtype(ds, label, rd.step, rd.rank, changes) == leaf["dtype"], (label, rd.key)
            checked += 1
    assert checked > 500


def test_divergence_sample_cast_is_listed_where_it_happens():
    truth = json.loads((sample_path("divergence") / "ground_truth.json").read_text())
    assert "bfloat16" in truth["what"]
    t = _open(sample_path("divergence", "target"))
    changes = dtype_changes(t)
    assert set(changes) == {f"Functional.gelu.0.{d}.{io}.0" for d in ("forward", "backward")
                            for io in ("input", "output")}
    for where in changes.values():
        assert where == {(1, 0): "torch.bfloat16", (2, 0): "torch.bfloat16"}
    assert str(t["dtype"].sel(tensor="Functional.gelu.0.forward.input.0").values) == "torch.float32"
    assert dtype_changes(_open(sample_path("divergence", "baseline"))) == {}


def test_first_divergence_names_the_dtype_at_the_origin_entry():
    b = _open(sample_path("divergence", "baseline"))
    t = _open(sample_path("divergence", "target"))
    f = first_divergence(b, t)
    assert (f.step, f.rank, f.tensor) == (1, 0, "Functional.gelu.0.forward.input.0")
    assert f.values["baseline"]["dtype"] == "torch.float32"
    assert f.values["target"]["dtype"] == "torch.bfloat16"
    hint = next(h for h in f.hints if h.startswith("dtype differs at this tensor"))
    assert "torch.float32 in baseline vs torch.bfloat16 in target" in hint and "before step 1" in hint


def test_dtype_change_alone_is_a_difference():
    """Same statistics, different dtype at one entry: counted, at that entry only."""
    from precnb.analysis import compare_runs

    b = _open(sample_path("divergence", "baseline"))
    t = b.copy()
    t.attrs = {**b.attrs, "dtype_changes": encode_dtype_changes(
        {"Functional.gelu.0.forward.output.0": {(2, 1): "torch.float16"}})}
    cmp = compare_runs(b, t)
    assert int(cmp.dtype_differs.sum()) == 1
    assert bool(cmp.differs.sel(step=2, rank=1, tensor="Functional.gelu.0.forward.output.0"))
    assert int(cmp.differs.sum()) == 1
    f = first_divergence(b, t)
    assert (f.step, f.rank, f.node) == (2, 1, "Functional.gelu.0.forward")
    assert f.values["target"]["dtype"] == "torch.float16"


def test_dtype_changes_survive_concat_combine_select_and_zarr(tmp_path):
    root = sample_path("divergence", "target")
    whole = _open(root)
    parts = [_open(root, steps=[s]) for s in (0, 1, 2)]
    assert dtype_changes(parts[0]) == {}
    assert dtype_changes(concat_steps(parts)) == dtype_changes(whole)
    both = combine_runs({"b": _open(sample_path("divergence", "baseline")), "t": whole})
    assert "dtype_changes" not in both.attrs  # run-specific: kept per run
    assert dtype_changes(select_run(both, "t")) == dtype_changes(whole)
    assert dtype_changes(select_run(both, "b")) == {}
    store = precnb.to_zarr(root, tmp_path / "t.zarr", progress=False)
    assert dtype_changes(precnb.open_run(store)) == dtype_changes(whole)


def test_step_offset_moves_the_target_dtype_table():
    b = _open(sample_path("divergence", "baseline"))
    t = _open(sample_path("divergence", "target"))
    t = t.assign_coords(step=t["step"] + 10)
    t.attrs["dtype_changes"] = encode_dtype_changes(
        {k: {(s + 10, r): d for (s, r), d in w.items()} for k, w in dtype_changes(t).items()})
    f = first_divergence(b, t, step_offset=10)
    assert (f.step, f.rank) == (1, 0) and f.values["target"]["dtype"] == "torch.bfloat16"


def test_tp_merge_keeps_the_representative_ranks_dtypes(tmp_path):
    src = sample_path("tp", "tp2")
    ds = _open(src)
    label = next(str(x) for x in ds["tensor"].values if ds["kind"].sel(tensor=x) == "api")
    ds.attrs["dtype_changes"] = encode_dtype_changes({label: {(0, 0): "torch.float16", (0, 1): "torch.float16"}})
    from precnb.analysis import Layout

    merged = merge_shards(ds, Layout(2, tp=2))
    assert dtype_changes(merged) == {label: {(0, 0): "torch.float16"}}


def test_truncated_table_is_bounded(monkeypatch, tmp_path):
    from precnb.io._assemble import _changes  # the layer that reads the bound

    monkeypatch.setattr(_changes, "MAX_DTYPE_CHANGES", 3)
    ds = _open(sample_path("divergence", "target"))
    assert sum(len(w) for w in dtype_changes(ds).values()) == 3


@pytest.mark.parametrize("reader", ["whole", "batched"])
def test_both_parsers_agree(monkeypatch, reader):
    if reader == "whole":
        monkeypatch.setenv("PRECNB_JSON_WHOLE", "1")
    ds = _open(sample_path("divergence", "target"))
    assert len(dtype_changes(ds)) == 4


def test_copy_with_a_changed_dtype_in_the_file(tmp_path):
    """A dump edited so that one entry's dtype differs: read back from the file."""
    src = sample_path("dp_nan")
    dst = tmp_path / "dp_nan"
    shutil.copytree(src, dst)
    f = dst / "step2" / "rank1" / "dump.json"
    doc = json.loads(f.read_text())
    node, rec = next((n, r) for n, r in doc["data"].items() if n.startswith("Functional.linear"))
    rec["input_args"][0]["dtype"] = "torch.float16"
    f.write_text(json.dumps(doc))
    ds = _open(dst)
    label = f"{node}.input.0"
    assert dtype_changes(ds) == {label: {(2, 1): "torch.float16"}}
    assert entry_dtype(ds, label, 2, 1) == "torch.float16" and entry_dtype(ds, label, 2, 0) != "torch.float16"
    xr.testing.assert_identical(ds, _open(dst, workers=2))


def test_combined_runs_keep_each_runs_entry_dtypes():
    """The target's first-seen dtype (bf16 at step 1 rank 0) is not the combined coordinate."""
    b = _open(sample_path("divergence", "baseline"), steps=[1, 2])
    t = _open(sample_path("divergence", "target"), steps=[1, 2])
    label = "Functional.gelu.0.forward.input.0"
    assert str(t["dtype"].sel(tensor=label).values) == "torch.bfloat16"
    assert dtype_changes(t)[label] == {(1, 1): "torch.float32", (2, 1): "torch.float32"}
    both = precnb.open_runs({"gpu": b, "npu": t})
    npu = select_run(both, "npu")
    assert str(npu["dtype"].sel(tensor=label).values) == "torch.float32"  # the combined coordinate
    assert [entry_dtype(npu, label, 1, r) for r in (0, 1)] == ["torch.bfloat16", "torch.float32"]
    f = first_divergence(both)
    assert (f.step, f.rank, f.tensor) == (1, 0, label)
    assert f.values["npu"]["dtype"] == "torch.bfloat16" and f.values["gpu"]["dtype"] == "torch.float32"


def test_detail_table_shows_the_entry_dtype():
    from precnb.viz.series import detail_frame

    both = precnb.open_runs({"gpu": sample_path("divergence", "baseline"),
                             "npu": sample_path("divergence", "target")}, progress=False)
    label = "Functional.gelu.0.forward.input.0"
    for rank, want in ((0, "torch.bfloat16"), (1, "torch.float32")):
        df = detail_frame(both, step=1, rank=rank, run="npu", baseline="gpu", limit=10_000)
        assert df.loc[df["tensor"] == label, "dtype"].item() == want
    df = detail_frame(both, step=0, rank=0, run="npu", limit=10_000)
    assert df.loc[df["tensor"] == label, "dtype"].item() == "torch.float32"
