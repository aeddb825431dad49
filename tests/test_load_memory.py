"""What a large load keeps once (issue #30 item 2): the construct table's strings, its bytes, the signatures."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import precnb
from precnb.io._runfacts import FactsAccumulator
from precnb.io.msprobe.discover import discover
from precnb.io.msprobe.parse import read_rank_dir
from precnb.io.msprobe.sides import construct_table, parse_construct, read_sides
from precnb.io.records import LoadReport, SharedTable
from tests.conftest import shared_path


def _s1() -> Path:
    return shared_path("data_samples", "msprobe", "S1_baseline", "statistics")  # or skip without ../shared


def _rank_dir(root: Path):
    return discover(root, LoadReport())[0]


def test_parse_construct_keeps_one_object_per_parent_and_every_entry():
    raw = json.loads(json.dumps({f"Functional.relu.{i}.forward": None if i % 5 == 0 else f"Module.m{i % 3}.M.forward.0"
                                 for i in range(1000)}))
    want = {k: v or "" for k, v in raw.items()}
    parents, micro = parse_construct(raw)
    assert parents == want and list(parents) == list(want) and micro == {}
    assert len({id(v) for v in parents.values()}) == 4  # "" and three parents


def test_construct_table_without_its_bytes_pickles_to_the_same_table():
    folder = _rank_dir(_s1()).path
    notes: list[str] = []
    parents, _, _, construct, _ = read_sides(folder, notes)
    assert construct is not None and construct.raw is None and construct.get() is parents and len(parents) > 100
    back = pickle.loads(pickle.dumps(construct))
    assert back.key == construct.key and back.raw is not None
    assert back.get() == parents and list(back.get()) == list(parents)
    assert construct_table((folder / "construct.json").read_bytes()) == parents
    assert isinstance(SharedTable(("t", 1), None, json.loads, {"a": "b"}).__reduce__()[1][1], bytes)


def test_kept_node_names_are_the_construct_tables_objects():
    rd = _rank_dir(_s1())
    rec = read_rank_dir(rd)
    table = rec.construct.get()
    keys = {id(k) for k in table}
    named = [n for n in rec.coords["node"] if n in table]  # optimizer steps have no construct entry
    assert len(named) > 100 and all(id(n) in keys for n in named)


def test_rank_dependent_signatures_per_step():
    acc = FactsAccumulator()
    for rank in range(4):
        acc.add({"scalar_sigs": {"Torch.dropout.0.forward": "p=0.1", "Torch.roll.0.forward": f"s={rank % 2}"}},
                step=0, rank=rank)
        acc.add({"scalar_sigs": {"Torch.roll.0.forward": "s=0", "Torch.new.0.forward": "k=1"}}, step=1, rank=rank)
    assert json.loads(acc.attrs()["scalar_signatures"]) == {
        "Torch.roll.0.forward": {"0": {"default": "s=0", "at": {"1": "s=1", "3": "s=1"}}}}
    same = FactsAccumulator()
    same.add({"scalar_sigs": {"Torch.roll.0.forward": "s=0"}}, step=0, rank=0)
    same.add({"scalar_sigs": {"Torch.roll.0.forward": "s=0"}}, step=0, rank=1)
    assert "scalar_signatures" not in same.attrs()


def test_load_identical_with_worker_processes(monkeypatch):
    """The construct table crosses from worker processes as its own text: the same dataset as one process."""
    from precnb.io import _pool

    one = precnb.open_run(_s1(), workers=1, progress=False)
    used = []
    real = _pool.outcomes_in_processes
    monkeypatch.setattr(_pool, "MIN_PARALLEL_BYTES", 0)  # a small run in processes all the same
    monkeypatch.setattr(_pool, "outcomes_in_processes", lambda *a, **k: used.append(1) or real(*a, **k))
    two = precnb.open_run(_s1(), workers=2, progress=False)
    assert used, "the files were not parsed in worker processes"
    assert json.loads(one.attrs["construct"]) and one.attrs["construct"] == two.attrs["construct"]
    assert one.identical(two)
