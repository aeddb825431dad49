"""Plan + run (issue #50 item 1): ``diagnose`` is ``run(make_plan(normalize(...)))`` and never calls itself.

A step-wise search with the pre-flight checks beside it (a pair of real Megatron-Core dumps read step batch by step
batch) ran the pre-flight checks through a second, recursive ``diagnose``; now they run on the steps the search read
through the same run path, and the answers are the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import precnb
import precnb.pipeline.run as run_mod
from precnb.pipeline.inputs import normalize
from precnb.pipeline.options import Options
from precnb.pipeline.plan import make_plan
from precnb.pipeline.run import run

MG = Path(__file__).resolve().parents[1] / "data_samples" / "megatron"


def test_one_run_plan() -> None:
    plan = make_plan(normalize(precnb.sample_path("dp_nan")), Options(kinds=["nan_origin"], workers=1))
    assert plan.baseline is None and plan.stepwise is None
    assert [d.kind for d in plan.diagnoses] == ["nan_origin"]
    t = run(plan)
    assert (t.finding.kind, t.finding.step, t.finding.rank) == ("nan_origin", 1, 1)


@pytest.mark.slow  # make test runs it; make test-fast stays under 5 minutes (RESULTS_tests.md)
@pytest.mark.skipif(not (MG / "tp1pp2_nan").exists(), reason="data_samples/megatron missing")
def test_diagnose_never_calls_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    base, targ = MG / "tp1pp2", MG / "tp1pp2_nan"
    plan = make_plan(normalize(targ, base), Options(workers=1, kinds=["first_divergence", "preflight"]))
    assert plan.stepwise is not None  # two common steps: the search reads step batch by step batch
    calls: list[object] = []
    from precnb.pipeline import plan as plan_mod

    made: list[bool] = []
    real_make = plan_mod.make_plan

    def counting_make(inputs, options, *, whole=False):
        made.append(whole)
        return real_make(inputs, options, whole=whole)

    monkeypatch.setattr(run_mod, "make_plan", counting_make)
    monkeypatch.setattr(run_mod, "diagnose", lambda *a, **k: calls.append(a) or pytest.fail("recursive diagnose"))
    t = run(plan)
    assert calls == []
    assert made == []  # the first-steps checks run on the steps the search read, in the same plan (no second one)
    f = t.result("first_divergence")
    assert f is not None and f.found and (f.step, f.rank) == (1, 1), f.reason
    assert t.result("preflight") is not None
    monkeypatch.undo()
    # the same answer as the front ends' one call
    same = precnb.diagnose(targ, baseline=base, kinds=["first_divergence", "preflight"], workers=1)
    assert (same.finding.kind, same.finding.step, same.finding.rank, same.finding.node) == \
        (t.finding.kind, t.finding.step, t.finding.rank, t.finding.node)
