"""precnb.analysis.causal.earliness: the causal order the explorer's "first bad" colour is drawn in.

Synthetic grids pin each rule (step first; a rank whose first flagged record is its own before
one that inherited it through a collective; the earlier communication epoch; execution order);
on the bundled samples the order alone — without the triage's answer pinned first — puts the
ground truth's origin at position 0.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import precnb
from precnb.analysis.causal.earliness import bad_records, causal_positions, causal_positions_of
from precnb.analysis.compare import compare_runs
from tests.conftest import sample_path

AR = 0  # tensor 0: the output of a collective (Distributed.all_reduce.0.forward.output.0)
COMM = np.array([True, False, False])
ROLE = np.array(["output", "output", "output"])
NODES = np.array(["Distributed.all_reduce.0.forward", "Torch.x.0.forward", "Torch.y.0.forward"])


def _grid(n_steps: int = 1) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((n_steps, 2, 3), bool), np.full((n_steps, 2, 3), -1, np.int64)


def _order(pos: np.ndarray) -> list[tuple[int, int, int]]:
    """Flagged records as (step, rank, tensor), earliest first."""
    idx = np.argwhere(np.isfinite(pos))
    return [tuple(int(v) for v in i) for i in idx[np.argsort(pos[tuple(idx.T)])]]


def test_an_inherited_collective_output_comes_after_the_rank_that_made_it():
    # rank 0 reaches the collective early (seq 1): its output is bad, and so is what follows (y, seq 2);
    # rank 1 computes the bad x at seq 5, before its own all_reduce (seq 6)
    bad, seq = _grid()
    seq[0, 0] = [1, 0, 2]
    seq[0, 1] = [6, 5, 7]
    bad[0, 0, [AR, 2]] = True
    bad[0, 1, [1, AR]] = True
    pos = causal_positions(bad, seq, COMM, ROLE, nodes=NODES)
    assert _order(pos) == [(0, 1, 1), (0, 1, AR), (0, 0, AR), (0, 0, 2)]
    # execution order alone (no collective known) would blame rank 0
    blind = causal_positions(bad, seq, np.zeros(3, bool), ROLE, nodes=NODES)
    assert _order(blind)[0] == (0, 0, AR)


def test_own_records_before_the_first_collective_come_first():
    # rank 0's own bad y comes after a (clean) collective; rank 1's own bad x before it
    bad, seq = _grid()
    seq[0, 0] = [1, 0, 3]
    seq[0, 1] = [8, 7, 9]
    bad[0, 0, 2] = bad[0, 1, 1] = True
    pos = causal_positions(bad, seq, COMM, ROLE, nodes=NODES)
    assert _order(pos) == [(0, 1, 1), (0, 0, 2)]


def test_step_then_rank_then_execution_order_and_absent_positions_last():
    bad, seq = _grid(2)
    seq[:] = [0, 1, 2]
    seq[0, 1, 2] = -1  # recorded without a position: after the positioned ones of its rank
    bad[1, 0, 1] = True  # a later step, early in its step
    bad[0, 1, [1, 2]] = True
    bad[0, 0, 2] = True
    pos = causal_positions(bad, seq, np.zeros(3, bool), ROLE, nodes=NODES)
    # step 0: rank 0's first event (seq 2) vs rank 1's (seq 1): rank 1; then rank 0; then step 1
    assert _order(pos) == [(0, 1, 1), (0, 1, 2), (0, 0, 2), (1, 0, 1)]
    assert np.isnan(pos[~bad]).all()


def test_a_pinned_record_comes_first():
    bad, seq = _grid()
    seq[:] = [0, 1, 2]
    bad[0, 0, 1] = True
    pos = causal_positions(bad, seq, np.zeros(3, bool), ROLE, nodes=NODES, first=(0, 1, 2))
    assert _order(pos) == [(0, 1, 2), (0, 0, 1)]


def _origin(name: str) -> dict:
    gt = json.loads(sample_path(name, "ground_truth.json").read_text())
    return next(f for f in gt["faults"] if f.get("role") == "origin")


@pytest.mark.parametrize(("name", "runs"), [("dp_nan", ("dp_nan",)),
                                            ("divergence", ("divergence/baseline", "divergence/target"))])
def test_the_order_alone_puts_the_origin_first_on_the_samples(name, runs):
    """No pinning: the NaN run's events, and the pair's differences, ordered causally."""
    dss = [precnb.open_run(sample_path(*r.split("/")), progress=False) for r in runs]
    if len(dss) == 1:
        grid = dss[0]
        bad, seq = bad_records(grid)
    else:
        grid = dss[1]
        bad, seq = bad_records(grid, compare_runs(dss[0], dss[1]))
    pos = causal_positions_of(grid, bad, seq=seq)
    s, r, t = np.unravel_index(np.nanargmin(pos), pos.shape)
    gt = _origin(name)
    assert (int(grid["step"].values[s]), int(grid["rank"].values[r]), str(grid["node"].values[t])) == (
        gt["step"], gt["rank"], gt["node"])
    # the rank it spread to comes later in the same step
    spread = next(f for f in json.loads(sample_path(name, "ground_truth.json").read_text())["faults"]
                  if f.get("role") == "spread")
    ri = int(np.flatnonzero(grid["rank"].values == spread["rank"])[0])
    assert np.nanmin(pos[s, ri]) > 0
