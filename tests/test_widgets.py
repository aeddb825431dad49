"""precnb.widgets without a browser: set selection traits / press buttons, assert on state."""

from __future__ import annotations

import statistics
import sys
import time
import types

import numpy as np
import pytest

import precnb
from tests.conftest import sample_path
from tests.test_viz import NAN_TENSOR, make_run, tile_ranks

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")
pytest.importorskip("altair")
from precnb.widgets import explore
from precnb.widgets.explorer import Explorer


def vega_point(jc, name, points):
    """Simulate the Vega signal of a point selection reaching Python (as altair's tests do)."""
    jc._vl_selections = {name: {"value": {"vlPoint": {"or": points}}, "store": points}}


def vega_interval(jc, name, value):
    jc._vl_selections = {name: {"value": value, "store": []}}


@pytest.fixture(scope="module")
def nan_run():
    return make_run(nan_at=(2, 1, NAN_TENSOR))


@pytest.fixture
def ex(nan_run):
    return explore(nan_run)


# -- opening --------------------------------------------------------------------------------
def test_opens_at_the_nan_origin(ex, nan_run):
    f = precnb.nan_origin(nan_run)
    assert (ex.step, ex.rank, ex.tensor, ex.row) == (f.step, f.rank, f.tensor, "blocks.1.attn") \
        == (2, 1, NAN_TENSOR, "blocks.1.attn")
    assert ex.finding is not None and ex.finding.kind == "nan_origin"
    assert ex.filters.color.value == "events"
    focus = ex.frame[ex.frame["focus"]]  # the heat map moved there: that cell is outlined
    assert list(zip(focus["row"], focus["col"], strict=True)) == [("blocks.1.attn", "2")]
    cell = ex.heatmap.chart.spec["params"][0]
    assert cell["name"] == "cell" and cell["value"] == [{"row": "blocks.1.attn", "col": "2"}]
    assert NAN_TENSOR in ex.nan.output.value and "NaN/Inf origin" in ex.nan.output.value
    assert ex.tabs.selected_index == 1
    assert NAN_TENSOR in ex.status.value and "step 2 · rank 1" in ex.status.value
    assert set(ex.series["tensor"]) == {NAN_TENSOR} and ex.series["nonfinite"].any()
    assert "module path" in ex.detail.html.value and "self.blocks.1.attn" in ex.detail.html.value


def test_healthy_run_opens_without_a_finding():
    ex = explore(make_run())
    assert ex.finding.kind == "none" and ex.tensor is None and "Nothing found" in ex.nan.output.value
    assert len(ex.frame) and ex.filters.color.value == "stat"


def test_accessor_and_input_forms(nan_run):
    assert isinstance(nan_run.prec.explore(auto=False), Explorer)
    pair = explore(make_run(), baseline=make_run(seed=3), auto=False)
    assert pair.runs.names == ["baseline", "target"] and pair.runs.baseline == "baseline"
    listed = explore([make_run(), make_run(seed=2)], auto=False)
    assert listed.runs.names == ["run0", "run1"] and listed.runs.target == "run1"


def test_missing_extras_raise_a_clear_import_error(monkeypatch, nan_run):
    import precnb.widgets as pw

    monkeypatch.setattr(pw, "_missing", lambda: ["anywidget"])
    with pytest.raises(ImportError, match=r"precnb\[notebook\]"):
        pw.explore(nan_run)


# -- heat-map selection → line chart + detail table -------------------------------------------
def test_cell_selection_drives_line_chart_and_detail(ex):
    vega_point(ex.heatmap.chart, "cell", [{"row": "lm_head", "col": "1"}])
    assert (ex.row, ex.step) == ("lm_head", 1)
    assert ex.tensor.startswith("Module.lm_head.Linear.") and ex.rank in (0, 1, 2)
    # line chart: the tensor over steps, one line per rank; the synced spec carries the data
    assert set(ex.series["tensor"]) == {ex.tensor} and set(ex.series["rank"]) == {0, 1, 2}
    (data,) = ex.lines.chart.spec["datasets"].values()
    assert {d["tensor"] for d in data} == {ex.tensor} and ex.lines.chart.spec["title"] == ex.tensor
    # detail table: the module's records at (step, rank) with dtype/shape, module path, stack
    html = ex.detail.html.value
    assert ex.tensor in html and "float32" in html and "[4, 8]" in html
    assert set(ex.detail.frame["tensor"]) == {t for t in ex.target()["tensor"].values if ".lm_head." in t}
    assert "line 1" in html or "self.lm_head" in html
    assert f"step 1 · rank {ex.rank}" in ex.status.value


def test_selected_cell_stays_selected_after_a_filter_change(ex):
    vega_point(ex.heatmap.chart, "cell", [{"row": "lm_head", "col": "1"}])
    ex.filters.top_k.value = 10
    assert ex.heatmap.chart.spec["params"][0]["value"] == [{"row": "lm_head", "col": "1"}]
    assert (ex.row, ex.step) == ("lm_head", 1)


def test_echo_of_python_selected_cell_is_ignored_and_empty_selection_keeps_state(ex):
    before = (ex.step, ex.rank, ex.tensor)
    vega_point(ex.heatmap.chart, "cell", [{"row": "blocks.1.attn", "col": "2"}])  # the pinned cell
    vega_point(ex.heatmap.chart, "cell", [])
    assert (ex.step, ex.rank, ex.tensor) == before


def test_shift_click_several_cells_draws_each_worst_tensor(ex):
    ex.filters.color.value = "stat"
    vega_point(ex.heatmap.chart, "cell", [{"row": "embed", "col": "0"}, {"row": "lm_head", "col": "0"}])
    assert len(set(ex.series["tensor"])) == 2 and ex.row == "lm_head"


def test_line_chart_pick_and_span(ex):
    ex.select_cell("embed", 0)
    t = ex.tensor
    vega_point(ex.lines.chart, "pick", [{"step": 1, "series": "rank 2"}])
    assert (ex.step, ex.rank, ex.tensor) == (1, 2, t)
    assert "step 1 · rank 2" in ex.status.value
    vega_interval(ex.lines.chart, "span", {"step": [0.6, 2.2]})
    assert ex.filters.steps.value == (1, 2)
    assert set(ex.frame["col"]) == {"1", "2"}
    vega_interval(ex.lines.chart, "span", {})  # a redrawn chart's empty brush changes nothing
    assert ex.filters.steps.value == (1, 2)


# -- filter bar ---------------------------------------------------------------------------------
def test_filter_bar(ex):
    f = ex.filters
    f.pattern.value = r"blocks\.0"
    assert set(ex.frame["row"]) == {"blocks.0.attn", "blocks.0.mlp"}
    f.pattern.value = ""
    f.direction.value = "backward"
    assert set(ex.detail.frame["direction"]) <= {"backward"}
    f.direction.value = "all"
    f.role.value = "output"
    f.rows.value = "tensor"
    assert all(".output." in r for r in ex.frame["row"])
    f.role.value = "all"
    f.rows.value = "module"
    f.color.value = "nonfinite"
    f.nonfinite_only.value = True
    assert ex.frame.groupby("row")["nonfinite"].sum().gt(0).all()
    f.nonfinite_only.value = False
    f.ranks.value = "0, 2"
    f.by.value = "rank"
    assert set(ex.frame["col"]) == {"0", "2"}
    f.ranks.value = "x-y"
    assert "N-M" in f.message.value
    f.pattern.value = "("
    assert "bad regex" in f.message.value


# -- diagnosis panels ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair():
    base = make_run()
    target = base.copy(deep=True)
    early = "Module.blocks.0.mlp.Linear.forward.0.output.0"  # small difference at step 1
    late = "Module.lm_head.Linear.forward.0.output.0"  # large difference at step 2
    target["norm"].loc[dict(step=1, rank=0, tensor=early)] *= 1.01
    target["norm"].loc[dict(step=2, rank=2, tensor=late)] *= 1.5
    return base, target, early, late


def test_two_runs_open_at_the_first_divergence(pair):
    base, target, early, _late = pair
    ex = explore({"gpu": base, "npu": target})
    assert (ex.step, ex.rank, ex.tensor) == (1, 0, early)
    assert ex.tabs.selected_index == 0 and ex.filters.color.value == "reldiff"
    assert "Module.blocks.0.mlp.Linear.forward.0" in ex.divergence.output.value
    focus = ex.frame[ex.frame["focus"]].iloc[0]
    assert (focus["row"], focus["col"]) == ("blocks.0.mlp", "1")
    assert set(ex.series["run"]) == {"gpu", "npu"}  # one line per run
    assert "rel_diff" in ex.detail.frame and "norm_gpu" in ex.detail.frame


def test_divergence_button_with_tolerance_moves_the_views(pair):
    base, target, _early, late = pair
    ex = explore({"gpu": base, "npu": target}, auto=False)
    assert ex.finding is None
    ex.divergence.tolerance.value = "0.1"
    ex.divergence.button.click()
    f = ex.divergence.finding
    assert (f.step, f.rank, f.tensor) == (2, 2, late)
    assert (ex.step, ex.rank, ex.tensor, ex.row) == (2, 2, late, "lm_head")
    assert "Module.lm_head.Linear.forward.0" in ex.divergence.output.value
    assert ex.frame[ex.frame["focus"]].iloc[0]["col"] == "2"
    ex.divergence.tolerance.value = "0.9"
    ex.divergence.button.click()
    assert ex.divergence.finding.kind == "none" and ex.tensor == late
    ex.divergence.baseline.value = "npu"
    ex.divergence.button.click()
    assert "same run" in ex.divergence.output.value


def test_finding_hidden_by_filters_is_made_visible(nan_run):
    ex = explore(nan_run, auto=False)
    ex.filters.pattern.value = "lm_head"
    ex.filters.steps.value = (0, 1)
    ex.nan.button.click()
    assert ex.filters.pattern.value == "" and ex.filters.steps.value == (0, 2)
    assert ex.tensor == NAN_TENSOR and ex.frame["focus"].any()


def test_real_divergence_sample():
    b = precnb.open_run(sample_path("divergence", "baseline"))
    t = precnb.open_run(sample_path("divergence", "target"))
    expected = precnb.first_divergence(b, t)
    ex = explore({"baseline": b, "target": t})
    assert (ex.step, ex.rank, ex.tensor) == (expected.step, expected.rank, expected.tensor)
    assert expected.node in ex.divergence.output.value


def test_real_nan_sample():
    ds = precnb.open_run(sample_path("dp_nan"))
    f = precnb.nan_origin(ds)
    ex = explore(ds)
    assert (ex.step, ex.rank, ex.tensor) == (f.step, f.rank, f.tensor)
    assert f.node in ex.nan.output.value


# -- shards, hierarchy, export --------------------------------------------------------------------
def test_shard_panel_reports_missing_functions(monkeypatch, nan_run):
    import precnb.widgets.shards as shards

    ex = explore(nan_run, auto=False)

    def missing(name):
        raise ImportError(f"precnb.analysis does not provide {name} yet")

    monkeypatch.setattr(shards, "resolve_analysis", missing)
    assert ex.shards.merge() is None and "merge_shards" in ex.shards.output.value
    assert ex.shards.check() is None and "check_replicas" in ex.shards.output.value


def test_shard_panel_merges_tp2_sample():
    tp2 = precnb.open_run(sample_path("tp", "tp2"))
    ex = explore(tp2, auto=False)
    try:
        from precnb.widgets.shards import resolve_analysis

        resolve_analysis("merge_shards")
    except ImportError:
        ex.shards.merge()
        assert "does not provide" in ex.shards.output.value
        return
    ex.shards.sizes["tp"].value = 2
    merged = ex.shards.merge()
    assert merged is not None, ex.shards.output.value
    assert merged.sizes["rank"] == 1 and "2 ranks → 1" in ex.shards.output.value
    assert ex.shards.chart_box.children
    ex.shards.check()
    assert ex.shards.output.value


def test_hierarchy_panel_draws_and_narrows(ex):
    ex.tabs.selected_index = 3  # drawn when first shown
    frame = ex.hierarchy.frame.set_index("node")
    assert frame.loc["Module.blocks.1.attn.Linear.forward.0", "count"] > 0
    vega_point(ex.hierarchy.chart, "node", [{"node": "Module.blocks.0.mlp.Linear.forward.0"}])
    assert ex.filters.pattern.value == r"^blocks\.0\.mlp(\.|$)"
    assert set(ex.frame["row"]) == {"blocks.0.mlp"}


def test_export_panel(monkeypatch, ex, tmp_path):
    monkeypatch.setitem(sys.modules, "precnb.report", None)  # not importable
    assert ex.export.export() is None and "not available" in ex.export.status.value
    calls = []
    fake = types.ModuleType("precnb.report")

    def write_html(ds, path, *, findings=None, **kw):
        calls.append((ds, path, findings))
        path.write_text("<html></html>")
        return path

    fake.write_html = write_html
    monkeypatch.setitem(sys.modules, "precnb.report", fake)
    ex.export.path.value = str(tmp_path / "r.html")
    assert ex.export.export() == tmp_path / "r.html"
    assert calls[0][2][0].kind == "nan_origin" and "written" in ex.export.status.value


# -- scale ----------------------------------------------------------------------------------------
def test_thousand_ranks_bounded_and_responsive():
    big = tile_ranks(make_run(n_steps=5, n_ranks=2, nan_at=(3, 1, NAN_TENSOR)), 1000)
    ex = explore(big)
    assert (ex.step, ex.rank, ex.tensor) == (3, 1, NAN_TENSOR)
    assert len(ex.frame) <= 40 * 48
    ex.filters.by.value = "rank"
    assert len(ex.frame) <= 40 * 32 and ex.frame["col"].nunique() == 32
    assert len(ex.heatmap.chart.spec["datasets"]) == 1
    cells = ex.frame[["row", "col"]].drop_duplicates().to_dict("records")
    times = []
    for c in cells[:: max(1, len(cells) // 9)][:9]:
        t = time.perf_counter()
        vega_point(ex.heatmap.chart, "cell", [c])
        times.append(time.perf_counter() - t)
        assert ex.row == c["row"]
    # one line per drawn rank (≤ max_lines) plus the median of the bucket's ranks
    assert ex.series["series"].nunique() <= ex.max_lines + 1
    assert statistics.median(times) < 1.0  # the 200 ms budget is measured in benchmarks/
    assert np.isfinite(statistics.median(times))
