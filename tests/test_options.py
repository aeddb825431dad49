"""``precnb.Options`` keeps the loading and pairing settings; any other keyword is a diagnosis's (issue #50 item 2).

``limit`` (how many further suspects a finding lists) is declared by the three diagnoses that list suspects (the
anomaly search, the replica check, the loss spike), reaches each of them from one keyword, and is the generated
``--limit`` of their subcommands; the triage's ``options`` JSON is what it was when ``Options`` held it.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import pytest
import xarray as xr

import precnb
from precnb.analysis.diagnoses import ANOMALY, REPLICAS, AnomalyOptions, ReplicaOptions
from precnb.analysis.options import option_fields, option_owners
from precnb.analysis.registry import Context, get
from precnb.analysis.spike.diagnosis import LOSS_SPIKE, SpikeOptions
from precnb.pipeline.options import DEFAULTS, Options
from precnb.pipeline.tensors import params_of
from tests.conftest import sample_path

LISTERS = {ANOMALY: AnomalyOptions, REPLICAS: ReplicaOptions, LOSS_SPIKE: SpikeOptions}


def test_limit_is_no_field_of_options() -> None:
    assert "limit" not in Options.__dataclass_fields__
    assert {"tensor_metrics", "rank_table"} <= set(Options.__dataclass_fields__)  # loading settings: they stay


@pytest.mark.parametrize("kind", sorted(LISTERS))
def test_each_diagnosis_listing_suspects_declares_limit(kind: str) -> None:
    cls = LISTERS[kind]
    assert get(kind).options is cls
    f = {f.name: f for f in fields(cls)}["limit"]
    assert f.default == 50
    assert f.metadata["help"] == "how many further suspects to list"
    assert f.metadata["argparse"] == {"type": "count"}


def test_one_keyword_reaches_every_diagnosis_declaring_it() -> None:
    assert set(option_owners()["limit"]) == set(LISTERS)
    assert option_fields()["limit"].default == 50
    opts = Options(limit=5)
    assert opts.limit == 5 and Options().limit == DEFAULTS.limit == 50
    assert {k: opts.of(k).limit for k in LISTERS} == dict.fromkeys(LISTERS, 5)
    assert {k: o.limit for k, o in opts.by_kind().items() if k in LISTERS} == dict.fromkeys(LISTERS, 5)
    assert {k: Options().of(k).limit for k in LISTERS} == dict.fromkeys(LISTERS, 50)
    assert opts.with_(steps=[1]).limit == 5 and Options.from_kwargs(limit=7).of(ANOMALY).limit == 7
    with pytest.raises(TypeError, match=r"known: \[.*'limit', "):
        Options(limitt=5)


def test_describe_and_equality_are_as_before() -> None:
    assert json.dumps(Options().describe()) == '{"step_offset": null, "crc": "report"}'
    assert json.dumps(Options(limit=5).describe()) == '{"step_offset": null, "crc": "report", "limit": 5}'
    assert Options(limit=50).describe() == Options().describe()
    assert Options(limit=50) == Options() and hash(Options(limit=50)) == hash(Options())
    assert Options(limit=5) == Options(limit=5) != Options(limit=6)
    assert Options(limit=5, replica_rtol=1e-3, target_layout="tp=2").describe() == {
        "target_layout": "tp=2", "step_offset": None, "crc": "report", "limit": 5, "replica_rtol": 1e-3}


def test_the_pipeline_parameters_still_hold_it() -> None:
    assert params_of([], Options(limit=7), None, None, None, {}, {}) == {"limit": 7}
    assert params_of([], Options(), None, None, None, {}, {}) == {"limit": 50}


def _ds() -> xr.Dataset:
    return xr.Dataset({"max": (("step",), [1.0, 2.0])}, coords={"step": [0, 1]})


@pytest.mark.parametrize(("kind", "where", "name"), [
    (ANOMALY, "precnb.analysis.anomalies", "anomalies"),
    (LOSS_SPIKE, "precnb.analysis.spike", "loss_spike"),
    (REPLICAS, "precnb.analysis.replicas.departures", "check_departures"),
])
def test_each_diagnosis_reads_its_own_limit(monkeypatch: pytest.MonkeyPatch, kind: str, where: str,
                                            name: str) -> None:
    import importlib

    seen: list[Any] = []
    monkeypatch.setattr(importlib.import_module(where), name, lambda *a, **kw: seen.append(kw["limit"]) or {})
    ctx = Context(target=_ds(), target_layout=f"layout-{kind}", params={"limit": 99},
                  options={kind: LISTERS[kind](limit=3)})
    get(kind).run(ctx)
    get(kind).run(Context(target=_ds(), target_layout=f"other-{kind}"))  # a Context built by hand: the default
    assert seen == [3, 50]


def test_diagnose_lists_as_many_suspects_as_asked() -> None:
    for limit in (1, 0):
        t = precnb.diagnose(sample_path("dp_nan"), kinds=[ANOMALY], limit=limit, workers=1)
        assert len(t.result(ANOMALY).suspects) == limit
        assert t.to_dict()["options"] == {"step_offset": None, "kinds": [ANOMALY], "crc": "report", "workers": 1,
                                          "limit": limit}


@pytest.mark.parametrize("verb", ["anomalies", "spike", "replicas"])
def test_limit_is_a_generated_flag(capsys: pytest.CaptureFixture[str], verb: str) -> None:
    from precnb.cli import main

    assert main([verb, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--limit LIMIT how many further suspects to list (default 50)" in out


def test_the_flag_reaches_the_diagnosis(capsys: pytest.CaptureFixture[str]) -> None:
    from precnb.cli import main

    assert main(["anomalies", str(sample_path("dp_nan")), "--limit", "2", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["suspects"]) == 2
