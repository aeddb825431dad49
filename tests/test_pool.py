"""Local worker processes for parsing (precnb.io._pool): same results as in-process, never a lost file."""

from __future__ import annotations

import os
import shutil

import pytest
import xarray as xr

import precnb
from precnb.io import _pool
from precnb.io._assemble import LoadReport
from precnb.io.executor import parse_files
from tests.conftest import open_quiet as _open
from tests.conftest import sample_path

_PARENT = os.getpid()


def _pid_of(item):
    return (item, os.getpid())


def _die_in_worker(item):
    if os.getpid() != _PARENT and item == 3:
        os._exit(1)  # a worker killed mid-task (as by the out-of-memory killer)
    return item * 10




pytestmark = pytest.mark.usefixtures("fresh_pool")


@pytest.mark.parametrize("name", ["dp_nan", "tp/tp2", "monitor"])
def test_two_workers_load_identical_to_in_process(name):
    path = sample_path(*name.split("/"))
    xr.testing.assert_identical(_open(path, workers=2), _open(path, workers=1))


def test_parse_files_runs_in_other_processes_in_item_order():
    items = list(range(40))
    out = parse_files(items, _pid_of, describe=str, report=LoadReport(), workers=2, progress=False)
    assert [i for i, _ in out] == items
    assert {pid for _, pid in out} - {_PARENT}, "no item was parsed in a worker"


def test_few_items_stay_in_process():
    out = parse_files([1, 2, 3], _pid_of, describe=str, report=LoadReport(), workers=2, progress=False)
    assert {pid for _, pid in out} == {_PARENT}


def test_a_dead_worker_loses_no_item():
    items = list(range(12))
    rep = LoadReport()
    out = parse_files(items, _die_in_worker, describe=str, report=rep, workers=2, progress=False)
    assert out == [i * 10 for i in items]
    assert rep.read == [str(i) for i in items] and not rep.skipped
    # the next load starts a fresh pool
    out = parse_files(items, _pid_of, describe=str, report=LoadReport(), workers=2, progress=False)
    assert [i for i, _ in out] == items


def test_broken_rank_file_reported_the_same_with_workers(tmp_path):
    src = sample_path("dp_nan")
    dst = tmp_path / "dp_nan"
    shutil.copytree(src, dst)
    victim = dst / "step1" / "rank1" / "dump.json"
    victim.write_text('{"task": "statistics", "data": {')
    ds1, ds2 = _open(dst, workers=1), _open(dst, workers=2)
    xr.testing.assert_identical(ds1, ds2)
    rep = precnb.load_report(ds2)
    assert len(rep.skipped) == 1 and str(victim) in rep.skipped[0][0]
    assert ds2["present"].sel(step=1, rank=0).any()  # the other rank of that step still loaded


def test_resolve_workers(monkeypatch):
    monkeypatch.delenv("PRECNB_WORKERS", raising=False)
    auto = min(_pool.available_cpus(), _pool.MAX_AUTO_WORKERS)
    assert _pool.resolve_workers(None) == auto  # the one default, everywhere
    assert _pool.resolve_workers(3) == 3
    assert _pool.resolve_workers("auto") == auto == _pool.resolve_workers(0)
    monkeypatch.setenv("PRECNB_WORKERS", "2")
    assert _pool.resolve_workers(None) == 2
    monkeypatch.setenv("PRECNB_WORKERS", "auto")
    assert _pool.resolve_workers(None) == auto
    monkeypatch.setenv("PRECNB_WORKERS", "many")
    with pytest.raises(ValueError, match="integer or 'auto'"):
        _pool.resolve_workers(None)
    with pytest.raises(ValueError, match=">= 0"):
        _pool.resolve_workers(-1)


def test_cli_rejects_bad_workers(capsys):
    from precnb.cli import main

    assert main(["info", str(sample_path("healthy")), "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err
