"""The replica check reads the origin's scalar arguments with or without ``--layout`` (issue 28, item 2).

An op given a per-rank scalar argument (Megatron's vocab-parallel masks: ``Tensor.__lt__(ids, vocab_start)``)
differs by design; an op whose tensor inputs *and* scalar arguments are identical and whose output departs is
a compute fault (sdc: ``torch.rsqrt``) or, random, an unsynchronised seed (sdc_rank's ``torch.normal``, the
Megatron run's dropout). ``--tp 2`` (the layout from flags) reads the dump's records as ``--layout`` does; a
dataset without its path falls back on the reader's checksums of the scalar arguments.
"""

from __future__ import annotations

import json

import pytest

import precnb
from precnb.analysis.replicas import replica_mismatches
from precnb.analysis.replicas.departures import check_departures, departure_events
from precnb.cli import main

BOTH = ("tensors and scalar arguments", "its scalar arguments are identical")


def replicas(capsys, sample: str, *layout: str) -> dict:
    code = main(["replicas", str(precnb.sample_path(sample)), *layout, "--json", "--workers", "1"])
    assert code == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("sample", "layout", "step", "rank", "node", "cause", "says"), [
    ("sdc/job1", "tp=2,dp=2", 1, 1, "Torch.rsqrt.0.forward", "compute_fault",
     "its inputs (tensors and scalar arguments) are identical"),
    ("sdc_rank/job1", "tp=2,dp=2", 1, 1, "Torch.normal.0.forward", "unsynchronised_seed",
     "it has no tensor input and its scalar arguments are identical"),
    ("megatron/tp2pp1_dropout_unsync", "tp=2", 0, 1, "Functional.dropout.0.forward", "unsynchronised_seed",
     "its inputs (tensors and scalar arguments) are identical"),
])
def test_scalar_arguments_are_read_with_and_without_layout(capsys, sample, layout, step, rank, node, cause, says):
    got = []
    for flags in (["--tp", "2"], ["--layout", layout]):
        f = replicas(capsys, sample, *flags)
        dep = f["evidence"]["departure"]
        assert (f["kind"], f["step"], f["rank"], f["node"], dep["cause"]) == ("replica_mismatch", step, rank, node,
                                                                             cause)
        assert dep["scalar_args_identical"] is True and says in f["reason"], f["reason"]
        assert "not read" not in f["reason"]
        got.append((f["reason"], dep))
    assert got[0] == got[1]  # the same answer either way


@pytest.mark.parametrize("sample", ["megatron/tp2pp1", "megatron/tp2sp", "megatron/tp2pp1_wrong_shard"])
def test_megatron_vocab_masks_differ_by_design_with_and_without_layout(capsys, sample):
    for flags in (["--tp", "2"], ["--layout", "tp=2"]):
        f = replicas(capsys, sample, *flags)
        assert f["kind"] == "none", f["reason"]
        aside = {a.get("node"): a["why"] for a in f["evidence"]["set_aside"]}
        for op in ("Tensor.__lt__.0.forward", "Tensor.__ge__.0.forward"):
            assert "rank-dependent by design" in aside[op] and "scalar arguments do not" in aside[op]


def test_a_dataset_without_its_path_uses_the_readers_checksums():
    ds = precnb.open_run(precnb.sample_path("sdc/job1"), workers=1)
    layout = precnb.Layout.parse("tp=2,dp=2", world_size=4)
    dep = check_departures(ds, layout).evidence["departure"]  # no records callable: the checksums decide
    assert (dep["step"], dep["node"], dep["scalar_args_identical"]) == (1, "Torch.rsqrt.0.forward", True)
    # rank 1 called rsqrt with another scalar argument at step 1 (as the reader would note it): by design
    odd = ds.copy()
    odd.attrs["scalar_signatures"] = json.dumps({"Torch.rsqrt.0.forward": {"1": {"default": 5, "at": {"1": 6}}}})
    f = check_departures(odd, layout)  # the check itself sets the op aside as rank-dependent ...
    assert "Torch.rsqrt.0.forward" not in [d["node"] for d in f.evidence["departures"]]
    assert any(a.get("node") == "Torch.rsqrt.0.forward" and "scalar arguments" in a["why"]
               for a in f.evidence["set_aside"])
    rows, _ = replica_mismatches(ds, layout)  # ... and so does the classification of its departure
    events, aside = departure_events(odd, rows)
    assert [(e["step"], e["node"]) for e in events][:1] == [(3, "Torch.rsqrt.0.forward")]
    assert aside[0]["step"] == 1 and aside[0]["node"] == "Torch.rsqrt.0.forward"
    assert "scalar arguments differ across the replicas (a per-rank argument): different by design" in aside[0]["why"]
    # a run whose reader does not note the scalar arguments: said so, not guessed
    other = ds.copy()
    other.attrs["source_format"] = "something_else"
    f = check_departures(other, layout)
    assert f.evidence["departure"]["scalar_args_identical"] is None and "not read" in f.reason
