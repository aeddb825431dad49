"""The dask-distributed path: one task per (step, rank) file on a 2-worker LocalCluster gives
exactly the in-process datasets and findings."""

from __future__ import annotations

import warnings

import pytest
import xarray as xr

import precnb
from precnb.io import executor
from tests.conftest import ROOT, shared_path

distributed = pytest.importorskip("distributed")

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

S1 = ("data_samples", "msprobe", "S1_baseline")
S5 = ("data_samples", "msprobe", "S5_tp_shards")


@pytest.fixture(scope="module")
def client():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                                           processes=True)
        c = distributed.Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def _sample(*parts: str):
    p = ROOT.joinpath("data_samples", *parts)
    if not p.exists():
        pytest.skip(f"bundled sample {p} missing")
    return p


@pytest.mark.parametrize("parts", [(*S1, "statistics"), (*S1, "md5"), (*S5, "tp2")], ids=lambda p: "/".join(p[-2:]))
def test_cluster_load_identical_to_in_process(client, parts):
    root = shared_path(*parts)
    local = precnb.open_run(root, progress=False)
    remote = precnb.open_run(root, client=client, progress=False)
    xr.testing.assert_identical(local, remote)
    assert local.attrs == remote.attrs


def test_tasks_run_on_the_workers(client):
    root = shared_path(*S5, "tp2")
    before = sum(len(v) for v in client.run(lambda dask_worker: dask_worker.state.log).values())
    precnb.open_run(root, client=client, progress=False)
    after = sum(len(v) for v in client.run(lambda dask_worker: dask_worker.state.log).values())
    assert after > before  # the workers did the parsing


def test_findings_identical_on_real_samples(client):
    root = shared_path(*S1, "statistics")
    local = precnb.open_run(root, progress=False)
    remote = precnb.open_run(root, client=client, progress=False)
    assert precnb.nan_origin(local).to_dict() == precnb.nan_origin(remote).to_dict()
    b = precnb.open_run(shared_path(*S5, "tp2"), progress=False)
    b_remote = precnb.open_run(shared_path(*S5, "tp2"), client=client, progress=False)
    t = precnb.open_run(shared_path(*S5, "tp2"), steps=[1], progress=False).assign_coords(step=[0])
    t_remote = precnb.open_run(shared_path(*S5, "tp2"), steps=[1], client=client, progress=False
                               ).assign_coords(step=[0])
    assert precnb.first_divergence(b, t).to_dict() == precnb.first_divergence(b_remote, t_remote).to_dict()


def test_fault_findings_identical_on_bundled_samples(client):
    nan_root = _sample("dp_nan")
    local = precnb.nan_origin(precnb.open_run(nan_root, progress=False))
    remote = precnb.nan_origin(precnb.open_run(nan_root, client=client, progress=False))
    assert local.kind == "nan_origin" and local.to_dict() == remote.to_dict()
    base, target = _sample("divergence", "baseline"), _sample("divergence", "target")
    local = precnb.first_divergence(precnb.open_run(base, progress=False), precnb.open_run(target, progress=False))
    remote = precnb.first_divergence(precnb.open_run(base, client=client, progress=False),
                                     precnb.open_run(target, client=client, progress=False))
    assert local.kind == "first_divergence" and local.to_dict() == remote.to_dict()


def test_ambient_client_is_used(client, monkeypatch):
    monkeypatch.delenv("PRECNB_NO_DASK_CLIENT", raising=False)
    with client.as_current():
        assert executor._ambient_client() is client
        root = shared_path(*S5, "tp2")
        xr.testing.assert_identical(precnb.open_run(root, progress=False),
                                    precnb.open_run(root, progress=False))  # client=None: the ambient one


@pytest.mark.slow  # make test runs it; make test-fast stays under 5 minutes (RESULTS_tests.md)
def test_broken_file_reported_like_in_process(client, tmp_path):
    import shutil

    root = tmp_path / "run"
    shutil.copytree(shared_path(*S5, "tp2"), root)
    (root / "step1" / "rank1" / "dump.json").write_text('{"data": {"Functional.linear.0.forward": ')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        local = precnb.open_run(root, progress=False)
        remote = precnb.open_run(root, client=client, progress=False)
    xr.testing.assert_identical(local, remote)
    assert len(precnb.load_report(remote).failures) == 1
    with pytest.raises(precnb.errors.DumpFormatError):
        precnb.open_run(root, client=client, errors="raise", progress=False)


@pytest.mark.slow
def test_streaming_zarr_on_the_cluster(client, tmp_path):
    root = shared_path(*S1, "statistics")
    store = precnb.to_zarr(root, tmp_path / "s1.zarr", client=client, progress=False)
    xr.testing.assert_identical(precnb.open_run(root, progress=False), precnb.open_run(store))
    lazy = precnb.open_run(store, lazy=True)
    assert precnb.nan_origin(lazy).to_dict() == precnb.nan_origin(precnb.open_run(root, progress=False)).to_dict()
