"""The scalar-argument checksums are taken only where a step has several files to compare them between."""

from __future__ import annotations

import json

import precnb
from precnb.io.msprobe import load
from precnb.io.msprobe.discover import discover
from precnb.io.msprobe.parse import read_rank_dir


def test_a_file_read_without_signatures_differs_only_by_them():
    rd = discover(precnb.sample_path("megatron/tp2pp1"))[0]
    full, bare = read_rank_dir(rd), read_rank_dir(rd, signatures=False)
    assert full.meta["facts"]["scalar_sigs"]  # the sample's API calls have scalar arguments
    assert "scalar_sigs" not in bare.meta["facts"]
    assert {k: v for k, v in full.meta["facts"].items() if k != "scalar_sigs"} == bare.meta["facts"]
    assert full.labels == bare.labels and full.meta["warnings"] == bare.meta["warnings"]


def test_a_load_gives_the_attributes_it_gives_with_every_signature_taken(monkeypatch):
    path = precnb.sample_path("megatron/tp2pp1")
    lone = precnb.open_run(path, ranks=[0], workers=1, progress=False)
    both = precnb.open_run(path, workers=1, progress=False)
    assert json.loads(both.attrs["scalar_signatures"])  # the ranks' vocabulary offsets differ: compared
    monkeypatch.setattr(load, "_read_dir", lambda rd, shared: read_rank_dir(rd))  # every file with its checksums
    assert precnb.open_run(path, ranks=[0], workers=1, progress=False).attrs == lone.attrs
    assert precnb.open_run(path, workers=1, progress=False).attrs == both.attrs
