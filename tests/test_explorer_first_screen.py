"""Issue 51: what the explorer says on its first screen, and what a saved notebook keeps.

Item 2: the finding bar says what, where and why — the finding's cause, as the text summary prints it
(``cause: ...``), not only in the Finding tab below the heat maps.
"""

from __future__ import annotations

import pytest

import precnb
from tests.conftest import sample_path

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# incident, target, baseline, options, words of its cause
CAUSES = [
    ("dp_nan", ("dp_nan",), None, {}, "sqrt of negative values"),
    ("tp2pp2_scaled", ("megatron", "tp2pp2_scaled"), ("megatron", "tp1pp1"), {}, "input_kwargs.alpha"),
    ("moe_empty_expert", ("moe_empty_expert",), None, {}, "expert that received no tokens"),
]


def _explore(target, baseline, opts):
    base = {"baseline": str(sample_path(*baseline))} if baseline else {}
    return precnb.explore(str(sample_path(*target)), **base, **opts)


@pytest.mark.parametrize(("name", "target", "baseline", "opts", "words"), CAUSES, ids=[c[0] for c in CAUSES])
def test_the_finding_bar_says_the_cause_as_the_summary_does(name, target, baseline, opts, words):
    ex = _explore(target, baseline, opts)
    f = ex.current_finding
    cause = next(line.strip() for line in f.summary().splitlines() if line.strip().startswith("cause"))
    assert words in cause, (name, cause)
    why = ex.bar.why.value
    assert "precnb-finding-why" in ex.bar.why._dom_classes
    import html

    assert html.escape(cause) in why, (name, why)
    # the title keeps saying what and where
    assert f.node in ex.bar.label.value and f"step {f.step}" in ex.bar.label.value


def test_without_a_cause_the_bar_says_the_finding_reason():
    from precnb.analysis.findings import Finding, why_lines

    f = Finding(kind="first_divergence", reason="x at step 0, rank 0: an input differs", step=0, rank=0, node="x")
    assert why_lines(f) == [f.reason]
    assert why_lines(Finding(kind="none", reason="nothing found")) == []


def test_the_explorer_is_displayed_with_a_static_view_the_live_widget_hides():
    """Item 3: a static HTML output (finding, where, why, chart as SVG, detail table), then the widget."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    from precnb.widgets.static import live_css, static_class

    InteractiveShell.instance()
    ex = _explore(("dp_nan",), None, {})
    with capture_output() as out:
        ex._ipython_display_()
    assert [sorted(o.data) for o in out.outputs] == [
        ["text/html"], ["application/vnd.jupyter.widget-view+json", "text/plain"]]
    static = out.outputs[0].data["text/html"]
    assert static_class(ex.model_id) in static and "<script" not in static
    for shown in (ex.bar.label.value, ex.bar.why.value, ex.record.status.value, "sqrt of negative values",
                  "<svg", "class='focus'"):
        assert shown in static, shown
    assert out.outputs[1].data["application/vnd.jupyter.widget-view+json"]["model_id"] == ex.model_id
    assert live_css(ex.model_id) in ex.css.value  # the live widget hides its static view


def test_the_explorer_opens_on_the_departing_copy_beside_its_replica():
    """Item 1: TP=2 with a per-rank dropout seed against TP=1: rank 1's copy departs, rank 0's (the merged
    entry) matches; the explorer shows rank 1's own record as dumped, its line beside rank 0's."""
    ex = _explore(("megatron", "tp2pp1_dropout_unsync"), ("megatron", "tp1pp1_dropout"), {"target_layout": "tp=2"})
    f = ex.current_finding
    dep, dump = f.values["departing_rank"], f.evidence["dump"]["rank"]
    assert dep == dump == 1 and f.rank == 0 and f.node == "Functional.dropout.0.forward"
    # the selected record: the departing copy as dumped
    assert (ex.step, ex.rank, ex.tensor, ex.unmerged) == (f.step, dump, f.tensor, True)
    raw = ex.data.raw()
    own = {s: float(raw[s].sel(step=f.step, rank=dump, tensor=f.tensor)) for s in ("max", "min", "mean", "norm")}
    assert own["mean"] == pytest.approx(f.values["target"]["mean"])  # the finding's target values: its own
    row = ex.detail.frame.set_index("tensor").loc[f.tensor]
    assert {s: float(row[s]) for s in own} == pytest.approx(own)
    assert "rank 1 (rank as dumped" in ex.status.value
    # the chart: the departing rank's line beside its replica's, apart at the finding's step
    at = ex.series[(ex.series["step"] == f.step)].set_index("rank")["value"]
    assert sorted(at.index) == [0, 1] and at[1] != at[0]
    assert at[1] == pytest.approx(own[ex.filters.stat.value])
    # the "where" view outlines the departing rank's cell; the bar names the dump rank
    assert ex._selected()[1] == {"row": "1", "col": str(f.step)}
    assert "(dump rank 1)" in ex.bar.label.value
