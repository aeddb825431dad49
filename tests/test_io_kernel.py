"""The MindSpore kernel-dump (statistic.csv) reader: real fixture and synthetic layouts."""

from __future__ import annotations

import csv
import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest

import precnb
from precnb.errors import DumpFormatError, NotADumpError
from precnb.io.mindspore.statistic import (
    KernelItem,
    discover,
    is_kernel_dump,
    open_kernel_dump,
    read_kernel_item,
    read_statistic_csv,
)
from precnb.schema import validate
from tests.conftest import shared_path

FIXTURE = ("fixtures", "msprobe_repo", "derived", "mindspore_native_statistic.from_mstt_test.csv")


@pytest.fixture(scope="module")
def fixture_csv() -> Path:
    return shared_path(*FIXTURE)


@pytest.fixture(scope="module")
def fixture_ds(fixture_csv):
    return precnb.open_run(fixture_csv, progress=False)


@pytest.mark.shared
def test_fixture_detected_and_loaded_as_step0_rank0(fixture_csv, fixture_ds):
    assert is_kernel_dump(fixture_csv)
    assert precnb.detect_format(fixture_csv) == "kernel"
    ds = validate(fixture_ds)
    assert ds.attrs["source_format"] == "kernel" and ds.attrs["framework"] == "mindspore"
    assert list(ds.step.values) == [0] and list(ds["rank"].values) == [0]
    assert ds.sizes["tensor"] == 15
    assert set(ds.kind.values) == {"kernel"} and set(ds.direction.values) == {"forward"}
    assert "crc" not in ds  # no MD5/SHA1 column


@pytest.mark.shared
def test_fixture_values_equal_csv_exactly(fixture_csv, fixture_ds):
    with open(fixture_csv, newline="") as fh:
        rows = list(csv.reader(fh))
    header = rows[0]
    assert header[-1] == "L2Norm Value"
    for k, row in enumerate(rows[1:]):
        assert len(row) == len(header) + 1 and row[-1] == ""  # the trailing comma
        rec = dict(zip(header, row, strict=False))
        label = f"{rec['Op Name']}.{rec['IO']}.{rec['Slot']}"
        t = fixture_ds.sel(step=0, rank=0, tensor=label)
        assert bool(t.present)
        assert float(t["max"]) == float(rec["Max Value"])
        assert float(t["min"]) == float(rec["Min Value"])
        assert float(t["norm"]) == float(rec["L2Norm Value"])
        assert math.isnan(float(t["mean"])) and int(t.null_stats) == 4  # no Avg Value column
        assert int(t["seq"]) == k
        assert str(t.node.values) == rec["Op Name"] and str(t.api.values) == rec["Op Type"]
        assert str(t.role.values) == rec["IO"] and str(t.dtype.values) == rec["Data Type"]
        assert str(t.module.values) == ""  # '_'-separated scope: no module path
        assert str(t.shape.values) == "[]" and int(t["numel"]) == 1


@pytest.mark.shared
def test_fixture_specific_rows(fixture_ds):
    s = fixture_ds.sel(step=0, rank=0)
    assert float(s["max"].sel(tensor="Default_Div-op0.output.0")) == 0.5
    assert float(s["norm"].sel(tensor="Default_Cast-op0.input.1")) == 30.0
    assert str(s.dtype.sel(tensor="Default_Cast-op0.input.1").values) == "int64"
    b = s.sel(tensor="Default_Cast-op0.output.0")  # the bool row
    assert str(b.dtype.values) == "bool" and str(b.api.values) == "Cast"
    assert (float(b["max"]), float(b["min"]), float(b["norm"])) == (1.0, 1.0, 1.0)


@pytest.mark.shared
def test_fixture_without_trailing_comma_reads_the_same(fixture_csv, tmp_path):
    lines = fixture_csv.read_text().splitlines()
    stripped = tmp_path / "statistic.csv"
    stripped.write_text("\n".join([lines[0]] + [ln.rstrip(",") for ln in lines[1:]]) + "\n")
    a = read_statistic_csv(fixture_csv)
    b = read_statistic_csv(stripped)
    assert [r["stats"] for r in a] == [r["stats"] for r in b]


# --------------------------------------------------------------------------- synthetic layouts

HEADER = ("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,"
          "Max Value,Min Value,Avg Value,L2Norm Value,Count,Negative Zero Count,"
          "Positive Zero Count,NaN Count,Negative Inf Count,Positive Inf Count,Zero Count,MD5\n")
NET = "Default/network-WithLossCell/_backbone-Net"


def graph_csv(step: int) -> str:
    return HEADER + "".join([
        f'RmsNorm,{NET}/RmsNorm-op0,1,0,17339054468197{step},input,0,8192,float32,"(1,4096)",'
        f"3.5,-2.25,0.125,40.5,4096,0,3,0,0,0,3,d41d8cd98f00b204e9800998ecf8427e,\n",
        f'RmsNorm,{NET}/RmsNorm-op0,1,0,17339054468198{step},output,0,8192,float32,"(1,4096)",'
        f"inf,-inf,nan,null,4096,0,0,2,1,1,0,null,\n",
        f'Cast,{NET}/Cast-op3,2,0,17339054468199{step},output,0,1,bool,"()",'
        f"True,False,null,null,1,0,0,0,0,0,1,0cc175b9c0f1b6a831c399e269772661,\n",
        f'RmsNorm,{NET}/RmsNorm-op0,1,0,17339054468200{step},input,0,8192,float32,"(1,4096)",'
        f"{step + 1}.0,0,0,0,4096,0,0,0,0,0,4096,900150983cd24fb0d6963f7d28e17f72,\n",
    ])


def make_dump(root: Path, ranks=(0, 1), steps=(0, 1)) -> Path:
    for r in ranks:
        for s in steps:
            d = root / f"rank_{r}" / "Net" / "0" / str(s)
            d.mkdir(parents=True)
            (d / "statistic.csv").write_text(graph_csv(s))
        (root / f"rank_{r}" / "execution_order").mkdir()
    return root


def test_slash_named_layout(tmp_path):
    root = make_dump(tmp_path / "dump")
    assert is_kernel_dump(root) and is_kernel_dump(root / "rank_1")
    assert precnb.detect_format(root) == "kernel"
    ds = precnb.open_run(root, progress=False)
    validate(ds)
    assert list(ds.step.values) == [0, 1] and list(ds["rank"].values) == [0, 1]
    inp = f"{NET}/RmsNorm-op0.input.0"
    out = f"{NET}/RmsNorm-op0.output.0"
    cast = f"{NET}/Cast-op3.output.0"
    assert list(ds.tensor.values) == [inp, out, cast, inp + ".1"]  # the repeat gets .1
    s = ds.sel(step=1, rank=1)
    t = s.sel(tensor=inp)
    assert (float(t["max"]), float(t["min"]), float(t["mean"]), float(t["norm"])) == \
        (3.5, -2.25, 0.125, 40.5)
    assert float(t["count"]) == 4096 and float(t["pos_zero_count"]) == 3.0
    assert float(t["zero_count"]) == 3.0 and float(t["neg_zero_count"]) == 0.0
    assert str(t.crc.values) == "d41d8cd98f00b204e9800998ecf8427e"
    assert str(t.module.values) == NET and str(t.node.values) == f"{NET}/RmsNorm-op0"
    assert str(t.api.values) == "RmsNorm" and str(t.role.values) == "input"
    assert str(t.shape.values) == "[1, 4096]" and int(t["numel"]) == 4096
    o = s.sel(tensor=out)
    assert float(o["max"]) == np.inf and float(o["min"]) == -np.inf
    assert math.isnan(float(o["mean"])) and math.isnan(float(o["norm"]))
    assert int(o["null_stats"]) == 8  # norm is null, mean is NaN
    assert float(o["nan_count"]) == 2 and float(o["neg_inf_count"]) == 1
    assert float(o["pos_inf_count"]) == 1 and str(o.crc.values) == ""
    c = s.sel(tensor=cast)
    assert (float(c["max"]), float(c["min"])) == (1.0, 0.0)
    assert int(c["null_stats"]) == 4 | 8 and int(c["numel"]) == 1
    assert float(s["max"].sel(tensor=inp + ".1")) == 2.0
    assert float(ds["max"].sel(step=0, rank=0, tensor=inp + ".1")) == 1.0
    assert [int(v) for v in s["seq"].values] == [0, 1, 2, 3]
    assert ds.attrs["framework"] == "mindspore"
    assert set(json.loads(ds.attrs["rank_dirs"])) == {"0,0", "0,1", "1,0", "1,1"}


def test_paths_rank_folder_and_single_file(tmp_path):
    root = make_dump(tmp_path / "dump")
    a = open_kernel_dump(root / "rank_1", progress=False)
    assert list(a["rank"].values) == [1] and list(a.step.values) == [0, 1]
    f = root / "rank_1" / "Net" / "0" / "1" / "statistic.csv"
    b = precnb.open_run(f)
    assert list(b["rank"].values) == [1] and list(b.step.values) == [1]
    np.testing.assert_array_equal(a["max"].sel(step=1).values, b["max"].sel(step=1).values)
    sel = open_kernel_dump(root, steps=[1], ranks=[0], progress=False)
    assert list(sel.step.values) == [1] and list(sel["rank"].values) == [0]


def test_several_graphs_in_one_iteration(tmp_path):
    root = tmp_path / "dump"
    for g in ("0", "3"):
        d = root / "rank_0" / "Net" / g / "0"
        d.mkdir(parents=True)
        (d / "statistic.csv").write_text(graph_csv(0))
    ds = open_kernel_dump(root, progress=False)
    assert ds.sizes["tensor"] == 8  # the second graph repeats the labels: .2, .3, .1, ...
    assert f"{NET}/RmsNorm-op0.input.0.3" in set(ds.tensor.values)


def test_broken_rank_reported_others_load(tmp_path):
    root = make_dump(tmp_path / "dump")
    bad = root / "rank_1" / "Net" / "0" / "0" / "statistic.csv"
    bad.write_text(HEADER + "Add,Default/Add-op1,0,0,1,input,0,4,float32,\"()\",1,2\n")
    with pytest.warns(UserWarning, match="could not be read"):
        ds = precnb.open_run(root, progress=False)
    rep = precnb.load_report(ds)
    assert len(rep.failures) == 1
    path, reason = rep.failures[0]
    assert path == str(bad) and "line 2: expected 22 fields" in reason
    assert list(ds["rank"].values) == [0, 1]
    assert bool(ds["present"].sel(step=0, rank=0).all())
    assert not bool(ds["present"].sel(step=0, rank=1).any())
    assert bool(ds["present"].sel(step=1, rank=1).all())
    with pytest.raises(DumpFormatError, match="line 2"):
        open_kernel_dump(root, errors="raise", progress=False)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Op Type,Op Name,IO\nAdd,x,input\n", r"header lacks \['Slot'\]"),
        ("Op Type,Op Name,IO,Slot,Max Value\nAdd,x,input,0,abc\n",
         r"line 2: column 'Max Value': 'abc' is not a number"),
        ("Op Type,Op Name,IO,Slot,Max Value\nAdd,x,input,0,1,2,3\n", r"line 2: expected 5 fields"),
        ("Op Type,Op Name,IO,Slot,Max Value\nAdd,,input,0,1\n", r"line 2: empty 'Op Name'"),
    ],
)
def test_malformed_csv(tmp_path, text, message):
    f = tmp_path / "statistic.csv"
    f.write_text(text)
    with pytest.raises(DumpFormatError, match=message) as info:
        read_kernel_item(KernelItem(0, 0, (f,)))
    assert str(f) in str(info.value)


def test_not_a_kernel_dump(tmp_path):
    assert not is_kernel_dump(tmp_path)
    other = tmp_path / "x.csv"
    other.write_text("a,b\n1,2\n")
    assert not is_kernel_dump(other)
    with pytest.raises(NotADumpError):
        discover(other)
    with pytest.raises(NotADumpError):
        discover(tmp_path)


def test_parse_item_pickles(tmp_path):
    item = KernelItem(0, 1, (tmp_path / "statistic.csv",))
    fn, back = pickle.loads(pickle.dumps((read_kernel_item, item)))
    assert back == item and fn is read_kernel_item
