"""The pipeline's step-wise search and side inputs are Diagnosis hooks, not kind branches (issue #27 item 2).

A diagnosis registered from this file alone, needing the first two steps of a pair (``first_steps=2``),
runs beside the first divergence's step-wise search on the bundled ``divergence`` pair (fault at step 1
of steps 0-2: the search stops there and step 2 is never read), and one with an ``inputs`` hook named as
``"module:function"`` gets what that hook read in its context.
"""

from __future__ import annotations

from typing import Any

import pytest

import precnb
from precnb.analysis.findings import Finding
from precnb.analysis.registry import Context, Diagnosis, register, unregister
from tests.conftest import sample_path

SEEN: dict[str, Any] = {}


def _first_steps_run(ctx: Context) -> Finding:
    SEEN["steps"] = sorted(int(s) for s in ctx.target["step"].values)
    return Finding(kind="none", reason="toy: looked at the first steps")


def side_input(source: Any, options: Any, raw_target: Any, *, loaded: Any, common: dict[str, Any]) -> dict[str, Any]:
    """The ``inputs`` hook: what the toy reads beside the run (here: the run's rank count)."""
    return {"toy_ranks": int(raw_target.sizes["rank"])}


def _with_input(ctx: Context) -> Finding:
    return Finding(kind="none", reason=f"toy ranks {ctx.params['toy_ranks']}")


EARLY = Diagnosis(kind="toy_first_steps", title="Toy first steps", priority=5, mode="pair", run=_first_steps_run,
                  description="toy: a check of the first two steps", first_steps=2)
SIDE = Diagnosis(kind="toy_side_input", title="Toy side input", priority=6, mode="any", run=_with_input,
                 description="toy: reads beside the run", inputs=f"{__name__}:side_input")


@pytest.fixture
def hooks():
    register(EARLY)
    register(SIDE)
    SEEN.clear()
    yield
    unregister(EARLY.kind)
    unregister(SIDE.kind)


def test_a_first_steps_diagnosis_runs_beside_the_stepwise_search(hooks):
    base, target = sample_path("divergence", "baseline"), sample_path("divergence", "target")
    t = precnb.diagnose(target, baseline=base, kinds=["first_divergence", EARLY.kind])
    f = t.finding
    assert (f.kind, f.step, f.rank) == ("first_divergence", 1, 0)
    assert f.stats["steps_not_searched"] == [2]  # the step-wise path was taken: step 2 not read
    assert SEEN["steps"] == [0, 1]  # the toy saw the first two steps, as the search read them
    assert t.result(EARLY.kind).reason == "toy: looked at the first steps"
    assert "toy first steps on baseline steps 0, 1" in t.notes
    assert [c["kind"] for c in t.checks] == [EARLY.kind, "first_divergence"]


def test_a_diagnosis_needing_every_step_reads_the_pair_whole(hooks):
    base, target = sample_path("divergence", "baseline"), sample_path("divergence", "target")
    t = precnb.diagnose(target, baseline=base, kinds=["first_divergence", SIDE.kind])
    assert (t.finding.step, t.finding.rank) == (1, 0)
    assert "steps_not_searched" not in t.finding.stats  # whole read: every step
    assert t.result(SIDE.kind).reason == f"toy ranks {int(t.raw_target.sizes['rank'])}"


def test_inputs_hook_given_as_a_callable(hooks):
    unregister(SIDE.kind)
    register(Diagnosis(kind=SIDE.kind, title=SIDE.title, priority=6, mode="any", run=_with_input,
                       description=SIDE.description, inputs=side_input))
    t = precnb.diagnose(sample_path("dp_nan"), kinds=[SIDE.kind])
    assert t.finding.reason == f"toy ranks {int(t.target.sizes['rank'])}"
