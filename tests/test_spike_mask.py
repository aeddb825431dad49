"""A by-design ``-inf`` is never a loss spike's numerics cause (issue 47, item 7).

``data_samples/spike_data_mask`` is ``spike_data`` (rank 1's batch at step 6 holds unseen tokens)
in a model with causal self-attention: ``masked_fill(causal_mask, -inf)`` puts ``-inf`` in the
attention scores at every step and rank, and the softmax reads it. The data cause must come
first, and no cause or suspect may name the mask (or the softmax that reads it) as an overflow.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

import precnb
from precnb.analysis.spike import loss_spike
from tests.test_spike import SAMPLES, check, cli, expected, gt, inputs

NAME = "spike_data_mask"


def _mask_nodes() -> set[str]:
    return {n["node"] for n in gt(NAME)["not_causes"]}


def _no_mask_cause(f: dict) -> None:
    masks = _mask_nodes()
    assert masks == {"Tensor.masked_fill.0.forward"}
    for c in f["causes"]:
        assert c["node"] not in masks and "softmax" not in str(c["node"]), c
        assert not (c["cause"] == "numerics" and "overflow" in c["text"]), c
    for s in f["suspects"]:
        assert s["node"] not in masks and "overflow" not in s["why"], s


def test_the_sample_holds_the_mask_at_every_step():
    g = gt(NAME)
    masks = g["evidence"]["causal_mask"]
    assert sorted(masks) == [f"step{s}/rank{r}" for s in (5, 6, 7) for r in (0, 1)]
    assert all(m["Min"] == float("-inf") for m in masks.values())
    text = "\n".join(p.read_text(encoding="utf-8") for p in (SAMPLES / NAME).rglob("*.json"))
    assert "/work/" not in text and "/root/" not in text and "/tmp/" not in text  # no machine paths


def test_cli_puts_the_data_cause_first_not_the_causal_mask():
    dump, mon, loss = inputs(NAME)
    r = cli("spike", dump, "--monitor", mon, "--loss", loss, "--json")
    assert r.returncode in (0, 1), r.stderr
    f = json.loads(r.stdout)
    check(f, expected(NAME))
    _no_mask_cause(f)
    assert [c["cause"] for c in f["causes"]] == ["data"]


def test_diagnose_agrees():
    dump, mon, loss = inputs(NAME)
    t = precnb.diagnose(dump, monitor=mon, loss=loss, kinds=["loss_spike"])
    f = t.finding.to_dict()
    check(f, expected(NAME))
    _no_mask_cause(f)


@pytest.mark.parametrize("steps", [[5, 6], [5, 6, 7]])
def test_mask_new_in_the_window_is_still_by_design(steps):
    """The spike's step S and S-1 only: the mask's -inf at S-1 has no earlier step, and is still no overflow."""
    dump, mon, loss = inputs(NAME)
    ds = precnb.open_run(dump).sel(step=steps)
    f = loss_spike(ds, monitor=precnb.open_run(mon), loss=pd.read_csv(loss)).to_dict()
    assert f["causes"][0]["cause"] == "data" and f["rank"] == 1
    _no_mask_cause(f)


def test_a_real_overflow_is_still_found():
    """spike_numerics: the float16 x.pow(2) overflow (new at step 8) stays the first, numerics, cause."""
    dump, mon, loss = inputs("spike_numerics")
    f = loss_spike(precnb.open_run(dump), monitor=precnb.open_run(mon), loss=pd.read_csv(loss))
    first = f.causes[0]
    assert (first["cause"], first["node"], first["step"]) == ("numerics", "Tensor.pow.1.forward", 8)
    assert "overflow" in first["text"]
