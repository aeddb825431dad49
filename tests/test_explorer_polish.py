"""Issue 26 items 6 and 8: the detail table holds the selected record; wording and colours a user reads."""

from __future__ import annotations

import numpy as np
import pytest

import precnb
from tests.conftest import open_quiet, sample_path


def test_detail_frame_always_holds_the_selected_record():
    """The window of execution order is around the record, not the first rows (item 6)."""
    from precnb.viz import detail_frame

    t = precnb.diagnose(sample_path("moe_empty_expert"))
    f = t.finding
    ds = t.target
    full = detail_frame(ds, step=f.step, rank=f.rank, limit=10_000)
    pos = int(np.flatnonzero(full["tensor"].to_numpy() == f.tensor)[0])
    assert pos >= 10  # far from the first records: the old first-10 window missed it
    win = detail_frame(ds, step=f.step, rank=f.rank, limit=10, focus=f.tensor)
    assert f.tensor in set(win["tensor"]) and len(win) == 10
    assert win.attrs["rows_total"] == len(full) and win.attrs["first_row"] == pos - 2
    assert list(win["tensor"]) == list(full["tensor"].iloc[pos - 2:pos + 8])


def test_suspects_say_their_whole_reason_and_epochs_in_words():
    from precnb.widgets.findings import suspect_label

    f = precnb.diagnose(sample_path("dp_nan")).finding
    s = next(x for x in f.suspects[1:] if "inherited" in x["why"])
    assert suspect_label(s).endswith("(inherited via communication)")  # no "inherited via co…"
    t = precnb.diagnose(sample_path("dp_sum", "target"), baseline=sample_path("dp_sum", "baseline")).finding
    whys = [x["why"] for x in t.suspects if x["why"].startswith("first difference")]
    assert whys and all("epoch" not in w and "collectives at that step" in w for w in whys), whys


def test_alignment_legend_tells_every_way_of_pairing_apart():
    from precnb.viz.alignment import _HOW_COLORS

    assert len(set(_HOW_COLORS.values())) == len(_HOW_COLORS)


def test_a_dump_plan_never_says_about_0_b():
    ds = open_quiet(sample_path("dp_nan")).copy(deep=True)
    ds["numel"][:] = -1  # no element counts in the statistics (a kernel or monitor source)
    t = precnb.diagnose(ds)
    plan = t.finding.dump_plan
    assert plan is not None and "0 B" not in plan["summary"] and "size unknown" in plan["summary"]
    assert plan["estimate"] == "unknown"


def test_explorer_suspect_buttons_are_not_clipped():
    pytest.importorskip("ipywidgets")
    from precnb.widgets import explore
    from precnb.widgets._views import EXPLORER_CSS as _CSS

    ex = explore(sample_path("dp_nan"))
    [b] = [c for c in ex.bar.suspects.children if hasattr(c, "click")]
    assert b.description.endswith("(inherited via communication)") and b.layout.max_width == "100%"
    assert ".precnb-suspect {white-space: normal" in _CSS
