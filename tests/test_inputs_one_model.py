"""One input model (issue #27 item 3): one rule for which run is which, one public ``open_runs``."""

from __future__ import annotations

import pytest
import xarray as xr

import precnb
from precnb.combine import combine_runs
from precnb.pipeline.inputs import NOT_A_RUN_NAME, pick_roles, split_inputs
from tests.conftest import sample_path
from tests.test_viz import make_run


@pytest.fixture(scope="module")
def three() -> xr.Dataset:
    return combine_runs({"a": make_run(seed=1), "b": make_run(seed=2), "c": make_run(seed=3)})


def test_pick_roles():
    assert pick_roles(["a", "b", "c"]) == ("c", "a")
    assert pick_roles(["a", "b", "c"], "c") == ("b", "c")
    with pytest.raises(ValueError, match=r"baseline 'x' is not one of the runs \['a', 'b'\]"):
        pick_roles(["a", "b"], "x")
    with pytest.raises(ValueError, match=NOT_A_RUN_NAME):
        pick_roles(["a", "b"], make_run())


def test_pipeline_and_explorer_pick_the_same_runs(three):
    pytest.importorskip("ipywidgets")
    from precnb.widgets._inputs import normalize_runs

    for baseline in (None, "b", "c"):
        t, b = split_inputs(three, baseline)
        runs = normalize_runs(three, baseline)
        assert (runs.target, runs.baseline) == (t.name, b.name)
    for bad in ("x", make_run()):
        with pytest.raises(ValueError) as pipe:
            split_inputs(three, bad)
        with pytest.raises(ValueError) as expl:
            normalize_runs(three, bad)
        assert str(pipe.value) == str(expl.value)


def test_one_public_open_runs():
    path = sample_path("dp_nan")
    public = precnb.open_runs({"x": path, "y": path}, progress=False)
    low = precnb.io.open_runs({"x": path, "y": path}, progress=False)  # the readers' layer under it
    xr.testing.assert_identical(public, low)  # same names: nothing to align, the same combination
    with pytest.raises(ValueError, match="mapping aligns two runs"):
        precnb.open_runs({"x": path}, mapping={})


def test_report_renders_tensor_metrics_from_the_triage(monkeypatch, tmp_path):
    """The report's metric columns come from the Triage's tensor metrics: no tensor file read at render time,
    the same values as comparing the files again."""
    import dataclasses

    import precnb.tensor_compare as tc
    from precnb.report import write_html
    from precnb.report._inputs import from_triage
    from precnb.report._tensor_cols import metric_columns

    s = sample_path("tensor_bug")
    tri = precnb.diagnose(s / "target", baseline=s / "baseline")
    f = tri.finding
    assert f.found and tri.tensor_metrics is not None
    data = from_triage(tri)
    labels = [str(t) for t in data.target["tensor"].values[:12]]
    read_again = metric_columns(dataclasses.replace(data, tensor_metrics=None), step=f.step, rank=f.rank,
                                tensors=labels)
    assert read_again  # tensor-mode pair: the files hold the tensors

    def no_reading(*_a, **_k):
        raise AssertionError("tensor files read at render time")

    monkeypatch.setattr(tc, "tensor_metrics", no_reading)
    assert metric_columns(data, step=f.step, rank=f.rank, tensors=labels) == read_again
    html = write_html(tri, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "1‰ err ratio" in html and "cosine" in html
