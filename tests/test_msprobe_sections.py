"""Every section of every record is read, nothing is dropped silently, and "nothing compared" is its own answer.

Committed fixtures (``tests/fixtures/msprobe_sections``, written by hand from msprobe's formats and its own test
data, see the README there): ``pt`` / ``ms`` are one transformer block dumped by PyTorch (mix) and by MindSpore
(a cell dump: an ``input`` section on the block's forward record, ``input_args`` on its backward records), whose
only value difference is the block's input; ``odd`` is a PyTorch dump in the shapes older releases and broken
files take (1.0.x's ``grad_input`` / ``grad_output``, a record key precnb does not know, a string where a section
belongs, a tensor without its dtype, a record that is not an object, no ``framework`` key).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import precnb
from tests._inprocess_cli import run_cli
from tests.conftest import shared_path

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "msprobe_sections"
SAMPLES = ROOT / "data_samples"


def cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args)  # `python -m precnb ARGS` in this process (tests/_inprocess_cli.py)


# ------------------------------------------------------------------------------------------ any section
def test_every_record_key_is_a_section_with_its_role():
    ds = precnb.open_run(FIX / "odd", progress=False)
    got = list(zip(ds["tensor"].values.tolist(), ds["role"].values.tolist(), strict=True))
    assert got == [
        ("Functional.linear.0.forward.input.0", "input"), ("Functional.linear.0.forward.input.1", "input"),
        ("Functional.linear.0.forward.output.0", "output"),
        ("Tensor.add_.0.forward.input.0", "input"), ("Tensor.add_.0.forward.output.0", "output"),
        ("Tensor.add_.0.forward.extra_state.0", ""),  # a key precnb does not know keeps its own name
        ("Functional.relu.0.forward.input.0", "input"),
        # 1.0.x: grad_output (w.r.t. the forward's outputs) is the backward input, grad_input its output
        ("Functional.relu.0.backward.input.0", "input"), ("Functional.relu.0.backward.output.0", "output"),
        ("Functional.linear.0.backward.input.0", "input"), ("Functional.linear.0.backward.output.1", "output"),
    ]
    raw = json.loads((FIX / "odd/step0/rank/dump.json").read_text())["data"]["Functional.relu.0.backward"]
    e = ds.sel(step=0, rank=0, tensor="Functional.relu.0.backward.input.0")
    assert [float(e[s]) for s in ("max", "min", "mean", "norm")] == [raw["grad_output"][0][k] for k in
                                                                     ("Max", "Min", "Mean", "Norm")]
    assert ds.attrs["framework"] == "pytorch"  # from the leaves' torch.Tensor type (no framework key)


def test_a_mindspore_cell_dump_reads_input_on_forward_and_input_args_on_backward():
    ds = precnb.open_run(FIX / "ms", progress=False)
    roles = dict(zip(ds["tensor"].values.tolist(), ds["role"].values.tolist(), strict=True))
    assert roles["Cell.model.layers.0.Block.forward.0.input.0"] == "input"
    assert roles["Cell.model.layers.0.Block.backward.0.input.0"] == "input"
    assert roles["Cell.model.layers.0.Block.backward.0.output.0"] == "output"
    assert float(ds["max"].sel(step=0, rank=0, tensor="Cell.model.layers.0.Block.forward.0.input.0")) == 4.5299e-05
    assert not precnb.load_report(ds).unread and not precnb.load_report(ds).warnings


def test_what_cannot_be_read_is_listed_and_counted():
    ds = precnb.open_run(FIX / "odd", progress=False)
    rep = precnb.load_report(ds)
    dump = str(FIX / "odd/step0/rank/dump.json")
    assert rep.unread == [  # in reading order
        (dump, "Functional.relu.0.forward", "input.1", "tensor fields without 'dtype'"),
        (dump, "Functional.relu.0.forward", "output", "a JSON string, not a list or object of tensors"),
        (dump, "Functional.broken.0.forward", "", "a JSON array, not an object of sections"),
    ]
    assert rep.unread_count == 3
    assert any("'extra_state' (1)" in w and "no role" in w for w in rep.warnings), rep.warnings
    # the record that is not an object has its own warning line; the other two are counted in one
    assert any("2 section(s) or leaf(s) precnb cannot read" in w for w in rep.warnings), rep.warnings
    assert sum("Functional.broken.0.forward" in w for w in rep.warnings) == 1, rep.warnings
    out = cli("info", str(FIX / "odd"))
    assert "3 section(s) or leaf(s) not read" in out.stdout
    assert "NOT READ   " + dump + ": Functional.relu.0.forward input.1: tensor fields without 'dtype'" in out.stdout
    js = json.loads(cli("info", str(FIX / "odd"), "--json").stdout)
    assert js["unread_count"] == 3 and js["unread"][2] == {
        "file": dump, "record": "Functional.broken.0.forward", "where": "", "why": "a JSON array, not an object of "
                                                                                    "sections"}
    clean = cli("info", str(FIX / "pt"))
    assert "; 0 section(s) or leaf(s) not read" in clean.stdout


def test_diff_finds_the_difference_in_a_forward_records_input_section():
    t = precnb.diagnose(FIX / "ms", baseline=FIX / "pt", progress=False)
    f = t.finding
    assert (f.kind, f.step, f.rank) == ("first_divergence", 0, 0)
    assert f.tensor == "Cell.model.layers.0.Block.forward.0.input.0"
    assert f.baseline["tensor"] == "Module.model.layers.0.Block.forward.0.input.0"
    assert f.values["target"]["max"] - f.values["baseline"]["max"] == pytest.approx(4.5299e-05 - 2.5625)
    # the index tensors' int64 (PyTorch) vs Int32 (MindSpore) is a note, not a difference
    assert set(f.stats["dtype_notes"]) == {"Functional.embedding.0.forward.input.0",
                                           "Cell.model.embed.Embedding.forward.0.input.0"}


# ------------------------------------------------------------------------------------------ msprobe's own pair
MS_COMPARE = ("fixtures", "msprobe_repo", "Ascend-msprobe", "test", "msprobe_test", "mindspore_ut", "compare",
              "dump_file")


@pytest.mark.shared
def test_msprobes_compare_pair_finds_its_one_numeric_difference():
    """msprobe's own MindSpore/PyTorch compare fixture: the difference its compare finds (Max diff -2.56) is in
    the "input" section of a Cell forward record; the bool mask stored as UInt8 is a note, not an origin."""
    root = shared_path(*MS_COMPARE)
    t = precnb.diagnose(root / "mindspore_data", baseline=root / "pytorch_data", progress=False)
    f = t.result("first_divergence")
    layer = "Cell.network_with_loss.module.language_model.encoder.layers.0.ParallelTransformerLayer.forward.0.input.0"
    first_value = f.values.get("first_value_difference", f.values)
    assert first_value.get("tensor", f.tensor) == layer
    assert first_value["target"]["max"] - first_value["baseline"]["max"] == pytest.approx(-2.5625, abs=1e-4)
    mask = "Functional.flash_attention_score.0.forward.input.attn_mask"
    assert mask in f.stats["dtype_notes"] and f.stats["dtype_notes"][mask]["target"] == "UInt8"
    assert all(s["tensor"] != mask for s in f.suspects)
    assert not (f.gap and mask in json.dumps(f.gap)) and mask not in json.dumps(f.dump_plan or {})
    assert not any("bool vs uint8" in h for h in f.hints)


# ------------------------------------------------------------------------------------------ nothing compared
def _two_steps(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(SAMPLES / "healthy" / "step0", a / "step0")
    shutil.copytree(SAMPLES / "healthy" / "step1", b / "step1")
    return a, b


def _no_tensors(tmp_path: Path) -> tuple[Path, Path]:
    """Two runs whose only record holds an object msprobe could not describe (its visualization fixtures)."""
    doc = {"task": "statistics", "level": "mix", "dump_data_dir": None, "data": {"api": {"input": [{}]}}}
    for name, folders in (("base", ["step0/rank0", "step0/rank1", "step1/rank0", "step2/rank0"]),
                          ("targ", ["step0/rank0"])):
        for f in folders:
            (tmp_path / name / f).mkdir(parents=True)
            (tmp_path / name / f / "dump.json").write_text(json.dumps({**doc, "framework": "pytorch"}
                                                                      if name == "base" else doc))
    (tmp_path / "targ/step0/rank1").mkdir()
    (tmp_path / "targ/step0/rank1/dump.json").write_text("{}")
    return tmp_path / "base", tmp_path / "targ"


@pytest.mark.slow
def test_runs_with_no_step_in_common_answer_nothing_compared(tmp_path):
    a, b = _two_steps(tmp_path)
    out = cli("diff", str(a), str(b))
    assert out.returncode == 1, out.stderr
    flat = " ".join(out.stdout.split())  # the text wraps at 120 columns
    assert flat.startswith("NOTHING COMPARED: the runs share no step (baseline holds step 0, target step 1)")
    assert "baseline: step 0, rank 0, 525 tensor(s), 525 record(s)" in flat
    js = cli("diff", str(a), str(b), "--json")
    assert js.returncode == 1
    f = json.loads(js.stdout)
    assert f["kind"] == "none" and f["reason"].startswith("nothing was compared: ")
    assert f["stats"]["compared_records"] == 0 and f["stats"]["nothing_compared"] is True
    assert f["stats"]["baseline"]["steps"] == [0] and f["stats"]["target"]["steps"] == [1]
    # the report and the explorer say the same (all through precnb.diagnose)
    html = tmp_path / "r.html"
    assert cli("report", str(b), "--baseline", str(a), "-o", str(html)).returncode == 0
    text = html.read_text()
    assert 'class="verdict nothing">nothing compared' in text and "Nothing compared" in text
    t = precnb.diagnose(b, baseline=a, progress=False)
    assert t.nothing_compared and t.finding.title == "Nothing compared"
    from precnb.widgets.findings import finding_title

    assert finding_title(t.finding).startswith("Nothing compared: the runs share no step")
    assert int(t.combined().sizes["step"]) == 2 and not bool(t.comparison().both.any())


def test_runs_with_no_tensor_record_answer_nothing_compared_and_name_what_was_skipped(tmp_path):
    base, targ = _no_tensors(tmp_path)
    out = cli("diff", str(base), str(targ))
    assert out.returncode == 1
    flat = " ".join(out.stdout.split())  # the text wraps at 120 columns
    assert flat.startswith("NOTHING COMPARED: neither run holds a tensor record; baseline: steps 0-2, "
                           "ranks 0-1, 0 tensor(s), 0 record(s); target: step 0, ranks 0-1")
    assert f"1 unreadable file(s) skipped (first: {targ / 'step0/rank1/dump.json'}: not an msprobe dump.json" \
        in flat
    assert "NOTHING FOUND" not in out.stdout


def test_part_of_the_runs_compared_says_how_much(tmp_path):
    part = tmp_path / "part"
    shutil.copytree(SAMPLES / "healthy" / "step0", part / "step0")
    f = precnb.diagnose(part, baseline=SAMPLES / "healthy", step_offset=0, kinds=["first_divergence"],
                        progress=False).finding
    assert f.kind == "none" and "(compared 525 of 1575 baseline records)" in f.reason, f.reason
    assert f.stats["records_baseline"] == 1575 and f.stats["records_target"] == 525


# ------------------------------------------------------------------------------------------ small messages
def test_an_unreadable_run_names_each_file_once(tmp_path):
    (tmp_path / "step0" / "rank0").mkdir(parents=True)
    dump = tmp_path / "step0" / "rank0" / "dump.json"
    dump.write_text('{"task": "statistics", "data": [1]}')
    out = cli("info", str(tmp_path))
    assert out.returncode == 1
    assert out.stderr.count(str(dump)) == 1, out.stderr


def test_framework_is_unknown_when_nothing_says_which(tmp_path):
    doc = {"task": "statistics", "level": "L1", "data": {"Functional.x.0.forward": {"input_args": [{"type": "int",
                                                                                                   "value": 1}]}}}
    (tmp_path / "step0" / "rank0").mkdir(parents=True)
    (tmp_path / "step0" / "rank0" / "dump.json").write_text(json.dumps(doc))
    ds = precnb.open_run(tmp_path, progress=False)
    assert ds.attrs["framework"] == "unknown"
    ms = precnb.open_run(FIX / "ms", progress=False)
    assert ms.attrs["framework"] == "mindspore"
    assert np.all(ms["present"].values.any(axis=(0, 1)))
