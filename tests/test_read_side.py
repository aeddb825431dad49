"""Read side: what would be lost silently is reported, and every message states the real reason.

* Folder names meaning the same number (``step1``/``step01``, ``rank1``/``rank01``,
  ``rank``/``rank0``, ``proc12``/``proc012``, kernel ``rank_1``/``rank_01`` and iteration
  ``0``/``00``): one is loaded (the canonical spelling), the other is listed in the load report
  naming both, and the CLI exits 1 naming both.
* Monitor CSV rows for the same (step, name, micro_step): the last row wins; one holding other
  values is listed with its file and line and the kept row's.
* A GBK compare CSV, a symlink loop, a broken link, a dump.json that is /dev/zero, a FIFO or a
  folder, a construct.json that is /dev/zero or a FIFO: the message says exactly that, and
  nothing blocks on a FIFO.
"""

from __future__ import annotations

import os
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from precnb.cli import main
from precnb.io.api import load_report
from tests.conftest import ROOT, open_quiet, sample_path

CORPUS = ROOT / "tests" / "corpus_broken"


@contextmanager
def no_hang(seconds: int = 60):
    """Fail instead of blocking forever (a FIFO opened for reading)."""
    def boom(*_):
        raise TimeoutError("blocked")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def cli(capsys, *argv):
    code = main([*argv, "--workers", "1"])
    out, err = capsys.readouterr()
    return code, out, err


# -- same-number folders ---------------------------------------------------------------------------

def test_step1_beside_step01(tmp_path, capsys):
    src = sample_path("dp_nan")
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(src / "step1", run / "step1")
    shutil.copytree(src / "step2", run / "step01")  # other values, same step number
    ds = open_quiet(run, workers=1)
    assert [int(s) for s in ds["step"].values] == [1]
    np.testing.assert_array_equal(ds["norm"].values, open_quiet(src / "step1", workers=1)["norm"].values)
    fails = load_report(ds).failures
    assert [p for p, _ in fails] == [str(run / "step01")]
    assert f"step 1 is also {run / 'step1'} (loaded)" in fails[0][1]
    code, out, err = cli(capsys, "nan", str(run))
    assert code == 1 and str(run / "step01") in err and str(run / "step1") in err
    code, out, err = cli(capsys, "info", str(run))
    assert code == 1 and "SKIPPED" in out and "step01" in out


@pytest.mark.parametrize(("names", "kept", "dropped"), [
    (("rank1", "rank01"), "rank1", "rank01"),
    (("rank", "rank0"), "rank0", "rank"),
    (("rank01", "rank001"), "rank001", "rank01"),  # no canonical spelling: the first by name
])
def test_rank_folders_meaning_the_same_number(tmp_path, capsys, names, kept, dropped):
    src = sample_path("dp_nan", "step1")
    run = tmp_path / "run" / "step1"
    run.mkdir(parents=True)
    shutil.copytree(src / "rank0", run / names[0])
    shutil.copytree(src / "rank1", run / names[1])
    ds = open_quiet(run.parent, workers=1)
    fails = load_report(ds).failures
    assert [p for p, _ in fails] == [str(run / dropped)]
    assert f"is also {run / kept} (loaded)" in fails[0][1]
    assert ds.sizes["rank"] == 1
    code, _, err = cli(capsys, "nan", str(run.parent))
    assert code == 1 and str(run / dropped) in err and str(run / kept) in err


def test_proc_folders_with_the_same_pid(tmp_path):
    src = next(sample_path("healthy", "step0").iterdir())
    step = tmp_path / "run" / "step0"
    step.mkdir(parents=True)
    shutil.copytree(src, step / "proc12")
    shutil.copytree(src, step / "proc012")
    fails = load_report(open_quiet(step.parent, workers=1)).failures
    assert [p for p, _ in fails] == [str(step / "proc012")] and "is also" in fails[0][1]


def test_kernel_rank_and_iteration_spellings(tmp_path, capsys):
    root = tmp_path / "k"
    shutil.copytree(CORPUS / "kernel_huge_shape", root)
    shutil.copytree(root / "rank_1", root / "rank_01")
    (root / "rank_0" / "Net" / "0" / "00").mkdir()
    shutil.copy(root / "rank_0" / "Net" / "0" / "0" / "statistic.csv", root / "rank_0" / "Net" / "0" / "00")
    fails = load_report(open_quiet(root, workers=1)).failures
    assert sorted(p for p, _ in fails) == [str(root / "rank_0" / "Net" / "0" / "00" / "statistic.csv"),
                                          str(root / "rank_01" / "Net" / "0" / "0" / "statistic.csv")]
    code, out, _ = cli(capsys, "info", str(root))
    assert code == 1 and out.count("SKIPPED") == 2 and "graph Net/0 is also" in out


# -- monitor duplicate rows -----------------------------------------------------------------------

def _monitor_copy(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "mon"
    shutil.copytree(sample_path("monitor", "monitor_output"), root)
    csv = next(root.glob("*-rank0-*")) / "actv_0-0.csv"
    return root, csv


def test_monitor_duplicate_rows_are_reported_and_the_last_wins(tmp_path, capsys):
    root, csv = _monitor_copy(tmp_path)
    lines = csv.read_text().splitlines()
    line_no = next(i for i, ln in enumerate(lines, 1) if ",embed.output,0," in ln)
    orig = lines[line_no - 1]
    norm = orig.split(",")[6]
    lines.append(orig.replace(f",{norm},", ",9.5,"))  # same step/name/micro_step, other norm
    csv.write_text("\n".join(lines) + "\n")
    last = len(lines)
    ds = open_quiet(root, workers=1)
    assert not any("#dup" in str(t) for t in ds["tensor"].values)
    assert float(ds["norm"].sel(step=0, rank=0, tensor="actv/embed.output")) == 9.5  # the last row wins
    fails = load_report(ds).failures
    assert fails == [(f"{csv} line {line_no}",
                      f"duplicate row: step 0, actv/embed.output is also on {csv} line {last} with different "
                      "values; not loaded (the last row wins)")]
    for cmd in ("info", "anomalies", "nan"):
        code, out, err = cli(capsys, cmd, str(root))
        assert code == 1 and f"line {line_no}" in out + err and f"line {last}" in out + err, cmd


def test_monitor_identical_repeated_rows_load_once(tmp_path):
    root, csv = _monitor_copy(tmp_path)
    lines = csv.read_text().splitlines()
    lines.append(lines[1])
    csv.write_text("\n".join(lines) + "\n")
    rep = load_report(open_quiet(root, workers=1))
    assert rep.failures == []
    assert any("1 repeated row(s) with the same values" in w for w in rep.warnings)


# -- messages ----------------------------------------------------------------------------------------

def test_gbk_compare_csv_says_not_utf8_with_or_without_format(tmp_path, capsys):
    f = tmp_path / "compare_result_rank0_1.csv"
    rows = ["NPU Name,Bench Name,NPU max,Bench max,Result,Err_message"]
    rows += [f"Functional.linear.{i}.forward.output.0,Functional.linear.{i}.forward.output.0,1.0,1.0,pass,精度达标"
             for i in range(3)]
    f.write_bytes(("\n".join(rows) + "\n").encode("gbk"))
    for extra in ([], ["--format", "compare"]):
        code, _, err = cli(capsys, "info", str(f), *extra)
        assert code == 1 and "not UTF-8 text: invalid byte 0xbe at line 2" in err, err
        assert "not a recognised input" not in err
    g = tmp_path / "gbk_header.csv"
    g.write_bytes("名称,值\n".encode("gbk"))
    code, _, err = cli(capsys, "info", str(g))
    assert code == 1 and "not UTF-8 text" in err and "line 1" in err


def test_symlink_loop_and_broken_link_given_as_the_path(tmp_path, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere")
    for fmt in ([], ["--format", "msprobe"], ["--format", "kernel"], ["--format", "monitor"]):
        code, _, err = cli(capsys, "info", str(tmp_path / "a"), *fmt)
        assert code == 1 and "symbolic link loop" in err and "no such file" not in err, (fmt, err)
    code, _, err = cli(capsys, "info", str(tmp_path / "broken"))
    assert code == 1 and f"broken symbolic link (points to {tmp_path / 'nowhere'}" in err


def _replace(path: Path, kind: str) -> None:
    """Turn the file *path* into a link to /dev/zero, a FIFO or a folder."""
    path.unlink()
    {"zero": lambda: path.symlink_to("/dev/zero"), "fifo": lambda: os.mkfifo(path), "dir": path.mkdir}[kind]()


def _dp_nan_with(tmp_path: Path, changes: dict[str, str]) -> Path:
    run = tmp_path / "run"
    shutil.copytree(sample_path("dp_nan"), run)
    for rel, kind in changes.items():
        _replace(run / rel, kind)
    return run


def test_dump_json_that_is_not_a_file(tmp_path, capsys):
    run = _dp_nan_with(tmp_path, {"step0/rank0/dump.json": "zero", "step0/rank1/dump.json": "fifo",
                                  "step1/rank0/dump.json": "dir"})
    with no_hang():
        fails = dict(load_report(open_quiet(run, workers=1)).failures)
        assert fails[str(run / "step0" / "rank0")] == ("dump.json (a link to /dev/zero) is a character device, "
                                                       "not a regular file")
        assert fails[str(run / "step0" / "rank1")] == "dump.json is a FIFO (named pipe), not a regular file"
        assert fails[str(run / "step1" / "rank0")] == "dump.json is a folder, not a regular file"
        assert not any("job died" in r for r in fails.values())
        code, _, err = cli(capsys, "info", str(run / "step0" / "rank1" / "dump.json"))
        assert code == 1 and "is a FIFO (named pipe)" in err
        code, _, err = cli(capsys, "info", str(run / "step0" / "rank0" / "dump.json"))
        assert code == 1 and "a link to /dev/zero) is a character device" in err
        code, _, err = cli(capsys, "info", "/dev/zero")
        assert code == 1 and "is a character device" in err


@pytest.mark.parametrize("fast", [True, False])
def test_construct_json_that_is_not_a_file_warns(tmp_path, monkeypatch, fast):
    if not fast:
        monkeypatch.setenv("PRECNB_REFERENCE_PARSER", "1")
    run = _dp_nan_with(tmp_path, {"step0/rank0/construct.json": "zero", "step0/rank1/construct.json": "fifo",
                                  "step1/rank0/stack.json": "fifo"})
    with no_hang():
        rep = load_report(open_quiet(run, workers=1))
    assert rep.failures == []
    text = "\n".join(rep.warnings)
    assert "construct.json (a link to /dev/zero) is a character device, not a regular file (ignored" in text
    assert "construct.json is a FIFO (named pipe), not a regular file (ignored" in text
    assert "stack.json is a FIFO (named pipe), not a regular file (ignored; values still loaded without stack" in text
