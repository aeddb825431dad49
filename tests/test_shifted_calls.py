"""A call made on one rank at one step only: its API's later labels there shift, and are paired by value (issue #48
item 5).

Small msprobe dumps written here: two steps on two ranks, a module call making four ``Tensor.__mul__`` calls of
distinct values and a ``Functional.linear`` after them. The variants add a call on one rank at one step (every later
``__mul__`` label there renumbered, as msprobe numbers them), remove one, or change one call's values.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import precnb
from precnb.analysis.compare import compare_runs
from precnb.analysis.compare.shifts import realign_shifted
from precnb.analysis.divergence import first_divergence
from precnb.combine import combine_runs

MLP = "Module.mlp.MLP.forward.0"


def _leaf(a: np.ndarray) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(a.shape), "Max": float(a.max()),
            "Min": float(a.min()), "Mean": float(a.mean()), "Norm": float(np.sqrt((a * a).sum())),
            "requires_grad": False}


def _write(root: Path, *, extra: tuple[int, int, int] | None = None, drop: tuple[int, int, int] | None = None,
           scale: tuple[int, int, int] | None = None, extra_everywhere: int | None = None) -> Path:
    """Two steps × two ranks. *extra* / *drop* / *scale* = (step, rank, k): a multiply by one after the k-th
    ``__mul__`` call, the k-th call not made, or its output scaled by 1.01, at that step and rank only;
    *extra_everywhere* = k: the multiply by one at every step and rank."""
    for step in range(2):
        for rank in range(2):
            rng = np.random.default_rng(10 * step + rank)
            x = rng.normal(size=(4, 8))
            data: dict = {}
            construct: dict = {}
            calls = []
            for k in range(4):
                y = x * (k + 2.0)
                if scale == (step, rank, k):
                    y = y * 1.01
                if drop != (step, rank, k):
                    calls.append((x, y))
                if extra == (step, rank, k) or extra_everywhere == k:
                    calls.append((y, y))  # a multiply by one: the same values
                x = y
            for i, (a, y) in enumerate(calls):
                node = f"Tensor.__mul__.{i}.forward"
                data[node] = {"input_args": [_leaf(a), {"type": "float", "value": 2.0}], "input_kwargs": {},
                              "output": [_leaf(y)]}
                construct[node] = [MLP, 0]
            out = x @ np.ones((8, 3))
            data["Functional.linear.0.forward"] = {"input_args": [_leaf(x)], "input_kwargs": {},
                                                   "output": [_leaf(out)]}
            construct["Functional.linear.0.forward"] = [MLP, 0]
            data[MLP] = {"input_args": [_leaf(rng.normal(size=(4, 8)))], "input_kwargs": {}, "output": [_leaf(out)]}
            construct[MLP] = [None, 0]
            d = root / f"step{step}" / f"rank{rank}"
            d.mkdir(parents=True)
            (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "mix", "framework": "pytorch",
                                                     "dump_data_dir": None, "data": data}), encoding="utf-8")
            (d / "construct.json").write_text(json.dumps(construct), encoding="utf-8")
    return root


def _runs(tmp_path: Path, **variant) -> tuple:
    base = precnb.open_run(_write(tmp_path / "base"), progress=False)
    targ = precnb.open_run(_write(tmp_path / "targ", **variant), progress=False)
    return base, targ


def test_an_extra_call_on_one_rank_at_one_step_is_named_and_the_later_calls_pair_by_value(tmp_path):
    base, targ = _runs(tmp_path, extra=(1, 1, 1))
    cmp = compare_runs(base, targ)
    assert not bool(cmp.differs.any())  # the renumbered calls compared with their counterparts, not neighbours
    assert [(x["step"], x["rank"], x["node"], x["only_in"], x["renumbered"]) for x in cmp.shifted_calls] == \
        [(1, 1, "Tensor.__mul__.2.forward", 1, 2)]
    f = first_divergence(base, targ)
    assert f.kind == "first_divergence" and (f.step, f.rank, f.node) == (1, 1, "Tensor.__mul__.2.forward")
    assert "runs in target but not in baseline" in f.reason, f.reason


def test_a_call_missing_on_one_rank_is_named_in_the_baselines_names(tmp_path):
    base, targ = _runs(tmp_path, drop=(1, 0, 2))
    cmp = compare_runs(base, targ)
    assert not bool(cmp.differs.any())
    assert [(x["step"], x["rank"], x["node"], x["only_in"]) for x in cmp.shifted_calls] == \
        [(1, 0, "Tensor.__mul__.2.forward", 0)]
    f = first_divergence(base, targ)
    assert "runs in baseline but not in target" in f.reason and f.baseline["node"] == "Tensor.__mul__.2.forward"
    own = base["max"].sel(step=1, rank=0, tensor=f.tensor).item()  # its own values, not those moved to its label
    assert f.values["baseline"]["max"] == own


def test_a_value_fault_is_not_paired_away(tmp_path):
    base, targ = _runs(tmp_path, scale=(1, 1, 2))
    cmp = compare_runs(base, targ)
    assert cmp.shifted_calls == []
    f = first_divergence(base, targ)
    assert f.kind == "first_divergence" and (f.step, f.rank) == (1, 1)
    assert f.node == "Tensor.__mul__.2.forward" and "runs in" not in f.reason


def test_runs_recorded_alike_are_returned_as_they_are(tmp_path):
    base, targ = _runs(tmp_path)
    both = combine_runs({"baseline": base, "target": targ})
    b, out, shifted = realign_shifted(base, both)
    assert b is base and out is both and shifted == []
    assert first_divergence(base, targ).kind == "none"


def test_the_baseline_side_holds_the_entries_it_is_compared_with(tmp_path):
    base, targ = _runs(tmp_path, extra=(1, 1, 1))
    cmp = compare_runs(base, targ)
    # at step 1 on rank 1 the baseline's third call is compared under the target's fourth label, and read there
    moved = cmp.base["max"].sel(step=1, rank=1, tensor="Tensor.__mul__.3.forward.output.0").item()
    own = base["max"].sel(step=1, rank=1, tensor="Tensor.__mul__.2.forward.output.0").item()
    assert moved == own
    assert not bool(cmp.base["present"].sel(step=1, rank=1, tensor="Tensor.__mul__.2.forward.output.0"))
    assert cmp.base["max"].sel(step=0, rank=1, tensor="Tensor.__mul__.2.forward.output.0").item() == \
        base["max"].sel(step=0, rank=1, tensor="Tensor.__mul__.2.forward.output.0").item()


def test_a_call_one_run_makes_at_every_step_and_rank_is_left_to_the_alignment(tmp_path):
    base, targ = _runs(tmp_path, extra_everywhere=1)  # alike everywhere (a layout's glue, another codebase's op)
    assert compare_runs(base, targ).shifted_calls == []
    f = first_divergence(base, targ)  # the alignment pairs the calls (and sets the multiply by one aside as glue)
    assert f.kind == "none", f.reason
