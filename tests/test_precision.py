"""Precision-aware comparison and tensor-metric verdicts, on the bundled samples (real msprobe dumps).

- ``tensor_bf16``: fp32 vs the same run under bf16 autocast → no divergence, and the finding says
  "target runs in bf16: compared with bf16 tolerance" (statistics only and with tensor metrics).
- ``tensor_bug``: a wrong residual scale in block 1 → found at that node, module ``blocks.1``, by the
  tensor metrics (cosine stays 1.0; the One Thousandth rule and rel_l2_err catch it).
- ``divergence``: the GELU cast to bf16 on one rank from step 1 is an isolated change → still a finding.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import xarray as xr

import precnb
from precnb.analysis import Tolerance
from precnb.analysis.compare.precision import detect_precision, mixed_precision_tolerance, normalise_dtype
from precnb.analysis.tensor.verdicts import TensorThresholds, tensor_differs, verdict_reason


def _have(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def _pair(samples, name):
    return precnb.open_run(samples(name, "baseline")), precnb.open_run(samples(name, "target"))


def _gt(samples, name):
    return json.loads(samples(name, "ground_truth.json").read_text())


def test_healthy_bf16_autocast_is_no_divergence_and_says_why(samples):
    base, targ = _pair(samples, "tensor_bf16")
    gt = _gt(samples, "tensor_bf16")
    assert gt["faults"] == [] and gt["precision"]["tensors_float32_in_baseline_bfloat16_in_target"] > 100
    for metrics in (None, precnb.tensor_metrics(base, targ)):
        f = precnb.first_divergence(base, targ, tensor_metrics=metrics)
        assert f.kind == "none", f.summary()
        assert "target runs in bf16: compared with bf16 tolerance" in f.reason
        p = f.stats["precision"]
        assert p["systematic"] and p["low_run"] == "target" and p["low_dtype"] == "bfloat16"
        assert p["tensors"] == gt["precision"]["tensors_float32_in_baseline_bfloat16_in_target"]
        assert set(p["families"]) >= {"Functional.linear", "Torch.matmul", "Functional.softmax"}
        if metrics is not None:
            assert f.stats["tensor_judged_records"] == f.stats["compared_records"]
    # the pipeline (what every front end calls) computes the tensor metrics itself
    t = precnb.diagnose(samples("tensor_bf16", "target"), baseline=samples("tensor_bf16", "baseline"))
    assert t.finding.kind == "none" and "compared with bf16 tolerance" in t.finding.reason
    assert any("tensor metrics" in n for n in t.notes)


def test_without_precision_awareness_bf16_diverges_at_the_first_autocast_op(samples):
    base, targ = _pair(samples, "tensor_bf16")
    gt = _gt(samples, "tensor_bf16")
    f = precnb.first_divergence(base, targ, precision_aware=False)
    assert f.kind == "first_divergence" and f.node == gt["precision"]["first_node_with_bfloat16"]
    assert any("dtype differs at this tensor" in h for h in f.hints)


def test_real_bug_is_found_at_its_module_by_the_tensor_metrics(samples):
    base, targ = _pair(samples, "tensor_bug")
    (fault,) = _gt(samples, "tensor_bug")["faults"]
    m = precnb.tensor_metrics(base, targ)
    f = precnb.first_divergence(base, targ, tensor_metrics=m)
    assert (f.step, f.rank, f.node, f.tensor, f.module) == (
        fault["step"], fault["rank"], fault["node"], fault["tensor"], fault["module"])
    tm = f.values["tensor_metrics"]
    assert tm["cosine"] == 1.0 and tm["rel_l2_err"] == pytest.approx(0.5)  # a scale: cosine is blind
    assert "one_thousandth_err_ratio 0 < 0.1" in tm["verdict"] and "rel_l2_err" in tm["verdict"]
    assert "precision" not in f.stats  # same dtypes everywhere
    # statistics alone agree on the place; the pipeline (with tensor metrics) too
    s = precnb.first_divergence(base, targ)
    assert (s.node, s.module) == (fault["node"], fault["module"])
    t = precnb.diagnose(samples("tensor_bug", "target"), baseline=samples("tensor_bug", "baseline"))
    assert (t.finding.node, t.finding.module) == (fault["node"], fault["module"])
    assert "tensor_metrics" in t.finding.values


def test_isolated_bf16_cast_on_one_rank_stays_a_finding(samples):
    base, targ = _pair(samples, "divergence")
    origin = _gt(samples, "divergence")["faults"][0]
    f = precnb.first_divergence(base, targ)
    assert (f.step, f.rank, f.node) == (origin["step"], origin["rank"], origin["node"])
    p = f.stats["precision"]
    assert not p["systematic"] and "isolated" in p["reason"] and "not at every step and rank" in p["reason"]


def _grid(labels, ranks=2, steps=1):
    return xr.DataArray(np.ones((steps, ranks, len(labels)), bool), dims=("step", "rank", "tensor"),
                        coords={"step": list(range(steps)), "rank": list(range(ranks)), "tensor": labels})


def test_detect_precision_rules():
    labels = ["Functional.linear.0.forward.output.0", "Torch.matmul.0.forward.output.0"]
    apis, kinds = ["Functional.linear", "Torch.matmul"], ["api", "api"]
    ex = {t: ("torch.float32", "torch.bfloat16") for t in labels}
    all_on = _grid(labels)
    ctx = detect_precision(all_on, ex, all_on, apis=apis, kinds=kinds)
    assert ctx.systematic and ctx.statement() == "target runs in bf16: compared with bf16 tolerance"
    one_rank = all_on.copy(data=all_on.values.copy())
    one_rank.values[:, 1, :] = False  # rank 1 computes in fp32
    assert not detect_precision(one_rank, ex, all_on, apis=apis, kinds=kinds).systematic
    one_family = detect_precision(all_on[:, :, :1], ex, all_on[:, :, :1], apis=apis[:1], kinds=kinds[:1])
    assert not one_family.systematic and "1 API family" in one_family.reason
    mixed = {labels[0]: ex[labels[0]], labels[1]: ("torch.bfloat16", "torch.float32")}
    assert not detect_precision(all_on, mixed, all_on, apis=apis, kinds=kinds).systematic
    to_int = {t: ("torch.float32", "torch.int64") for t in labels}
    assert not detect_precision(all_on, to_int, all_on, apis=apis, kinds=kinds).systematic
    fp16 = {t: ("torch.float16", "torch.float32") for t in labels}
    c16 = detect_precision(all_on, fp16, all_on, apis=apis, kinds=kinds, names=("gpu", "npu"))
    assert c16.systematic and c16.statement() == "gpu runs in fp16: compared with fp16 tolerance"
    assert detect_precision(xr.zeros_like(all_on), ex, all_on) is None
    assert normalise_dtype("BFloat16") == "bfloat16"


def test_mixed_precision_tolerance_keeps_explicit_and_calibrated_choices():
    t = mixed_precision_tolerance(Tolerance(), "bfloat16")
    assert t.rtol_for("torch.float32") == 8 * 2 ** -8 and t.rtol_for("torch.bool") == 0.0
    assert mixed_precision_tolerance(Tolerance(rtol=1e-3), "bfloat16").rtol_for("torch.float32") == 1e-3
    cal = mixed_precision_tolerance(Tolerance(per_tensor={"x": 0.5}), "float16")
    assert cal.rtol_for("torch.float32", "x") == 0.5 and cal.rtol_for("torch.float32") == 8 * 2 ** -11


def _metrics(**vals):
    labels = ["t"]
    data = {k: (("step", "rank", "tensor"), np.array(v, dtype=object if k == "status" else float).reshape(1, 1, 1))
            for k, v in vals.items()}
    return xr.Dataset(data, coords={"step": [0], "rank": [0], "tensor": labels})


def test_tensor_verdict_rules_and_reasons():
    grid = _grid(["t"], ranks=1)
    ok = dict(status="ok", cosine=1.0, max_abs_err=0.0, one_thousandth_err_ratio=1.0, rel_l2_err=0.0)

    def differs(low=False, rtol=2 ** -14, **change):
        d, judged = tensor_differs(_metrics(**{**ok, **change}), grid, [rtol], low_precision=low)
        assert bool(judged.item())
        return bool(d.item())

    assert not differs()
    assert differs(cosine=0.98, max_abs_err=0.01)  # msprobe: cos < 0.99 and MaxAbsErr > 0.001
    assert not differs(cosine=0.98, max_abs_err=0.0005)
    assert differs(cosine=0.85)  # cos < 0.9
    assert differs(max_abs_err=1.5)  # MaxAbsErr > 1
    assert differs(one_thousandth_err_ratio=0.05)  # One Thousandth output rule
    assert not differs(low=True, one_thousandth_err_ratio=0.05, rtol=0.03)  # off under bf16
    assert differs(rel_l2_err=0.5)
    assert differs(status="nan_inf_mismatch") and differs(status="shape_mismatch")
    assert not differs(status="zero_d", cosine=np.nan, rel_l2_err=1e-6)
    assert differs(status="zero_d", cosine=np.nan, rel_l2_err=1e-2)
    _d, judged = tensor_differs(_metrics(**{**ok, "status": "no_data"}), grid, [0.0])
    assert not bool(judged.item())  # statistics decide there
    assert verdict_reason({**ok, "cosine": 0.85}, 2 ** -14) == "cosine 0.85 < 0.9"


def test_calibrated_thresholds_loosen_per_tensor_only(samples):
    base, targ = _pair(samples, "tensor_bf16")
    m = precnb.tensor_metrics(base, targ)
    thr = TensorThresholds.calibrate(m, factor=4)
    label = "Module.blocks.1.mlp_norm.RMSNorm.parameters_grad.0.weight"
    b = {k: float(v[0]) for k, v in thr.bounds([label]).items()}
    worst = float(m["cosine"].sel(tensor=label).min())
    assert b["cosine"] == min(0.99, 1 - 4 * (1 - worst)) == 0.99  # never stricter than msprobe's
    assert b["one_thousandth_ratio"] == 0.0  # healthy bf16: no element within 0.1 %
    assert b["rel_l2_err"] == pytest.approx(4 * float(m["rel_l2_err"].sel(tensor=label).max()))
    # calibrated on the healthy pair, even the precision-blind comparison of it finds nothing by value
    f = precnb.first_divergence(base, targ, tensor_metrics=m, tensor_thresholds=thr,
                                tolerance=Tolerance(rtol=0.05))
    assert f.kind == "none", f.summary()


@pytest.mark.needs_generator
@pytest.mark.slow
@pytest.mark.skipif(not (_have("torch") and _have("msprobe")), reason="needs torch and msprobe")
def test_bug_under_bf16_autocast_is_found_with_bf16_tolerance(tmp_path):
    """fp32 baseline vs bf16 autocast *with* the residual bug: the bug is still found at blocks.1."""
    from precnb_samples import _scn_tensor as S
    from precnb_samples._scenarios import Context

    ctx = Context(out=tmp_path, log_dir=tmp_path / "logs", command="test")
    sample = tmp_path / "bf16_bug"
    S._run(ctx, sample, "baseline", "b", residual_scale=((S.BUG_BLOCK, 1.0),))
    S._run(ctx, sample, "target", "t", residual_scale=((S.BUG_BLOCK, S.BUG_SCALE),), autocast="bfloat16")
    t = precnb.diagnose(sample / "target", baseline=sample / "baseline")
    f = t.finding
    assert f.kind == "first_divergence" and f.module == f"blocks.{S.BUG_BLOCK}", f.summary()
    assert f.node.startswith("Tensor.__mul__.") and f.stats["precision"]["systematic"]
    assert any("target runs in bf16: compared with bf16 tolerance" in h for h in f.hints)
