"""The MindSpore tensor-layout kernel-dump reader on the shared S14 dump and the bundled kernel_resume pair.

Values are checked against numpy on every .npy file (the test's own name parsing and formulas), the
order against the files' timestamps, names against the graph IR, and the diagnosis of the bundled
correct/bad pair against its ground_truth.json (which the generator derived from the files).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import precnb
from precnb.errors import NotADumpError
from precnb.io.mindspore.tensors import is_ms_kernel_tensors, open_ms_kernel_tensors, tensor_stats
from precnb.schema import validate
from tests.conftest import open_quiet, sample_path, shared_path

FILE = re.compile(r"^([^.]+)\.(.+)\.\d+\.\d+\.(\d+)\.(input|output)\.(\d+)\.[^.]+\.[^.]+\.npy$")


def _files(iteration: Path) -> list[tuple[int, str, str, str, int, Path]]:
    """(timestamp, op_type, op_name, io, slot, path) of the tensor files, by timestamp."""
    out = []
    for f in iteration.iterdir():
        m = FILE.match(f.name)
        assert m, f.name
        out.append((int(m[3]), m[1], m[2], m[4], int(m[5]), f))
    return sorted(out, key=lambda r: (r[0], r[2], r[3] != "input", r[4]))


def _key_of(ds, j: int) -> tuple[str, str, int]:
    """The file key (op_name with '_', io, slot) of tensor j, from the dataset's own coordinates."""
    node = str(ds["node"].values[j])
    label = str(ds["tensor"].values[j])
    io, slot = label[len(node) + 1:].split(".")[:2]
    if node.startswith("Parameter."):
        return node[len("Parameter."):].replace(".", "_"), io, int(slot)
    return node.replace("/", "_"), io, int(slot)


def _check_values_equal_numpy(ds, rank_dir: Path) -> int:
    """Every file's statistics equal numpy's float64 ones, and seq follows the timestamps."""
    checked = 0
    for step in ds["step"].values:
        s = ds.sel(step=step, rank=0)
        present = np.flatnonzero(s["present"].values)
        by_key = {_key_of(ds, j): j for j in present}
        files = _files(next((rank_dir / "TinyGPT").iterdir()) / str(step))
        assert len(files) == len(present) == len(by_key)
        last_seq = -1
        for _ts, op_type, op_name, io, slot, path in files:
            j = by_key[(op_name, io, slot)]
            x = np.load(path, allow_pickle=False).astype(np.float64).ravel()
            assert float(s["max"].values[j]) == float(x.max())
            assert float(s["min"].values[j]) == float(x.min())
            assert float(s["mean"].values[j]) == float(x.mean())
            assert float(s["norm"].values[j]) == float(np.sqrt(np.sum(x * x)))
            assert int(s["numel"].values[j]) == x.size
            assert str(ds["api"].values[j]) == op_type
            seq = int(s["seq"].values[j])
            assert seq > last_seq, (path.name, seq, last_seq)  # files in timestamp order = seq order
            last_seq = seq
            checked += 1
    return checked


# ------------------------------------------------------------------------------------------ S14
@pytest.fixture(scope="module")
def s14():
    root = shared_path("data_samples", "msprobe", "S14_ms_kernel_resume", "correct", "dump")
    return root, open_quiet(root)


@pytest.mark.shared
def test_s14_detected_at_every_level(s14):
    root, _ = s14
    rank = root / "rank_0"
    for p in (root, rank, rank / "TinyGPT", rank / "TinyGPT" / "0", rank / "TinyGPT" / "0" / "1"):
        assert precnb.detect_format(p) == "kernel_tensors", p
    assert is_ms_kernel_tensors(root) and not is_ms_kernel_tensors(rank / "graphs")
    ds = open_quiet(root.parent)  # the variant folder wrapping dump/ resolves to it
    assert ds.sizes["tensor"] == 1397


@pytest.mark.shared
def test_s14_values_equal_numpy_and_seq_is_timestamp_order(s14):
    root, ds = s14
    validate(ds)
    assert ds.attrs["source_format"] == "kernel_tensors" and ds.attrs["framework"] == "mindspore"
    assert list(ds["step"].values) == [0, 1] and list(ds["rank"].values) == [0]
    assert _check_values_equal_numpy(ds, root / "rank_0") == 2 * 1397
    assert "timestamp" in ds.attrs["kernel_order"]


@pytest.mark.shared
def test_s14_names_modules_and_parameters(s14):
    _, ds = s14
    t = "Default/network-NetWithLoss/net-TinyGPT/norm_out-RMSNorm/Mul-op1.input.1"
    j = list(ds["tensor"].values).index(t)
    assert str(ds["module"].values[j]) == "norm_out" and str(ds["direction"].values[j]) == "forward"
    assert str(ds["role"].values[j]) == "parameter"
    assert json.loads(ds.attrs["kernel_parameters"])[t] == "net.norm_out.weight"
    assert str(ds["dtype"].values[j]) == "Float32" and str(ds["shape"].values[j]) == "[32]"
    # a kernel the IR and the execution-order CSV do not list: its module from the longest listed scope
    node = ("Gradients_Default_network-NetWithLoss_net-TinyGPT_layers-CellList_0-DecoderLayer_"
            "attention_norm-RMSNorm_AddN-op1")
    k = list(ds["node"].values).index(node)
    assert str(ds["module"].values[k]) == "layers.0.attention_norm" and str(ds["direction"].values[k]) == "backward"
    p = list(ds["tensor"].values).index("Parameter.net.layers.1.ffn_norm.weight.output.0")
    assert (str(ds["module"].values[p]), str(ds["role"].values[p])) == ("layers.1.ffn_norm", "parameter")
    a = list(ds["tensor"].values).index("Parameter.adam_m.layers.0.attention_norm.weight.output.0")
    assert (str(ds["role"].values[a]), str(ds["direction"].values[a])) == ("state", "optimizer")
    i = list(ds["tensor"].values).index("Parameter.inputs0.output.0")
    assert str(ds["role"].values[i]) == "input" and str(ds["dtype"].values[i]) == "Int32"
    assert "Expand/_SubScalar/Sub-op0" in set(ds["node"].values)  # expanders keep their own root
    loss = [str(m) for n, m in zip(ds["node"].values, ds["module"].values, strict=True)
            if str(n).startswith("Default/network-NetWithLoss/Neg-")]
    assert loss and set(loss) == {""}  # outside the network cell: no module


@pytest.mark.shared
def test_s14_load_report_says_order_comes_from_timestamps(s14):
    _, ds = s14
    rep = precnb.load_report(ds)
    assert rep.ok
    assert any("execution-order CSV" in w and "33 kernel(s) without dump files" in w and "timestamp" in w
               for w in rep.warnings), rep.warnings


@pytest.mark.shared
def test_s14_steps_and_ranks_selection(s14):
    root, _ = s14
    ds = open_quiet(root, steps=[1])
    assert list(ds["step"].values) == [1]
    with pytest.raises(NotADumpError):
        open_ms_kernel_tensors(root, ranks=[3])


# --------------------------------------------------------------------------- bundled kernel_resume
@pytest.fixture(scope="module")
def pair():
    base = sample_path("kernel_resume")
    gt = json.loads((base / "ground_truth.json").read_text(encoding="utf-8"))
    return base, gt, open_quiet(base / "correct"), open_quiet(base / "bad")


def test_bundled_values_equal_numpy(pair):
    base, _, correct, bad = pair
    for ds, variant in ((correct, "correct"), (bad, "bad")):
        assert _check_values_equal_numpy(ds, base / variant / "dump" / "rank_0") == 2 * 866


def test_bundled_first_divergence_is_the_zero_weight_input(pair):
    _, gt, correct, bad = pair
    fault = gt["faults"][0]
    f = precnb.first_divergence(correct, bad)
    assert f.kind == "first_divergence"
    assert (f.step, f.rank, f.node, f.tensor, f.module) == (
        fault["step"], 0, fault["node"], fault["tensor"], fault["module"])
    assert f.node == "Default/network-NetWithLoss/net-TinyGPT/norm_out-RMSNorm/Mul-op1"
    vt = f.values["target"]
    assert vt["max"] == vt["min"] == vt["norm"] == 0.0 and f.values["baseline"]["mean"] == pytest.approx(
        fault["values"]["correct"]["mean"], rel=1e-12)
    zero = [h for h in f.hints if "exactly zero" in h]
    assert len(zero) == 1 and "net.norm_out.weight" in zero[0] and fault["tensor"] in zero[0]
    assert any("loaded weights (checkpoint)" in h for h in f.hints)
    # every tensor before it in the correct run's order agrees exactly
    s0c, s0b = correct.sel(step=0, rank=0), bad.sel(step=0, rank=0)
    j = list(correct["tensor"].values).index(f.tensor)
    before = np.flatnonzero(s0c["seq"].values < int(s0c["seq"].values[j]))
    assert len(before) == fault["position_in_timestamp_order"]
    for k in before:
        for v in ("max", "min", "mean", "norm"):
            a, b = float(s0c[v].values[k]), float(s0b[v].values[k])
            assert a == b or (math.isnan(a) and math.isnan(b))


def test_bundled_same_run_finds_nothing(pair):
    _, _, correct, _ = pair
    assert precnb.first_divergence(correct, correct).kind == "none"


def test_cli_diff_on_bundled_pair(pair, capsys):
    from precnb.cli import main

    base, gt, _, _ = pair
    rc = main(["diff", str(base / "correct"), str(base / "bad"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc in (0, 1)
    assert out["kind"] == "first_divergence" and out["tensor"] == gt["faults"][0]["tensor"]
    assert any("net.norm_out.weight" in h and "exactly zero" in h for h in out["hints"])


# ------------------------------------------------------------------------ broken and synthetic input
def _synthetic(tmp_path: Path) -> Path:
    it = tmp_path / "dump" / "rank_0" / "Net" / "0" / "0"
    it.mkdir(parents=True)
    np.save(it / "Add.Default_net-Net_Add-op0.0.0.100.input.0.DefaultFormat.Float32.npy",
            np.array([1.0, np.nan, -np.inf, 2.0], np.float32))
    np.save(it / "Add.Default_net-Net_Add-op0.0.0.101.input.1.DefaultFormat.Float32.npy",
            np.array([np.inf, 0.0], np.float32))
    np.save(it / "Add.Default_net-Net_Add-op0.0.0.102.output.0.DefaultFormat.Float32.npy",
            np.zeros((0, 3), np.float32))
    np.save(it / "Cast.Default_net-Net_Cast-op0.0.0.103.output.0.DefaultFormat.Bool.npy", np.array([True, False]))
    return it


def test_nan_inf_empty_and_bool_preserved(tmp_path):
    it = _synthetic(tmp_path)
    ds = open_quiet(tmp_path / "dump")
    s = ds.sel(step=0, rank=0)
    a = s.sel(tensor="Default_net-Net_Add-op0.input.0")
    assert math.isnan(float(a["max"])) and math.isnan(float(a["mean"])) and math.isnan(float(a["norm"]))
    assert float(a["nan_count"]) == 1 and float(a["neg_inf_count"]) == 1
    b = s.sel(tensor="Default_net-Net_Add-op0.input.1")
    assert float(b["max"]) == math.inf and float(b["norm"]) == math.inf and float(b["min"]) == 0.0
    e = s.sel(tensor="Default_net-Net_Add-op0.output.0")
    assert bool(e["present"]) and int(e["null_stats"]) == 15 and int(e["numel"]) == 0
    c = s.sel(tensor="Default_net-Net_Cast-op0.output.0")
    assert (float(c["max"]), float(c["min"]), float(c["mean"])) == (1.0, 0.0, 0.5)
    assert [str(x) for x in ds["tensor"].values[np.argsort(s["seq"].values)]][:2] == [
        "Default_net-Net_Add-op0.input.0", "Default_net-Net_Add-op0.input.1"]
    del it


def test_broken_and_pickled_files_are_reported_not_loaded(tmp_path):
    it = _synthetic(tmp_path)
    good = it / "Add.Default_net-Net_Add-op0.0.0.100.input.0.DefaultFormat.Float32.npy"
    trunc = it / "Mul.Default_net-Net_Mul-op0.0.0.104.input.0.DefaultFormat.Float32.npy"
    trunc.write_bytes(good.read_bytes()[:-5])
    marker = tmp_path / "unpickled"
    pickled = it / "Mul.Default_net-Net_Mul-op0.0.0.105.input.1.DefaultFormat.Float32.npy"
    np.save(pickled, np.array([_Boom(str(marker))], dtype=object), allow_pickle=True)
    (it / "notes.txt").write_text("not a dump file")
    with pytest.warns(UserWarning, match="could not be read"):
        ds = precnb.open_run(tmp_path / "dump", progress=False)
    assert not marker.exists()  # nothing was unpickled
    rep = precnb.load_report(ds)
    failed = dict(rep.failures)
    assert set(failed) == {str(trunc), str(pickled)}
    assert all("npy" in r for r in failed.values())
    assert any(p.endswith("notes.txt") and r.startswith("ignored") for p, r in rep.skipped)
    assert ds.sizes["tensor"] == 4  # the other files loaded
    with pytest.raises(precnb.errors.DumpFormatError, match="Mul"):
        open_ms_kernel_tensors(tmp_path / "dump", errors="raise")


class _Boom:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_not_a_kernel_tensor_dump(tmp_path):
    assert not is_ms_kernel_tensors(tmp_path)
    (tmp_path / "rank_0" / "Net" / "0" / "0").mkdir(parents=True)
    assert not is_ms_kernel_tensors(tmp_path)
    it = _synthetic(tmp_path / "b")
    (it / "statistic.csv").write_text("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape\n")
    assert not is_ms_kernel_tensors(tmp_path / "b" / "dump")  # the statistic.csv reader's input
    assert not is_ms_kernel_tensors(sample_path("healthy"))


def test_tensor_stats_chunked_agrees(monkeypatch):
    from precnb.io.mindspore import _files as mod

    a = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    a[3], a[9] = 0.0, np.inf
    whole = tensor_stats(a)
    monkeypatch.setattr(mod, "CHUNK", 64)
    parts = tensor_stats(a)
    assert parts == whole  # exact here: inf dominates the sums, max/min/counts are exact in any order
    a[9] = 1.0
    monkeypatch.setattr(mod, "CHUNK", 1 << 24)
    whole = tensor_stats(a)
    monkeypatch.setattr(mod, "CHUNK", 64)
    parts = tensor_stats(a)
    for k in ("max", "min", "nan_count", "pos_inf_count", "neg_inf_count", "zero_count"):
        assert parts[k] == whole[k]
    assert parts["mean"] == pytest.approx(whole["mean"], rel=1e-12, abs=1e-15)
    assert parts["norm"] == pytest.approx(whole["norm"], rel=1e-12)


def test_hashed_long_names_are_read_through_mapping_csv(tmp_path):
    """MindSpore 2.10 names a file by a hash when its name is too long and lists it in mapping.csv
    (no header: ``<hash>.npy,<original name>``), as observed on a real CPU dump with long cell names."""
    it = tmp_path / "dump" / "rank_0" / "Top" / "0" / "0"
    it.mkdir(parents=True)
    long_name = ("ReLU.Default_" + "a" * 200 + "-Mid_" + "b" * 100
                 + "-Leaf_ReLU-op0.0.0.17961.output.0.DefaultFormat.Float32.npy")
    np.save(it / "1567544679.npy", np.array([3.0, -1.0], np.float32))
    (it / "mapping.csv").write_text(f"1567544679.npy,{long_name}\n", encoding="utf-8")
    ds = open_quiet(tmp_path / "dump")
    label = "Default_" + "a" * 200 + "-Mid_" + "b" * 100 + "-Leaf_ReLU-op0.output.0"
    s = ds.sel(step=0, rank=0, tensor=label)
    assert (float(s["max"]), float(s["min"]), str(s["api"].values)) == (3.0, -1.0, "ReLU")
    assert str(s["module"].values) == "a" * 200 + "." + "b" * 100  # from the name's attr-Class pattern
    assert precnb.load_report(ds).ok
