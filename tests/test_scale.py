"""Scale paths: the msprobe parser read batch by batch identical to the whole-file parse and to the
raw JSON, order-independent assembly, streaming zarr conversion identical to the in-memory load,
lazy analysis."""

from __future__ import annotations

import json
import math
import os
import random
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import precnb
from precnb.errors import OutputRefusedError
from precnb.io import msprobe as md
from precnb.io._assemble import Assembler, SharedTable, assemble
from precnb.io.msprobe import _json
from precnb.io.msprobe.parse import leaves_of
from tests.conftest import ROOT, SHARED, spy_batches

sys.path.insert(0, str(ROOT / "benchmarks"))
import generate

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

REAL_ROOTS = [
    SHARED / "data_samples" / "msprobe" / "S1_baseline" / "statistics",
    SHARED / "data_samples" / "msprobe" / "S1_baseline" / "md5",
    SHARED / "data_samples" / "msprobe" / "S1_baseline" / "tensor",
    SHARED / "data_samples" / "msprobe" / "S5_tp_shards" / "tp2",
    ROOT / "data_samples" / "dp_nan",
    ROOT / "data_samples" / "divergence" / "target",
    ROOT / "data_samples" / "tp" / "tp2",
]


# ------------------------------------------------------------------------------- helpers
def _table(t):
    return t.get() if isinstance(t, SharedTable) else t


def same_records(a, b) -> None:
    """Two FileRecords hold exactly the same data (NaN payloads and -0.0 included)."""
    assert (a.step, a.rank) == (b.step, b.rank)
    assert a.labels == b.labels
    assert a.coords.keys() == b.coords.keys()
    for k in a.coords:
        assert list(np.asarray(a.coords[k]).tolist()) == list(np.asarray(b.coords[k]).tolist()), k
    assert a.values.keys() == b.values.keys()
    for k in a.values:
        assert a.values[k].dtype == b.values[k].dtype
        assert np.array_equal(a.values[k].view(np.uint64), b.values[k].view(np.uint64)), k
    for k in ("null_stats", "seq", "numel"):
        x, y = getattr(a, k), getattr(b, k)
        assert x.dtype == y.dtype and np.array_equal(x, y), k
    assert a.strings == b.strings
    assert _table(a.construct) == _table(b.construct)
    assert _table(a.stacks) == _table(b.stacks)
    assert a.meta == b.meta


def whole(rd):
    """The record of the whole-file parse (standard library rules), or the error it raised."""
    old = os.environ.get("PRECNB_JSON_WHOLE")
    os.environ["PRECNB_JSON_WHOLE"] = "1"
    try:
        return md.read_rank_dir(rd)
    except Exception as exc:  # compared by the caller
        return exc
    finally:
        if old is None:
            del os.environ["PRECNB_JSON_WHOLE"]


def batched_and_whole(rd):
    """(record of the default parse, record of the whole-file parse, or the error each raised)."""
    try:
        a = md.read_rank_dir(rd)
    except Exception as exc:  # compared below
        a = exc
    return a, whole(rd)


def check_folder(folder: Path, monkeypatch=None) -> bool:
    """The default parse equals the whole-file parse; returns whether the batched JSON path gave up."""
    gave_up = spy_batches(monkeypatch) if monkeypatch is not None else []
    rd = md.discover(folder)[0]
    try:
        a = md.read_rank_dir(rd)
    except Exception as exc:  # compared below
        a = exc
    if monkeypatch is not None:
        monkeypatch.undo()
    b = whole(rd)
    if isinstance(b, Exception):
        assert type(a) is type(b) and str(a) == str(b)
    else:
        assert not isinstance(a, Exception), a
        same_records(a, b)
        check_against_raw_json(rd, a)
    return bool(gave_up)


def check_against_raw_json(rd, rec) -> None:
    """Every statistic, dtype and shape of the record is the raw JSON's (json.loads of the file)."""
    doc = json.loads(rd.dump_file.read_bytes().lstrip(b"\xef\xbb\xbf"))
    data = doc.get("data", doc) if isinstance(doc, dict) else {}
    expected = {}
    for node, record in data.items():
        for label, _role, lf in leaves_of(node, record):
            expected.setdefault(label, lf)
    by_label = dict(zip(rec.labels, range(len(rec.labels)), strict=True))
    for label, lf in expected.items():
        i = by_label[label]
        for name, key in (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "Norm")):
            want = lf.get(key)
            got = rec.values[name][i]
            if isinstance(want, float):
                assert (got != got and want != want) or (
                    got == want and math.copysign(1, got) == math.copysign(1, want))
            elif want is None:
                assert got != got and rec.null_stats[i] & (1 << ("max", "min", "mean", "norm").index(name))
        dtype = lf.get("dtype")
        assert rec.coords["dtype"][i] == (dtype if isinstance(dtype, str) else "")


def write_rank(tmp: Path, dump: bytes | str | dict, *, construct=None, stack=None) -> Path:
    folder = tmp / "step0" / "rank0"
    folder.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(dump, indent=1) if isinstance(dump, dict) else dump
    (folder / "dump.json").write_bytes(raw.encode() if isinstance(raw, str) else raw)
    for name, side in (("construct.json", construct), ("stack.json", stack)):
        if side is not None:
            (folder / name).write_text(side if isinstance(side, str) else json.dumps(side, indent=1))
    return folder


def leaf(**kw):
    base = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3],
            "Max": 1.5, "Min": -1.5, "Mean": 0.25, "Norm": 3.0, "requires_grad": True}
    base.update(kw)
    return base


def load_both(root: Path, **kw):
    """open_run batch by batch and with whole-file parses (PRECNB_JSON_WHOLE)."""
    fast = precnb.open_run(root, progress=False, **kw)
    os.environ["PRECNB_JSON_WHOLE"] = "1"
    try:
        ref = precnb.open_run(root, progress=False, **kw)
    finally:
        del os.environ["PRECNB_JSON_WHOLE"]
    return fast, ref


# ---------------------------------------------------- batched == whole == raw JSON (files)
@pytest.mark.parametrize("root", REAL_ROOTS, ids=lambda p: "/".join(p.parts[-2:]))
def test_records_identical_on_real_dumps(root):
    if not root.exists():
        pytest.skip(f"{root} not available")
    for rd in md.discover(root):
        a, b = batched_and_whole(rd)
        same_records(a, b)
        check_against_raw_json(rd, a)


@pytest.mark.parametrize("root", REAL_ROOTS[:4] + REAL_ROOTS[4:5], ids=lambda p: "/".join(p.parts[-2:]))
def test_dataset_identical_on_real_dumps(root):
    if not root.exists():
        pytest.skip(f"{root} not available")
    fast, ref = load_both(root)
    xr.testing.assert_identical(fast, ref)


TRICKY = {
    "nan_inside_strings": {"data": {"Functional.x.0.forward": {
        "input_args": [leaf(Max=float("nan"), note='he said "NaN: Infinity", -Infinity')],
        "output": [leaf(Min=float("-inf"), dtype="torch.float16")]}}},
    "nan_as_string_value": {"data": {"Functional.x.0.forward": {
        "output": [leaf(Max="NaN", Min="-Infinity", Mean="nan", Norm="Infinity")]}}},
    "string_stats_null_like": {"data": {"Functional.x.0.forward": {"output": [leaf(Max="null", Mean="n/a")]}}},
    "nested_outputs": {"data": {"Module.a.A.forward.0": {
        "input_args": [[leaf(), [leaf(Norm=float("inf"))]], {"k": {"deeper": [leaf(Max=float("nan"))]}}],
        "input_kwargs": {"mask": leaf(dtype="torch.bool", Mean=None, Norm=None)},
        "output": {"x": leaf(Max=float("-inf"), Min=float("-inf"))}}}},
    "scalar_value_nan": {"data": {"Functional.x.0.forward": {
        "input_args": [{"type": "float", "value": float("nan")}, leaf()],
        "output": [leaf(Max=float("inf"))]}}},
    "ints_bools_and_big_ints": {"data": {"Functional.x.0.forward": {
        "output": [leaf(Max=18446744073709551617, Min=-9223372036854775809, Mean=True, Norm=7,
                        dtype="torch.int64"), leaf(Max=float("nan"))]}}},
    "token_in_shape": {"data": {"Functional.x.0.forward": {"output": [leaf(shape=[float("nan"), 2])]}}},
    "float_and_bool_dims": {"data": {"Functional.x.0.forward": {
        "output": [leaf(shape=[2, 3]), leaf(shape=[2.0, 3]), leaf(shape=[True, 3]), leaf(shape=[1, 3]),
                   leaf(shape=[True, 3]), leaf(Max=float("nan"))]}}},
    "bad_values_warned": {"data": {"Functional.x.0.forward": {
        "output": [leaf(Max=[1, 2], dtype=5, md5=7, data_name=3), leaf(data_name="../../etc/passwd")]}}},
    "null_record_and_list_record": {"data": {"Functional.x.0.forward": None,
                                             "Functional.y.0.forward": [1, 2],
                                             "Functional.z.0.forward": {"output": [leaf(Max=float("nan"))]}}},
    "duplicate_labels": {"data": {"Functional.x.0.forward": {
        "input_args": [leaf(Max=float("nan"))], "input_kwargs": {"0": leaf(Min=1.0)},
        "output": [leaf()]}}},
    "md5_and_data_name": {"data": {"Functional.x.0.forward": {
        "output": [leaf(md5="a1b2c3d4", data_name="Functional.x.0.forward.output.0.pt", Max=float("nan")),
                   leaf(md5="", data_name="")]}}},
    "param_grads_and_backward": {"data": {
        "Module.fc.Linear.parameters_grad.0": {"weight": [leaf(Norm=float("inf"))], "bias": leaf()},
        "Functional.x.0.backward": {"input": [leaf(Max=float("-inf"))], "output": [leaf()]}}},
    "communication": {"data": {"Distributed.all_reduce.0.forward": {
        "input_args": [leaf(Max=float("nan")), {"type": "ProcessGroup", "group_ranks": [0, 1, 2]}],
        "output": [leaf()]}}},
    "empty_data": {"data": {}},
    "missing_framework": {"data": {"Functional.x.0.forward": {"output": [leaf(Max=float("nan"))]}}},
    "too_deep": {"data": {"Functional.x.0.forward": {"output": [[[[[[[[[[[[leaf()]]]]]]]]]]]] * 1}}},
}


def _deep(n: int):
    v = leaf(Max=float("nan"))
    for _ in range(n):
        v = [v]
    return v


@pytest.mark.parametrize("name", [*sorted(TRICKY), "deep_63", "deep_64", "deep_65"])
def test_records_identical_on_tricky_dumps(tmp_path, monkeypatch, name):
    if name.startswith("deep_"):
        doc = {"data": {"Functional.x.0.forward": {"output": _deep(int(name[5:]))}}}
    else:
        doc = json.loads(json.dumps(TRICKY[name]))
    doc = {"task": "statistics", "level": "mix", "framework": "pytorch", **doc}
    if name == "missing_framework":
        del doc["framework"]
    folder = write_rank(tmp_path, json.dumps(doc, indent=1),
                        construct={"Functional.x.0.forward": "Module.a.A.forward.0", "Module.a.A.forward.0": None},
                        stack={"Functional.x.0.forward": ["File a.py, line 1, in f, \n x = NaN"]})
    # none needs the whole-file parse: the standard library and the C reader read every bare token (one in a shape
    # element too, handed back by the C reader), and "data": {} on one line is found by structure
    assert not check_folder(folder, monkeypatch)


@pytest.mark.parametrize("construct,stack", [
    ('{"Functional.x.0.forward": NaN}', None),                # token in construct: reference parser
    ('{"a": ', None),                                           # broken construct
    ("[1, 2]", None),                                           # not an object
    (None, '{"0": [["Functional.x.0.forward"], ["File NaN"]]}'),  # new stack.json format
    (None, "{broken"),
    ('{"Functional.x.0.forward": ["Module.a.A.forward.0", 3]}', None),  # Megatron micro step
])
def test_records_identical_with_odd_side_files(tmp_path, construct, stack):
    doc = {"task": "statistics", "level": "mix", "framework": "pytorch",
           "data": {"Functional.x.0.forward": {"output": [leaf(Max=float("nan"))]}}}
    check_folder(write_rank(tmp_path, doc, construct=construct, stack=stack))


@pytest.mark.parametrize("raw", [
    b"", b"{", b"\xef\xbb\xbf{}", b'{"data": {"Functional.x.0.forward": {"output": [1e400]}}}',
    b'{"data": 5}', b"[1]", b'{"data": {"x": 1}, "framework": "pytorch"}',
    b'{"framework": "pytorch", "data": {"Functional.x.0.forward": {"output": [{"type": "torch.Tensor", '
    b'"dtype": "torch.float32", "shape": [1], "Max": NaN, "Min": "\\ud800", "Mean": 1, "Norm": 1}]}}}',
])
def test_records_identical_on_broken_dumps(tmp_path, raw):
    check_folder(write_rank(tmp_path, raw))


# --------------------------------------------------------------------------- assembling
def test_assembler_is_independent_of_arrival_order():
    root = ROOT / "data_samples" / "dp_nan"
    if not root.exists():
        pytest.skip("bundled sample missing")
    recs = [md.read_rank_dir(d) for d in md.discover(root)]
    expected = assemble(recs, source_format="msprobe")
    order = list(range(len(recs)))
    random.Random(3).shuffle(order)
    acc = Assembler()
    for i in order:
        acc.add(recs[i], order=i)
    xr.testing.assert_identical(expected, acc.build(source_format="msprobe"))


def test_assembler_coordinates_skip_none_like_the_first_value_rule():
    from precnb.io._assemble import RecordBuilder

    def rec(step, rank, module):
        b = RecordBuilder(step, rank)
        b.add("t.output.0", {"max": 1.0}, node="t", kind="api", module=module)
        r = b.build()
        r.coords["module"] = [module]
        return r

    recs = [rec(0, 1, "late"), rec(0, 0, None), rec(1, 0, "later")]
    ds = assemble(recs, source_format="synthetic")
    acc = Assembler()
    for i in (2, 0, 1):
        acc.add(recs[i], order=i)
    xr.testing.assert_identical(ds, acc.build(source_format="synthetic"))
    assert ds["module"].values[0] == "late"


# --------------------------------------------------------------------- streaming to zarr
@pytest.fixture(scope="module")
def tree48(tmp_path_factory):
    template = generate.default_template()
    if not template.exists():
        pytest.skip("no template dump (../shared or data_samples/healthy)")
    out = tmp_path_factory.mktemp("gen48")
    generate.generate(out, ranks=48, steps=3, template=template, trees=("baseline",), quiet=True)
    root = out / "baseline"
    # a node first recorded at step 1 (the tensor dimension grows while streaming) ...
    first = root / "step0" / "rank0" / "dump.json"
    doc = json.loads(first.read_text())
    victim = next(n for n in doc["data"] if n.startswith("Functional.gelu"))
    for r in range(48):
        f = root / "step0" / f"rank{r}" / "dump.json"
        d = json.loads(f.read_text())
        del d["data"][victim]
        f.unlink()  # a hard link in the generated tree: write a new file
        f.write_text(json.dumps(d, indent=1))
    # ... and a checksum first seen at step 2 (a variable appears while streaming)
    f = root / "step2" / "rank5" / "dump.json"
    d = json.loads(f.read_text())
    node = next(iter(d["data"].values()))
    next(v for v in node["input_args"] if isinstance(v, dict) and "dtype" in v)["md5"] = "deadbeef"
    f.unlink()
    f.write_text(json.dumps(d, indent=1))
    return root


@pytest.mark.slow
def test_streaming_zarr_reopens_identical_to_in_memory_load(tree48, tmp_path):
    eager = precnb.open_run(tree48, progress=False)
    assert eager.sizes["rank"] == 48 and "crc" in eager
    store = precnb.to_zarr(tree48, tmp_path / "run.zarr", progress=False)
    back = precnb.open_run(store)
    xr.testing.assert_identical(eager, back)
    lazy = precnb.open_run(store, lazy=True)
    assert lazy["max"].chunks is not None and lazy["max"].data.npartitions >= 3
    xr.testing.assert_identical(eager, lazy.compute())
    with pytest.raises(FileExistsError):
        precnb.to_zarr(tree48, store)


@pytest.mark.slow  # make test runs it; make test-fast stays under 5 minutes (RESULTS_tests.md)
def test_streaming_zarr_selection_and_overwrite(tree48, tmp_path):
    eager = precnb.open_run(tree48, steps=[1, 2], ranks=list(range(0, 48, 5)), progress=False)
    store = tmp_path / "sel.zarr"
    store.mkdir()  # a folder precnb did not write, even an empty one, is never replaced
    with pytest.raises(OutputRefusedError, match="not a precnb output"):
        precnb.to_zarr(tree48, store, mode="w", steps=[1, 2], progress=False)
    store.rmdir()
    precnb.to_zarr(tree48, store, steps=[0], progress=False)
    precnb.to_zarr(tree48, store, mode="w", steps=[1, 2], ranks=list(range(0, 48, 5)), progress=False)
    xr.testing.assert_identical(eager, precnb.open_run(store))


def test_streaming_reports_broken_files(tree48, tmp_path):
    import shutil

    root = tmp_path / "tree"
    shutil.copytree(tree48 / "step1", root / "step1")
    (root / "step1" / "rank3" / "dump.json").unlink()
    (root / "step1" / "rank3" / "dump.json").write_text('{"data": {')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = precnb.open_run(root, progress=False)
        store = precnb.to_zarr(root, tmp_path / "b.zarr", progress=False)
        back = precnb.open_run(store)
    xr.testing.assert_identical(eager, back)
    assert len(precnb.load_report(back).failures) == 1


# --------------------------------------------------------------------------- lazy analysis
@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    template = generate.default_template()
    if not template.exists():
        pytest.skip("no template dump")
    out = tmp_path_factory.mktemp("gen8")
    m = generate.generate(out, ranks=8, steps=3, template=template, quiet=True)
    stores = {}
    for tree in ("baseline", "nan", "diverge"):
        stores[tree] = precnb.to_zarr(out / tree, out / f"{tree}.zarr", progress=False)
    return out, m, stores


@pytest.mark.slow  # make test runs it; make test-fast stays under 5 minutes (RESULTS_tests.md)
def test_analysis_on_lazy_zarr_matches_eager(faults):
    out, m, stores = faults
    lazy = {k: precnb.open_run(v, lazy=True) for k, v in stores.items()}
    assert lazy["nan"]["max"].chunks is not None
    eager = {k: precnb.open_run(out / k, progress=False) for k in stores}
    f_lazy = precnb.nan_origin(lazy["nan"])
    f_eager = precnb.nan_origin(eager["nan"])
    # the lazy searches stop at the fault: everything but the counts over unsearched steps agrees
    lz, eg = f_lazy.to_dict(), f_eager.to_dict()
    ls, es = lz.pop("stats"), eg.pop("stats")
    assert lz == eg
    assert {k: ls[k] for k in ("nan_values", "inf_values", "steps", "ranks")} == {
        k: es[k] for k in ("nan_values", "inf_values", "steps", "ranks")}
    assert (f_eager.step, f_eager.rank, f_eager.node) == (m["nan"]["step"], m["nan"]["rank"], m["nan"]["node"])
    d_lazy = precnb.first_divergence(lazy["baseline"], lazy["diverge"])
    d_eager = precnb.first_divergence(eager["baseline"], eager["diverge"])
    lz, eg = d_lazy.to_dict(), d_eager.to_dict()
    ls, es = lz.pop("stats"), eg.pop("stats")
    assert lz == eg
    from precnb.analysis.divergence.stepwise import step_batches

    loaded: list[int] = []
    for batch in step_batches(es["steps"]):  # batches are read until one holds the fault
        loaded += batch
        if m["divergence"]["step"] in batch:
            break
    assert ls["steps"] == loaded
    assert ls["steps_not_searched"] == [s for s in es["steps"] if s not in loaded]
    assert (d_eager.step, d_eager.rank, d_eager.node) == (
        m["divergence"]["step"], m["divergence"]["rank"], m["divergence"]["node"])


def test_a_node_name_in_two_batches_reads_as_the_whole_parse(tmp_path, monkeypatch):
    """A node written twice, the copies in different batches (far apart): the batched parse gives up and the
    whole-file parse's records are read (the first position, the last record), as json.loads would."""
    body = {f"Functional.f{i}.0.forward": {"output": [leaf(Max=float(i), Min=0.0, Mean=0.5, Norm=1.0)]}
            for i in range(12000)}
    doc = {"task": "statistics", "level": "mix", "framework": "pytorch", "data": body}
    text = json.dumps(doc, indent=1)
    again = json.dumps({"Functional.f5.0.forward": {"output": [leaf(Max=-7.0)]}}, indent=1)
    again = "\n".join(" " + line for line in again.splitlines()[1:-1])  # the record at data's indentation
    last = text.rindex("\n  }\n }")  # after the last record of data
    text = text[:last + 4] + ",\n" + again + text[last + 4:]
    assert json.loads(text)["data"]["Functional.f5.0.forward"]["output"][0]["Max"] == -7.0
    folder = write_rank(tmp_path, text)
    with pytest.raises(_json.NotBatchableError):  # the copies are in different batches: the batched parse gives up
        list(_json.parts(folder / "dump.json"))
    assert check_folder(folder, monkeypatch)  # gave up, and equal to the whole-file parse
    ds = precnb.open_run(folder)
    assert float(ds["max"].sel(tensor="Functional.f5.0.forward.output.0").item()) == -7.0
    assert list(ds["tensor"].values[:7]) == [f"Functional.f{i}.0.forward.output.0" for i in range(7)]
