"""Scalar arguments (eps, scales) of the divergence's node: read from both dumps and named as the cause.

The statistics cannot show that an op ran with a different constant; the records can. Real
samples: the MindSpore port whose RMSNorm eps is 1e-2 instead of 1e-6 (xfw/ms_bug vs the PyTorch
run), and a PyTorch run whose residual scale is 0.5 instead of 1.0 (tensor_bug).
"""

from __future__ import annotations

import json

import pytest

import precnb
from precnb.analysis.divergence.scalars import differing_arguments, scalar_arguments
from precnb.io.api import node_records
from tests._inprocess_cli import run_cli
from tests.conftest import sample_path


def _gt(name):
    return json.loads((sample_path(name) / "ground_truth.json").read_text())


def test_node_records_read_exactly_the_file_record():
    root = sample_path("xfw")
    f = _gt("xfw")["faults"][0]
    node = f["first_differing_api"]
    whole = json.loads((root / f["dump_json"]).read_text())["data"][node]
    got = node_records(root / "ms_bug", 0, 0, [node, "Functional.no_such_op.0.forward"])
    assert got == {node: whole}
    assert node_records(root / "ms_bug", 5, 0, [node]) == {}  # a step the run does not have
    assert node_records(root / "ms_bug", 0, 3, [node]) == {}  # nor that rank


def test_scalar_arguments_of_a_real_record():
    rec = node_records(sample_path("xfw") / "pt", 0, 0, ["Tensor.__add__.6.forward"])["Tensor.__add__.6.forward"]
    assert scalar_arguments(rec) == {"input_args.1": 1e-06}


def test_port_with_another_eps_is_explained_by_the_argument():
    g = _gt("xfw")
    f0 = g["faults"][0]
    root = sample_path("xfw")
    t = precnb.diagnose(root / "ms_bug", baseline=root / "pt")
    f = t.finding
    assert (f.kind, f.step, f.rank, f.node) == ("first_divergence", 0, 0, f0["first_differing_api"])
    inputs = f0["first_differing_api_inputs"]["input_args.1"]
    cause = f.causes[0]
    assert cause["cause"] == "scalar_argument" and cause["certain"]
    assert cause["arguments"] == [{"argument": "input_args.1", "target": inputs["ms"]["value"],
                                   "baseline": inputs["pt"]["value"]}]
    assert "input_args.1 = 0.01 here, 1e-06 in" in f.reason


def test_same_eps_gives_no_argument_cause():
    root = sample_path("xfw")
    assert precnb.diagnose(root / "ms_same", baseline=root / "pt").finding.kind == "none"
    rt = node_records(root / "ms_same", 0, 0, ["Tensor.__add__.6.forward"])
    rb = node_records(root / "pt", 0, 0, ["Tensor.__add__.6.forward"])
    assert differing_arguments(rt["Tensor.__add__.6.forward"], rb["Tensor.__add__.6.forward"]) == []


def test_residual_scale_is_named_in_the_cli_json():
    gt = _gt("tensor_bug")["faults"][0]
    root = sample_path("tensor_bug")
    out = run_cli("diff", root / "baseline", root / "target", "--json")
    assert out.returncode in (0, 1), out.stderr
    doc = json.loads(out.stdout)
    f = (doc["findings"] if isinstance(doc, dict) and "findings" in doc else doc)
    f = f[0] if isinstance(f, list) else f
    assert f["node"] == gt["node"] and "input_args.1" in gt["differing_leaves"]
    scal = [c for c in f["causes"] if c.get("cause") == "scalar_argument"]
    assert scal and scal[0]["arguments"] == [{"argument": "input_args.1", "target": 0.5, "baseline": 1.0}]


def test_datasets_as_inputs_keep_the_finding_without_the_cause():
    root = sample_path("tensor_bug")
    from tests.conftest import open_quiet

    f = precnb.diagnose(open_quiet(root / "target"), baseline=open_quiet(root / "baseline")).finding
    assert f.node == _gt("tensor_bug")["faults"][0]["node"]
    assert not [c for c in f.causes if c.get("cause") == "scalar_argument"]


@pytest.mark.shared
def test_real_healthy_port_reads_its_records_and_finds_no_argument_cause(shared):
    """S13 (real PyTorch model and its MindSpore port, healthy): records read, nothing differs, nothing found."""
    root = shared("data_samples", "msprobe", "S13_ms_vs_pt")
    t = precnb.diagnose(root / "ms_same", baseline=root / "pt", progress=False)
    assert t.finding.kind == "none"
    node = "Functional.embedding.0.forward"
    rec = node_records(root / "pt", 0, 0, [node])
    assert node in rec and "input_args" in rec[node]


def test_explorer_rerun_match_unmatch_and_export_keep_every_cause(tmp_path):
    """Issue 26 item 3: a rerun goes through the first run's inputs (the datasets as read, and their dumps)."""
    pytest.importorskip("ipywidgets")
    from precnb.pipeline import ReadRun
    from precnb.widgets import explore

    target, base = sample_path("xfw", "ms_bug"), sample_path("xfw", "pt")
    want = precnb.diagnose(target, baseline=base).finding
    assert "computed with a different scalar argument" in want.reason

    def same(f):  # (an unpaired call adds "n node(s) at this step exist in one run only" to the reason)
        assert f.reason.startswith(want.reason) and (f.causes, f.node, f.step, f.rank) == (
            want.causes, want.node, want.step, want.rank)

    ex = explore(target, baseline=base)
    same(ex.finding)
    assert all(isinstance(v, ReadRun) for v in ex.sources().values())  # the datasets, and where they came from
    same(ex.rerun().finding)
    panel = ex.panel("Alignment")
    panel.on_show()
    pair = next(p for p in ex.triage.alignment.modules if p.baseline and p.target)
    panel.pick(left=pair.baseline, right=pair.target)
    same(panel.do_match().finding)
    panel.level.value = "calls"
    call = [p for p in ex.triage.alignment.nodes if p.target.endswith(".backward")][-1]  # after the origin
    panel.pick(left=call.baseline, right=call.target)
    t = panel.do_unmatch()
    assert call.target not in {p.target for p in t.alignment.nodes}
    same(t.finding)
    export = ex.panel("Export")
    export.path.value = str(tmp_path / "report.html")
    out = export.export()
    assert out is not None and "different scalar argument (input_args.1 = 0.01 here, 1e-06 in pt)" in \
        out.read_text().replace("&#39;", "'")
