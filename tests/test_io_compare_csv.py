"""The compare-result CSV reader: three header generations, exact values, synthetic variants."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

import precnb
from precnb.errors import DumpFormatError, NotADumpError
from precnb.io.compare_csv import is_compare_csv, open_compare_csv, split_compare_name
from precnb.schema import validate
from tests.conftest import shared_path

RES = ("fixtures", "msprobe_repo", "Ascend-msprobe", "test", "msprobe_test", "resources")
PTDBG = (*RES, "compare_result_20230703104808.csv")
NO_ACC = (*RES, "compare_result_without_accuracy.csv")
V262 = ("fixtures", "msprobe_repo", "derived",
        "compare_result_statistics_step1_vs_step0.trimmed.csv")
FIXTURES = {"ptdbg": PTDBG, "without_accuracy": NO_ACC, "26.2": V262}


def expected(text: str) -> float | None:
    """Independent reading of a compare stat cell (None = no value)."""
    s = text.strip()
    if s in ("", "N/A", "None"):
        return None
    if s in ("True", "False"):
        return 1.0 if s == "True" else 0.0
    return float(s)


def same(a: float, b: float | None) -> bool:
    if b is None or math.isnan(b):
        return math.isnan(a)
    return a == b


def rows_of(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.shared
@pytest.mark.parametrize("name", list(FIXTURES))
def test_fixtures_load_and_values_equal_csv(name):
    path = shared_path(*FIXTURES[name])
    assert is_compare_csv(path) and precnb.detect_format(path) == "compare"
    ds = precnb.open_run(path)
    validate(ds)
    assert list(ds.run.values) == ["target", "baseline"]
    assert list(ds.step.values) == [0] and list(ds["rank"].values) == [0]
    rows = rows_of(path)
    assert ds.sizes["tensor"] == len(rows)
    stat_cols = {"max": "max", "min": "min", "mean": "mean", "norm": "l2norm"}
    checked = 0
    for k, row in enumerate(rows):
        label = row["NPU Name"] if row["NPU Name"] not in ("", "N/A") else row["Bench Name"]
        assert ds.tensor.values[k] == label
        for run, side in (("target", "NPU"), ("baseline", "Bench")):
            t = ds.sel(run=run, step=0, rank=0, tensor=label)
            if row[f"{side} Name"] == "N/A":
                assert not bool(t.present), (label, run)
                continue
            assert bool(t.present), (label, run)
            for stat, col in stat_cols.items():
                text = row.get(f"{side} {col}")
                got = float(t[stat])
                if text is None:  # no such column (ptdbg has no l2norm): null
                    bit = {"max": 1, "min": 2, "mean": 4, "norm": 8}[stat]
                    assert math.isnan(got) and int(t.null_stats) & bit
                    continue
                assert same(got, expected(text)), (label, run, stat, got, text)
                checked += 1
            assert int(t["seq"]) == k
    assert checked >= len(rows) * 3


@pytest.mark.shared
def test_ptdbg_fixture_metadata():
    ds = open_compare_csv(shared_path(*PTDBG))
    assert ds.attrs["compare_header"] == "ptdbg" and ds.attrs["compare_mode"] == "tensor"
    t = ds.sel(tensor="Functional_linear_0_forward_input.0")
    assert str(t.compare_result.values) == "Yes" and str(t.compare_err.values) == ""
    assert float(t.cosine) == 1.0 and float(t.max_abs_err) == 0.0
    assert str(t.node.values) == "Functional_linear_0_forward"
    assert (str(t.api.values), str(t.direction.values), str(t.role.values), int(t.call)) == \
        ("Functional.linear", "forward", "input", 0)
    assert str(t.dtype.values) == "torch.float32" and str(t.shape.values) == "[3, 2]"
    assert int(ds["numel"].sel(run="baseline", step=0, rank=0,
                               tensor="Functional_linear_0_forward_input.2")) == 3
    out = ds.sel(tensor="Torch_relu_0_forward_output")
    assert str(out.role.values) == "output" and str(out.api.values) == "Torch.relu"
    assert float(out["min"].sel(run="target", step=0, rank=0)) == 0.0
    assert int(ds["null_stats"].sel(run="target", step=0, rank=0).max()) == 8  # no l2norm column


@pytest.mark.shared
def test_without_accuracy_fixture_uses_bench_name():
    ds = open_compare_csv(shared_path(*NO_ACC))
    assert bool(ds["present"].all())  # NPU name empty but NPU values given
    t = ds.sel(tensor="Functional_linear_0_forward_input.0", step=0, rank=0)
    assert float(t["max"].sel(run="target")) == 1.9482584
    assert float(t["mean"].sel(run="baseline")) == -0.200359523
    assert set(ds.compare_result.values) == {""}


@pytest.mark.shared
def test_262_fixture_results_errors_inf_and_percent():
    path = shared_path(*V262)
    ds = open_compare_csv(path)
    assert ds.attrs["compare_header"] == "result" and ds.attrs["compare_mode"] == "summary"
    rows = {r["NPU Name"]: r for r in rows_of(path)}
    res = ds.compare_result.to_series()
    assert res["Tensor.add_.0.forward.output.0"] == "error"
    assert res["Functional.relu.1.forward.output.0"] == "warning"
    assert (res == "pass").sum() == sum(r["Result"] == "pass" for r in rows.values())
    err = str(ds.compare_err.sel(tensor="Tensor.add_.0.forward.output.0").values)
    assert err == ("error: The NormRelativeErr of output is greater than 0.5.; "
                   "warning: The norm relative error of output is 10 times that of input.")
    # inf relative errors and % strings
    t = ds.sel(tensor="Tensor.add_.0.forward.input.0")
    assert float(t.max_rel_err) == np.inf and float(t.max_diff) == 1.0
    conv = "Functional.conv2d.0.forward.input.0"
    assert float(ds.mean_rel_err.sel(tensor=conv)) == float("0.02132239678778361") / 100
    assert float(ds.norm_rel_err.sel(tensor=conv)) == float("0.014298969203197884") / 100
    assert float(ds.norm_diff.sel(tensor=conv)) == -0.1812744140625
    for name, r in rows.items():
        for col, var in (("MaxRelativeErr", "max_rel_err"), ("NormRelativeErr", "norm_rel_err")):
            text = r[col]
            want = math.nan if text == "N/A" else (
                float(text[:-1]) / 100 if text.endswith("%") else float(text))
            assert same(float(ds[var].sel(tensor=name)), want), (name, col)
    # None arguments: present, all stats null
    none_arg = ds.sel(tensor="Functional.conv2d.0.forward.input.2", run="target", step=0, rank=0)
    assert bool(none_arg.present) and int(none_arg.null_stats) == 15
    assert str(none_arg.dtype.values) == ""
    # bool scalars read as 1.0
    assert float(ds["max"].sel(tensor="Functional.relu.0.forward.input.inplace", run="target",
                               step=0, rank=0)) == 1.0
    # param grads with no bench side
    pg = ds.sel(tensor="Module.fc.Linear.parameters_grad.1.bias")
    assert list(pg.present.values.ravel()) == [True, False]
    assert (str(pg.kind.values), str(pg.module.values), str(pg.role.values)) == \
        ("param_grad", "fc", "grad")
    assert float(pg["max"].sel(run="target", step=0, rank=0)) == 0.06104128062725067
    # per-tensor coordinates from the name
    w = ds.sel(tensor="Module.conv1.Conv2d.forward.0.parameters.weight")
    assert (str(w.node.values), str(w.kind.values), str(w.module.values), str(w.role.values)) == \
        ("Module.conv1.Conv2d.forward.0", "module", "conv1", "parameter")
    b = ds.sel(tensor="Functional.linear.0.backward.output.2")
    assert (str(b.direction.values), str(b.role.values)) == ("backward", "output")
    stacks = json.loads(ds.attrs["stacks"])
    assert stacks["Functional.conv2d.0.forward"][0].startswith("File ")


# --------------------------------------------------------------------------- synthetic variants

MD5_262 = (
    "NPU Name,Bench Name,NPU Dtype,Bench Dtype,NPU Tensor Shape,Bench Tensor Shape,"
    "NPU Requires_grad,Bench Requires_grad,NPU MD5,BENCH MD5,Requires_grad Consistent,Result,"
    "Err_message,NPU_Stack_Info\n"
    'Functional.linear.0.forward.input.0,Functional.linear.0.forward.input.0,torch.float32,'
    'torch.float32,"[2, 3]","[2, 3]",False,False,1a2b3c4d,1a2b3c4d,True,pass,[],'
    "\"['File a.py, line 1, in f', 'x = linear(y)']\"\n"
    'Functional.linear.0.forward.output.0,Functional.linear.0.forward.output.0,torch.float32,'
    'torch.float32,"[2, 4]","[2, 4]",False,False,deadbeef,0badf00d,True,error,'
    '"[""error: CRC32 differs.""]",N/A\n'
    "Tensor.add.0.forward.output.0,N/A,torch.float32,N/A,[4],N/A,False,N/A,cafe0001,N/A,False,"
    "warning,[],N/A\n"
)

SUMMARY_NO_REQ_GRAD = (
    "NPU Name,Bench Name,NPU Dtype,Bench Dtype,NPU Tensor Shape,Bench Tensor Shape,"
    "Max diff,Min diff,Mean diff,L2norm diff,MaxRelativeErr,MinRelativeErr,MeanRelativeErr,"
    "NormRelativeErr,NPU max,NPU min,NPU mean,NPU l2norm,Bench max,Bench min,Bench mean,"
    "Bench l2norm,Result,Err_message\n"
    "Functional.softmax.0.forward.output.0,Functional.softmax.0.forward.output.0,torch.float16,"
    "torch.float16,\"[8]\",\"[8]\",0,0,0,0,0.0%,0.0%,0.0%,0.0%, inf, -inf,nan,1.5, inf, -inf,"
    "nan,1.5,pass,\n"
    "N/A,Functional.relu.3.forward.input.0,N/A,torch.float32,N/A,\"[8]\",N/A,N/A,N/A,N/A,N/A,"
    "N/A,N/A,N/A,N/A,N/A,N/A,N/A,2.0,-1.0,0.5,3.0,warning,Need double check api accuracy.\n"
)

TENSOR_MSTT = (
    "NPU Name,Bench Name,NPU Dtype,Bench Dtype,NPU Tensor Shape,Bench Tensor Shape,Cosine,"
    "EucDist,MaxAbsErr,MaxRelativeErr,One Thousandth Err Ratio,Five Thousandths Err Ratio,"
    "NPU max,NPU min,NPU mean,NPU l2norm,Bench max,Bench min,Bench mean,Bench l2norm,"
    "Requires_grad Consistent,Accuracy Reached or Not,Err_message,Data_name\n"
    "Module.fc.Linear.forward.0.output.0,Module.fc.Linear.forward.0.output.0,torch.float32,"
    "torch.float32,\"[2, 2]\",\"[2, 2]\",0.98765,0.5,0.25,unsupported,0.9,1.0,1.0,-1.0,0.0,2.0,"
    "1.0,-1.0,0.0,2.0,True,No,,\"['Module.fc.Linear.forward.0.output.0.pt', "
    "'Module.fc.Linear.forward.0.output.0.pt']\"\n"
)


def test_md5_262_with_rank_in_file_name(tmp_path):
    f = tmp_path / "compare_result_rank3_20260101120000.csv"
    f.write_text(MD5_262)
    assert is_compare_csv(f)
    ds = precnb.open_run(f)
    validate(ds)
    assert list(ds["rank"].values) == [3] and list(ds.step.values) == [0]
    assert ds.attrs["compare_mode"] == "md5" and ds.attrs["compare_header"] == "result"
    assert list(ds.md5_target.values) == ["1a2b3c4d", "deadbeef", "cafe0001"]
    assert list(ds.md5_baseline.values) == ["1a2b3c4d", "0badf00d", ""]
    assert list(ds.compare_result.values) == ["pass", "error", "warning"]
    assert str(ds.compare_err.values[1]) == "error: CRC32 differs."
    crc = ds["crc"].sel(step=0, rank=3)
    out = crc.sel(tensor="Functional.linear.0.forward.output.0")
    assert str(out.sel(run="target").values) == "deadbeef"
    assert str(out.sel(run="baseline").values) == "0badf00d"
    assert not bool(ds.present.sel(run="baseline", step=0, rank=3,
                                   tensor="Tensor.add.0.forward.output.0"))
    assert int(ds.null_stats.sel(run="target", step=0, rank=3).max()) == 15  # no stat columns
    assert json.loads(ds.attrs["stacks"]) == {
        "Functional.linear.0.forward": ["File a.py, line 1, in f", "x = linear(y)"]}


def test_summary_inf_strings_and_bench_only_rows(tmp_path):
    f = tmp_path / "compare_result_1_5_20260101120000.csv"
    f.write_text(SUMMARY_NO_REQ_GRAD)
    ds = open_compare_csv(f)
    assert list(ds["rank"].values) == [1] and list(ds.step.values) == [5]
    assert ds.attrs["compare_header"] == "result" and ds.attrs["compare_mode"] == "summary"
    sm = ds.sel(tensor="Functional.softmax.0.forward.output.0", step=5, rank=1)
    for run in ("target", "baseline"):
        assert float(sm["max"].sel(run=run)) == np.inf
        assert float(sm["min"].sel(run=run)) == -np.inf
        assert math.isnan(float(sm["mean"].sel(run=run)))
        assert int(sm["null_stats"].sel(run=run)) == 0  # nan and inf are values, not null
        assert float(sm["norm"].sel(run=run)) == 1.5
    assert float(ds.max_rel_err.sel(tensor="Functional.softmax.0.forward.output.0")) == 0.0
    relu = "Functional.relu.3.forward.input.0"  # NPU side N/A: labelled with the Bench name
    assert list(ds.tensor.values) == ["Functional.softmax.0.forward.output.0", relu]
    r = ds.sel(tensor=relu, step=5, rank=1)
    assert list(r.present.values) == [False, True]
    assert float(r["norm"].sel(run="baseline")) == 3.0
    assert math.isnan(float(r["norm"].sel(run="target")))
    assert str(r.dtype.values) == "torch.float32" and str(r.shape.values) == "[8]"
    assert str(ds.compare_err.sel(tensor=relu).values) == "Need double check api accuracy."


def test_tensor_mstt_metrics(tmp_path):
    f = tmp_path / "compare_result_20250101000000.csv"
    f.write_text(TENSOR_MSTT)
    ds = open_compare_csv(f)
    assert ds.attrs["compare_header"] == "accuracy" and ds.attrs["compare_mode"] == "tensor"
    t = ds.sel(tensor="Module.fc.Linear.forward.0.output.0")
    assert float(t.cosine) == 0.98765 and float(t.euc_dist) == 0.5
    assert float(t.max_abs_err) == 0.25 and math.isnan(float(t.max_rel_err))
    assert float(t.one_thousandth_err_ratio) == 0.9 and float(t.five_thousandths_err_ratio) == 1.0
    assert str(t.compare_result.values) == "No"
    assert str(t.api.values) == "Linear" and str(t.module.values) == "fc"
    assert str(ds["data_name"].sel(run="target", step=0, rank=0).values[0]) == \
        "Module.fc.Linear.forward.0.output.0.pt"


def test_split_compare_name():
    assert split_compare_name("Module.a.B.backward.1.input.0") == ("Module.a.B.backward.1", "input")
    assert split_compare_name("Functional.x.0.forward.input.kw.0") == \
        ("Functional.x.0.forward", "input")
    assert split_compare_name("Module.fc.Linear.parameters_grad.weight") == \
        ("Module.fc.Linear.parameters_grad", "grad")
    assert split_compare_name("Functional_linear_0_forward_output") == \
        ("Functional_linear_0_forward", "output")
    assert split_compare_name("weird") == ("weird", "")


def test_malformed_and_not_compare(tmp_path):
    f = tmp_path / "compare_result_1.csv"
    header = SUMMARY_NO_REQ_GRAD.splitlines()[0]
    f.write_text(header + "\nA.0.forward.input.0,A.0.forward.input.0,x\n")
    with pytest.raises(DumpFormatError, match=r"compare_result_1\.csv: line 2: expected 24 fields"):
        open_compare_csv(f)
    g = tmp_path / "other.csv"
    g.write_text("a,b\n1,2\n")
    assert not is_compare_csv(g) and not is_compare_csv(tmp_path)
    with pytest.raises(NotADumpError):
        open_compare_csv(g)
