"""precnb.tensor_metrics against msprobe compare, on every tensor of the bundled tensor-mode pairs.

The bundled samples keep the CSV that the real ``msprobe compare`` 26.2.0 wrote for their pair
(``<sample>/msprobe_compare/compare_result_*.csv``), so these tests need neither torch nor msprobe.
Tolerance: the six metrics must be **equal** to the CSV's values (msprobe rounds five of them to
12 decimals, which precnb reproduces; EucDist is unrounded float64 and must match to 1e-12
relative). Non-numeric cells map to statuses: ``unsupported`` (0-d / empty / unmatched),
``N/A`` (NaN/inf at different places), ``shape unmatched``, ``Nan`` (all-zero side).
"""

from __future__ import annotations

import ast
import csv
import importlib.util
import math
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import precnb
from precnb.analysis.tensor.metrics import MSPROBE_COLUMNS, pair_metrics, ulp_error
from precnb.errors import PrecnbError
from precnb.io._torchzip import UnsupportedArchiveError, read_torch_zip
from precnb.io.tensors import TensorFolder, load_array
from precnb.tensor_compare import select_tensors, tensor_metrics, to_frame

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data_samples"
SAMPLES = ("tensor_bf16", "tensor_bug")
EUC_RTOL = 1e-12


def _have(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def _sample(name: str) -> Path:
    p = DATA / name
    if not (p / "ground_truth.json").exists():
        pytest.skip(f"{p} missing (run `make samples`)")
    return p


def _csv_rows(folder: Path) -> list[dict[str, str]]:
    (path,) = sorted(folder.glob("compare_result_*.csv"))
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def check_against_csv(metrics, rows: list[dict[str, str]]) -> dict[str, float]:
    """Assert precnb == msprobe on every CSV row with data files; return the max deviation per metric."""
    index = {str(t): j for j, t in enumerate(metrics["tensor"].values)}
    worst = dict.fromkeys(MSPROBE_COLUMNS, 0.0)
    compared = 0
    for row in rows:
        names = ast.literal_eval(row["Data_name"]) if row.get("Data_name", "").startswith("[") else None
        if not names or "-1" in names or "N/A" in names:
            continue  # no tensor file on a side: msprobe writes "unsupported", precnb has no pair
        label = row["NPU Name"]
        j = index[label]
        status = str(metrics["status"].values[0, 0, j])
        compared += 1
        for var, col in MSPROBE_COLUMNS.items():
            cell = row[col].strip()
            ours = float(metrics[var].values[0, 0, j])
            ref = _number(cell)
            where = f"{label} {col}: msprobe {cell!r}, precnb {ours!r} ({status})"
            if ref is None or math.isnan(ref):
                assert math.isnan(ours), where
                if cell == "N/A":
                    assert status == "nan_inf_mismatch", where
                elif cell == "shape unmatched":
                    assert status == "shape_mismatch", where
                elif cell == "unsupported":
                    assert status in ("zero_d", "empty", "dtype_unmatched"), where
                continue
            if math.isinf(ref):
                assert ours == ref, where
                continue
            dev = abs(ours - ref)
            limit = EUC_RTOL * max(1.0, abs(ref)) if var == "euc_dist" else 0.0
            assert dev <= limit, where
            worst[var] = max(worst[var], dev)
    assert compared > 400 if len(rows) > 400 else compared > 0
    return worst


@pytest.mark.parametrize("name", SAMPLES)
def test_metrics_equal_msprobe_compare_csv_on_every_tensor(name):
    s = _sample(name)
    m = tensor_metrics(s / "baseline", s / "target")
    rows = _csv_rows(s / "msprobe_compare")
    worst = check_against_csv(m, rows)
    assert all(v == 0.0 for k, v in worst.items() if k != "euc_dist"), worst
    # every tensor file of the pair has a result; the 0-d losses are msprobe's "scalar" rows
    counts = to_frame(m)["status"].value_counts().to_dict()
    assert set(counts) <= {"ok", "zero_d"} and counts["zero_d"] == 2


def test_dataset_shape_coords_and_selection():
    s = _sample("tensor_bug")
    base, targ = precnb.open_run(s / "baseline"), precnb.open_run(s / "target")
    m = precnb.tensor_metrics(base, targ)
    assert m["cosine"].dims == ("step", "rank", "tensor")
    assert list(m["baseline_tensor"].values) == list(m["tensor"].values)
    for v in ("cosine", "euc_dist", "max_abs_err", "max_rel_err", "one_thousandth_err_ratio",
              "five_thousandths_err_ratio", "bitwise_equal", "ulp_err", "status"):
        assert v in m
    # before the bug every tensor is bit-identical; the residual mul of block 1 is the first that is not
    frame = to_frame(m)
    seq = targ["seq"].sel(step=0, rank=0, tensor=list(frame["tensor"])).values
    frame = frame.assign(seq=seq).sort_values("seq")
    first = frame[~frame["bitwise_equal"]].iloc[0]
    assert first["tensor"] == "Tensor.__mul__.6.forward.output.0" and first["module"] == "blocks.1"
    assert first["cosine"] == 1.0 and first["max_rel_err"] == 0.5  # a scale: cosine is blind to it
    # a module path selects that module's tensors only; a regex and a list work too
    sub = precnb.tensor_metrics(base, targ, tensors="blocks.1.attn")
    assert sub.sizes["tensor"] and all(str(x).startswith("blocks.1.attn") for x in sub["module"].values)
    picked = select_tensors(targ, r"^Torch\.matmul\.0\.")
    assert picked == [t for t in targ["tensor"].values if t.startswith("Torch.matmul.0.")] and len(picked) >= 5
    with pytest.raises(KeyError):
        precnb.tensor_metrics(base, targ, tensors=["no.such.tensor"])
    with pytest.raises(ValueError):
        precnb.tensor_metrics(base, targ, tensors="nothing_matches_this")
    with pytest.raises(ValueError):
        precnb.tensor_metrics(base, targ, steps=[7])


def test_lazy_equals_eager_and_computes_only_what_is_selected(monkeypatch):
    s = _sample("tensor_bug")
    eager = precnb.tensor_metrics(s / "baseline", s / "target", chunk=50)
    lazy = precnb.tensor_metrics(s / "baseline", s / "target", chunk=50, lazy=True)
    assert lazy["cosine"].chunks is not None
    import precnb.tensor_compare.blocks as tc  # where the blocks are computed

    calls = []
    real = tc._compute_block
    monkeypatch.setattr(tc, "_compute_block", lambda *a: calls.append(len(a[0])) or real(*a))
    lazy2 = precnb.tensor_metrics(s / "baseline", s / "target", chunk=50, lazy=True)
    one = lazy2["cosine"].isel(tensor=slice(0, 10)).compute()
    assert calls == [50]  # one block of 50 read, not the 9 blocks of the pair
    assert np.array_equal(one.values, eager["cosine"].isel(tensor=slice(0, 10)).values, equal_nan=True)
    full = lazy.compute()
    for v in eager.data_vars:
        assert full[v].equals(eager[v]), v
    threads = precnb.tensor_metrics(s / "baseline", s / "target", scheduler="threads", workers=2)
    for v in eager.data_vars:
        assert threads[v].equals(eager[v]), v


def test_alignment_maps_target_labels_to_other_baseline_labels():
    s = _sample("tensor_bug")
    a, b = "Functional.linear.0.forward.output.0", "Functional.linear.1.forward.output.0"
    m = precnb.tensor_metrics(s / "baseline", s / "target", tensors=[a], alignment={a: b})
    assert m["baseline_tensor"].values.tolist() == [b]
    ta, _ = load_array(s / "target/step0/rank0/dump_tensor_data" / f"{a}.pt")
    bb, _ = load_array(s / "baseline/step0/rank0/dump_tensor_data" / f"{b}.pt")
    assert m["cosine"].item() == pair_metrics(ta, bb).values["cosine"] < 0.9  # q vs k projection


def test_not_a_tensor_dump_is_a_clear_error():
    s = DATA / "healthy"
    if not s.exists():
        pytest.skip("healthy sample missing")
    with pytest.raises(PrecnbError, match="task=tensor"):
        precnb.tensor_metrics(s, s)


def test_unreadable_file_is_one_entry_not_the_run(tmp_path):
    import shutil

    s = _sample("tensor_bug")
    for side in ("baseline", "target"):
        shutil.copytree(s / side, tmp_path / side)
    bad = tmp_path / "target/step0/rank0/dump_tensor_data/Functional.gelu.0.forward.output.0.pt"
    bad.write_bytes(b"\x80\x04not a torch file")
    m = precnb.tensor_metrics(tmp_path / "baseline", tmp_path / "target")
    st = m["status"].sel(tensor="Functional.gelu.0.forward.output.0").item()
    assert st == "unreadable" and "refused" in m["message"].sel(tensor="Functional.gelu.0.forward.output.0").item()
    assert int((m["status"] == "ok").sum()) == 431


# ------------------------------------------------------------------------- formulas and edge cases
def test_pair_metrics_edge_cases_without_msprobe():
    f32 = np.float32
    m = pair_metrics(np.array([1, np.nan, np.inf, -np.inf, 2], f32), np.array([1.5, np.nan, -np.inf, np.inf, 2], f32))
    assert m.status == "ok"  # same places: zeroed on both sides (the sign of an infinity is not compared)
    assert m.values["max_abs_err"] == 0.5
    assert pair_metrics(np.array([1, np.nan], f32), np.array([np.nan, 1], f32)).status == "nan_inf_mismatch"
    z = pair_metrics(np.array([3.0], f32), np.array([2.0], f32))  # squeezed to 0-d
    assert z.status == "zero_d" and math.isnan(z.values["cosine"]) and z.values["max_abs_err"] == 1.0
    assert z.values["max_rel_err"] == 0.5
    assert pair_metrics(np.zeros((0, 3), f32), np.zeros((0, 3), f32)).status == "empty"
    assert pair_metrics(np.ones((2, 3), f32), np.ones((3, 2), f32)).status == "shape_mismatch"
    assert pair_metrics(np.ones((1, 4), f32), np.ones(4, f32)).status == "ok"  # squeeze makes them match
    both_zero = pair_metrics(np.zeros(5, f32), np.zeros(5, f32))
    assert both_zero.values["cosine"] == 1.0 and both_zero.bitwise_equal
    one_zero = pair_metrics(np.zeros(5, f32), np.ones(5, f32))
    assert math.isnan(one_zero.values["cosine"]) and one_zero.values["rel_l2_err"] == 1.0
    # zeros in the baseline: float32 eps is added to both sides there
    rel = pair_metrics(np.array([0.0, 1.0, 0.0, 2.0], f32), np.array([0.0, 1.0, 1e-3, 0.0], f32))
    assert rel.values["max_rel_err"] == float(f"{2.0 / np.finfo(np.float32).eps:.12f}") - 1
    assert pair_metrics(np.arange(4), np.arange(4.0, dtype=f32)).status == "dtype_unmatched"
    near = pair_metrics(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0 + 1e-7]))
    assert near.values["cosine"] == 1.0  # > 0.9999: rounded to 6 decimals
    assert ulp_error(np.array([1.0 + 2 ** -7]), np.array([1.0]), "bfloat16") == 1.0
    bf = pair_metrics(np.array([1.0078125, 2.0], f32), np.array([1.0, 2.0], f32), target_dtype="torch.bfloat16",
                      baseline_dtype="torch.float32")
    assert bf.values["ulp_err"] == 1.0 and not bf.bitwise_equal
    assert math.isnan(pair_metrics(np.ones(3, f32), np.ones(3, f32)).values["ulp_err"])  # fp32 pair


# ----------------------------------------------------------------------- safe, torch-free .pt reading
def _zip(path: Path, pkl: bytes, storages: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pkl)
        zf.writestr("archive/byteorder", "little")
        for k, v in storages.items():
            zf.writestr(f"archive/data/{k}", v)
    return path


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("touch EVIL_MARKER",))


def test_malicious_pickle_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _zip(tmp_path / "evil.pt", pickle.dumps(_Evil(), protocol=2), {})
    with pytest.raises(UnsupportedArchiveError, match=r"os\.system|posix\.system"):
        read_torch_zip(path)
    assert not (tmp_path / "EVIL_MARKER").exists()
    with pytest.raises(PrecnbError):  # load_array refuses it too (falls back to torch's weights_only)
        load_array(path)
    assert not (tmp_path / "EVIL_MARKER").exists()


def test_tensor_reaching_past_its_storage_is_refused(tmp_path):
    s = _sample("tensor_bug")
    src = s / "baseline/step0/rank0/dump_tensor_data/Functional.linear.0.forward.output.0.pt"
    with zipfile.ZipFile(src) as zf:
        pkl_name = next(n for n in zf.namelist() if n.endswith("data.pkl"))
        pkl = zf.read(pkl_name)
        data = zf.read(pkl_name.replace("data.pkl", "data/0"))
    # the same archive, with a storage of 4 floats only (the pickle still says 1x8x16)
    path = _zip(tmp_path / "short.pt", pkl.replace(b"K\x80", b"K\x04", 1), {"0": data[:16]})
    with pytest.raises(UnsupportedArchiveError):
        read_torch_zip(path)


def test_symlinked_tensor_file_leaving_the_folder_is_refused(tmp_path):
    folder = tmp_path / "dump_tensor_data"
    folder.mkdir()
    (tmp_path / "outside.npy").write_bytes(b"x")
    (folder / "a.npy").symlink_to(tmp_path / "outside.npy")
    with pytest.raises(PrecnbError, match="outside"):
        TensorFolder(folder).path("a.npy")
    with pytest.raises(PrecnbError, match="outside"):
        TensorFolder(folder).path("../outside.npy")


@pytest.mark.needs_generator
@pytest.mark.skipif(not _have("torch"), reason="needs torch")
def test_torch_free_reader_equals_torch_load_on_every_file():
    import torch

    n = 0
    for name in SAMPLES:
        for f in sorted((_sample(name)).glob("*/step0/rank0/dump_tensor_data/*.pt")):
            ours, dtype = read_torch_zip(f)
            ref = torch.load(f, weights_only=True, map_location="cpu")
            assert dtype == str(ref.dtype)
            ref_np = (ref.float() if ref.dtype == torch.bfloat16 else ref).numpy()
            assert ours.shape == ref_np.shape and ours.dtype == ref_np.dtype and ours.tobytes() == ref_np.tobytes()
            n += 1
    assert n > 1700


@pytest.mark.needs_generator
@pytest.mark.slow
@pytest.mark.skipif(not (_have("torch") and _have("msprobe")), reason="needs torch and msprobe")
def test_edge_cases_equal_the_real_msprobe_compare(tmp_path):
    """NaN/inf, 0-d, one-element, empty, shape/dtype mismatches, bf16/fp16/ints/bools vs real msprobe."""
    sys.path.insert(0, str(Path(__file__).parent))
    from _tensor_edge_cases import write_edge_dumps

    write_edge_dumps(tmp_path)
    out = tmp_path / "msprobe_compare"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", "import sys; from msprobe.msprobe import main; sys.exit(main())",
                           "compare", "-tp", str(tmp_path / "target/step0/rank0/dump.json"),
                           "-gp", str(tmp_path / "baseline/step0/rank0/dump.json"), "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    m = tensor_metrics(tmp_path / "baseline", tmp_path / "target")
    rows = _csv_rows(out)
    check_against_csv(m, rows)
    status = {str(t).split(".")[1]: str(s) for t, s in zip(m["tensor"].values, m["status"].values[0, 0], strict=True)}
    assert status["edge_nan_moved"] == "nan_inf_mismatch" and status["edge_empty"] == "empty"
    assert status["edge_shape_mismatch"] == "shape_mismatch" and status["edge_int_vs_float"] == "dtype_unmatched"
    assert status["edge_zero_d"] == status["edge_one_element"] == "zero_d"
