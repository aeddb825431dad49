"""Broken and hostile inputs: every reader reports what it skipped and why, and never crashes.

* ``tests/corpus_broken/``: tiny hand-made broken samples, each with its exact skip / warning /
  error message (both msprobe parsers: the fast path and the reference reader).
* Truncated rank of a real TP=2 dump (the acceptance check), mismatched runs, missing side
  files, empty folders, symlink loops, unreadable folders (real permissions when not root,
  simulated otherwise), FIFOs and files that are not dumps at all.
* The CLI: exit 2 on usage errors, 1 on unreadable data, one line on stderr, no traceback
  unless ``--debug``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import precnb
from precnb.cli import main
from precnb.errors import DumpFormatError, NotADumpError, PrecnbError
from precnb.io.api import load_report
from precnb.schema import validate
from tests.conftest import shared_path

CORPUS = Path(__file__).resolve().parent / "corpus_broken"
ROOT = Path(__file__).resolve().parents[1]
S = ("data_samples", "msprobe")
PARSERS = ["batched", "whole"]

GOOD_JSON = {
    "task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
    "data": {"Functional.linear.0.forward": {
        "input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0,
                        "Mean": 0.5, "Norm": 2.0}],
        "input_kwargs": {},
        "output": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 3.0, "Min": -1.0,
                    "Mean": 0.25, "Norm": 4.0}]}},
}


def open_quiet(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return precnb.open_run(path, **kw)


@pytest.fixture(params=PARSERS)
def parser(request, monkeypatch):
    """Run msprobe tests with the fast path and with the reference reader."""
    if request.param == "whole":
        monkeypatch.setenv("PRECNB_JSON_WHOLE", "1")
    else:
        monkeypatch.delenv("PRECNB_JSON_WHOLE", raising=False)
    return request.param


def write_dump(root: Path, ranks=(0,), steps=(0,), doc=None) -> Path:
    for s in steps:
        for r in ranks:
            d = root / f"step{s}" / f"rank{r}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "dump.json").write_text(json.dumps(doc or GOOD_JSON, indent=1))
    return root


# ------------------------------------------------------------------------------- the corpus

# case -> (kind, detail); "{dir}" stands for the case folder. kinds:
#   skipped: (file relative to the case, exact reason after "<file>: "), the other rank loads
#   warnings: exact list of load-report warnings (the load succeeds)
#   error: (exception class, exact message)
CORPUS_EXPECTED: dict[str, tuple[str, object]] = {
    "msprobe_truncated": ("skipped", ("step0/rank1/dump.json",
                                      "invalid JSON at line 16 column 11 (char 280): Expecting ':' delimiter "
                                      "(truncated file?)")),
    "msprobe_invalid_utf8": ("skipped", ("step0/rank1/dump.json",
                                         "invalid UTF-8 byte 0xff at line 15 column 13 (byte 265) "
                                         "(not a text JSON file?)")),
    "msprobe_empty_file": ("skipped", ("step0/rank1/dump.json",
                                       "file is empty (the job may have died before writing it)")),
    "msprobe_data_is_list": ("skipped", ("step0/rank1/dump.json",
                                         "not an msprobe dump.json: 'data' is a JSON array, expected an object of "
                                         "node records")),
    "msprobe_top_is_list": ("skipped", ("step0/rank1/dump.json",
                                        "not an msprobe dump.json: holds a JSON array, expected an object with a "
                                        "'data' object")),
    "msprobe_no_data_key": ("skipped", ("step0/rank1/dump.json", "not an msprobe dump.json (no 'data' object)")),
    "msprobe_long_int": ("skipped", ("step0/rank1/dump.json",
                                     "invalid JSON at line 1 column 125 (char 124): an integer literal has more "
                                     "than 4300 digits")),
    "msprobe_deep_nesting": ("skipped", ("step0/rank1/dump.json",
                                         "node 'Functional.linear.0.forward': values nested more than 64 levels deep "
                                         "(at 'Functional.linear.0.forward.input" + ".0" * 41 + "....)")),
    "msprobe_no_dump_json": ("skipped", ("step0/rank1",
                                         "no dump.json in rank folder (job died before the first flush?)")),
    "msprobe_bad_types": ("warnings", [
        "{dir}/step0/rank0/dump.json: 2 statistic(s) neither a number nor null; loaded as null "
        "(first: Functional.linear.0.forward.input.0 Min=[1])",
        "{dir}/step0/rank0/dump.json: 2 tensor(s) whose shape is not a list of non-negative integers; numel unknown "
        "(first: Functional.linear.0.forward.input.0 shape='2x3')",
        "{dir}/step0/rank0/dump.json: 1 dtype/md5/data_name value(s) that are not strings; ignored "
        "(first: Functional.linear.0.forward.output.0 md5=7)",
        "{dir}/step0/rank0/dump.json: 1 node record(s) that are not JSON objects; skipped "
        "(first: 'Functional.relu.0.forward': array)",
        "{dir}/step0/rank0/dump.json: 1 top-level task/level/framework value(s) that are not strings; ignored "
        "(first: task=['statistics'])",
    ]),
    "msprobe_broken_side_files": ("warnings", [
        "{dir}/step0/rank0/construct.json: invalid JSON at line 1 column 33 (char 32): Unterminated string "
        "starting at (ignored; values still loaded)",
        "{dir}/step0/rank0/stack.json: holds a JSON list, not an object (ignored; values still loaded)",
    ]),
    "msprobe_utf8_in_string": ("warnings", [
        "{dir}/step0/rank0/dump.json: invalid UTF-8 bytes inside strings (first: 0xff at line 11 column 29 "
        "(byte 218)) replaced by U+FFFD"]),
    "msprobe_data_name_traversal": ("warnings", [
        "{dir}/step0/rank0/dump.json: 2 data_name(s) pointing outside dump_tensor_data; precnb.load_tensor refuses "
        "them (first: Functional.linear.0.forward.output.0 data_name='../../../../etc/passwd')"]),
    "msprobe_empty_data": ("warnings", [
        "{dir}/step0/rank0/dump.json: 'data' is empty (nothing was dumped on this rank and step)"]),
    "msprobe_bom_and_tokens": ("warnings", []),
    "msprobe_huge_numbers": ("warnings", []),
    "msprobe_duplicate_keys": ("warnings", []),
    "msprobe_huge_counters": ("warnings", []),
    "not_a_dump": ("error", (NotADumpError,
                             "{dir}: not a recognised input (expected an msprobe dump, monitor output, MindSpore "
                             "kernel dump (statistic.csv or .npy tensors), compare result CSV, msprobe config_check "
                             "pack or precnb zarr "
                             "store)")),
    "monitor_bad_step": ("skipped", ("Dec03_21-34-40-rank1-1a2b3c4d/actv_0-0.csv",
                                     "line 2: column 'step': 'abc' is not an integer")),
    "monitor_step_out_of_range": ("skipped", ("Dec03_21-34-40-rank1-1a2b3c4d/actv_0-0.csv",
                                              "line 2: column 'step': 99999999999 is out of range (0..2147483647)")),
    "monitor_huge_micro_step": ("skipped", ("Dec03_21-34-40-rank1-1a2b3c4d/actv_0-0.csv",
                                            "line 2: column 'micro_step': 123456789 is out of range (-1..99999)")),
    "monitor_wrong_fields": ("skipped", ("Dec03_21-34-40-rank1-1a2b3c4d/actv_0-0.csv",
                                         "line 3: expected 6 fields as in the header, got 3")),
    "monitor_bad_number": ("skipped", ("Dec03_21-34-40-rank1-1a2b3c4d/actv_0-0.csv",
                                       "line 2: column 'norm': 'x' is not a number")),
    "monitor_not_utf8": ("skipped", ("Dec03_21-34-40-rank1-1a2b3c4d/actv_0-0.csv",
                                     "not UTF-8 text: invalid byte 0xff at line 3 column 10 (byte 85)")),
    "monitor_empty_file": ("skipped", ("Dec03_21-34-40-rank1-1a2b3c4d/actv_0-0.csv", "empty file (no header)")),
    "kernel_bad_value": ("skipped", ("rank_1/Net/0/0/statistic.csv",
                                     "line 2: column 'Max Value': 'abc' is not a number")),
    "kernel_missing_columns": ("skipped", ("rank_1/Net/0/0/statistic.csv",
                                           "line 1: not a MindSpore statistic.csv: header lacks ['IO', 'Slot']")),
    "kernel_short_row": ("skipped", ("rank_1/Net/0/0/statistic.csv",
                                     "line 3: expected 13 fields as in the header (plus an optional trailing "
                                     "comma), got 4")),
    "kernel_huge_shape": ("warnings", []),
    "compare_bad_row": ("error", (DumpFormatError, "{dir}/compare_result_rank0_20250101.csv: line 3: expected 5 "
                                                   "fields as in the header, got 2")),
    "compare_literals": ("warnings", []),
}


def _target(case: Path) -> Path:
    return next(case.glob("*.csv")) if case.name.startswith("compare") else case


def test_corpus_is_complete_and_tiny():
    cases = sorted(p.name for p in CORPUS.iterdir() if p.is_dir())
    assert cases == sorted(CORPUS_EXPECTED)
    for f in CORPUS.rglob("*"):
        if f.is_file():
            assert f.stat().st_size < 8192, f


@pytest.mark.parametrize("case", sorted(CORPUS_EXPECTED))
def test_corpus_exact_messages(case, parser):
    if parser == "reference" and not case.startswith("msprobe"):
        pytest.skip("the parser choice concerns msprobe dumps only")
    folder = CORPUS / case
    kind, detail = CORPUS_EXPECTED[case]
    fill = lambda text: text.replace("{dir}", str(folder))  # noqa: E731
    if kind == "error":
        cls, message = detail
        with pytest.raises(cls) as e:
            open_quiet(_target(folder))
        assert str(e.value) == fill(message)
        return
    ds = open_quiet(_target(folder))
    validate(ds)
    rep = load_report(ds)
    if kind == "skipped":
        rel, reason = detail
        path = str(folder / rel)
        want = reason if rel.endswith(("step0/rank1",)) else f"{path}: {reason}"
        assert rep.failures == [(path, want)]
        assert rep.warnings == []
        ranks = [int(r) for r in ds["rank"].values]
        assert 1 in ranks or case == "msprobe_no_dump_json"  # the broken rank stays in the coordinate
        assert bool(ds["present"].sel(rank=0).any())  # ... and the good one loaded
    else:
        assert rep.failures == []
        assert rep.warnings == [fill(w) for w in detail]


def test_corpus_values_are_exact(parser):
    ds = open_quiet(CORPUS / "msprobe_bom_and_tokens")
    t = "Functional.linear.0.forward.output.0"
    v = {k: float(ds[k].sel(step=0, rank=0, tensor=t)) for k in ("max", "min", "mean", "norm")}
    assert math.isnan(v["max"]) and v["min"] == -math.inf and v["mean"] == math.inf and math.isnan(v["norm"])
    assert int(ds["null_stats"].sel(step=0, rank=0, tensor=t)) == 8  # NaN is a value, null is null

    ds = open_quiet(CORPUS / "msprobe_huge_numbers")
    v = {k: float(ds[k].sel(step=0, rank=0, tensor=t)) for k in ("max", "min", "mean", "norm")}
    assert v == {"max": math.inf, "min": -math.inf, "mean": math.inf, "norm": 1.2345678901234568e29}

    ds = open_quiet(CORPUS / "msprobe_duplicate_keys")  # the last key wins, as with json.load
    assert float(ds["max"].sel(step=0, rank=0, tensor=t)) == 3.0
    assert float(ds["min"].sel(step=0, rank=0, tensor=t)) == 2.0

    ds = open_quiet(CORPUS / "msprobe_bad_types")
    x = ds.sel(step=0, rank=0, tensor="Functional.linear.0.forward.input.0")
    assert math.isnan(float(x["max"])) and float(x["norm"]) == -math.inf  # numeric strings are numbers
    assert int(x["null_stats"]) == 2 | 4 and int(x["numel"]) == -1 and str(x["shape"].values) == ""
    y = ds.sel(step=0, rank=0, tensor="Functional.linear.0.forward.output.0")
    assert float(y["max"]) == 1.0 and int(y["numel"]) == -1 and str(y["dtype"].values) == ""

    ds = open_quiet(CORPUS / "msprobe_huge_counters")
    assert int(ds["call"].values[0]) == -1 and int(ds["micro_step"].values[0]) == -1

    ds = open_quiet(CORPUS / "kernel_huge_shape")
    x = ds.sel(step=0, rank=1, tensor="Default_Sub-op0.input.0")
    assert (float(x["max"]), float(x["min"]), int(x["numel"])) == (math.inf, -math.inf, -1)
    assert int(x["null_stats"]) == 4 | 8  # no Avg Value column; L2Norm "null"


def test_corpus_compare_literals_are_never_executed(tmp_path):
    ds = open_quiet(_target(CORPUS / "compare_literals"))
    assert ds.sizes["tensor"] == 1 and not Path("/tmp/x").exists()


# ------------------------------------------------------------------ acceptance: truncated rank

def test_truncated_rank_of_real_tp2_dump(tmp_path, capsys, parser):
    dst = tmp_path / "tp2"
    shutil.copytree(shared_path(*S, "S5_tp_shards", "tp2"), dst)
    f = dst / "step0" / "rank1" / "dump.json"
    raw = f.read_bytes()
    f.write_bytes(raw[: len(raw) // 2])
    ds = open_quiet(dst)
    rep = load_report(ds)
    assert [p for p, _ in rep.failures] == [str(f)]
    reason = rep.failures[0][1]
    assert reason.startswith(f"{f}: invalid JSON at line ") and " column " in reason and "(char " in reason
    assert reason.endswith("(truncated file?)")
    assert bool(ds["present"].sel(step=0, rank=0).any()) and not bool(ds["present"].sel(step=0, rank=1).any())
    assert bool(ds["present"].sel(step=1, rank=1).any())  # the other step of the same rank loads
    code = main(["info", str(dst)])
    out, _err = capsys.readouterr()
    assert code == 1 and "SKIPPED" in out and str(f) in out and "line" in out and "column" in out
    p = subprocess.run([sys.executable, "-m", "precnb", "info", str(dst)], capture_output=True, text=True,
                       check=False, env={**os.environ, "PRECNB_NO_DASK_CLIENT": "1"})
    assert p.returncode == 1 and "Traceback" not in p.stderr + p.stdout


def test_errors_raise_stops_at_the_broken_file(tmp_path):
    root = write_dump(tmp_path / "d", ranks=(0, 1))
    (root / "step0" / "rank1" / "dump.json").write_text('{"data": {"x": ')
    with pytest.raises(DumpFormatError, match=r"rank1/dump.json: invalid JSON at line 1 column 16"):
        open_quiet(root, errors="raise")


# --------------------------------------------------------------------- mismatched runs

def test_mismatched_steps_and_ranks_between_runs(tmp_path):
    a = open_quiet(write_dump(tmp_path / "a", ranks=(0, 1), steps=(0, 1)))
    b = open_quiet(write_dump(tmp_path / "b", ranks=(1, 2), steps=(1, 2)))
    both = precnb.open_runs({"a": a, "b": b})
    validate(both)
    assert [int(s) for s in both["step"].values] == [0, 1, 2] and [int(r) for r in both["rank"].values] == [0, 1, 2]
    assert not bool(both["present"].sel(run="a", step=2).any()) and not bool(both["present"].sel(run="b", rank=0).any())
    f = precnb.first_divergence(a, b)  # they overlap at step 1, rank 1: identical there
    assert f.kind == "none"
    f = precnb.first_divergence(a.sel(step=[0]), b.sel(step=[2]), step_offset=0)  # nothing in common: its own answer
    assert f.kind == "none" and f.nothing_compared
    assert f.reason.startswith("nothing was compared: the runs share no step")


def test_open_runs_with_one_unreadable_run_raises_precnb_error(tmp_path):
    a = write_dump(tmp_path / "a")
    with pytest.raises(NotADumpError):
        precnb.open_runs({"a": a, "b": tmp_path / "missing"})


# --------------------------------------------------------------------- folders and side files

def test_missing_construct_and_stack_are_normal(tmp_path, parser):
    ds = open_quiet(write_dump(tmp_path / "d"))
    rep = load_report(ds)
    assert rep.ok and rep.warnings == []
    assert json.loads(ds.attrs["construct"]) == {} and json.loads(ds.attrs["stacks"]) == {}
    assert set(ds["module"].values) == {""}


@pytest.mark.parametrize("fmt", [None, "msprobe", "monitor", "kernel", "compare"])
def test_empty_folder_is_not_a_dump(tmp_path, fmt):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PrecnbError):
        open_quiet(tmp_path / "empty", format=fmt)


def test_empty_step_and_rank_folders(tmp_path, parser):
    root = write_dump(tmp_path / "d", ranks=(0,))
    (root / "step0" / "rank1").mkdir()
    (root / "step1").mkdir()
    ds = open_quiet(root)
    assert load_report(ds).failures == [(str(root / "step0" / "rank1"),
                                         "no dump.json in rank folder (job died before the first flush?)")]
    (tmp_path / "only_empty" / "step0" / "rank0").mkdir(parents=True)
    with pytest.raises(NotADumpError, match=r"no msprobe dump found .*no dump.json in rank folder"):
        open_quiet(tmp_path / "only_empty")


def test_step_folder_symlinked_to_its_parent(tmp_path, parser):
    root = write_dump(tmp_path / "d", ranks=(0, 1))
    (root / "step1").symlink_to(root, target_is_directory=True)  # a loop
    (root / "step0" / "rank2").symlink_to(root / "step0")  # another loop
    (root / "step0" / "rank3").symlink_to(root / "step0" / "rank3")  # a self loop (ELOOP)
    ds = open_quiet(root)
    rep = load_report(ds)
    assert [int(r) for r in ds["rank"].values] == [0, 1] and [int(s) for s in ds["step"].values] == [0]
    assert (str(root / "step1"), "ignored: symlink to one of its parent folders (a loop)") in rep.skipped
    assert (str(root / "step0" / "rank2"), "ignored: symlink to one of its parent folders (a loop)") in rep.skipped
    assert (str(root / "step0" / "rank3"), "broken symlink") in rep.failures
    assert precnb.detect_format(root) == "msprobe"


def test_symlink_loops_in_monitor_and_kernel_trees(tmp_path):
    k = tmp_path / "k"
    d = k / "rank_0" / "Net" / "0" / "0"
    d.mkdir(parents=True)
    (d / "statistic.csv").write_text("Op Type,Op Name,IO,Slot,Max Value\nAdd,Default_Add-op0,input,0,1.5\n")
    (k / "rank_1").symlink_to(k, target_is_directory=True)
    (d / "loop").symlink_to(k, target_is_directory=True)
    ds = open_quiet(k)
    assert float(ds["max"].sel(step=0, rank=0, tensor="Default_Add-op0.input.0")) == 1.5
    m = tmp_path / "m"
    r0 = m / "Dec03_21-34-40-rank0-1a2b3c4d"
    r0.mkdir(parents=True)
    (r0 / "actv_0-0.csv").write_text("vpp_stage,name,step,micro_step,norm\n0,a.output,0,0,2.0\n")
    (m / "Dec03_21-34-40-rank1-1a2b3c4d").symlink_to(m, target_is_directory=True)
    ds = open_quiet(m)
    rep = load_report(ds)
    assert [int(r) for r in ds["rank"].values] == [0]
    assert rep.skipped == [(str(m / "Dec03_21-34-40-rank1-1a2b3c4d"), "rank folder holds no monitor CSV file")]


def test_fifo_named_dump_json_does_not_hang(tmp_path, parser):
    root = write_dump(tmp_path / "d", ranks=(0,))
    (root / "step0" / "rank1").mkdir()
    os.mkfifo(root / "step0" / "rank1" / "dump.json")
    ds = open_quiet(root)
    assert load_report(ds).failures == [(str(root / "step0" / "rank1"),
                                         "dump.json is a FIFO (named pipe), not a regular file")]


def test_paths_that_are_not_dumps(tmp_path, parser):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    binary = tmp_path / "b" / "step0" / "rank0"
    binary.mkdir(parents=True)
    (binary / "dump.json").write_bytes(bytes(range(256)) * 4)
    for p in (text, tmp_path / "missing", tmp_path / "b", Path("/dev/null")):
        with pytest.raises(PrecnbError):
            open_quiet(p)
    with pytest.raises(NotADumpError, match=r"no dump file could be read \(.*not a JSON text file \(starts with"):
        open_quiet(tmp_path / "b")



@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any folder: covered by the simulated test below")
def test_unreadable_folders_real_permissions(tmp_path):
    root = write_dump(tmp_path / "d", ranks=(0, 1))
    locked = root / "step0" / "rank1"
    locked.chmod(0)
    try:
        ds = open_quiet(root)
        assert load_report(ds).failures == [(str(locked), "cannot list folder: Permission denied")]
        (root / "step0").chmod(0)
        with pytest.raises(NotADumpError, match="Permission denied"):
            open_quiet(root)
    finally:
        (root / "step0").chmod(0o755)
        locked.chmod(0o755)


def test_unreadable_folders_simulated(tmp_path, monkeypatch, parser):
    """As root, permissions do not stop reads: deny them at the Python level instead."""
    root = write_dump(tmp_path / "d", ranks=(0, 1, 2))
    denied = {root / "step0" / "rank1", root / "step0" / "rank2" / "dump.json"}
    real_iterdir, real_open, real_is_file = Path.iterdir, Path.open, Path.is_file

    def iterdir(self):
        if self in denied:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    def is_file(self):
        if self.parent in denied:
            raise PermissionError(13, "Permission denied", str(self))
        return real_is_file(self)

    def open_(self, *a, **k):
        if self in denied:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *a, **k)

    real_os_open = os.open

    def os_open(path, flags, *a, **k):  # precnb._files.open_regular opens with os.open (O_NONBLOCK)
        if Path(path) in denied:
            raise PermissionError(13, "Permission denied", str(path))
        return real_os_open(path, flags, *a, **k)

    real_stat = os.stat

    def os_stat(path, *a, **k):  # discovery checks each rank folder's dump.json with one os.stat
        if not isinstance(path, int) and Path(os.fsdecode(path)).parent in denied:
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *a, **k)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    monkeypatch.setattr(Path, "is_file", is_file)
    monkeypatch.setattr(Path, "open", open_)
    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(os, "stat", os_stat)
    ds = open_quiet(root)
    rep = load_report(ds)
    f2 = root / "step0" / "rank2" / "dump.json"
    assert sorted(rep.failures) == [(str(root / "step0" / "rank1"), "cannot list folder: Permission denied"),
                                    (str(f2), f"{f2}: cannot read: Permission denied")]
    denied.add(root)
    with pytest.raises(NotADumpError, match="cannot list folder: Permission denied"):
        open_quiet(root, format="msprobe")  # (format detection: see test_detect_format_on_unreadable_paths)


def test_unreadable_rank_folders_of_monitor_and_kernel_simulated(tmp_path, monkeypatch):
    k = tmp_path / "k"
    m = tmp_path / "m"
    for r in (0, 1):
        d = k / f"rank_{r}" / "Net" / "0" / "0"
        d.mkdir(parents=True)
        (d / "statistic.csv").write_text("Op Type,Op Name,IO,Slot,Max Value\nAdd,Default_Add-op0,input,0,1.5\n")
        f = m / f"Dec03_21-34-40-rank{r}-1a2b3c4d"
        f.mkdir(parents=True)
        (f / "actv_0-0.csv").write_text("vpp_stage,name,step,micro_step,norm\n0,a.output,0,0,2.0\n")
    denied = {k / "rank_1" / "Net", m / "Dec03_21-34-40-rank1-1a2b3c4d"}
    real_iterdir = Path.iterdir

    def iterdir(self):
        if self in denied:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    ds = open_quiet(k)
    assert load_report(ds).failures == [(str(k / "rank_1" / "Net"), "cannot list folder: Permission denied")]
    assert [int(r) for r in ds["rank"].values] == [0]
    ds = open_quiet(m)
    assert load_report(ds).failures == [(str(m / "Dec03_21-34-40-rank1-1a2b3c4d"),
                                         "cannot list folder: Permission denied")]
    denied.add(k / "rank_0" / "Net")
    with pytest.raises(NotADumpError, match=r"no statistic.csv could be found .*Permission denied"):
        open_quiet(k, format="kernel")


# --------------------------------------------------------------------- the CLI

def cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_exit_codes_and_one_line_messages(tmp_path, capsys):
    good = write_dump(tmp_path / "good")
    (tmp_path / "empty").mkdir()
    cases = [
        (["info", str(tmp_path / "missing")], 1, "no such file or directory"),
        (["info", str(tmp_path / "empty")], 1, "not a recognised input"),
        (["nan", str(CORPUS / "not_a_dump")], 1, "not a recognised input"),
        (["info", str(good), "--steps", "x"], 2, "usage error: --steps"),
        (["info", str(good), "--ranks", "1:x"], 2, "usage error: --ranks"),
        (["diff", str(good), str(tmp_path / "missing")], 1, "no such file or directory"),
        (["convert", str(good), "-o", str(good)], 1, "it is the input"),
        (["info", str(CORPUS / "compare_bad_row" / "compare_result_rank0_20250101.csv")], 1, "line 3: expected 5"),
    ]
    for argv, want, text in cases:
        code, _out, err = cli(capsys, *argv)
        assert code == want, (argv, err)
        assert text in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    assert main(["info"]) == 2  # argparse: missing PATH
    assert cli(capsys, "info", str(good))[0] == 0


def test_cli_partly_unreadable_run(tmp_path, capsys):
    root = write_dump(tmp_path / "d", ranks=(0, 1))
    bad = root / "step0" / "rank1" / "dump.json"
    bad.write_text('{"data": {')
    code, out, err = cli(capsys, "info", str(root))
    assert code == 1 and f"SKIPPED    {bad}: invalid JSON at line 1 column 11 (char 10)" in out
    store = tmp_path / "out.zarr"
    code, out, err = cli(capsys, "convert", str(root), "-o", str(store))
    assert code == 1 and store.is_dir() and f"precnb convert: skipped unreadable {bad}: invalid JSON" in err
    assert err.count("\n") == 1


def test_cli_analysis_commands_exit_1_on_partly_unreadable_run(tmp_path, capsys):
    root = write_dump(tmp_path / "d", ranks=(0, 1))
    bad = root / "step0" / "rank1" / "dump.json"
    bad.write_text('{"data": {')
    for argv in (["nan", str(root)], ["anomalies", str(root)], ["diff", str(root), str(root)]):
        code, _out, err = cli(capsys, *argv)
        assert code == 1 and str(bad) in err, argv


def test_cli_debug_shows_traceback_anywhere_on_the_line(tmp_path):
    env = {**os.environ, "PRECNB_NO_DASK_CLIENT": "1"}
    for argv in (["--debug", "info", str(tmp_path / "nope")], ["info", str(tmp_path / "nope"), "--debug"]):
        p = subprocess.run([sys.executable, "-m", "precnb", *argv], capture_output=True, text=True, check=False,
                           env=env)
        assert p.returncode == 1 and "Traceback" in p.stderr and "NotADumpError" in p.stderr
    p = subprocess.run([sys.executable, "-m", "precnb", "info", str(tmp_path / "nope")], capture_output=True,
                       text=True, check=False, env=env)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


def test_cli_internal_error_is_one_line(monkeypatch, capsys, tmp_path):
    import precnb.analysis.summary as summary

    def boom(ds):
        raise ZeroDivisionError("oops")

    monkeypatch.setattr(summary, "summarize", boom)
    code, _out, err = cli(capsys, "info", str(write_dump(tmp_path / "d")))
    assert code == 1 and err.startswith("precnb info: internal error: ZeroDivisionError: oops")
    assert err.count("\n") == 1


# --------------------------------------------------------------------- load report everywhere

def test_every_reader_fills_the_load_report(tmp_path, capsys):
    ms = open_quiet(CORPUS / "msprobe_truncated")
    assert load_report(ms).read == [str(CORPUS / "msprobe_truncated" / "step0" / "rank0" / "dump.json")]
    mon = open_quiet(CORPUS / "monitor_bad_step")
    assert load_report(mon).read == [str(CORPUS / "monitor_bad_step" / "Dec03_21-34-40-rank0-1a2b3c4d"
                                         / "actv_0-0.csv")]
    ker = open_quiet(CORPUS / "kernel_bad_value")
    assert load_report(ker).read == [str(CORPUS / "kernel_bad_value" / "rank_0" / "Net" / "0" / "0" / "statistic.csv")]
    cmp_csv = _target(CORPUS / "compare_literals")
    assert load_report(open_quiet(cmp_csv)).read == [str(cmp_csv)]
    store = tmp_path / "s.zarr"
    precnb.to_zarr(ms, store)
    assert load_report(open_quiet(store)).to_dict() == load_report(ms).to_dict()


def test_info_prints_warnings_and_counts(capsys):
    code, out, _ = cli(capsys, "info", str(CORPUS / "msprobe_bad_types"))
    assert code == 0
    assert "read       1 file(s); skipped 0" in out
    assert out.count("warning    ") == 5 and "neither a number nor null" in out
    code, out, _ = cli(capsys, "info", "--json", str(CORPUS / "msprobe_bad_types"))
    obj = json.loads(out)
    assert obj["files_read"] == 1 and len(obj["warnings"]) == 5


def test_load_report_warnings_reach_open_run_for_every_parser(parser):
    ds = open_quiet(CORPUS / "msprobe_data_name_traversal")
    assert len(load_report(ds).warnings) == 1
    assert list(ds["data_name"].values[0, 0]) == ["../../../../etc/passwd", "/etc/shadow",
                                                   "Functional.linear.0.forward.output.2.pt"]


def _odd_paths(tmp_path: Path) -> list[Path]:
    (tmp_path / "step0").write_text("a file named like a folder")
    return [tmp_path / ("x" * 300), tmp_path / "a\udcff", Path("/proc/self/mem"), tmp_path / "step0",
            tmp_path / ("x" * 300) / "dump.json"]


def test_no_reader_leaks_non_precnb_exceptions_on_odd_paths(tmp_path):
    for p in _odd_paths(tmp_path):
        for fmt in ("msprobe", "monitor", "kernel", "compare"):
            with pytest.raises(PrecnbError):
                open_quiet(p, format=fmt)


def test_detect_format_and_store_on_unreadable_paths(tmp_path):
    for p in _odd_paths(tmp_path):
        with pytest.raises(PrecnbError):
            open_quiet(p)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PrecnbError):
        open_quiet(tmp_path / "empty", format="zarr")
    (tmp_path / "bad.zarr").mkdir()
    (tmp_path / "bad.zarr" / "zarr.json").write_text("{not json")
    with pytest.raises(PrecnbError):
        open_quiet(tmp_path / "bad.zarr")


def test_values_are_float64_with_nan_inf_preserved(tmp_path):
    doc = json.loads(json.dumps(GOOD_JSON))
    leaf = doc["data"]["Functional.linear.0.forward"]["output"][0]
    leaf.update({"Max": float("inf"), "Min": float("-inf"), "Mean": float("nan"), "Norm": None})
    ds = open_quiet(write_dump(tmp_path / "d", doc=doc))
    x = ds.sel(step=0, rank=0, tensor="Functional.linear.0.forward.output.0")
    assert ds["max"].dtype == np.float64
    assert float(x["max"]) == math.inf and float(x["min"]) == -math.inf and math.isnan(float(x["mean"]))
    assert int(x["null_stats"]) == 8
