"""Merging data-parallel replicas dumped at level L1 (issue 47): on the committed dp2 run of megatron_pop.

At L1 msprobe writes no module records: the calls Megatron's linear layers make in their backward
(``Tensor.matmul``, ``Tensor.t`` of the incoming gradient) are told from forward calls only by the autograd
engine's frame on their stack. A replica's gradient is its own (the gradient of its own loss, before the
reduction), never a part of the whole batch's; a value saved by the forward and read in the backward still
concatenates to the whole batch's. And msprobe's call counters shift at step 1, so a shard class kept from an
earlier step batch must name the same call.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
POP = ROOT / "data_samples" / "megatron_pop"


def _runs() -> tuple[Path, Path]:
    gt = json.loads((POP / "ground_truth.json").read_text(encoding="utf-8"))
    h = next(h for h in gt["draws"]["subset"]["healthy"] if h["name"].startswith("dp2L1@"))
    return POP / "runs" / h["run"] / "dump", POP / "runs" / h["reference"] / "dump"


pytestmark = pytest.mark.skipif(not (POP / "ground_truth.json").exists(), reason="data_samples/megatron_pop missing")


def _merged(steps, like=None):
    import precnb
    from precnb.analysis.layout import Layout

    run, ref = _runs()
    t = precnb.open_run(str(run), steps=steps, progress=False)
    b = precnb.open_run(str(ref), steps=steps, progress=False)
    return precnb.merge_shards(t, Layout.coerce("dp=2", 2), reference=b, merge_dp=True, like=like), t, b


def test_backward_calls_found_by_their_stack_are_each_replicas_own():
    m, t, b = _merged([0])
    kind = m["shard_kind_dp"].to_series()
    # the gradient the linear layer's backward multiplies (2x the whole batch's: each replica's own loss)
    grad = "Tensor.matmul.0.forward.input.0"
    assert kind[grad] == "dp_local", kind[grad]
    assert float(t["norm"].sel(step=0, rank=0, tensor=grad)) > float(b["norm"].sel(step=0, rank=0, tensor=grad))
    # an activation saved by the forward, read by a backward call: the replicas hold its parts
    saved = "Tensor.mul_.0.forward.input.0"
    assert kind[saved] == "sharded", kind[saved]
    assert np.isclose(float(m["norm"].sel(step=0, rank=0, tensor=saved)),
                      float(b["norm"].sel(step=0, rank=0, tensor=saved)), rtol=1e-6)
    # a replica's own gradient counts the whole batch's elements (the alignment pairs it by name)
    assert int(m["numel"].sel(step=0, rank=0, tensor=grad)) == int(b["numel"].sel(step=0, rank=0, tensor=grad))


def test_a_class_kept_from_an_earlier_batch_names_the_same_call():
    """Tensor.__add__.3's second input is a batch part at step 0 and a replicated bias from step 1 (the counter
    shifts): merged step by step it must be the bias at step 1, not two concatenated copies of it."""
    first, _, _ = _merged([0])
    later, t, _ = _merged([1], like=first)
    lbl = "Tensor.__add__.3.forward.input.1"
    assert first["shard_kind_dp"].sel(tensor=lbl).item() == "sharded"
    own = float(t["norm"].sel(step=1, rank=0, tensor=lbl))
    assert float(t["norm"].sel(step=1, rank=1, tensor=lbl)) == own  # the replicas' copies of one bias
    assert float(later["norm"].sel(step=1, rank=0, tensor=lbl)) == own


def test_batches_joined_keep_each_labels_own_class():
    """The step-wise search joins its step batches: a label first recorded at step 1 (a backward call whose
    counter shifts) keeps the class its own batch gave it (each replica's own gradient: set aside), not the
    blank of step 0's coordinate, which made it a false divergence at step 1 of a healthy dp2 run at L1."""
    from precnb.combine import concat_steps

    first, _, _ = _merged([0])
    later, _, _ = _merged([1], like=first)
    new = [x for x in later["tensor"].values.tolist() if x not in set(first["tensor"].values.tolist())]
    assert new, "no label first recorded at step 1"
    joined = concat_steps([first, later])
    for lbl in new:
        assert joined["shard_kind_dp"].sel(tensor=lbl).item() == later["shard_kind_dp"].sel(tensor=lbl).item()
    assert "dp_local" in {later["shard_kind_dp"].sel(tensor=x).item() for x in new}
