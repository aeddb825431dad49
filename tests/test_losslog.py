"""Loss logs (issue 29): CSV and TensorBoard event files, read without TensorBoard.

The event files in tests/fixtures/tensorboard were written by TensorBoard's own EventFileWriter
(tools/make_tensorboard_fixture.py) from data_samples/spike_data/loss_log.csv.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from precnb.errors import DumpFormatError
from precnb.io.losslog import read_event_scalars, read_loss_log
from tests._inprocess_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
TB = ROOT / "tests" / "fixtures" / "tensorboard"
CSV = ROOT / "data_samples" / "spike_data" / "loss_log.csv"


def f32(x):
    return np.asarray(x, dtype=np.float32).astype(float)


def test_simple_value_scalars_per_rank_folder():
    df = read_loss_log(TB / "simple")
    ref = pd.read_csv(CSV)
    assert df.attrs["tag"] == "train/loss"  # not eval/loss, not lr
    assert sorted(set(df["rank"])) == [0.0, 1.0] and len(df) == len(ref)
    got = df.sort_values(["rank", "step"])["loss"].to_numpy()
    want = f32(ref.sort_values(["rank", "step"])["loss"])
    assert np.array_equal(got, want)  # float32 as written, exactly


def test_tensor_scalars_and_a_rewritten_step():
    df = read_loss_log(TB / "tensor")
    ref = pd.read_csv(CSV).groupby("step")["loss"].mean()
    assert df.attrs["tag"] == "loss" and df["rank"].isna().all()
    assert df["step"].tolist() == list(range(10))  # step 3 written twice: once in the table
    assert np.allclose(df["loss"], f32(ref.to_numpy()), rtol=0, atol=1e-6)


def test_explicit_tag_and_unknown_tag():
    df = read_loss_log(TB / "simple", tag="eval/loss")
    assert sorted(set(df["step"])) == [0, 3, 6, 9]
    with pytest.raises(DumpFormatError, match=r"no scalar tag 'nope'.*train/loss"):
        read_loss_log(TB / "simple", tag="nope")


def test_matches_tensorboard_where_installed():
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    ea = ea_mod.EventAccumulator(str(TB / "simple" / "rank1"))
    ea.Reload()
    theirs = [(e.step, e.value) for e in ea.Scalars("train/loss")]
    ours = read_event_scalars(next((TB / "simple" / "rank1").iterdir()))
    mine = [(int(s), float(v)) for s, t, v in zip(ours["step"], ours["tag"], ours["value"], strict=True)
            if t == "train/loss"]
    assert mine == theirs


def test_corrupt_and_truncated_event_files(tmp_path):
    src = next((TB / "simple" / "rank0").iterdir())
    data = bytearray(src.read_bytes())
    bad = tmp_path / src.name
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x40
    bad.write_bytes(bytes(flipped))
    with pytest.raises(DumpFormatError, match="checksum"):
        read_loss_log(bad)
    cut = tmp_path / "cut" / src.name
    cut.parent.mkdir()
    cut.write_bytes(bytes(data[:-7]))  # a log being written: the last record (eval/loss, step 9) is incomplete
    assert len(read_loss_log(cut.parent)) == 10
    assert read_loss_log(cut.parent, tag="eval/loss")["step"].tolist() == [0, 3, 6]
    junk = tmp_path / "events.out.tfevents.junk"
    junk.write_bytes(b"\x00" * 40)
    with pytest.raises(DumpFormatError, match="checksum"):
        read_loss_log(junk)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DumpFormatError, match="no TensorBoard event file"):
        read_loss_log(empty)


@pytest.mark.parametrize(("text", "match"), [
    ("", "empty file"),
    ("step,value\n0,1\n", "must name step and loss"),
    ("step,loss\n0,1\n-1,2\n", "line 3: step '-1'"),
    ("step,loss\n0,abc\n", "line 2: loss 'abc' is not a number"),
    ("step,loss,rank\n0,1,0\n0,2,0\n", "step 0 rank 0 appears more than once"),
    ("step,loss\n0,1,5\n", "line 2: 3 fields"),
])
def test_bad_csv(tmp_path, text, match):
    p = tmp_path / "loss.csv"
    p.write_text(text)
    with pytest.raises(DumpFormatError, match=match) as e:
        read_loss_log(p)
    assert str(p) in str(e.value)


def test_csv_keeps_nonfinite_and_optional_rank(tmp_path):
    p = tmp_path / "loss.csv"
    p.write_text("loss,step,rank\nnan,0,\ninf,1,\n3.5,2,1\n")
    df = read_loss_log(p)
    assert np.isnan(df["loss"][0]) and np.isinf(df["loss"][1]) and df["rank"].isna().tolist() == [True, True, False]


@pytest.mark.slow
def test_spike_from_tensorboard_logs_same_answer_as_csv(tmp_path):
    dump = ROOT / "data_samples" / "spike_data" / "dump"
    mon = ROOT / "data_samples" / "spike_data" / "monitor_output"
    answers = []
    for log in (CSV, TB / "simple"):
        out = run_cli("spike", dump, "--monitor", mon, "--loss", log, "--json")
        assert out.returncode == 0, out.stderr
        f = json.loads(out.stdout)
        answers.append((f["step"], f["rank"], f["node"], f["causes"][0]["cause"]))
        assert "TensorBoard tag 'train/loss'" in f["values"]["spike"]["source"] or log == CSV
    assert answers[0] == answers[1] == (6, 1, "Functional.embedding.0.forward", "data")
    copy = tmp_path / "tb"
    shutil.copytree(TB / "tensor", copy)  # the job's loss only: the dump's losses say which rank
    out = run_cli("spike", dump, "--monitor", mon, "--loss", copy, "--json")
    f = json.loads(out.stdout)
    assert (f["step"], f["rank"], f["causes"][0]["cause"]) == (6, 1, "data")


# -- issue #49 ------------------------------------------------------------------------------------------------
def _record(payload: bytes) -> bytes:
    import struct

    from precnb.io._tfevents import _masked

    head = struct.pack("<Q", len(payload))
    return head + struct.pack("<I", _masked(head)) + payload + struct.pack("<I", _masked(payload))


def test_fifo_in_a_loss_folder_is_refused(tmp_path):
    import os

    folder = tmp_path / "tb" / "rank0"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "events.out.tfevents.1.host")
    r = subprocess.run([sys.executable, "-c", "from precnb.io.losslog import read_loss_log; "
                        f"read_loss_log({str(tmp_path / 'tb')!r})"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "FIFO (named pipe), not a regular file" in r.stderr  # used to block forever


def test_huge_record_refused_without_reading_it(tmp_path):
    import struct

    from precnb.io._tfevents import _masked

    p = tmp_path / "events.out.tfevents.1.big"
    head = struct.pack("<Q", 1 << 30)  # a 1 GiB record used to be allowed (and read whole)
    p.write_bytes(head + struct.pack("<I", _masked(head)) + b"\x00" * 64)
    with pytest.raises(DumpFormatError, match="record 0 at byte 0: 1073741824 bytes is longer than"):
        read_event_scalars(p)


def test_crc32c_is_the_castagnoli_checksum():
    from precnb.io._tfevents import _crc32c

    assert _crc32c(b"123456789") == 0xE3069283  # the standard check value


def test_many_records_read_in_bounded_time(tmp_path):
    import time

    src = next((TB / "simple" / "rank0").iterdir())
    data = src.read_bytes()
    p = tmp_path / "events.out.tfevents.1.many"
    p.write_bytes(data * 200)
    t0 = time.perf_counter()
    df = read_event_scalars(p)
    assert len(df) == 200 * len(read_event_scalars(src))
    assert time.perf_counter() - t0 < 30


def test_superscript_step_is_an_input_error_naming_the_line(tmp_path):
    p = tmp_path / "loss.csv"
    p.write_text("step,loss\n0,1\n\u00b2,2\n")
    with pytest.raises(DumpFormatError, match="line 3: step '²' is not a non-negative integer"):
        read_loss_log(p)
    r = run_cli("spike", CSV.parent / "dump", "--loss", p)
    assert r.returncode == 1 and "usage error" not in r.stderr and str(p) in r.stderr


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([b])
        out += bytes([b | 0x80])


def _scalar_event(step: int, tag: bytes, value: float) -> bytes:
    """An Event as SummaryWriter.add_scalar writes it: wall_time, step, summary {value {tag, simple_value}}."""
    import struct

    def ld(num: int, payload: bytes) -> bytes:
        return _varint(num << 3 | 2) + _varint(len(payload)) + payload

    v = ld(1, tag) + b"\x15" + struct.pack("<f", value)
    return b"\x09" + struct.pack("<d", 1.5) + b"\x10" + _varint(step % (1 << 64)) + ld(5, ld(1, v))


def test_add_scalar_records_decode_as_the_generic_walk_does():
    from precnb.io._tfevents import _add_scalar_record, _event_scalars

    for step in (0, 1, 127, 128, 300, 2**31, 2**62, -1, -(2**63)):
        for tag in (b"loss", b"train/loss", "é/损失".encode(), b"\xff\xfe"):
            ev = _scalar_event(step, tag, 2.5)
            fast = _add_scalar_record(ev, len(ev), {})
            s, scalars = _event_scalars(ev, 0, len(ev))
            assert fast == (s, *scalars[0]) and fast[0] == step
    ev = _scalar_event(3, b"loss", 1.0) + b"\x18\x01"  # a field more: another shape, the generic walk
    assert _add_scalar_record(ev, len(ev), {}) is None


def test_two_hundred_thousand_small_records(tmp_path, monkeypatch):
    """Issue #49 defect 8: 2M small records took > 150 s (52 s after the streaming fix): one walk per field."""
    import time

    from precnb.io import _tfevents

    p = tmp_path / "events.out.tfevents.1.many"
    with open(p, "wb") as fh:
        fh.write(b"".join(_record(_scalar_event(s, b"train/loss", 3.0 - s * 1e-6)) for s in range(200_000)))
    walked = []
    monkeypatch.setattr(_tfevents, "_event_scalars", lambda *a: walked.append(a) or (None, []))
    t0 = time.perf_counter()
    df = read_loss_log(p)
    took = time.perf_counter() - t0
    assert not walked and len(df) == 200_000 and df["step"].iloc[-1] == 199_999
    assert df["loss"].iloc[1] == np.float32(3.0 - 1e-6)
    assert took < 20, took
