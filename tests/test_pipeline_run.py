"""One triage, each finishing step once (issue #50 item 1): :func:`precnb.pipeline.run.run` counted.

Per triage: each input path's reader is asked once (format detection), and the findings are ordered, enriched
(:func:`precnb.pipeline.prepare.enrich_all`) and made into a triage (:func:`precnb.pipeline.result.build_triage`)
once each, on the whole read and on the step-wise search with the pre-flight checks beside it (a pair of real
Megatron-Core dumps read step batch by step batch), which used to build two triages and join them.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

import precnb
import precnb.io.detect as detect_mod
import precnb.pipeline.prepare as prepare_mod
import precnb.pipeline.run as run_mod
from precnb.analysis import registry
from precnb.analysis.findings import enrich as enrich_mod
from precnb.pipeline.inputs import normalize
from precnb.pipeline.options import Options
from precnb.pipeline.plan import make_plan

MG = Path(__file__).resolve().parents[1] / "data_samples" / "megatron"


def _spy(monkeypatch: pytest.MonkeyPatch, calls: collections.Counter[Any], module: Any, name: str, key: Any) -> None:
    real = getattr(module, name)

    def spied(*a: Any, **k: Any) -> Any:
        calls[key(a)] += 1
        return real(*a, **k)

    monkeypatch.setattr(module, name, spied)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[Any]:
    calls: collections.Counter[Any] = collections.Counter()
    _spy(monkeypatch, calls, detect_mod, "detect_format", lambda a: ("detect", Path(a[0]).resolve()))
    _spy(monkeypatch, calls, prepare_mod, "enrich_all", lambda a: "enrich")
    _spy(monkeypatch, calls, enrich_mod, "enrich", lambda a: "enrich one read")
    _spy(monkeypatch, calls, registry, "order_findings", lambda a: "order")
    _spy(monkeypatch, calls, run_mod, "build_triage", lambda a: "build_triage")
    _spy(monkeypatch, calls, run_mod, "make_plan", lambda a: "make_plan")
    return calls


def _detections(calls: collections.Counter[Any]) -> dict[Path, int]:
    return {k[1]: n for k, n in calls.items() if isinstance(k, tuple) and k[0] == "detect"}


@pytest.mark.skipif(not (MG / "tp1pp2_nan").exists(), reason="data_samples/megatron missing")
def test_stepwise_triage_with_preflight_is_made_once(counted: collections.Counter[Any]) -> None:
    base, targ = MG / "tp1pp2", MG / "tp1pp2_nan"
    plan = make_plan(normalize(targ, base), Options(workers=1, kinds=["preflight", "first_divergence"]))
    assert plan.stepwise is not None  # the search reads step batch by step batch, the pre-flight checks beside it
    counted.clear()  # the plan asked each reader which steps the runs hold: counted with the run below
    t = run_mod.run(plan)
    f = t.result("first_divergence")
    assert f is not None and f.found and (f.step, f.rank) == (1, 1), f.reason
    assert t.result("preflight") is not None
    assert [c["kind"] for c in t.checks] == ["preflight", "first_divergence"]
    assert any(n.startswith("pre-flight checks on baseline steps") for n in t.notes), t.notes
    assert (counted["order"], counted["enrich"], counted["build_triage"], counted["make_plan"]) == (1, 1, 1, 0)
    assert counted["enrich one read"] == 2  # each finding against the runs its diagnosis read: search, first steps
    assert _detections(counted) == {}  # the plan's sources already know their readers


@pytest.mark.skipif(not (MG / "tp1pp2_nan").exists(), reason="data_samples/megatron missing")
def test_diagnose_asks_each_reader_once_per_path(counted: collections.Counter[Any]) -> None:
    base, targ = MG / "tp1pp2", MG / "tp1pp2_nan"
    t = precnb.diagnose(targ, baseline=base, kinds=["preflight", "first_divergence"], workers=1)
    assert t.finding.found and "steps_not_searched" in t.result("first_divergence").stats  # the step-wise path
    assert _detections(counted) == {base.resolve(): 1, targ.resolve(): 1}  # was 4 each (batches, steps, records)
    assert (counted["order"], counted["enrich"], counted["build_triage"], counted["make_plan"]) == (1, 1, 1, 1)


def test_whole_read_is_finished_once(counted: collections.Counter[Any]) -> None:
    from tests.conftest import sample_path

    base, targ = sample_path("divergence", "baseline"), sample_path("divergence", "target")
    t = precnb.diagnose(targ, baseline=base, workers=1)  # every diagnosis: the pair is read whole
    assert t.finding.kind == "first_divergence" and "steps_not_searched" not in t.finding.stats
    assert (counted["order"], counted["enrich"], counted["enrich one read"], counted["build_triage"]) == (1, 1, 1, 1)
    assert set(_detections(counted).values()) == {1}
    assert {Path(base).resolve(), Path(targ).resolve()} <= set(_detections(counted))


def _cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    import json

    from precnb.cli import main

    assert main([*args, "--json", "--workers", "1"]) == 0
    return json.loads(capsys.readouterr().out)


def _key(f: dict[str, Any]) -> tuple[Any, ...]:
    return (f["kind"], f.get("step"), f.get("rank"), f.get("node"), f.get("reason"),
            (f.get("evidence") or {}).get("candidates"))


def test_replica_check_reads_the_layout_as_the_command_line_does(capsys: pytest.CaptureFixture[str]) -> None:
    """``diagnose(run, kinds=["replica_mismatch"])`` needs no ``layout=``: ``precnb replicas RUN``'s rule (one path).

    The real SDC job (tp=2, dp=2, a faulty device): the layout is read from the dumps and said as an assumption.
    """
    run = precnb.sample_path("sdc/job2")
    t = precnb.diagnose(run, kinds=["replica_mismatch"], workers=1)
    assert _key(t.finding.to_dict()) == _key(_cli_json(capsys, "replicas", str(run)))
    assert t.finding.found and t.target_layout is not None and (t.target_layout.tp, t.target_layout.dp) == (2, 2)
    assert [a["layout"] for a in t.assumptions if a["kind"] == "inferred_layout"] == ["tp=2,dp=2"]
    with pytest.raises(ValueError, match="needs a baseline"):  # a check that no layout makes applicable still says why
        precnb.diagnose(run, kinds=["first_divergence"], workers=1)


def test_a_baseline_is_the_replica_checks_clean_run(capsys: pytest.CaptureFixture[str]) -> None:
    """``diagnose(run, baseline=clean, kinds=["replica_mismatch"])`` is ``precnb replicas RUN --baseline CLEAN``."""
    run, clean = precnb.sample_path("sdc/job2"), precnb.sample_path("sdc_clean")
    t = precnb.diagnose(run, baseline=clean, kinds=["replica_mismatch"], workers=1)
    cli = _cli_json(capsys, "replicas", str(run), "--baseline", str(clean))
    assert _key(t.finding.to_dict()) == _key(cli)
    assert cli["evidence"]["candidates"] == [{"rank": 2, "wrong_side": True}]  # the clean run decides, not the majority
    same = precnb.diagnose(run, replica_baseline=clean, kinds=["replica_mismatch"], workers=1)
    assert _key(same.finding.to_dict()) == _key(cli)
