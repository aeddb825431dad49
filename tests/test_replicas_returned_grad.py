"""Which copy of a returned parameter's gradient departs: each rank's own backward records decide.

Real Megatron-Core tp2pp2 dump (``data_samples/megatron/tp2pp2``, step 0): the second stage's ``linear_fc2`` is a
``skip_bias_add`` row-parallel layer, so msprobe records its bias gradient per micro-batch (the module's backward
``input.1``) and accumulated (``parameters_grad``). A copy scaled on one rank (a corrupted gradient accumulation,
the population's ``bias_grad_scale`` fault) is named by that rank, whichever it is, by ``replicas`` (a TP pair with
no clean run) and by ``diff`` against the unsharded run (which records no counterpart that could decide).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import precnb
from precnb.analysis.replicas.returned_grad import returned_grad_departures
from tests._cli_json import cli_json

MG = Path(__file__).resolve().parents[1] / "data_samples" / "megatron"
NODE = "Module.0.decoder.layers.1.mlp.linear_fc2.RowParallelLinear.parameters_grad.0"
LABEL = NODE + ".bias"

pytestmark = pytest.mark.skipif(not (MG / "tp2pp2").exists(), reason="data_samples/megatron missing")


def _two_steps(tmp: Path, name: str) -> Path:
    """The sample's step 0 dumped twice (steps 0 and 1): a replica check needs a step where the copies agree."""
    run = tmp / name
    shutil.copytree(MG / name / "step0", run / "step0")
    shutil.copytree(MG / name / "step0", run / "step1")
    return run


def _scaled(tmp: Path, rank: int, factor: float = 1.02) -> Path:
    """Two steps of the tp2pp2 dump; at step 1 *rank* recorded its accumulated bias gradient scaled by *factor*."""
    run = _two_steps(tmp, "tp2pp2")
    f = run / "step1" / f"rank{rank}" / "dump.json"
    doc = json.loads(f.read_text())
    rec = doc["data"][NODE]["bias"][0]
    for k in ("Max", "Min", "Mean", "Norm"):
        rec[k] = rec[k] * factor
    f.write_text(json.dumps(doc))
    return run


def test_healthy_copies_keep_the_identity() -> None:
    ds = precnb.open_run(MG / "tp2pp2", steps=[0])
    assert LABEL in ds.indexes["tensor"]
    assert returned_grad_departures(ds, LABEL, step=0, ranks=[2, 3]) is None
    # a parameter its module does not return has no such record: no decision
    assert returned_grad_departures(ds, NODE + ".weight", step=0, ranks=[2, 3]) is None


@pytest.mark.slow
@pytest.mark.parametrize("rank", [2, 3])
def test_the_scaled_copy_is_named(tmp_path: Path, rank: int) -> None:
    run = _scaled(tmp_path, rank)
    got = returned_grad_departures(precnb.open_run(run, steps=[1]), LABEL, step=1, ranks=[2, 3])
    assert got is not None and got["rank"] == rank
    assert "not the sum of the gradients" in got["why"]

    rep = cli_json(tmp_path, "replicas", str(run))
    f = rep  # the CLI's JSON answer is the finding
    assert (f["step"], f["rank"], f["tensor"]) == (1, rank, LABEL)
    assert "own records decides" in f["reason"]

    base = _two_steps(tmp_path, "tp1pp1")
    diff = cli_json(tmp_path, "diff", str(base), str(run), "--target-layout", "tp=2,pp=2")
    d = diff
    assert d["step"] == 1 and d["node"].endswith("layers.3.mlp.linear_fc2.RowParallelLinear.parameters_grad.0")
    assert d["evidence"]["dump"]["rank"] == rank
    assert d["values"]["shard_rank"] == rank
