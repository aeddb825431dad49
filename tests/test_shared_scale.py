"""This session's scale paths on the real msprobe 26.2.0 samples in ../shared (skipped without it).

Worker processes, stepwise search, lazy (out-of-core) analysis and per-entry dtypes must give
on real dumps exactly what the in-memory, whole-run paths give.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import xarray as xr

import precnb
from precnb.analysis import anomaly_table, first_divergence, first_divergence_stepwise, nan_origin
from precnb.cli import main
from precnb.io.msprobe import discover
from precnb.schema import entry_dtype
from tests.conftest import open_quiet as _open
from tests.conftest import shared_path
from tests.test_io_msprobe import raw_leaves

S1 = ("data_samples", "msprobe", "S1_baseline")
S5 = ("data_samples", "msprobe", "S5_tp_shards")
S6 = ("data_samples", "msprobe", "S6_monitor", "monitor_output")




pytestmark = pytest.mark.usefixtures("fresh_pool")


# S1 md5 in make test only: the worker pool's path is S1 statistics' here, md5 reading is test_io_msprobe's (#53)
@pytest.mark.parametrize("parts", [(*S1, "statistics"), pytest.param((*S1, "md5"), marks=pytest.mark.slow),
                                   (*S5, "tp2"), S6])
def test_worker_processes_load_identical_to_in_process(parts):
    root = shared_path(*parts)
    xr.testing.assert_identical(_open(root, workers=2), _open(root, workers=1))


def test_stepwise_md5_vs_rerun_equals_whole_run_and_cli():
    md5, rerun = shared_path(*S1, "md5"), shared_path(*S1, "md5_rerun")

    def load(batch):
        return _open(md5, steps=batch), _open(rerun, steps=batch)

    f = first_divergence_stepwise(load, [0, 1])
    whole = first_divergence(_open(md5, steps=[0, 1]), _open(rerun))
    assert f.kind == whole.kind == "none" and f.reason == whole.reason
    assert f.stats["crc_only_records"] == whole.stats["crc_only_records"] == 107


def test_cli_diff_on_real_runs_reads_every_step_when_nothing_differs(capsys):
    """S1 statistics vs the md5 run of the same training: no value differs, all five steps read."""
    stats, md5 = shared_path(*S1, "statistics"), shared_path(*S1, "md5")
    assert main(["diff", str(stats), str(md5), "--json", "--workers", "2"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == first_divergence(_open(stats), _open(md5)).kind == "none"
    assert d["stats"]["steps"] == [0, 1, 2, 3, 4] and d["stats"]["steps_not_searched"] == []


def test_cli_diff_on_an_edited_real_dump_stops_after_the_changed_step(capsys, tmp_path):
    """One statistic of the real S1 dump changed at step 2, rank 0: found there, step 4 never read."""
    import shutil

    src = shared_path(*S1, "statistics")
    dst = tmp_path / "statistics"
    shutil.copytree(src, dst)
    f = next((dst / "step2").glob("*/dump.json"))  # a proc<PID> folder: rank 0
    text = f.read_text()
    doc = json.loads(text)
    node = next(n for n in doc["data"] if n.startswith("Functional.gelu"))
    doc["data"][node]["output"][0]["Max"] *= 2
    f.write_text(json.dumps(doc))
    next((dst / "step4").glob("*/dump.json")).write_text("{ broken: never read")
    assert main(["diff", str(src), str(dst), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["kind"], d["step"], d["rank"], d["node"]) == ("first_divergence", 2, 0, node)
    assert d["tensor"] == f"{node}.output.0"
    assert d["stats"]["steps_not_searched"] == [4]


@pytest.mark.slow
def test_lazy_analysis_on_real_zarr_stores_equals_in_memory(tmp_path):
    root = shared_path(*S1, "statistics")
    store = precnb.to_zarr(root, tmp_path / "s1.zarr", progress=False)
    lazy, eager = precnb.open_run(store, lazy=True), _open(root)
    assert lazy["max"].chunks is not None
    a, b = nan_origin(lazy), nan_origin(eager)
    assert (a.kind, a.evidence["benign_nodes"]) == (b.kind, b.evidence["benign_nodes"]) == ("none",
                                                                                            b.evidence["benign_nodes"])
    pd.testing.assert_frame_equal(anomaly_table(lazy), anomaly_table(eager))
    md5 = precnb.to_zarr(shared_path(*S1, "md5"), tmp_path / "md5.zarr", progress=False)
    rerun = precnb.to_zarr(shared_path(*S1, "md5_rerun"), tmp_path / "rerun.zarr", progress=False)
    f = first_divergence(precnb.open_run(md5, lazy=True), precnb.open_run(rerun, lazy=True))
    g = first_divergence(_open(shared_path(*S1, "md5")), _open(shared_path(*S1, "md5_rerun")))
    assert (f.kind, f.reason, f.stats["crc_only_records"]) == (g.kind, g.reason, g.stats["crc_only_records"])


def test_lazy_anomalies_on_real_monitor_data_equal_in_memory():
    ds = _open(shared_path(*S6))
    pd.testing.assert_frame_equal(anomaly_table(ds.chunk({"step": 1, "rank": 1})), anomaly_table(ds))
    f = precnb.anomalies(ds.chunk({"step": 1, "rank": 1}))
    assert (f.step, f.rank) == (2, 1)  # the spike injected at step 2 on rank 1


@pytest.mark.parametrize("parts", [(*S1, "statistics"), (*S1, "tensor"), (*S5, "tp2"), (*S5, "tp1")])
def test_every_entry_dtype_equals_the_real_dump_file(parts):
    root = shared_path(*parts)
    ds = _open(root)
    checked = 0
    for rd in discover(root):
        for label, leaf in raw_leaves(rd.dump_file).items():
            if "dtype" in leaf:
                assert entry_dtype(ds, label, rd.step, rd.rank) == leaf["dtype"], (label, rd.key)
                checked += 1
    assert checked > 500
