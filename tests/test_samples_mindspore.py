"""The bundled MindSpore samples (xfw, kernel_resume): ground truth re-checked on the files, and precnb's answers.

The first tests read the dumps with json / numpy only (not precnb.io); the precnb tests assert the
real answer (step, node, module) on them; the last test regenerates kernel_resume with the real
MindSpore and is skipped without ``PRECNB_MINDSPORE_PYTHON``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import precnb
from tests.conftest import ROOT, open_quiet, sample_path


def _gt(name: str) -> dict:
    return json.loads((sample_path(name) / "ground_truth.json").read_text(encoding="utf-8"))


def _data(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))["data"]


# ---------------------------------------------------------------------------------------- xfw
def test_xfw_module_pairs_exist_in_both_dumps():
    g = _gt("xfw")
    base = sample_path("xfw")
    pt = _data(base / g["dump_files"]["pt"]["step0"]["0"])
    ms = _data(base / g["dump_files"]["ms_same"]["step0"]["0"])
    assert len(g["module_map_pt_to_ms"]) == 25
    for m in g["module_map_pt_to_ms"]:
        assert m["pt_node"] in pt and m["ms_node"] in ms
        assert m["pt_node"].startswith(f"Module.{m['pt_module']}.") and m["ms_node"].startswith(f"Cell.{m['ms_cell']}.")
    for a in g["api_pairs_forward_step0"]:
        assert a["pt_api"] in pt and a["ms_api"] in ms
        o_pt, o_ms = pt[a["pt_api"]]["output"][0], ms[a["ms_api"]]["output"][0]
        assert np.prod(o_pt["shape"]) == np.prod(o_ms["shape"])  # MindSpore's Dense MatMul output is 2-D
        if np.isfinite(o_pt["Norm"]) or np.isfinite(o_ms["Norm"]):  # the masked scores hold -inf in both
            assert abs(o_pt["Norm"] - o_ms["Norm"]) <= 1e-4 * max(abs(o_pt["Norm"]), 1e-30)
        else:
            assert o_pt["Norm"] == o_ms["Norm"]
    assert ms[g["api_pairs_forward_step0"][0]["ms_api"]]["output"][0]["dtype"] == "Float32"


def test_xfw_bug_is_where_the_ground_truth_says():
    g = _gt("xfw")
    f = g["faults"][0]
    base = sample_path("xfw")
    bug = _data(base / f["dump_json"])
    same = _data(base / f["dump_json"].replace("ms_bug/", "ms_same/").replace(
        Path(f["dump_json"]).parent.name, Path(g["dump_files"]["ms_same"]["step0"]["0"]).parent.name))
    assert list(bug) == list(same)
    first = next(n for n in bug if json.dumps(bug[n], sort_keys=True) != json.dumps(same[n], sort_keys=True))
    assert first == f["first_differing_api"] == "Tensor.__add__.6.forward"
    assert bug[first]["input_args"][1]["value"] == 0.01 and same[first]["input_args"][1]["value"] == 1e-6
    assert f["module"] == "layers.1.ffn_norm" and f["baseline_module"] == "blocks.1.mlp_norm"
    assert f["module_input_scale_aware_err"] < 1e-6 < 1e-2 < f["module_output_scale_aware_err"]


def test_xfw_same_framework_diff_finds_the_bug():
    """ms_same vs ms_bug share names: precnb's first divergence is the wrong eps, in layers.1.ffn_norm."""
    g = _gt("xfw")
    base = sample_path("xfw")
    f = precnb.first_divergence(open_quiet(base / "ms_same"), open_quiet(base / "ms_bug"))
    assert (f.kind, f.step, f.node) == ("first_divergence", 0, g["faults"][0]["first_differing_api"])
    assert f.module == "layers.1.ffn_norm"
    # the differing scalar (input_args.1, eps) is not a tensor of precnb's msprobe dataset: the output is named
    assert f.tensor in ("Tensor.__add__.6.forward.input.1", "Tensor.__add__.6.forward.output.0")


def test_xfw_cross_framework_diff_names_the_culprit_on_both_sides():
    """pt vs ms_same: nothing; pt vs ms_bug: the ground truth's culprit module and first differing API, both names."""
    g = _gt("xfw")
    f0 = g["faults"][0]
    base = sample_path("xfw")
    pt = open_quiet(base / "pt")
    assert precnb.first_divergence(pt, open_quiet(base / "ms_same")).kind == "none"
    f = precnb.first_divergence(pt, open_quiet(base / "ms_bug"))
    assert (f.kind, f.step, f.node, f.module) == ("first_divergence", f0["step"], f0["first_differing_api"],
                                                   f0["module"])
    assert f.baseline["module"] == f0["baseline_module"] and f.baseline["node"] == f0["baseline_first_differing_api"]
    c = f.evidence["culprit"]
    assert (c["node"], c["baseline"]["node"]) == (f0["node"], f0["baseline_node"])


def test_xfw_msprobe_compare_behaviour_recorded():
    g = _gt("xfw")
    runs = {(c["target"], c["options"]): c for c in g["msprobe_compare"]}
    plain = runs[("ms_same", "(none)")]
    assert plain["matched_rows"] < plain["rows"] and plain["error_rows"] > 0.9 * plain["matched_rows"]
    assert runs[("ms_bug", "(none)")]["first_row_with_a_value_error"] == "Tensor.__add__.6.forward.input.1"


# ------------------------------------------------------------------------------- kernel_resume
def test_kernel_resume_fault_files_hold_the_zero_weight():
    g = _gt("kernel_resume")
    f = g["faults"][0]
    base = sample_path("kernel_resume")
    bad = np.load(base / f["file"], allow_pickle=False)
    good = np.load(base / f["baseline_file"], allow_pickle=False)
    assert bad.shape == good.shape == (8,) and not bad.any()
    assert 0.8 < good.mean() < 1.0
    assert f["parameter"] == "net.norm_out.weight" and g["checks"]["param_not_load"]["bad"] == [f["parameter"]]
    assert not list(base.rglob("*.pb"))  # the binary graph with absolute paths was removed
    for variant in ("correct", "bad"):
        ir = base / variant / "dump" / "rank_0" / "graphs" / "ms_output_trace_code_graph_0.ir"
        assert f"Fullname with scope: ({f['node']})" in ir.read_text(encoding="utf-8")


def test_kernel_resume_precnb_reads_both_runs():
    base = sample_path("kernel_resume")
    for variant in ("correct", "bad"):
        ds = open_quiet(base / variant)
        assert precnb.detect_format(base / variant / "dump") == "kernel_tensors"
        assert ds.sizes["tensor"] == 866 and list(ds["step"].values) == [0, 1]


# --------------------------------------------------------------------------------- regeneration
@pytest.mark.needs_generator
@pytest.mark.skipif(not os.environ.get("PRECNB_MINDSPORE_PYTHON") or importlib.util.find_spec("torch") is None,
                    reason="needs PRECNB_MINDSPORE_PYTHON (MindSpore 2.10 venv) and torch + msprobe")
def test_regenerate_kernel_resume(tmp_path):
    out = subprocess.run([sys.executable, "-m", "precnb_samples", "--out", str(tmp_path), "--only", "kernel_resume",
                          "--no-readme"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    new = json.loads((tmp_path / "kernel_resume" / "ground_truth.json").read_text(encoding="utf-8"))
    old = _gt("kernel_resume")
    for key in ("node", "tensor", "module", "parameter", "step"):
        assert new["faults"][0][key] == old["faults"][0][key]
    assert new["faults"][0]["values"]["correct"] == old["faults"][0]["values"]["correct"]
    f = precnb.first_divergence(open_quiet(tmp_path / "kernel_resume" / "correct"),
                                open_quiet(tmp_path / "kernel_resume" / "bad"))
    assert f.tensor == old["faults"][0]["tensor"]


def test_missing_mindspore_interpreter_is_named(monkeypatch):
    monkeypatch.delenv("PRECNB_MINDSPORE_PYTHON", raising=False)
    from precnb_samples import _ms_run

    with pytest.raises(ImportError, match=r"PRECNB_MINDSPORE_PYTHON.*pip install 'numpy<2' mindspore==2\.10\.0"):
        _ms_run.require_mindspore()


@pytest.mark.needs_generator
@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("msprobe") is None,
                    reason="the generator checks torch and msprobe before MindSpore")
def test_asking_for_a_mindspore_sample_without_its_interpreter_is_an_error(tmp_path):
    code = (f"import sys; from precnb_samples import main; "
            f"sys.exit(main(['--out', {str(tmp_path)!r}, '--only', 'kernel_resume', '--no-readme']))")
    env = {k: v for k, v in os.environ.items() if k != "PRECNB_MINDSPORE_PYTHON"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 2 and "PRECNB_MINDSPORE_PYTHON" in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "kernel_resume").exists()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("msprobe") is None,
                    reason="generate() checks torch and msprobe first")
def test_all_samples_without_mindspore_skip_the_mindspore_ones(tmp_path, monkeypatch):
    from unittest import mock

    import precnb_samples as samples
    from precnb_samples import _scenarios

    monkeypatch.delenv("PRECNB_MINDSPORE_PYTHON", raising=False)
    logs: list[str] = []
    with mock.patch.object(_scenarios, "generate_one", side_effect=lambda ctx, name, gen: ctx.out / name):
        done = samples.generate(tmp_path, log=logs.append, write_readme=False)
    assert [p.relative_to(tmp_path).as_posix() for p in done] == [  # nested names: preflight/healthy
        n for n in samples.SAMPLE_NAMES if n not in ("xfw", "kernel_resume")]
    assert any("skipping xfw" in line for line in logs) and any("skipping kernel_resume" in line for line in logs)
