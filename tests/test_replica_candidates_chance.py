"""precnb.analysis.replicas.candidates: copies that agree by chance at the first step are not replicas (issue #47).

Draw 7's healthy tp2 run (seed 3471, held out) had, at step 1, its first masked softmax's output bit for bit the same
on both TP ranks (other heads, but the causal mask's zeros and ones fix Max, Min and Mean, and the Norm coincided),
while the softmax's inputs differed. The rule "bit-identical at the first step that shows it" made that output, and
the attention dropout's input holding it, replicas; at step 2 they "departed" (`replicas` and `diagnose`). Here the
committed healthy tp2pp1 run (``data_samples/megatron_pop``, seed 2033, steps 0-4) is given the same coincidence.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import precnb
from precnb.analysis.layout import Layout
from precnb.analysis.replicas import check_replicas

POP = Path(__file__).resolve().parents[1] / "data_samples" / "megatron_pop"
RUN = "r376997605075"  # healthy tp2pp1, seed 2033, steps 0-4

pytestmark = pytest.mark.skipif(not (POP / "runs" / RUN).exists(), reason="data_samples/megatron_pop missing")


def _coincide(ds, label: str, step_index: int):
    """Rank 1's entries holding *label*'s value at *step_index* (bit for bit: the records of the op, of the module
    returning it, of the next op's input) set to rank 0's: copies that agree by chance there."""
    import numpy as np

    out = ds.copy(deep=True)
    stats = np.stack([ds[s].values[step_index] for s in ("max", "min", "mean", "norm")], axis=-1)  # (rank, t, 4)
    j = list(ds["tensor"].values).index(label)
    cols = np.flatnonzero((stats[1] == stats[1, j]).all(axis=-1))
    for s in ("max", "min", "mean", "norm"):
        v = out[s].values
        v[step_index, 1, cols] = v[step_index, 0, cols]
    return out


def test_copies_equal_by_chance_where_their_inputs_differ_are_not_replicas():
    gt = json.loads((POP / "ground_truth.json").read_text(encoding="utf-8"))
    assert gt["runs"][RUN]["spec"]["layout"] == "tp2pp1" and not gt["runs"][RUN]["spec"]["bugs"]
    run = precnb.open_run(POP / "runs" / RUN / "dump", workers=1)
    layout = Layout.coerce("tp=2", 2)
    assert check_replicas(run, layout).kind == "none"
    soft = "Functional.softmax.0.forward"
    j = list(run["tensor"].values).index(f"{soft}.input.0")
    assert (run["max"].values[:, 0, j] != run["max"].values[:, 1, j]).all()  # other heads: the inputs differ
    chance = _coincide(run, f"{soft}.output.0", 1)  # step 1: the first of the steps 1-4 label group
    assert check_replicas(chance, layout).kind == "none", check_replicas(chance, layout).reason


def test_copies_equal_where_their_inputs_agree_still_depart():
    """The rule still holds for a true copy: a replicated tensor (the first layernorm's output) equal on both ranks at
    its first step, changed on rank 1 from step 2 on, departs there."""
    run = precnb.open_run(POP / "runs" / RUN / "dump", workers=1)
    node = next(str(n) for n in run["node"].values if str(n).startswith("Module.0.decoder.layers.0.input_layernorm")
                and str(n).endswith("forward.0"))
    j = list(run["tensor"].values).index(f"{node}.output.0")
    assert (run["norm"].values[:, 0, j] == run["norm"].values[:, 1, j]).all()
    out = run.copy(deep=True)
    v = out["norm"].values
    v[2:, 1, j] *= 1.001
    got = check_replicas(out, Layout.coerce("tp=2", 2))
    assert (got.kind, got.step) == ("replica_mismatch", 2), got.reason


def test_a_value_a_module_call_all_reduces_is_not_a_chance_copy():
    """A row-parallel linear's module record has the rank's shard as input and the all-reduced output: its copies
    agree while its inputs differ, by construction, not by chance. Counted as chance, it carried "chance" down the
    residual stream, and a layernorm output that went NaN on one rank (draw 2's and draw 7's eps = -1 faults) was
    no longer a replica: `replicas` said all agree."""
    run = precnb.open_run(POP / "runs" / RUN / "dump", workers=1)
    node = "Module.0.decoder.layers.2.pre_mlp_layernorm.RMSNorm.forward.0"
    j = list(run["tensor"].values).index(f"{node}.output.0")
    out = run.copy(deep=True)
    for s in ("max", "min", "mean", "norm"):
        out[s].values[1:, 1, j] = float("nan")  # from step 1 on, as the injected eps = -1
    got = check_replicas(out, Layout.coerce("tp=2", 2))
    assert (got.kind, got.step, got.node) == ("replica_mismatch", 1, node), got.reason
