"""Discovery restricted to steps / ranks: the same folders and reports as the whole discovery, filtered,
without listing the step folders it was not asked for (a step-wise search over a 100-step run)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from precnb.errors import NotADumpError
from precnb.io._assemble import LoadReport
from precnb.io.msprobe.discover import discover
from precnb.io.msprobe.load import available_steps, select_rank_dirs

disc = importlib.import_module("precnb.io.msprobe.discover")  # the module (the package exports the function)
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data_samples" / "msprobe"


def _tree(root: Path) -> Path:
    """Steps 0-5 × rank0-3, with the folders discovery must report: a rank folder without dump.json (step 3),
    rank1 beside rank01 (step 4), proc folders (step 5), a broken symlink and a loop (step 2)."""
    for s in range(5):
        for r in range(4):
            d = root / f"step{s}" / f"rank{r}"
            d.mkdir(parents=True)
            (d / "dump.json").write_text('{"data": {}}')
    (root / "step3" / "rank2" / "dump.json").unlink()
    (root / "step4" / "rank01").mkdir()
    (root / "step4" / "rank01" / "dump.json").write_text('{"data": {}}')
    for p in ("proc7", "proc9"):
        (root / "step5" / p).mkdir(parents=True)
        (root / "step5" / p / "debug.json").write_text('{"data": {}}')
    (root / "step2" / "rank8").symlink_to(root / "nowhere")
    (root / "step2" / "rank9").symlink_to(root / "step2")
    (root / "step1" / "rank3" / "dump.json").unlink()
    (root / "step1" / "rank3" / "dump.json").symlink_to(root / "step0" / "rank3" / "dump.json")
    return root


def _whole(root: Path, steps=None, ranks=None):
    rep = LoadReport()
    out = discover(root, rep)
    keep = [d for d in out if (steps is None or d.step in steps) and (ranks is None or d.rank in ranks)]
    return keep, rep


@pytest.mark.parametrize("steps,ranks", [([0], None), ([3, 4], None), ([2], [1, 8]), (None, [0, 3]), ([5], [1]),
                                         ([1, 5], [0, 1]), ([4], [1])])
def test_filtered_equals_whole(tmp_path, steps, ranks):
    root = _tree(tmp_path / "d")
    want, whole_rep = _whole(root, steps, ranks)
    rep = LoadReport()
    got = discover(root, rep, steps=steps, ranks=ranks)
    assert got == want
    # what is reported: the whole discovery's reports about the chosen steps' folders (and no others)
    chosen = {f"step{s}" for s in (steps if steps is not None else range(6))}
    assert all(Path(p).relative_to(root).parts[0] in chosen for p, _ in rep.skipped)
    if ranks is None:
        assert sorted(rep.skipped) == sorted(x for x in whole_rep.skipped
                                             if Path(x[0]).relative_to(root).parts[0] in chosen)


def test_unchosen_steps_are_not_listed(tmp_path, monkeypatch):
    root = _tree(tmp_path / "d")
    listed: list[str] = []
    real = os.scandir

    def scandir(p="."):
        listed.append(Path(p).name)
        return real(p)

    monkeypatch.setattr(disc.os, "scandir", scandir)
    discover(root, steps=[4])
    assert listed == ["step4"]
    listed.clear()
    assert available_steps(root) == [0, 1, 2, 3, 4, 5]
    assert sorted(listed) == [f"step{s}" for s in range(6)]


def test_first_stops_at_one_rank_per_step(tmp_path):
    root = _tree(tmp_path / "d")
    got = discover(root, first=True)
    assert [(d.step, d.rank) for d in got] == [(s, 0) for s in range(5)] + [(5, 0)]
    assert available_steps(root, ranks=[2]) == [0, 1, 2, 4]  # step 3's rank2 has no dump.json
    assert available_steps(root, ranks=[1]) == [0, 1, 2, 3, 4, 5]  # step 5: proc9 is rank 1
    assert available_steps(root, ranks=[77]) == []


def test_selection_errors_keep_their_messages(tmp_path):
    root = _tree(tmp_path / "d")
    with pytest.raises(NotADumpError, match="no \\(step, rank\\) folder matches the selection"):
        select_rank_dirs(root, LoadReport(), [99], None)
    empty = tmp_path / "empty"
    (empty / "step0" / "rank0").mkdir(parents=True)
    with pytest.raises(NotADumpError, match="no msprobe dump found"):
        select_rank_dirs(empty, LoadReport(), [0], None)
    with pytest.raises(NotADumpError, match="no msprobe dump found"):
        available_steps(empty, ranks=[0])


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared samples absent")
@pytest.mark.parametrize("sample", ["S1_baseline", "S5_tp_shards", "S13_ms_vs_pt"])
def test_real_samples(sample):
    roots = sorted({p.parent.parent.parent for p in (SHARED / sample).rglob("dump.json")
                    if p.parent.parent.name.startswith("step")})
    assert roots
    for root in roots:
        whole = discover(root)
        steps = sorted({d.step for d in whole})
        ranks = sorted({d.rank for d in whole})
        assert available_steps(root) == steps
        assert discover(root, steps=steps[:1]) == [d for d in whole if d.step == steps[0]]
        assert discover(root, steps=steps[-1:], ranks=ranks[-1:]) == [
            d for d in whole if d.step == steps[-1] and d.rank == ranks[-1]]


def test_tensor_files_found_without_listing_every_rank(tmp_path):
    from precnb.pipeline.tensors import has_tensor_files

    root = _tree(tmp_path / "d")
    assert not has_tensor_files(root)
    (root / "step0" / "rank2" / "dump_tensor_data").mkdir()  # any rank of the first step
    assert has_tensor_files(root)
    (root / "step0" / "rank2" / "dump_tensor_data").rmdir()
    (root / "step3" / "rank0" / "dump_tensor_data").mkdir()  # the first rank of a later step
    assert has_tensor_files(root) and has_tensor_files(root / "step3") and has_tensor_files(root / "step3" / "rank0")
    assert not has_tensor_files(root / "step4")
