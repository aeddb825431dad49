"""The monitor reader against real TrainerMon v1 output (S6) and synthetic v2 output."""

from __future__ import annotations

import csv
import itertools
import json
import math
import pickle
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

import precnb
from precnb.errors import DumpFormatError, NotADumpError
from precnb.io.monitor import (
    FAMILY_RANK,
    MonitorFile,
    is_monitor_output,
    open_monitor,
    read_monitor_csv,
)
from precnb.schema import validate
from tests.conftest import shared_path

S6 = ("data_samples", "msprobe", "S6_monitor", "monitor_output")
FAMILIES = ["actv", "actv_grad", "grad_unreduced", "grad_reduced", "exp_avg", "exp_avg_sq",
            "param_origin", "param_updated"]
NON_STAT = {"vpp_stage", "name", "step", "micro_step", "shape", "dtype", "module_name", "scope"}


@pytest.fixture(scope="module")
def s6_root() -> Path:
    return shared_path(*S6)


@pytest.fixture(scope="module")
def s6(s6_root):
    return open_monitor(s6_root, progress=False)


def family_of(csv_path: Path) -> str:
    return csv_path.stem.rsplit("_", 1)[0]


def same(a: float, text: str) -> bool:
    b = float(text)
    return (math.isnan(a) and math.isnan(b)) or a == b


# --------------------------------------------------------------------------- S6 (real v1 output)

@pytest.mark.shared
def test_s6_loads_both_ranks_all_families_all_steps(s6, s6_root):
    validate(s6)
    assert precnb.detect_format(s6_root) == "monitor"
    assert list(s6["rank"].values) == [0, 1]
    assert list(s6.step.values) == [0, 1, 2, 3, 4, 5]
    assert sorted(set(s6.api.values)) == sorted(FAMILIES)
    assert set(s6.kind.values) == {"monitor"}
    assert s6.attrs["source_format"] == "monitor"
    assert s6.attrs["monitor_version"] == "v1"
    assert set(json.loads(s6.attrs["rank_dirs"])) == {"0", "1"}
    assert set(json.loads(s6.attrs["anomaly_json"])) == {"0", "1"}
    for var in ("min", "max", "norm", "mean", "zeros", "nans"):
        assert s6[var].dtype == np.float64
    rep = precnb.load_report(s6)
    assert not rep.skipped and len(rep.read) == 92


@pytest.mark.shared
def test_s6_open_run_auto_detects(s6_root):
    ds = precnb.open_run(s6_root, progress=False)
    assert ds.attrs["source_format"] == "monitor" and ds.sizes["tensor"] == 150


@pytest.mark.shared
def test_s6_values_equal_csv_exactly(s6, s6_root):
    files = sorted(s6_root.glob("*-rank*-*/*.csv"))
    assert len(files) == 92
    sample = random.Random(0).sample(files, 30)
    # always include the NaN-carrying files
    sample += [f for f in files if f.name in ("actv_4-4.csv", "grad_reduced_4-4.csv",
                                               "actv_grad_0-0.csv")]
    checked = 0
    for f in sample:
        rank = int(f.parent.name.split("-rank")[1].split("-")[0])
        family = family_of(f)
        with open(f, newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert rows
        for row in rows:
            label = f"{family}/{row['name']}"
            sel = s6.sel(step=int(row["step"]), rank=rank, tensor=label)
            assert bool(sel.present), (f, label)
            for col, text in row.items():
                if col in NON_STAT:
                    continue
                got = float(sel[col])
                assert same(got, text), (f, label, col, got, text)
                checked += 1
            if row["dtype"] != "nan":
                assert str(sel.dtype.values) == row["dtype"]
                assert str(sel.shape.values) == row["shape"].replace(" ", "").replace(",", ", ")
    assert checked > 1000


@pytest.mark.shared
def test_s6_first_nan_activation_rank1_step4(s6):
    actv = s6.sel(rank=1).isel(tensor=s6.api.values == "actv")
    nan = np.isnan(actv["max"]) & actv["present"]
    steps = [int(s) for s in actv.step.values if bool(nan.sel(step=s).any())]
    assert steps[0] == 4
    at = nan.sel(step=4).values
    seq = actv["seq"].sel(step=4).values
    first = actv.tensor.values[at][np.argmin(seq[at])]
    assert first == "actv/blocks.1.attn.output"
    assert float(s6["nans"].sel(step=4, rank=1, tensor=first)) == 128.0
    # rank 0 has no NaN activation before step 5
    actv0 = s6["max"].sel(rank=0).isel(tensor=s6.api.values == "actv")
    assert not bool(np.isnan(actv0.sel(step=slice(0, 4))).any())
    assert bool(np.isnan(actv0.sel(step=5)).any())


@pytest.mark.shared
def test_s6_present_false_where_not_in_csv(s6):
    exp_avg = [t for t in s6.tensor.values if t.startswith("exp_avg/")]
    assert len(exp_avg) == 19
    assert not bool(s6["present"].sel(step=0, tensor=exp_avg).any())
    assert bool(s6["present"].sel(step=1, tensor=exp_avg).all())
    assert bool(np.isnan(s6["norm"].sel(step=0, tensor=exp_avg)).all())
    assert int(s6["seq"].sel(step=0, rank=0, tensor=exp_avg[0])) == -1


@pytest.mark.shared
def test_s6_nan_row_without_tensor(s6):
    # the gradient of the int64 token ids is None: the monitor writes a row of 'nan'
    t = s6.sel(tensor="actv_grad/embed.input", step=0, rank=0)
    assert bool(t.present)
    assert all(math.isnan(float(t[v])) for v in ("min", "max", "norm", "mean", "zeros", "nans"))
    assert str(t.dtype.values) == "" and int(t.numel) == -1
    assert int(t.null_stats) == 0  # nan, not null


@pytest.mark.shared
def test_s6_coordinates(s6):
    t = s6.sel(tensor="actv/blocks.1.attn.output")
    assert (str(t.module.values), str(t.direction.values), str(t.role.values)) == \
        ("blocks.1.attn", "forward", "output")
    assert str(t.node.values) == "actv/blocks.1.attn.output"
    assert int(t.micro_step) == 0
    assert str(t.dtype.values) == "torch.float32" and str(t.shape.values) == "[4, 16, 32]"
    assert int(s6["numel"].sel(step=0, rank=0, tensor="actv/blocks.1.attn.output")) == 4 * 16 * 32
    assert str(s6.sel(tensor="actv/embed.input").role.values) == "input"
    g = s6.sel(tensor="actv_grad/blocks.0.mlp.input")
    assert (str(g.module.values), str(g.direction.values), str(g.role.values)) == \
        ("blocks.0.mlp", "backward", "grad")
    p = s6.sel(tensor="param_origin/blocks.0.attn.q_proj.weight")
    assert (str(p.module.values), str(p.direction.values), str(p.role.values)) == \
        ("blocks.0.attn.q_proj", "optimizer", "parameter")
    assert int(p.micro_step) == -1
    assert str(s6.sel(tensor="exp_avg_sq/lm_head.weight").role.values) == "state"
    assert str(s6.sel(tensor="grad_reduced/lm_head.weight").role.values) == "grad"
    assert str(s6.sel(tensor="grad_unreduced/lm_head.weight").direction.values) == "backward"


@pytest.mark.shared
def test_s6_seq_follows_training_order(s6, s6_root):
    seq = s6["seq"].sel(step=2, rank=1)
    api = s6.api.values
    order = sorted(FAMILIES, key=FAMILY_RANK.__getitem__)
    assert order == ["actv", "actv_grad", "grad_unreduced", "grad_reduced", "param_origin",
                     "exp_avg", "exp_avg_sq", "param_updated"]
    for a, b in itertools.pairwise(order):
        assert int(seq.values[api == a].max()) < int(seq.values[api == b].min()), (a, b)
    # CSV row order within a family, and the documented formula
    folder = next(s6_root.glob("*-rank1-*"))
    with open(folder / "grad_unreduced_2-2.csv", newline="") as fh:
        names = [r["name"] for r in csv.DictReader(fh)]
    got = [int(seq.sel(tensor=f"grad_unreduced/{n}")) for n in names]
    assert got == [FAMILY_RANK["grad_unreduced"] * 1_000_000 + i for i in range(len(names))]
    with open(folder / "actv_grad_2-2.csv", newline="") as fh:
        names = [r["name"] for r in csv.DictReader(fh)]
    got = [int(seq.sel(tensor=f"actv_grad/{n}")) for n in names]
    assert got == sorted(got) and got[0] == 1_000_000


@pytest.mark.shared
def test_s6_gradient_spike_visible(s6):
    norm = s6["norm"].sel(step=2, tensor="grad_unreduced/lm_head.weight")
    assert float(norm.sel(rank=1)) > 500 * float(norm.sel(rank=0))


@pytest.mark.shared
def test_s6_rank_folder_and_selection(s6_root, s6):
    folder = next(s6_root.glob("*-rank1-*"))
    assert is_monitor_output(folder)
    one = open_monitor(folder, progress=False)
    assert list(one["rank"].values) == [1]
    np.testing.assert_array_equal(one["max"].sel(rank=1).values,
                                  s6["max"].sel(rank=1, tensor=one.tensor).values)
    sel = open_monitor(s6_root, steps=[3, 4], ranks=[0], progress=False)
    assert list(sel.step.values) == [3, 4] and list(sel["rank"].values) == [0]


@pytest.mark.shared
def test_s6_broken_file_is_reported_and_other_ranks_load(s6_root, tmp_path):
    root = tmp_path / "monitor_output"
    shutil.copytree(s6_root, root)
    bad = next(root.glob("*-rank0-*")) / "actv_3-3.csv"
    text = bad.read_text().splitlines()
    text[4] = text[4] + ",extra,fields"
    bad.write_text("\n".join(text) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = precnb.open_run(root, progress=False)
    assert any("could not be read" in str(w.message) for w in caught)
    rep = precnb.load_report(ds)
    assert len(rep.failures) == 1
    path, reason = rep.failures[0]
    assert path.endswith("actv_3-3.csv") and "line 5" in reason
    assert list(ds["rank"].values) == [0, 1]
    assert not bool(ds["present"].sel(step=3, rank=0, tensor="actv/embed.output"))
    assert bool(ds["present"].sel(step=3, rank=1, tensor="actv/embed.output"))
    assert bool(ds["present"].sel(step=3, rank=0, tensor="actv_grad/embed.output"))
    with pytest.raises(DumpFormatError, match=r"actv_3-3\.csv: line 5: expected 12 fields"):
        open_monitor(root, errors="raise", progress=False)


def test_parse_function_pickles():
    item = MonitorFile(Path("x/actv_0-0.csv"), 0, "v1", "actv", (0, 0))
    assert pickle.loads(pickle.dumps((read_monitor_csv, item)))[1] == item


# --------------------------------------------------------------------------- synthetic v1

def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_v1_micro_steps_vpp_and_extra_ops(tmp_path):
    folder = tmp_path / "out" / "Dec03_21-34-40-rank3-1a2b3c4d"
    write(folder / "actv_0-1.csv",
          "vpp_stage,name,step,micro_step,norm,nans,entropy\n"
          "0,layers.0.input_0,0,0,1.5,0,0.25\n"
          "1,layers.0.input_0,0,0,2.5,0,0.5\n"
          "0,layers.0.input_0,0,1,3.5,0,0.75\n"
          "0,layers.0.output,1,0,inf,1,nan\n"
          "0,layers.0.output,1,1,-inf,2,\n")
    write(folder / "grad_reduced_0-1.csv",
          "vpp_stage,name,step,norm,mean\n0,layers.0.weight,0,0.125,1e-08\n0,layers.0.weight,1,nan,2\n")
    write(folder / "stack_info.csv", "module_name,stack_info\nx,y\n")
    assert is_monitor_output(tmp_path / "out")
    ds = open_monitor(tmp_path / "out", progress=False)
    validate(ds)
    assert list(ds["rank"].values) == [3] and list(ds.step.values) == [0, 1]
    labels = set(ds.tensor.values)
    assert {"actv/0:layers.0.input_0/micro0", "actv/1:layers.0.input_0/micro0",
            "actv/0:layers.0.input_0/micro1", "actv/0:layers.0.output/micro0",
            "grad_reduced/0:layers.0.weight"} <= labels
    t = ds.sel(step=0, rank=3, tensor="actv/1:layers.0.input_0/micro0")
    assert float(t["norm"]) == 2.5 and float(t["entropy"]) == 0.5
    assert str(t.node.values) == "actv/1:layers.0.input_0"
    assert str(t.module.values) == "layers.0" and str(t.role.values) == "input"
    assert int(ds["seq"].sel(step=0, rank=3, tensor="actv/0:layers.0.input_0/micro1")) == 10_000 + 0
    o = ds.sel(step=1, rank=3)
    assert float(o["norm"].sel(tensor="actv/0:layers.0.output/micro0")) == np.inf
    assert float(o["norm"].sel(tensor="actv/0:layers.0.output/micro1")) == -np.inf
    assert math.isnan(float(o["entropy"].sel(tensor="actv/0:layers.0.output/micro1")))
    assert float(o["mean"].sel(tensor="grad_reduced/0:layers.0.weight")) == 2.0
    assert math.isnan(float(o["norm"].sel(tensor="grad_reduced/0:layers.0.weight")))
    # grad_reduced has no min/max columns: null, not NaN
    assert int(o["null_stats"].sel(tensor="grad_reduced/0:layers.0.weight")) == 1 | 2
    assert str(ds.sel(tensor="grad_reduced/0:layers.0.weight").module.values) == "layers.0"


# --------------------------------------------------------------------------- synthetic v2

V2_MODULE = (
    "vpp_stage,step,module_name,scope,micro_step,min,max,norm,mean,shape,dtype\n"
    "0,0,decoder.layers.0.mlp.input,forward,0,-1.0,2.0,3.0,0.5,\"[2, 4]\",torch.bfloat16\n"
    "0,0,decoder.layers.0.mlp.output,forward,0,-1.5,2.5,3.5,nan,\"[2, 4]\",torch.bfloat16\n"
    "0,0,decoder.layers.0.mlp.output,backward,0,-0.1,0.1,0.2,0.0,\"[2, 4]\",torch.bfloat16\n"
    "0,1,decoder.layers.0.mlp.input,forward,0,-1.0,2.0,4.0,0.5,\"[2, 4]\",torch.bfloat16\n"
)
V2_WG = ("vpp_stage,step,module_name,scope,norm,nans\n"
         "0,0,decoder.layers.0.mlp.fc1.weight,unreduced,0.5,0\n"
         "0,0,decoder.layers.0.mlp.fc1.weight,reduced,0.25,0\n")
V2_OPT = ("vpp_stage,step,module_name,scope,norm\n"
          "0,0,decoder.layers.0.mlp.fc1.weight,exp_avg,0.01\n"
          "0,0,decoder.layers.0.mlp.fc1.weight,exp_avg_sq,0.0001\n")
V2_PARAM = ("vpp_stage,step,module_name,scope,norm\n"
            "0,0,decoder.layers.0.mlp.fc1.weight,param_origin,10.0\n"
            "0,0,decoder.layers.0.mlp.fc1.weight,param_updated,10.5\n")
V2_CC = "vpp_stage,step,module_name,scope,norm\n0,0,all_reduce.0,comm,7.0\n"


def make_v2(root: Path, ranks=(0, 1)) -> Path:
    for r in ranks:
        d = root / f"rank_{r}"
        write(d / "module_step0-1.csv", V2_MODULE)
        write(d / "weight_grad_step0-1.csv", V2_WG)
        write(d / "optimizer_step0-1.csv", V2_OPT)
        write(d / "param_step0-1.csv", V2_PARAM)
        write(d / "cc_step0-1.csv", V2_CC)
    return root


def test_v2_layout(tmp_path):
    root = make_v2(tmp_path / "v2")
    assert is_monitor_output(root) and is_monitor_output(root / "rank_1")
    assert precnb.detect_format(root) == "monitor"
    ds = precnb.open_run(root, progress=False)
    validate(ds)
    assert ds.attrs["monitor_version"] == "v2"
    assert list(ds["rank"].values) == [0, 1] and list(ds.step.values) == [0, 1]
    w = "decoder.layers.0.mlp.fc1.weight"
    expect = {"actv/decoder.layers.0.mlp.input", "actv/decoder.layers.0.mlp.output",
              "actv_grad/decoder.layers.0.mlp.output", f"grad_unreduced/{w}", f"grad_reduced/{w}",
              f"exp_avg/{w}", f"exp_avg_sq/{w}", f"param_origin/{w}", f"param_updated/{w}",
              "cc/all_reduce.0"}
    assert set(ds.tensor.values) == expect
    s0 = ds.sel(step=0, rank=1)
    assert float(s0["norm"].sel(tensor=f"exp_avg_sq/{w}")) == 0.0001
    assert float(s0["norm"].sel(tensor="actv_grad/decoder.layers.0.mlp.output")) == 0.2
    assert math.isnan(float(s0["mean"].sel(tensor="actv/decoder.layers.0.mlp.output")))
    assert float(s0["nans"].sel(tensor=f"grad_reduced/{w}")) == 0.0
    assert float(ds["norm"].sel(step=1, rank=0, tensor="actv/decoder.layers.0.mlp.input")) == 4.0
    assert not bool(ds["present"].sel(step=1, rank=0, tensor=f"exp_avg/{w}"))
    seq = s0["seq"]
    order = ["actv/decoder.layers.0.mlp.input", "actv_grad/decoder.layers.0.mlp.output",
             f"grad_unreduced/{w}", f"grad_reduced/{w}", f"param_origin/{w}", f"exp_avg/{w}",
             f"exp_avg_sq/{w}", f"param_updated/{w}", "cc/all_reduce.0"]
    vals = [int(seq.sel(tensor=t)) for t in order]
    assert vals == sorted(vals)
    t = ds.sel(tensor=f"grad_unreduced/{w}")
    assert (str(t.module.values), str(t.role.values), str(t.api.values)) == \
        ("decoder.layers.0.mlp.fc1", "grad", "grad_unreduced")
    a = ds.sel(tensor="actv/decoder.layers.0.mlp.input")
    assert str(a.dtype.values) == "torch.bfloat16" and str(a.shape.values) == "[2, 4]"
    assert int(a.micro_step) == 0
    one = open_monitor(root / "rank_1", progress=False)
    assert list(one["rank"].values) == [1]


def test_v2_broken_rank_does_not_hide_the_other(tmp_path):
    root = make_v2(tmp_path / "v2")
    write(root / "rank_1" / "optimizer_step0-1.csv",
          "vpp_stage,step,module_name,scope,norm\n0,0,w,exp_avg,notanumber\n")
    with pytest.warns(UserWarning, match="could not be read"):
        ds = precnb.open_run(root, progress=False)
    rep = precnb.load_report(ds)
    assert len(rep.failures) == 1
    assert "line 2: column 'norm': 'notanumber' is not a number" in rep.failures[0][1]
    w = "decoder.layers.0.mlp.fc1.weight"
    assert bool(ds["present"].sel(step=0, rank=0, tensor=f"exp_avg/{w}"))
    assert not bool(ds["present"].sel(step=0, rank=1, tensor=f"exp_avg/{w}"))
    assert bool(ds["present"].sel(step=0, rank=1, tensor=f"param_origin/{w}"))


# --------------------------------------------------------------------------- malformed input

@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vpp_stage,name,norm\n0,a.weight,1.0\n", r"header lacks \['step'\]"),
        ("vpp_stage,name,step,norm\n0,a.weight,x,1.0\n",
         r"line 2: column 'step': 'x' is not an integer"),
        ("vpp_stage,name,step,norm\n0,a.weight,0\n",
         r"line 2: expected 4 fields as in the header, got 3"),
        ("vpp_stage,name,step,norm\n0,a.weight,0,1.0\n0,,0,1.0\n", r"line 3: empty 'name'"),
        ("", r"empty file"),
    ],
)
def test_malformed_csv_names_file_and_line(tmp_path, text, message):
    f = write(tmp_path / "m-rank0-ab12" / "param_origin_0-0.csv", text)
    with pytest.raises(DumpFormatError, match=message) as info:
        read_monitor_csv(MonitorFile(f, 0, "v1", "param_origin", (0, 0)))
    assert str(f) in str(info.value)


def test_not_monitor_output(tmp_path):
    assert not is_monitor_output(tmp_path)
    write(tmp_path / "rank_0" / "notes.csv", "a,b\n1,2\n")
    assert not is_monitor_output(tmp_path)
    with pytest.raises(NotADumpError):
        open_monitor(tmp_path)
    assert not is_monitor_output(tmp_path / "rank_0" / "notes.csv")
