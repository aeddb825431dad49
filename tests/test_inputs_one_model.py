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


def _src(name: str, seed: int) -> xr.Dataset:
    ds = make_run(seed=seed)
    ds.attrs["source"] = f"/dumps/{name}"
    return ds


def _cases() -> list[tuple[str, object, object, tuple[str | None, str | None], bool]]:
    """(label, run_or_runs, baseline, (target, baseline) names, the pipeline takes it): every accepted form."""
    from precnb.pipeline.inputs import ReadRun

    gpu, npu, c = _src("gpu", 1), _src("npu", 2), _src("c", 3)
    div = sample_path("divergence")
    return [
        ("one dataset", npu, None, ("npu", None), True),
        ("one dataset, no source", make_run(seed=4), None, ("target", None), True),
        ("one path", div / "target", None, ("target", None), True),
        ("a dataset and its baseline", npu, gpu, ("npu", "gpu"), True),
        ("two paths", div / "target", div / "baseline", ("target", "baseline"), True),
        ("two paths, one name", sample_path("divergence", "target"), str(div / "target"),
         ("target (target)", "target (baseline)"), True),
        ("read runs", ReadRun(npu, str(div / "target")), ReadRun(gpu, str(div / "baseline")),
         ("target", "baseline"), True),
        ("a mapping of one", {"only": npu}, None, ("only", None), True),
        ("a mapping of two", {"gpu": gpu, "npu": npu}, None, ("npu", "gpu"), True),
        ("a mapping of paths", {"b": div / "baseline", "t": str(div / "target")}, None, ("t", "b"), True),
        ("a sequence", [gpu, npu], None, ("run1", "run0"), True),
        ("combined, one run", combine_runs({"solo": npu}), None, ("solo", None), True),
        ("combined, two", combine_runs({"x": gpu, "y": npu}), None, ("y", "x"), True),
        ("combined, two, baseline named", combine_runs({"x": gpu, "y": npu}), "y", ("x", "y"), True),
        ("combined, three", combine_runs({"a": gpu, "b": npu, "c": c}), None, ("c", "a"), True),
        ("combined, three, baseline named", combine_runs({"a": gpu, "b": npu, "c": c}), "c", ("b", "c"), True),
        ("a mapping of three", {"a": gpu, "b": npu, "c": c}, None, ("c", "a"), False),
        ("a mapping of three, baseline named", {"a": gpu, "b": npu, "c": c}, "b", ("c", "b"), False),
        ("a sequence of three", [gpu, npu, c], None, ("run2", "run0"), False),
    ]


def test_every_input_form_gives_the_same_roles_to_the_pipeline_and_the_explorer():
    """One table: what ``diagnose`` compares (split_inputs) is what the explorer shows (normalize_runs)."""
    from precnb.pipeline.inputs import normalize
    from precnb.widgets._inputs import normalize_runs

    for label, given, baseline, (target, base), pipeline in _cases():
        inp = normalize(given, baseline)
        assert (inp.target, inp.baseline) == (target, base), label
        runs = normalize_runs(given, baseline)
        if base is None:  # one run: the explorer shows it without a run dim
            assert (runs.target, runs.baseline, runs.names) == (None, None, []), label
        else:
            assert (runs.target, runs.baseline) == (target, base), label
            assert set(runs.names) == set(inp.names) and base in runs.names and target in runs.names, label
        if pipeline:
            t, b = split_inputs(given, baseline)
            assert (t.name, b.name if b is not None else None) == (target, base), label
        else:  # more than two runs in a mapping: the explorer shows them all, a triage compares two
            with pytest.raises(ValueError, match="pass one run, or a mapping of two runs"):
                split_inputs(given, baseline)


def test_every_bad_input_fails_alike_in_the_pipeline_and_the_explorer(three):
    from precnb.report import to_html
    from precnb.widgets._inputs import normalize_runs

    run = make_run()
    bad = [
        (three, "x", ValueError, r"baseline 'x' is not one of the runs \['a', 'b', 'c'\]"),
        (three, run, ValueError, NOT_A_RUN_NAME),
        ({"a": run, "b": run}, "a", ValueError, "a mapping of runs already says which is the baseline"),
        ({}, None, ValueError, "pass one run, or a mapping of two runs"),
        (run, "no_such_run", ValueError, r"baseline 'no_such_run': no such path"),
        (5, None, TypeError, "expected a path or an xarray.Dataset, got int"),
        ({"a": run, "b": 5}, None, TypeError, "expected a path or an xarray.Dataset, got int"),
        (run, 5.0, TypeError, "expected a path or an xarray.Dataset, got float"),
    ]
    for given, baseline, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            split_inputs(given, baseline)
        with pytest.raises(exc, match=msg):
            normalize_runs(given, baseline)
        with pytest.raises(exc, match=msg):  # the report, through the same model
            to_html(given, baseline=baseline)
    with pytest.raises(ValueError, match="pass one run, or a mapping of two runs"):
        to_html({"a": run, "b": run, "c": run})


def test_a_triage_is_an_input_of_the_explorer_with_its_own_names():
    from precnb.pipeline.inputs import normalize
    from precnb.widgets._inputs import normalize_runs, runs_for

    tri = precnb.diagnose({"gpu": _src("gpu", 1), "npu": _src("npu", 2)}, kinds=[])
    assert tri.names == ("gpu", "npu")
    inp = normalize(tri)
    assert (inp.target, inp.baseline) == ("npu", "gpu")
    runs = normalize_runs(tri)
    assert (runs.target, runs.baseline) == ("npu", "gpu") and runs.names == ["gpu", "npu"]
    shown, same = runs_for(tri)
    assert same is tri and (shown.target, shown.baseline) == ("npu", "gpu")
    with pytest.raises(ValueError, match="a Triage already holds its runs and options"):
        normalize(tri, "gpu")
    with pytest.raises(ValueError, match="a Triage already holds its runs and options"):
        runs_for(tri, options={"steps": [0]})
    with pytest.raises(TypeError, match="got Triage"):  # already diagnosed: not a run to read again
        split_inputs(tri)


def test_the_explorer_diagnoses_what_it_shows():
    """runs_for (precnb.explore) hands the pipeline the inputs it normalised: the triage's names are the shown ones."""
    from precnb.widgets._inputs import runs_for

    gpu, npu = _src("gpu", 1), _src("npu", 2)
    for given, baseline, want in [({"gpu": gpu, "npu": npu}, None, ("npu", "gpu")),
                                  (npu, gpu, ("npu", "gpu")),
                                  ([gpu, npu], None, ("run1", "run0")),
                                  (combine_runs({"x": gpu, "y": npu}), "y", ("x", "y"))]:
        runs, tri = runs_for(given, baseline, auto=False)
        assert (runs.target, runs.baseline) == want
        assert (tri.names[1], tri.names[0]) == want


def test_layouts_by_run_name_are_part_of_the_inputs():
    """``layouts={name: layout}`` (issue #27 item 3): the input model gives each run its layout, by name or by role."""
    from precnb.pipeline.inputs import normalize

    tp1, tp2 = sample_path("tp", "tp1"), sample_path("tp", "tp2")
    by_name = precnb.diagnose({"tp1": tp1, "tp2": tp2}, layouts={"tp2": "tp=2"}, progress=False)
    by_role = precnb.diagnose(tp2, baseline=tp1, target_layout="tp=2", progress=False)
    assert by_name.target_layout is not None and by_name.target_layout.tp == 2
    assert by_name.target_layout.describe() == by_role.target_layout.describe()
    assert by_name.baseline_layout is None or by_name.baseline_layout.tp == 1
    f1, f2 = by_name.finding, by_role.finding
    assert (f1.kind, f1.found, f1.step, f1.rank, f1.tensor) == (f2.kind, f2.found, f2.step, f2.rank, f2.tensor)
    # the triage's options name the layout by role, as resolved: a rerun on its runs reads the same
    assert by_name.options.layouts is None and by_name.options.target_layout == "tp=2"
    assert int(by_name.target.sizes["rank"]) == 1  # the two TP shards merged into one whole layer
    from precnb.analysis.layout import LayoutError

    with pytest.raises(LayoutError, match="world size 2 is not divisible by tp"):  # the layout given is the one used
        precnb.diagnose({"tp1": tp1, "tp2": tp2}, layouts={"tp2": "tp=4"}, progress=False)

    inp = normalize({"a": tp1, "b": tp2}, layouts={"a": "tp=1"}, target_layout="tp=2")
    assert (inp.baseline_layout, inp.target_layout) == ("tp=1", "tp=2")
    assert normalize(inp).layouts == {"a": "tp=1", "b": "tp=2"}  # RunInputs as it is
    with pytest.raises(ValueError, match=r"layouts: 'c' is not one of the runs \['a', 'b'\]"):
        normalize({"a": tp1, "b": tp2}, layouts={"c": "tp=2"})
    with pytest.raises(ValueError, match=r"the layout of run 'b' is given twice"):
        normalize({"a": tp1, "b": tp2}, layouts={"b": "tp=2"}, target_layout="tp=4")
    with pytest.raises(ValueError, match="baseline_layout needs a baseline"):
        normalize(tp2, baseline_layout="tp=1")
    with pytest.raises(ValueError, match=r"layouts: 'c' is not one of the runs"):  # before anything is read
        precnb.diagnose({"a": tp1, "b": tp2}, layouts={"c": "tp=2"})


def test_layouts_by_name_reach_the_report_and_the_explorer_alike():
    pytest.importorskip("ipywidgets")
    from precnb.report import to_html
    from precnb.widgets._inputs import runs_for

    tp1, tp2 = sample_path("tp", "tp1"), sample_path("tp", "tp2")
    runs = {"tp1": tp1, "tp2": tp2}
    _, tri = runs_for(runs, options={"layouts": {"tp2": "tp=2"}, "progress": False}, auto=False)
    assert tri.target_layout is not None and tri.target_layout.tp == 2
    page = to_html(runs, layouts={"tp2": "tp=2"}, progress=False)
    assert "layout target: world 2 = tp2 × cp1 × pp1" in page  # the report's settings line
    assert "target layout read from the dumps" not in page  # given, not inferred
    assert "target layout read from the dumps" in to_html(runs, progress=False)
