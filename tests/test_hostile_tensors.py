"""Hostile tensor files fail cleanly (issue 23, items 3, 4, 10, 11).

* Readers open regular files only: a FIFO named ``*.npy`` in a MindSpore kernel tensor dump
  used to block ``precnb info`` forever; a FIFO as a tensor file said "tensor file not found".
* Each tensor file is checked against the element count and dtype its dump record gives before
  it is materialised: a 629-byte ``.pt`` claiming 12 GB (a stride-0 view), a zip member
  expanding to gigabytes, a ``.npy`` whose header claims more than the file holds — one
  unreadable tensor, named (exit 1), never the end of the command ("out of memory").
* ``diff`` and ``metrics`` exit 1 naming the refused files (they used to exit 0).

The hostile ``.pt`` files are written here byte by byte (a torch zip archive: ``data.pkl`` naming
``torch._utils._rebuild_tensor_v2`` and a storage), so no torch is needed.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from precnb.errors import DumpFormatError
from precnb.io._expect import Expected, TensorRefusedError
from precnb.io._fs import NotRegularFileError, open_regular
from precnb.io._torchzip import read_torch_zip
from precnb.io.tensors import load_array
from tests._inprocess_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 240  # a FIFO that blocks would hang: every subprocess here has a deadline


def _p(x) -> bytes:
    return pickle.dumps(x, protocol=2)[2:-1]


def write_pt(path: Path, *, numel: int, size: tuple, stride: tuple, offset: int = 0, data: bytes | None = None,
             storage: str = "FloatStorage", itemsize: int = 4, compress: int = zipfile.ZIP_STORED,
             declared: int | None = None) -> Path:
    """A torch zip archive holding one tensor (what torch.save writes), built without torch."""
    pkl = (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(" + b"(" + _p("storage") + f"ctorch\n{storage}\n".encode()
           + _p("0") + _p("cpu") + _p(numel if declared is None else declared) + b"tQ" + _p(offset) + _p(size)
           + _p(stride) + b"\x89" + b"ccollections\nOrderedDict\n)RtR.")
    with zipfile.ZipFile(path, "w", compression=compress) as zf:
        zf.writestr("archive/data.pkl", pkl)
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/data/0", data if data is not None else bytes(numel * itemsize))
        zf.writestr("archive/version", "3\n")
    return path


def test_the_crafted_archive_reads_like_torch_save(tmp_path):
    pt = write_pt(tmp_path / "ok.pt", numel=6, size=(2, 3), stride=(3, 1),
                  data=np.arange(6, dtype="<f4").tobytes())
    arr, dtype = read_torch_zip(pt)
    assert dtype == "torch.float32" and arr.tolist() == [[0, 1, 2], [3, 4, 5]]
    arr, _ = load_array(pt, Expected(6, "torch.float32"))
    assert arr.shape == (2, 3)


# ----------------------------------------------------------------------------- checked before materialising
def test_a_stride0_view_claiming_12_gb_is_refused_before_it_is_materialised(tmp_path):
    pt = write_pt(tmp_path / "bomb.pt", numel=1, size=(3_000_000_000,), stride=(0,))
    assert pt.stat().st_size < 1024
    with pytest.raises(TensorRefusedError, match=r"bomb.pt: a view of 3000000000 elements over a storage of 1"):
        read_torch_zip(pt)  # no record: the view itself is impossible for a contiguous clone
    with pytest.raises(TensorRefusedError, match="its dump record says 256"):
        load_array(pt, Expected(256, "torch.float32"))
    with pytest.raises(TensorRefusedError):
        load_array(pt)


def test_a_storage_larger_than_its_record_is_refused_before_it_is_read(tmp_path):
    pt = write_pt(tmp_path / "big.pt", numel=1 << 20, size=(1 << 20,), stride=(1,))
    with pytest.raises(TensorRefusedError, match=r"big.pt: the archive expands to 4194\d+ bytes, more than a tensor "
                                                 r"of 256 elements needs"):
        load_array(pt, Expected(256, "torch.float32"))
    assert load_array(pt, Expected(1 << 20, "torch.float32"))[0].size == 1 << 20


def test_a_zip_member_expanding_beyond_limits_is_refused(tmp_path):
    n = 16 << 20  # 64 MB of zeros in a ~64 kB deflated member
    pt = write_pt(tmp_path / "zipbomb.pt", numel=n, size=(n,), stride=(1,), compress=zipfile.ZIP_DEFLATED)
    assert pt.stat().st_size < 1 << 20
    with pytest.raises(TensorRefusedError, match=r"expands .* zip bomb"):
        load_array(pt)
    with pytest.raises(TensorRefusedError, match=r"a zip bomb|expands to"):
        load_array(pt, Expected(256, "torch.float32"))


def test_a_dtype_other_than_the_record_is_refused(tmp_path):
    pt = write_pt(tmp_path / "int.pt", numel=4, size=(4,), stride=(1,), storage="LongStorage", itemsize=8)
    with pytest.raises(TensorRefusedError, match=r"holds torch\.int64, its dump record says torch\.float32"):
        load_array(pt, Expected(4, "torch.float32"))
    assert load_array(pt, Expected(4, "torch.int64"))[1] == "torch.int64"


def test_a_npy_claiming_more_than_it_holds_is_refused_before_allocation(tmp_path):
    npy = tmp_path / "huge.npy"
    with open(npy, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (3_000_000_000,)})
        fh.write(b"\0" * 64)
    with pytest.raises(TensorRefusedError, match=r"huge.npy: the header claims 3000000000 x float32 .* truncated"):
        load_array(npy)
    ok = tmp_path / "ok.npy"
    np.save(ok, np.arange(10, dtype=np.float32))
    with pytest.raises(TensorRefusedError, match="holds 10 elements, its dump record says 4"):
        load_array(ok, Expected(4, "Float32"))
    assert load_array(ok, Expected(10, "Float32"))[0].tolist() == list(range(10))


def test_a_truncated_zip_is_named_as_such(tmp_path):
    pt = write_pt(tmp_path / "t.pt", numel=6, size=(6,), stride=(1,))
    pt.write_bytes(pt.read_bytes()[:-40])
    with pytest.raises(DumpFormatError, match=r"t.pt: a damaged or truncated zip archive"):
        load_array(pt)


# ----------------------------------------------------------------------------- regular files only
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_open_regular_never_opens_a_fifo(tmp_path):
    fifo = tmp_path / "x.npy"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFileError, match="it is a FIFO"):
        open_regular(fifo)
    link = tmp_path / "link.npy"
    link.symlink_to(fifo)
    with pytest.raises(NotRegularFileError, match=r"a link to .*x.npy\) is a FIFO"):
        open_regular(link)
    with pytest.raises(DumpFormatError, match=r"x.npy: it is a FIFO \(named pipe\), not a regular file"):
        load_array(fifo)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_in_a_kernel_tensor_dump_does_not_block_info(tmp_path, samples):
    run = tmp_path / "correct"
    shutil.copytree(samples("kernel_resume", "correct"), run)
    folder = run / "dump" / "rank_0" / "TinyGPT" / "0" / "0"
    victim = sorted(folder.glob("*.npy"))[0]
    victim.unlink()
    os.mkfifo(victim)
    p = subprocess.run([sys.executable, "-m", "precnb", "info", str(run)], capture_output=True, text=True,
                       cwd=ROOT, timeout=TIMEOUT)
    assert p.returncode == 1, p.stderr
    assert f"{victim}: cannot read .npy: it is a FIFO (named pipe), not a regular file" in p.stdout
    assert "tensors    865 in" in p.stdout or "tensors    866 in" in p.stdout  # the other files are read


# ----------------------------------------------------------------------------- one bad file, named, exit 1
def _tensor_pair(tmp_path: Path, samples) -> tuple[Path, Path, str]:
    base, target = tmp_path / "baseline", tmp_path / "target"
    shutil.copytree(samples("tensor_bug", "baseline"), base)
    shutil.copytree(samples("tensor_bug", "target"), target)
    return base, target, "Functional.gelu.0.forward.output.0.pt"


def _metrics_json(base: Path, target: Path, *extra: str) -> tuple[int, dict, str]:
    p = run_cli("metrics", base, target, "--json", *extra)  # in this process (tests/_inprocess_cli.py)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {}, p.stderr


def test_metrics_exits_1_naming_the_refused_file_and_reads_the_rest(tmp_path, samples):
    base, target, name = _tensor_pair(tmp_path, samples)
    rc, clean, _ = _metrics_json(base, target)
    assert rc == 0 and clean["status_counts"].get("unreadable", 0) == 0
    hostile = target / "step0" / "rank0" / "dump_tensor_data" / name
    write_pt(hostile, numel=1, size=(3_000_000_000,), stride=(0,))
    rc, doc, err = _metrics_json(base, target)
    assert rc == 1, err
    assert doc["status_counts"]["unreadable"] == 1 and doc["pairs"] == clean["pairs"]
    assert doc["status_counts"]["ok"] == clean["status_counts"]["ok"] - 1  # every other pair computed
    (row,) = [r for r in doc["rows"] if r["status"] == "unreadable"]
    assert row["tensor"] == "Functional.gelu.0.forward.output.0" and str(hostile) in row["message"]
    assert "Functional.gelu.0.forward.output.0 at step 0 rank 0" in err and str(hostile) in err
    assert "out of memory" not in err


def test_diff_exits_1_naming_a_refused_tensor_file(tmp_path, samples):
    base, target, name = _tensor_pair(tmp_path, samples)
    hostile = target / "step0" / "rank0" / "dump_tensor_data" / name
    write_pt(hostile, numel=1 << 20, size=(1 << 20,), stride=(1,))  # larger than its record (256 elements)
    p = run_cli("diff", base, target, "--json")  # refused by its header: nothing of 1M elements is allocated
    assert p.returncode == 1, p.stderr
    assert str(hostile) in p.stderr and "more than a tensor of 256 elements needs; refused" in p.stderr
    finding = json.loads(p.stdout)
    gt = json.loads(samples("tensor_bug", "ground_truth.json").read_text())
    assert finding["kind"] == "first_divergence" and finding["node"] == gt["faults"][0]["node"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_tensor_file_is_named_a_fifo(tmp_path, samples):
    base, target, name = _tensor_pair(tmp_path, samples)
    victim = target / "step0" / "rank0" / "dump_tensor_data" / name
    victim.unlink()
    os.mkfifo(victim)
    rc, doc, _ = _metrics_json(base, target)
    assert rc == 1
    (row,) = [r for r in doc["rows"] if r["status"] == "unreadable"]
    assert "it is a FIFO (named pipe), not a regular file" in row["message"] and "not found" not in row["message"]
