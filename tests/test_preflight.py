"""Pre-flight checks on the bundled preflight samples (real msprobe 26.2.0, 2-rank DP): real answers.

Every expected parameter name, count, rank, step and ratio is read from the sample's
``ground_truth.json`` (derived from the dumps by the generator, not by precnb's readers).
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

import precnb
from tests._inprocess_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
PF = ROOT / "data_samples" / "preflight"


def gt(name: str) -> dict:
    path = PF / name / "ground_truth.json"
    if not path.exists():
        pytest.skip(f"bundled sample preflight/{name} missing (run `make samples`)")
    return json.loads(path.read_text())


def checks(base, target=None, **kw) -> dict[str, dict]:
    out = precnb.preflight(base, target, progress=False, **kw)
    assert list(out) == ["schema", "status", "baseline", "target", "checks"]
    for c in out["checks"]:
        assert c["status"] in ("pass", "warn", "fail", "skip") and isinstance(c["message"], str) and c["message"]
    json.dumps(out, allow_nan=False)  # strict JSON
    return {c["name"]: c for c in out["checks"]}


def pair(name: str, **kw) -> dict[str, dict]:
    return checks(PF / name / "baseline", PF / name / "target", **kw)


def failing(cs: dict[str, dict]) -> list[str]:
    return [n for n, c in cs.items() if c["status"] == "fail"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args)  # `python -m precnb ARGS` in this process (tests/_inprocess_cli.py)


# ------------------------------------------------------------------------------------- samples
def test_healthy_pair_has_no_failing_check():
    g = gt("healthy")
    cs = pair("healthy")
    assert failing(cs) == []
    for name in ("parameters", "frozen", "hyperparameters", "initial_weights", "data", "dp_data", "coverage"):
        assert cs[name]["status"] == "pass", (name, cs[name]["message"])
    n = g["checks"]["target"]["parameter_count"]
    assert f"same {n} parameters" in cs["parameters"]["message"]
    assert cs["hyperparameters"]["details"]["update_ratio"]["ratio"] == pytest.approx(1.0, abs=1e-6)


def test_frozen_parameter_in_the_target():
    g = gt("frozen")
    (name,) = {f["name"] for f in g["faults"]}
    cs = pair("frozen")
    assert failing(cs) == ["frozen"]
    c = cs["frozen"]
    assert list(c["details"]["frozen_in_target_only"]) == [name]
    signs = c["details"]["frozen_in_target_only"][name]
    # the three signs the ground truth reads from the dumps
    assert name not in g["checks"]["target"]["with_gradient_record"] and "no gradient record" in signs
    assert g["checks"]["target"]["parameters"][name]["requires_grad"] is False and "requires_grad false" in signs
    assert name not in g["checks"]["target"]["changed_from_step0_to_step1"] and "weights never change" in signs
    assert name in c["message"] and "target only" in c["message"] and c["confidence"] == "high"
    assert c["details"]["frozen_in_baseline_only"] == {}


def test_extra_parameter_in_the_target():
    g = gt("extra_param")
    (name,) = {f["name"] for f in g["faults"]}
    shape = g["faults"][0]["shape"]
    nb, nt = g["checks"]["baseline"]["parameter_count"], g["checks"]["target"]["parameter_count"]
    eb, et = g["checks"]["baseline"]["parameter_elements"], g["checks"]["target"]["parameter_elements"]
    cs = pair("extra_param")
    assert failing(cs) == ["parameters"]
    c = cs["parameters"]
    assert c["details"]["only_in_target"] == [f"{name} {shape} float32".replace(", ", ", ")]
    assert c["details"]["only_in_baseline"] == []
    assert f"parameter counts {nb} (baseline) vs {nt} (target)" in c["message"]
    assert f"{eb:,} vs {et:,} elements" in c["message"] and name in c["message"]
    assert (c["details"]["baseline"]["count"], c["details"]["target"]["count"]) == (nb, nt)


def test_every_dp_rank_on_the_same_batch():
    g = gt("same_batch")
    dup_steps = sorted({f["step"] for f in g["faults"]})
    ranks = sorted({f["rank"] for f in g["faults"]} | {f["same_as_rank"] for f in g["faults"]})
    cs = checks(PF / "same_batch")
    assert failing(cs) == ["dp_data"]
    c = cs["dp_data"]
    run = next(iter(c["details"]["runs"].values()))
    assert run["same_batch"] == [{"ranks": ranks, "steps": dup_steps}]
    assert run["node"] == g["faults"][0]["node"] and c["confidence"] == "high"
    assert "ranks 0, 1 at steps 0-1" in c["message"]


def test_dp_ranks_sharing_a_batch_by_design_pass_with_a_layout():
    cs = checks(PF / "same_batch", layout="tp=2")  # two TP ranks read one batch by design
    assert cs["dp_data"]["status"] == "skip" and "one rank" not in cs["dp_data"]["message"]


def test_learning_rate_ten_times():
    g = gt("lr10")
    want = g["faults"][0]["lr_ratio"]
    assert all(r == pytest.approx(want) for r in g["checks"]["step_size_ratio_target_over_baseline"].values())
    cs = pair("lr10")
    assert failing(cs) == ["hyperparameters"]
    c = cs["hyperparameters"]
    lr = next(i for i in c["details"]["inferred"] if i.get("api"))
    assert lr["api"] == "Tensor.addcdiv_" and lr["argument"] == "value" and lr["basis"] == "inferred"
    assert lr["ratio"] == pytest.approx(want, rel=1e-9) and lr["confidence"] == "high"
    assert (lr["baseline"], lr["target"]) == (g["faults"][0]["baseline_step_size"], g["faults"][0]["target_step_size"])
    assert c["details"]["update_ratio"]["ratio"] == pytest.approx(want, rel=1e-3)
    assert "learning rate x10 in the target" in c["message"] and "x10" in c["message"]


def test_fused_optimizer_arguments_are_read_and_agree_on_a_healthy_pair():
    """dp_sum (fused AdamW, mix dump): lr/betas/eps/weight decay read, equal; the 2x gradients are no lr change."""
    root = ROOT / "data_samples" / "dp_sum"
    cs = checks(root / "baseline", root / "target")
    assert failing(cs) == []
    c = cs["hyperparameters"]
    assert c["status"] == "pass" and "lr=0.01" in c["message"] and c["basis"] == "read"
    assert c["details"]["update_ratio"]["ratio"] == pytest.approx(1.0, rel=1e-3)


@pytest.mark.parametrize("sample", ["divergence", "dp_sum"])
def test_existing_pairs_fail_no_preflight_check(sample):
    cs = checks(ROOT / "data_samples" / sample / "baseline", ROOT / "data_samples" / sample / "target")
    assert failing(cs) == []


def test_tp_pair_with_layout_fails_no_check_and_without_names_the_shards():
    root = ROOT / "data_samples" / "tp"
    assert failing(checks(root / "tp1", root / "tp2", target_layout="tp=2")) == []
    # without a layout it is read from the dumps (issue 24): the shards are merged, the inventory agrees
    assert failing(checks(root / "tp1", root / "tp2")) == []
    with pytest.raises(ValueError, match=r"contradicts the dumps: ranks \[0, 1\] hold different shards"):
        checks(root / "tp1", root / "tp2", target_layout="tp=1")  # a layout the dumps contradict


# ------------------------------------------------------------------------------ config_check
def test_config_check_pack_pair_healthy():
    root = PF / "packs" / "healthy"
    cs = checks(root / "baseline.zip", root / "target.zip")
    assert failing(cs) == []
    assert {"env", "packages", "random"} <= set(cs) and cs["env"]["status"] == "pass"
    assert "config_check hyper-parameters agree" in cs["hyperparameters"]["message"]


def test_config_check_same_data_pair_passes_rank_by_rank_but_fails_across_ranks():
    g = gt("packs")
    for rel, facts in g["checks"]["packs"].items():
        if rel.startswith("same_data/"):
            assert all(facts["same_dataset_features_on_both_ranks"].values())
    root = PF / "packs" / "same_data"
    cs = checks(root / "baseline.zip", root / "target.zip")
    assert cs["data"]["status"] == "pass"  # rank R against rank R (msprobe's comparison): equal
    assert failing(cs) == ["dp_data"]
    for run in cs["dp_data"]["details"]["runs"].values():
        assert run["same_batch"] == [{"ranks": [0, 1], "steps": g["steps"]}]
    one = checks(root / "target.zip")
    assert failing(one) == ["dp_data"]


# ------------------------------------------------------------------------------ front ends
def test_diagnose_orders_a_failing_preflight_first_and_a_clean_one_last():
    t = precnb.diagnose(PF / "frozen" / "target", baseline=PF / "frozen" / "baseline", progress=False)
    assert t.finding.kind == "preflight" and t.finding.values["checks"]["frozen"] == "fail"
    assert t.finding.evidence["checks"][0]["name"] == "parameters"
    assert any("consequences" in h for h in t.finding.hints)
    later = t.finding.evidence["later_findings"]
    assert later and later[0]["kind"] == "first_divergence"
    t = precnb.diagnose(PF / "healthy" / "target", baseline=PF / "healthy" / "baseline", progress=False)
    assert t.finding is not t.result("preflight") and t.result("preflight").kind == "none"


def test_cli_preflight_json_and_exit_codes(tmp_path):
    out = cli("preflight", str(PF / "frozen" / "baseline"), str(PF / "frozen" / "target"), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)  # exactly one JSON object
    assert doc["status"] == "fail" and {c["name"]: c["status"] for c in doc["checks"]}["frozen"] == "fail"
    out = cli("preflight", str(PF / "same_batch"))
    assert out.returncode == 0 and "[FAIL] dp_data" in out.stdout
    out = cli("preflight", str(tmp_path / "missing"))
    assert out.returncode == 1 and "no such file" in out.stderr
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"PK\x03\x04 not really a zip")
    out = cli("preflight", str(broken), "--format", "config_check")
    assert out.returncode == 1 and "broken.zip" in out.stderr


def test_cli_diff_prints_the_preflight_finding_first():
    base, target = str(PF / "lr10" / "baseline"), str(PF / "lr10" / "target")
    out = cli("diff", base, target, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kind"] == "preflight" and doc["values"]["checks"]["hyperparameters"] == "fail"
    assert doc["evidence"]["later_findings"][0]["kind"] == "first_divergence"
    text = cli("diff", base, target).stdout
    assert text.index("PRE-FLIGHT CHECK FAILED") < text.index("FIRST DIVERGENCE")
    healthy = json.loads(cli("diff", str(PF / "healthy" / "baseline"), str(PF / "healthy" / "target"),
                             "--json").stdout)
    assert healthy["kind"] == "none" and "divergence" in healthy["reason"]


def test_report_shows_the_checklist_escaped():
    pytest.importorskip("jinja2")
    from precnb.report import to_html

    t = precnb.diagnose(PF / "frozen" / "target", baseline=PF / "frozen" / "baseline", progress=False)
    t.result("preflight").evidence["checks"][0]["message"] = "<script>alert(1)</script>"
    page = to_html(t)
    assert 'id="preflight"' in page and 'data-check="frozen" data-status="fail"' in page
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page
    kinds = page.split('id="findings"', 1)[1]
    assert kinds.index('data-kind="preflight"') < kinds.index('data-kind="first_divergence"')


def test_explorer_shows_the_checklist_and_opens_on_the_divergence():
    pytest.importorskip("ipywidgets")
    ex = precnb.explore(PF / "frozen" / "target", baseline=PF / "frozen" / "baseline")
    assert ex.finding.kind == "preflight" and ex.preflight is not None
    assert "data-check='frozen'" in ex.preflight.value and "blocks.0.attn.q_proj.weight" in ex.preflight.value
    div = ex.triage.result("first_divergence")
    assert (ex.step, ex.rank, ex.tensor) == (div.step, div.rank, div.tensor)


def test_preflight_runs_on_opened_datasets_and_summary_lists_every_check():
    ds = precnb.open_run(PF / "same_batch", progress=False)
    t = precnb.diagnose(ds, kinds=["preflight"])
    text = t.finding.summary()
    assert text.startswith("PRE-FLIGHT CHECK FAILED") and "[FAIL] dp_data" in text and "[PASS] parameters" in text
    assert not math.isnan(float(len(text)))


def test_without_parameter_records_the_optimizer_lists_stand_in():
    """A dump without module records (level L1): the inventory comes from the optimizer's per-parameter calls."""
    from precnb.analysis.preflight import preflight

    def no_params(ds):
        keep = [t for t, r, k in zip(ds["tensor"].values, ds["role"].values, ds["kind"].values, strict=True)
                if r != "parameter" and k != "param_grad"]
        return ds.sel(tensor=keep)

    g = gt("lr10")
    n = g["checks"]["baseline"]["parameter_count"]
    base = no_params(precnb.open_run(PF / "lr10" / "baseline", progress=False))
    target = no_params(precnb.open_run(PF / "lr10" / "target", progress=False))
    c = {x["name"]: x for x in preflight(target, baseline=base)}["parameters"]
    assert c["status"] == "pass" and f"updates {n} tensors in the baseline and {n} in the target" in c["message"]
    # one parameter less in the target's optimizer (its Tensor.addcdiv_ call removed)
    last = sorted({str(x) for x in target["node"].values if str(x).startswith("Tensor.addcdiv_.")},
                  key=lambda s: int(s.split(".")[2]))[-1]
    shape = str(target["shape"].sel(tensor=f"{last}.input.0").values)
    fewer = target.sel(tensor=[t for t in target["tensor"].values if not str(t).startswith(f"{last}.")])
    c = {x["name"]: x for x in preflight(fewer, baseline=base)}["parameters"]
    assert c["status"] == "fail" and c["details"]["extra_shapes_in_baseline"] == [shape]
    assert "in the target" in c["message"] and str(n - 1) in c["message"]


@pytest.mark.shared
def test_aligned_runs_of_two_frameworks_fail_no_check(shared):
    """S13: the same model in PyTorch and MindSpore (other names, other dtype spellings), aligned by the pipeline."""
    root = shared("data_samples", "msprobe", "S13_ms_vs_pt")
    cs = checks(root / "pt", root / "ms_same")
    assert failing(cs) == []
    assert cs["parameters"]["status"] == "pass" and cs["initial_weights"]["status"] == "pass"


@pytest.mark.shared
def test_single_tensor_adamw_arguments_of_a_real_run_are_read(shared):
    """S1 (torch's single-tensor AdamW): the step size -lr/(1-beta1^t) of every step is recorded."""
    ds = precnb.open_run(shared("data_samples", "msprobe", "S1_baseline", "statistics"), progress=False)
    sa = json.loads(ds.attrs["scalar_args"])
    lerp = sa["Tensor.lerp_"]["2"]["0"][0]  # 1 - beta1
    for step, (v,) in sa["Tensor.addcdiv_"]["value"].items():
        assert v == pytest.approx(-0.01 / (1 - (1 - lerp) ** (int(step) + 1)), rel=1e-12)


# -- issue 26 item 7: pre-flight wording --------------------------------------------------------------
def test_same_batch_is_not_claimed_from_nan_outputs_and_integer_extremes():
    """A NaN step (the embedding output NaN) whose token ids share max and min (mean and norm null) says nothing."""
    import warnings

    from precnb.analysis.preflight._data import check_dp_data, model_input

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = precnb.open_run(ROOT / "data_samples" / "dp_nan", progress=False, steps=[2])
    _node, ins, outs = model_input(ds)
    assert np.isnan(ds["norm"].sel(tensor=outs[0], rank=1).values).all()  # step 2: rank 1's output is NaN
    assert (ds["null_stats"].sel(tensor=ins[0]).values & 12 == 12).all()  # int64 ids: mean and norm are null
    for s in ("max", "min"):  # two batches of one vocabulary: the same largest and smallest id
        ds[s].loc[dict(rank=1, tensor=ins)] = ds[s].sel(rank=0, tensor=ins).values
    c = check_dp_data([("dp_nan", ds, None)])
    assert c["status"] == "skip" and "same batch" not in c["message"], c["message"]
    assert "cannot tell" in c["message"]


def test_warnings_are_no_green_passed_heading_and_a_zero_weight_is_named_first():
    pytest.importorskip("ipywidgets")
    from precnb.widgets.preflight import preflight_html

    kr = ROOT / "data_samples" / "kernel_resume"
    t = precnb.diagnose(kr / "bad", baseline=kr / "correct", progress=False)
    pre = t.result("preflight")
    assert pre.stats["status"] == "warn" and "passed" not in pre.reason
    assert pre.reason.startswith("no pre-flight check failed, 2 warnings")
    page = preflight_html(pre)
    assert "checks passed" not in page and "no check failed, 2 warning(s)" in page and "#2a7'>Pre-flight" not in page
    assert "CHECKS PASSED" not in pre.summary() and "NO CHECK FAILED, 2 WARNINGS" in pre.summary()
    first_warn = pre.reason.split(": ", 1)[1]
    assert first_warn.startswith("initial_weights: norm_out.1") and "all zeros in bad only" in first_warn
    assert "likely root cause" in first_warn


def test_a_warning_that_is_the_root_cause_is_what_a_clean_triage_shows_first():
    pytest.importorskip("ipywidgets")
    import bs4

    from precnb.report import to_html
    from precnb.widgets import explore

    kr = ROOT / "data_samples" / "kernel_resume"
    t = precnb.diagnose(kr / "bad", baseline=kr / "correct", tolerance=10.0, progress=False)  # nothing beyond rtol 10
    assert not t.found and t.finding is t.result("preflight") and "all zeros in bad only" in t.finding.reason
    ex = explore(kr / "bad", baseline=kr / "correct", tolerance=10.0)
    assert "#b76e00" in ex.bar.label.value and "all zeros in bad only" in ex.bar.label.value
    soup = bs4.BeautifulSoup(to_html(t), "html.parser")
    verdict = soup.select_one(".verdict")
    assert "warn" in verdict["class"] and "pre-flight warnings" in verdict.get_text()
    assert "likely root cause" in soup.select_one("#preflight").get_text()
