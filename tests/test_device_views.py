"""The device beside the rank in the explorer's rank view and in the report; the suspect marked (issue 28, item 5)."""

from __future__ import annotations

import pytest

import precnb

pytest.importorskip("ipywidgets")
pytest.importorskip("altair")

SDC = precnb.sample_path("sdc")
CLEAN = precnb.sample_path("sdc_clean")
OPTS = {"target_layout": "tp=2,dp=2", "workers": 1}


def test_explorer_rank_view_names_devices_and_marks_the_suspect():
    from precnb.widgets import explore

    ex = explore(SDC / "job2", rank_table=SDC / "rank_tables" / "job2.json", replica_baseline=CLEAN, **OPTS)
    assert (ex.finding.kind, ex.finding.step, ex.finding.rank) == ("replica_mismatch", 2, 2)
    wf = ex.heat.where_frame_
    by_rank = dict(zip(wf["rank_lo"].astype(int), wf["device"], strict=True))
    assert by_rank == {0: "10.0.0.2:1", 1: "10.0.0.1:0", 2: "10.0.0.1:1 (suspect)", 3: "10.0.0.2:0"}
    assert "devices: rank 2 on 10.0.0.1:1 (suspect)" in ex.where.caption.value
    spec = ex.where.chart.to_dict() if hasattr(ex.where.chart, "to_dict") else ex.where.chart.chart.to_dict()
    assert "host:device" in str(spec)
    # without a table: no device column, no caption
    ex = explore(SDC / "job2", **OPTS)
    assert "device" not in ex.heat.where_frame_ and "devices:" not in ex.where.caption.value


def test_report_shows_the_device_beside_the_rank(tmp_path):
    from precnb.report import write_html

    t = precnb.diagnose(SDC / "job1", rank_table=SDC / "rank_tables" / "job1.csv", replica_baseline=CLEAN,
                        kinds=["replica_mismatch"], **OPTS)
    html = write_html(t, tmp_path / "r.html").read_text()
    assert "10.0.0.1:1 — suspect device (the wrong side of the departure)" in html
    assert "<th>device</th>" in html  # the suspects table's column
    t = precnb.diagnose(SDC / "job1", rank_table=SDC / "rank_tables" / "job1.csv", kinds=["replica_mismatch"], **OPTS)
    html = write_html(t, tmp_path / "r2.html").read_text()
    assert "10.0.0.1:1 — one of 2 candidate devices (also rank 0 on 10.0.0.1:0)" in html
