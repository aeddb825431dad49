"""Issue 26 item 9: the explorer's reruns reuse what did not change, and answer as a full diagnose does.

A rerun (another tolerance, a Match, an Unmatch at the calls level) goes through the datasets the
first run read: what depends on them alone is reused (:mod:`precnb.analysis._memo`). Each rerun's
triage is compared, whole (every finding's kind, step, rank, node, reason, causes and evidence, the
checks, the notes, the alignment summary), with :func:`precnb.diagnose` run afresh from the dumps
with the same options (new dataset objects: nothing reused).
"""

from __future__ import annotations

import pytest

import precnb
from precnb.analysis._memo import memos
from tests.conftest import sample_path

pytest.importorskip("ipywidgets")

CASES = {
    "renamed": ("renamed/target", "renamed/baseline"),
    "divergence": ("divergence/target", "divergence/baseline"),
    "xfw": ("xfw/ms_bug", "xfw/pt"),
    "megatron_unsync": ("megatron/tp2pp1_dropout_unsync", "megatron/tp1pp1_dropout"),
    "megatron_shard": ("megatron/tp2pp1_wrong_shard", "megatron/tp1pp1"),
}


def _hits() -> int:
    """Hits of the memos that carry results from one run to the next (not the baseline's renaming nor the returned
    parameters, which the comparison and the pre-flight checks of one run share: a fresh run hits them too)."""
    from precnb.analysis.align.alignment import _APPLIED
    from precnb.analysis.undefined import _RETURNED

    return sum(m.hits for m in memos() if m is not _APPLIED and m is not _RETURNED)


def _same_as_fresh(t, target, base) -> None:
    """*t* (a rerun's triage) is what a fresh diagnose with its options answers."""
    before = _hits()
    fresh = precnb.diagnose(target, baseline=base, options=t.options)
    assert _hits() == before  # read afresh: nothing reused
    got, want = t.to_dict(), fresh.to_dict()
    assert [f["kind"] for f in got["findings"]] == [f["kind"] for f in want["findings"]]
    for a, b in zip(got["findings"], want["findings"], strict=True):
        assert (a["step"], a["rank"], a["node"], a["reason"], a["causes"]) == (
            b["step"], b["rank"], b["node"], b["reason"], b["causes"])
    assert got == want


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_rerun_match_unmatch_reuse_and_answer_as_a_full_diagnose(case):
    from precnb.widgets import explore

    target, base = (sample_path(*p.split("/")) for p in CASES[case])
    ex = explore(target, baseline=base)
    before = _hits()
    _same_as_fresh(ex.rerun(tolerance=1e-3), target, base)
    assert _hits() > before  # something was reused
    panel = ex.panel("Alignment")
    panel.on_show()
    mod = next(p for p in ex.triage.alignment.modules if p.baseline and p.target)
    panel.level.value = "modules"
    panel.pick(left=mod.baseline, right=mod.target)
    before = _hits()
    t = panel.do_match()
    assert t is not None and (mod.baseline, mod.target) in {(p.baseline, p.target) for p in t.alignment.modules}
    assert _hits() > before
    _same_as_fresh(t, target, base)
    panel.level.value = "calls"
    call = [p for p in ex.triage.alignment.nodes if p.target.endswith(".backward")][-1]
    panel.pick(left=call.baseline, right=call.target)
    t = panel.do_unmatch()  # item 4: at the calls level, on the picked call
    assert t is not None and call.target not in {p.target for p in t.alignment.nodes}
    _same_as_fresh(t, target, base)
    _same_as_fresh(ex.rerun(tolerance=1e-5), target, base)


def test_rerun_keeps_the_scalar_argument_cause():
    """Item 3 through the reused path: the cause diagnose gives (a different scalar argument) stays."""
    from precnb.widgets import explore

    target, base = sample_path("xfw", "ms_bug"), sample_path("xfw", "pt")
    want = precnb.diagnose(target, baseline=base).finding
    assert "different scalar argument (input_args.1 = 0.01 here, 1e-06 in pt)" in want.reason
    ex = explore(target, baseline=base)
    for t in (ex.rerun(tolerance=1e-6), ex.rerun()):
        f = t.finding
        assert (f.kind, f.node, f.step, f.rank, f.reason, f.causes) == (
            want.kind, want.node, want.step, want.rank, want.reason, want.causes)


def test_hidden_hierarchy_redraws_when_shown_not_on_every_selection():
    """A rerun or a selection does not redraw the Hierarchy tab while another tab is shown; opening it does."""
    from precnb.widgets import explore

    ex = explore(sample_path("divergence", "target"), baseline=sample_path("divergence", "baseline"))
    h = ex.panel("Hierarchy")
    ex.tabs.selected_index = ex.panels.index(h)
    drawn = h.chart
    assert drawn is not None
    ex.tabs.selected_index = 0
    ex.rerun(tolerance=1e-3)
    assert h.chart is drawn and h._stale  # hidden: not redrawn
    ex.tabs.selected_index = ex.panels.index(h)
    assert h.chart is not drawn and not h._stale  # shown: drawn for the new triage and selection


@pytest.mark.parametrize("case", ["divergence", "xfw"])
def test_another_tolerance_rethresholds_the_stored_relative_differences(case):
    """A rerun with another tolerance reuses the pair's renaming and relative differences, thresholds them again.

    Its comparison (every mask, the relative differences, the tolerances) is the one a fresh diagnose makes;
    the two tolerances give different masks, so a stale reuse of the previous thresholds would fail.
    """
    import numpy as np
    import xarray as xr

    from precnb.analysis.compare.prep import _PREPARED
    from precnb.widgets import explore

    target, base = (sample_path(*p.split("/")) for p in CASES[case])
    ex = explore(target, baseline=base)
    loose = ex.triage.comparison()
    hits = _PREPARED.hits
    t = ex.rerun(tolerance=1e-9)
    assert _PREPARED.hits > hits  # the tolerance-free part was reused
    got = t.comparison()
    fresh = precnb.diagnose(target, baseline=base, options=t.options).comparison()
    assert int(got.differs.sum()) != int(loose.differs.sum())  # the tolerance matters on this pair
    for name in ("differs", "rel", "rtol", "both", "only_baseline", "only_target", "crc_differs", "dtype_differs"):
        xr.testing.assert_identical(getattr(got, name), getattr(fresh, name))
    assert (got.shape_changed, got.dtype_changed, got.step_offset) == (
        fresh.shape_changed, fresh.dtype_changed, fresh.step_offset)
    assert np.array_equal(got.ds["tensor"].values, fresh.ds["tensor"].values)
    _same_as_fresh(t, target, base)


def _chart_content(chart):
    """What the Alignment tab's chart shows: each layer's data (by value) and encoding, the selections' values."""
    spec = chart.spec
    data = spec.get("datasets", {})
    layers = [(data[layer["data"]["name"]], layer.get("encoding"), layer.get("mark"), layer.get("transform"))
              for layer in spec["layer"]]
    params = [(p["name"], p.get("value")) for p in spec.get("params", [])]
    return layers, params, spec["height"], spec["title"]


@pytest.mark.parametrize("case", ["renamed", "xfw"])
def test_match_then_unmatch_answers_and_draws_as_a_fresh_explorer_with_that_mapping(case, monkeypatch):
    """Match a module pair, then Unmatch a call: the triage, the whole alignment and the Alignment tab (redrawn
    on the same chart widget, its spec reused) are those of an explorer opened afresh with the resulting mapping."""
    from precnb.viz import alignment as viz
    from precnb.widgets import explore

    built = []
    chart_of = viz.alignment_chart
    monkeypatch.setattr(viz, "alignment_chart", lambda *a, **k: built.append(1) or chart_of(*a, **k))

    target, base = (sample_path(*p.split("/")) for p in CASES[case])
    ex = explore(target, baseline=base)
    panel = ex.panel("Alignment")
    ex.tabs.selected_index = ex.panels.index(panel)  # on the tab: every rerun redraws it
    chart = panel.chart
    mod = next(p for p in ex.triage.alignment.modules if p.baseline and p.target and p.how != "user")
    panel.level.value = "modules"
    panel.pick(left=mod.baseline, right=mod.target)
    built.clear()
    assert panel.do_match() is not None
    assert not built  # the same shape: the spec is reused, only the data and selections change
    panel.level.value = "calls"
    call = [p for p in ex.triage.alignment.nodes if p.target.endswith(".forward")][-1]
    panel.pick(left=call.baseline, right=call.target)
    built.clear()
    t = panel.do_unmatch()
    assert t is not None and panel.chart is chart  # one widget, redrawn in place
    assert not built  # a row more or less: the spec resized (precnb.viz.alignment.resized), not built again
    assert {p.how for p in t.alignment.modules if (p.baseline, p.target) == (mod.baseline, mod.target)} == {"user"}
    assert call.target in t.alignment.user_unpaired
    _same_as_fresh(t, target, base)
    fresh = explore(target, baseline=base, mapping=t.options.mapping)
    assert fresh.triage.alignment.to_dict() == t.alignment.to_dict()
    assert fresh.triage.alignment.target_coords == t.alignment.target_coords
    assert fresh.triage.finding.to_dict() == t.finding.to_dict()
    again = fresh.panel("Alignment")
    fresh.tabs.selected_index = fresh.panels.index(again)
    again.pick(left=call.baseline, right=call.target)
    again.level.value = "calls"  # drawn with the same picks
    assert again.chart is not chart and again.rows.equals(panel.rows)
    assert _chart_content(again.chart) == _chart_content(panel.chart)


def test_combined_side_tables_follow_the_texts_they_are_merged_from():
    """The merge of the runs' ``construct`` / ``stacks`` texts, kept per set of texts, is the merge of those texts."""
    import xarray as xr

    from precnb import combine

    a = xr.Dataset(attrs={"construct": '{"x":"m","y":""}', "stacks": '{"x":["s"]}'})
    b = xr.Dataset(attrs={"construct": '{"y":"n","z":""}'})
    want = combine._merge_side_tables([a, b])
    assert want == {"construct": '{"x":"m","y":"","z":""}', "stacks": '{"x":["s"]}'}
    assert combine._merged_side_tables([a, b]) == want == combine._merged_side_tables([a, b])
    b.attrs["construct"] = '{"q":""}'
    assert combine._merged_side_tables([a, b])["construct"] == '{"x":"m","y":"","q":""}'
    c = xr.Dataset(attrs={"construct": {"w": ""}})  # a table held as a dict: merged as it is
    assert combine._merged_side_tables([c, a])["construct"] == '{"w":"","x":"m","y":""}'
