"""Diagnosis engine on real msprobe output and on faults injected into copies of it."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import precnb
from precnb.analysis import Tolerance, anomaly_table, compare_runs, first_divergence, nan_origin
from precnb.naming import is_communication
from tests.conftest import sample_path, shared_path

S = ("data_samples", "msprobe")


@pytest.fixture(scope="module")
def s1_stats():
    return precnb.open_run(shared_path(*S, "S1_baseline", "statistics"))


@pytest.fixture(scope="module")
def tp2():
    return precnb.open_run(shared_path(*S, "S5_tp_shards", "tp2"))


def test_md5_rerun_crc_only_is_not_divergence():
    a = precnb.open_run(shared_path(*S, "S1_baseline", "md5"), steps=[0, 1])
    b = precnb.open_run(shared_path(*S, "S1_baseline", "md5_rerun"))
    f = first_divergence(a, b)
    assert f.kind == "none"
    assert f.stats["crc_only_records"] == 107  # ground truth: 107 of 1826 CRCs differ
    assert "CRC-only" in f.reason
    apis = {str(a.api.sel(tensor=c["tensor"]).values).rsplit(".", 1)[-1] for c in f.crc_only}
    assert apis <= {"__iadd__", "__truediv__", "add_", "addcdiv_", "addcmul_", "lerp_", "mul_"}
    strict = first_divergence(a, b, crc="strict")
    assert strict.kind == "first_divergence" and strict.step == 0


def test_statistics_vs_md5_runs_agree():
    a = precnb.open_run(shared_path(*S, "S1_baseline", "statistics"))
    b = precnb.open_run(shared_path(*S, "S1_baseline", "md5"))
    assert first_divergence(a, b).kind == "none"  # ground truth: 0 stat mismatches


def test_s1_nan_origin_none_and_masks_benign(s1_stats):
    f = nan_origin(s1_stats)
    assert f.kind == "none"
    assert f.stats["inf_values"] > 0 and f.stats["nan_values"] == 0
    assert "Tensor.masked_fill.0.forward" in f.evidence["benign_nodes"]


def test_s1_anomalies_has_no_nan_anomaly(s1_stats):
    df = anomaly_table(s1_stats)
    assert not (df["type"] == "nonfinite").any()


def _perturb(ds, *, step, rank, tensor, factor=1.01, var="norm"):
    out = ds.copy(deep=True)
    out[var].loc[dict(step=step, rank=rank, tensor=tensor)] *= factor
    return out


def _later_tensors(ds, step, rank, tensor):
    seq = ds["seq"].sel(step=step, rank=rank)
    s0 = int(seq.sel(tensor=tensor))
    return [str(t) for t in ds.tensor.values if int(seq.sel(tensor=t)) > s0]


def test_injected_divergence_found_exactly(tp2):
    lbl = "Functional.gelu.0.forward.output.0" if "Functional.gelu.0.forward.output.0" in tp2.tensor \
        else next(t for t in tp2.tensor.values if t.startswith("Functional.linear.3.forward.output"))
    target = _perturb(tp2, step=1, rank=1, tensor=lbl)
    # everything after the injection point on rank 1 step 1 differs too
    for t in _later_tensors(tp2, 1, 1, lbl)[:50]:
        target["max"].loc[dict(step=1, rank=1, tensor=t)] *= 1.5
    f = first_divergence(tp2, target)
    assert (f.kind, f.step, f.rank, f.tensor) == ("first_divergence", 1, 1, lbl)
    assert f.node == str(tp2.node.sel(tensor=lbl).values)
    assert f.module and f.values["target"]["norm"] != f.values["baseline"]["norm"]
    assert f.evidence["stack"]


def test_divergence_is_communication_aware(tp2):
    """Rank 0 differs first in wall order at an all_reduce output, rank 1 computed it."""
    ar = next(t for t in tp2.tensor.values if t.startswith("Distributed.all_reduce.0.forward.output"))
    seq = tp2["seq"].sel(step=0)
    compute = [t for t in tp2.tensor.values
               if tp2.kind.sel(tensor=t) == "api" and not is_communication(str(tp2.node.sel(tensor=t).values))
               and str(tp2.role.sel(tensor=t).values) == "output"
               and int(seq.sel(rank=1, tensor=t)) < int(seq.sel(rank=1, tensor=ar))]
    src = compute[-1]  # the last compute op before the first all_reduce on rank 1
    target = tp2.copy(deep=True)
    target["max"].loc[dict(step=0, rank=1, tensor=src)] += 1.0
    for r in (0, 1):
        target["max"].loc[dict(step=0, rank=r, tensor=ar)] += 1.0
    f = first_divergence(tp2, target)
    assert (f.step, f.rank, f.tensor) == (0, 1, src)
    inherited = [s for s in f.suspects if s["rank"] == 0]
    assert inherited and inherited[0]["why"] == "inherited via communication"


def test_structural_difference_reported(tp2):
    tp1 = precnb.open_run(shared_path(*S, "S5_tp_shards", "tp1"))
    f = first_divergence(tp1, tp2)
    only = {s["node"] for s in f.structural if s["only_in"] == "target"}
    assert len(only) == 12 and all(n.startswith("Distributed.all_reduce") for n in only)
    assert any("shard" in h for h in f.hints)


def test_grad_sum_not_average_hint(tp2):
    target = tp2.copy(deep=True)
    g = target.kind == "param_grad"
    for v in ("max", "min", "mean", "norm"):
        target[v] = target[v].where(~g, target[v] * 2)
    f = first_divergence(tp2, target)
    assert f.kind == "first_divergence"
    assert any("summed, not averaged" in h and "world size" in h for h in f.hints)


def test_zero_parameter_hint(tp2):
    p = next(t for t in tp2.tensor.values if str(tp2.role.sel(tensor=t).values) == "parameter")
    target = tp2.copy(deep=True)
    for v in ("max", "min", "mean", "norm"):
        target[v].loc[dict(tensor=p)] = 0.0
    f = first_divergence(tp2, target)
    assert any("exactly zero" in h and p in h for h in f.hints)


def test_tolerance_override_and_calibration(tp2):
    lbl = [t for t in tp2.tensor.values if str(tp2.role.sel(tensor=t).values) == "output"][5]
    target = _perturb(tp2, step=0, rank=0, tensor=lbl, factor=1 + 1e-3)
    assert first_divergence(tp2, target).kind == "first_divergence"
    assert first_divergence(tp2, target, tolerance=Tolerance(rtol=1e-2)).kind == "none"
    cal = Tolerance.calibrate(tp2, target)
    assert cal.per_tensor[lbl] >= 1e-3
    assert first_divergence(tp2, target, tolerance=cal).kind == "none"
    assert Tolerance().rtol_for("torch.bfloat16") == 2 ** -8
    assert Tolerance().rtol_for("torch.int64") == 0.0


def test_resumed_run_step_offset_auto(s1_stats):
    resumed = s1_stats.sel(step=[2, 3, 4]).assign_coords(step=[0, 1, 2])
    f = first_divergence(s1_stats, resumed, step_offset="auto")
    assert f.kind == "none" and f.stats["step_offset"] == -2
    g = first_divergence(s1_stats, resumed, step_offset=0)  # without alignment they differ at step 0
    assert g.kind == "first_divergence" and g.step == 0
    # the one default: the runs hold different steps, so the offset is detected
    d = first_divergence(s1_stats, resumed)
    assert d.kind == "none" and d.stats["step_offset"] == -2


def test_restrict_steps_and_ranks(tp2):
    target = _perturb(tp2, step=0, rank=0, tensor=tp2.tensor.values[10], factor=2)
    assert first_divergence(tp2, target, steps=[1]).kind == "none"
    assert first_divergence(tp2, target, ranks=[1]).kind == "none"
    assert first_divergence(tp2, target, ranks=[0]).step == 0


def test_nan_origin_across_ranks(tp2):
    ds = tp2.copy(deep=True)
    soft = "Functional.softmax.1.forward.output.0"
    ds["max"].loc[dict(step=1, rank=1, tensor=soft)] = np.nan
    later = _later_tensors(tp2, 1, 1, soft)
    for t in later:
        ds["mean"].loc[dict(step=1, rank=1, tensor=t)] = np.nan
    ar = [t for t in tp2.tensor.values if t.startswith("Distributed.all_reduce") and ".output." in t]
    first_ar_after = min((t for t in ar if t in later), key=lambda t: int(tp2.seq.sel(step=1, rank=0, tensor=t)))
    for t in [*_later_tensors(tp2, 1, 0, first_ar_after), first_ar_after]:
        ds["mean"].loc[dict(step=1, rank=0, tensor=t)] = np.nan
    f = nan_origin(ds)
    assert (f.kind, f.step, f.rank, f.node) == ("nan_origin", 1, 1, "Functional.softmax.1.forward")
    assert f.values["created_by_node"] is True
    assert any(s["rank"] == 0 and s["why"] == "inherited via communication" for s in f.suspects)


def test_nan_through_inputs(tp2):
    ds = tp2.copy(deep=True)
    first = tp2.tensor.values[int(np.argmin(tp2.seq.sel(step=0, rank=0).values))]
    ds["mean"].loc[dict(step=0, rank=0, tensor=first)] = np.nan  # int tensor: Mean is null, ignored
    assert nan_origin(ds).kind == "none"
    ds["max"].loc[dict(step=0, rank=0, tensor=first)] = np.nan
    f = nan_origin(ds)
    assert (f.step, f.rank, f.tensor) == (0, 0, first)
    assert f.values["created_by_node"] is False and "inputs" in f.reason


def test_new_overflow_inf_is_origin_but_masks_are_not(tp2):
    ds = tp2.copy(deep=True)
    lbl = next(t for t in tp2.tensor.values if t.startswith("Functional.linear.2.forward.output"))
    ds["max"].loc[dict(step=1, rank=0, tensor=lbl)] = np.inf
    f = nan_origin(ds)
    assert (f.kind, f.step, f.rank, f.tensor) == ("nan_origin", 1, 0, lbl)
    assert "overflow" in f.reason


def test_s6_monitor_anomalies():
    ds = precnb.open_run(shared_path(*S, "S6_monitor", "monitor_output"))
    f = precnb.anomalies(ds)
    assert f.kind == "anomaly" and (f.step, f.rank) == (2, 1)
    nf = f.values["first_nonfinite"]
    assert (nf["step"], nf["rank"], nf["tensor"]) == (4, 1, "actv/blocks.1.attn.output")
    df = anomaly_table(ds)
    spikes = df[(df.type == "spike") & (df.step == 2) & (df.tensor.str.startswith("grad_unreduced/"))]
    assert set(spikes["rank"]) == {1}  # the rank-1 gradient-norm spike; rank 0 unreduced is clean
    assert not df.tensor.str.contains("embed.input").any()
    g = nan_origin(ds)
    assert (g.step, g.rank, g.tensor) == (4, 1, "actv/blocks.1.attn.output")


def test_compare_runs_masks(tp2):
    tp1 = precnb.open_run(shared_path(*S, "S5_tp_shards", "tp1"))
    cmp = compare_runs(tp1, tp2)
    assert cmp.ds.sizes["rank"] == 1  # only rank 0 is shared
    assert int(cmp.only_target.sum()) > 0 and int(cmp.only_baseline.sum()) == 0


def test_finding_json_is_strict(tp2):
    import json

    ds = tp2.copy(deep=True)
    ds["max"].loc[dict(step=0, rank=0, tensor=tp2.tensor.values[3])] = np.nan
    text = nan_origin(ds).to_json()
    obj = json.loads(text)
    assert obj["schema"] == "precnb.finding/1" and obj["kind"] == "nan_origin"
    for key in ("step", "rank", "node", "tensor", "module", "reason", "values", "structural", "hints",
                "suspects", "evidence"):
        assert key in obj
    import re

    assert not re.search(r"[:\[,]\s*-?(NaN|Infinity)", text)  # no bare non-JSON tokens


@pytest.mark.parametrize("seed", range(5))
def test_relative_difference_numpy_path_equals_xarray_path(seed):
    """The one-pass numpy implementation gives exactly the xarray formula (NaN, ±inf, null, absent)."""
    from precnb.analysis import relative_difference
    from precnb.combine import combine_runs

    rng = np.random.default_rng(seed)
    base = precnb.open_run(sample_path("divergence", "baseline"), progress=False)
    runs = {}
    for name in ("a", "b"):
        ds = base.copy(deep=True)
        for s in ("max", "min", "mean", "norm"):
            v = ds[s].values
            v *= rng.choice([1.0, 1.0 + 1e-3, -1.0], size=v.shape)
            v[rng.random(v.shape) < 0.05] = np.nan
            v[rng.random(v.shape) < 0.05] = np.inf
            v[rng.random(v.shape) < 0.05] = -np.inf
        ds["null_stats"].values[rng.random(ds["null_stats"].shape) < 0.1] = 4
        ds["present"].values[rng.random(ds["present"].shape) < 0.1] = False
        ds["numel"].values[rng.random(ds["numel"].shape) < 0.05] = -1
        runs[name] = ds
    both = combine_runs(runs)
    a, b = both.isel(run=0), both.isel(run=1)
    fast = relative_difference(a, b, ("max", "min", "mean", "norm"), atol=1e-30)
    slow = _reference_relative_difference(a, b, ("max", "min", "mean", "norm"), atol=1e-30)
    np.testing.assert_array_equal(fast.values, slow.values)
    assert fast.dims == slow.dims
    assert list(fast["stat"].values) == list(slow["stat"].values)


def _reference_relative_difference(a: xr.Dataset, b: xr.Dataset, stats: tuple[str, ...], *, atol: float
                                   ) -> xr.DataArray:
    """The formula written with xarray operations, element by element: the reference."""
    from precnb.analysis.masks import recorded

    numel_a = a["numel"].where(a["numel"] > 0, 1).astype(np.float64)
    numel_b = b["numel"].where(b["numel"] > 0, 1).astype(np.float64)
    rms_a = np.abs(a["norm"]) / np.sqrt(numel_a)
    rms_b = np.abs(b["norm"]) / np.sqrt(numel_b)
    rms = np.fmax(rms_a.fillna(0), rms_b.fillna(0))
    rms = rms.where(np.isfinite(rms), 0)
    for ds in (a, b):  # every statistic's scale includes the tensor's largest magnitude (a finite one)
        amax = np.fmax(np.abs(ds["max"]), np.abs(ds["min"]))
        rms = np.fmax(rms, amax.where(np.isfinite(amax), 0))
    out = []
    for s in stats:
        x, y = a[s], b[s]
        both_rec = recorded(a, s) & recorded(b, s)
        scale = np.fmax(np.fmax(np.abs(x), np.abs(y)), rms)
        scale = scale.where(np.isfinite(scale), 0)
        scale = np.fmax(scale, atol)
        with np.errstate(invalid="ignore", over="ignore"):
            rel = np.abs(x - y) / scale
        same_nf = (np.isnan(x) & np.isnan(y)) | ((x == y) & np.isinf(x))
        rel = xr.where(same_nf, 0.0, rel)
        rel = xr.where(~np.isfinite(rel) & ~same_nf, np.inf, rel)
        # a statistic that is null on either side has nothing to compare (e.g. the Max of a
        # merged partial sum); dtype changes are reported separately
        rel = rel.where(both_rec, 0.0)
        out.append(rel)
    return xr.concat(out, dim=xr.DataArray(list(stats), dims="stat", name="stat"))



def test_grad_ratio_hint_with_zero_target_norms_warns_nothing():
    """A vanished gradient (norm 0 in the target) must not print a divide-by-zero warning into a notebook."""
    import warnings

    from precnb.analysis.divergence.hints import grad_ratio_hint

    ds = precnb.open_run(sample_path("divergence", "baseline"), progress=False)
    grads = ds["kind"].values == "param_grad"
    assert grads.sum() >= 4
    target = ds.copy(deep=True)
    cols = np.flatnonzero(grads)
    target["norm"].values[..., cols[: len(cols) // 2]] = 0.0
    target["norm"].values[..., cols[len(cols) // 2:]] *= 0.5  # the baseline's are twice the target's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hint = grad_ratio_hint(ds, target, ds["present"] & target["present"], 2, ("baseline", "target"))
    assert hint is None or "baseline" in hint
