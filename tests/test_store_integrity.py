"""Issue #49: a damaged or hand-edited zarr store is named, never read as a confident wrong answer.

Defect 1: chunk files deleted from a store read as fill values (``nan`` answered step 2 instead of step 1, exit 0).
Defect 3: a FIFO in place of a chunk or a metadata file blocked every command. ``info`` lists the gaps.
Every fixture is made here: a store converted from the bundled ``dp_nan`` sample, then damaged.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings

import pytest

from tests.conftest import sample_path

STATS = ("max", "min", "mean", "norm", "present", "null_stats", "numel", "seq")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    import precnb

    out = tmp_path_factory.mktemp("store") / "b.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        precnb.to_zarr(sample_path("dp_nan"), out, progress=False, workers=1)
    return out


def _copy(store, tmp_path, name="d.zarr"):
    dst = tmp_path / name
    shutil.copytree(store, dst)
    return dst


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "precnb", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_every_chunk_is_written(store):
    # the step coordinate's step 0 equals its fill value: zarr skipped that chunk by default
    assert sorted(os.listdir(store / "step" / "c")) == ["0", "1", "2"]
    for name in STATS:
        assert sorted(os.listdir(store / name / "c")) == ["0", "1", "2"]


def test_missing_chunks_withhold_the_answer(store, tmp_path):
    d = _copy(store, tmp_path)
    for name in STATS:
        (d / name / "c" / "1" / "0" / "0").unlink()
    r = _cli("nan", d)
    assert r.returncode == 1, r.stdout
    assert "first NaN" not in r.stdout
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "damaged zarr store: 8 chunk file(s) missing" in err
    assert "max/c/1/0/0 (max: step 1" in err

    import precnb
    from precnb.errors import DumpFormatError

    with pytest.raises(DumpFormatError, match="chunk file"):
        precnb.open_run(d)


def test_info_lists_missing_chunks(store, tmp_path):
    d = _copy(store, tmp_path)
    (d / "max" / "c" / "1" / "0" / "0").unlink()
    r = _cli("info", d)
    assert r.returncode == 1
    assert "skipped 1" in r.stdout
    assert f"SKIPPED    {d}/max/c/1/0/0: chunk file missing (max: step 1, ranks 0-1" in r.stdout


def test_info_reports_fill_valued_regions_of_a_store_without_the_promise(store, tmp_path):
    import zarr

    from precnb.io._store_audit import COMPLETE_ATTR

    d = _copy(store, tmp_path)
    g = zarr.open_group(d, mode="r+", zarr_format=3)
    del g.attrs[COMPLETE_ATTR]  # as an older precnb wrote it: absent chunks may be fill values
    (d / "step" / "c" / "0").unlink()
    r = _cli("info", d)
    assert "chunk(s) not written, read as fill values" in r.stdout and "step (1)" in r.stdout
    assert r.returncode == 0, r.stdout + r.stderr


# every file kind with `info`, every command with a chunk file (7 cases, a subprocess each) in make test-fast; the
# other 9 pairs (the same refusal, precnb/_files.py, on the same store) in make test (issue #53 item 8)
@pytest.mark.parametrize(("command", "where"), [
    pytest.param(c, w, marks=() if c == "info" or w == "max/c/1/0/0" else pytest.mark.slow)
    for w in ["max/c/1/0/0", "max/zarr.json", "zarr.json", "tensor/c/0"] for c in ["info", "nan", "diff", "open_run"]])
def test_fifo_in_a_store_is_refused(store, tmp_path, where, command):
    d = _copy(store, tmp_path)
    (d / where).unlink()
    os.mkfifo(d / where)
    if command == "open_run":
        r = subprocess.run([sys.executable, "-c", f"import precnb; precnb.open_run({str(d)!r})"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "FIFO" in r.stderr
        return
    args = (command, d, d) if command == "diff" else (command, d)
    r = _cli(*args, timeout=60)  # used to block forever
    assert r.returncode == 1, r.stderr
    assert "FIFO (named pipe)" in r.stderr and where.split("/")[-1] in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
