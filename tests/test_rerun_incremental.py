"""Issue 51 item 8: an explorer's Match / Unmatch reruns only what the alignment change can affect.

A Match or an Unmatch changes the mapping, hence the alignment and what reads it (the comparison, the
first-divergence search, the pre-flight checks of the renamed baseline). What reads the runs alone is
taken from the previous run (:class:`precnb.analysis._memo.DatasetMemo`): each run's layout, the shards
merged, the replica check of the target as dumped, the target's parameter table and frozen-parameter
signs. The answer must still be the full rerun's: the findings JSON of each edit equals that of
:func:`precnb.diagnose` run afresh from the dumps with the same options (nothing reused).
"""

from __future__ import annotations

import json

import pytest

import precnb
from tests.conftest import sample_path

pytest.importorskip("ipywidgets")

CASES = {  # real msprobe dumps: MindSpore vs PyTorch; a TP=2 run with an unsynchronised seed against TP=1
    "xfw": ("xfw/ms_bug", "xfw/pt"),
    "megatron_unsync": ("megatron/tp2pp1_dropout_unsync", "megatron/tp1pp1_dropout"),
}


def _findings_json(t) -> str:
    return json.dumps(t.to_dict()["findings"], sort_keys=True, default=str)


def _fresh(t, target, base):
    return precnb.diagnose(target, baseline=base, options=t.options)


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "megatron_unsync" else c
                                  for c in sorted(CASES)])  # the slowest case runs in make test only
def test_match_and_unmatch_rerun_only_what_the_alignment_affects(case, monkeypatch):
    from precnb.analysis import diagnoses
    from precnb.analysis.layout import infer
    from precnb.analysis.preflight import _common
    from precnb.widgets import explore

    target, base = (sample_path(*p.split("/")) for p in CASES[case])
    ex = explore(target, baseline=base)
    panel = ex.panel("Alignment")
    panel.on_show()
    calls: dict[str, int] = {}

    def counted(name, fn):
        def wrapper(*a, **k):
            calls[name] = calls.get(name, 0) + 1
            return fn(*a, **k)
        return wrapper

    from precnb.analysis.replicas import departures

    monkeypatch.setattr(departures, "check_departures", counted("replica check", departures.check_departures))
    monkeypatch.setattr(infer, "infer_layout", counted("layout inferred", infer.infer_layout))
    monkeypatch.setattr(_common, "_parameter_table", counted("parameter table", _common._parameter_table))
    replica_ran = ex.triage.result("replica_mismatch") is not None
    hits = diagnoses._REPLICA_RESULTS.hits

    mod = next(p for p in ex.triage.alignment.modules if p.baseline and p.target)
    panel.level.value = "modules"
    panel.pick(left=mod.baseline, right=mod.target)
    matched = panel.do_match()
    assert matched is not None and (mod.baseline, mod.target) in {(p.baseline, p.target)
                                                                  for p in matched.alignment.modules}
    panel.level.value = "calls"
    call = [p for p in matched.alignment.nodes if p.target.endswith(".forward")][-1]
    panel.pick(left=call.baseline, right=call.target)
    unmatched = panel.do_unmatch()
    assert unmatched is not None and call.target in unmatched.alignment.user_unpaired
    # what reads the runs alone was not computed again: neither the replica check nor the layouts nor the
    # target's parameters (the baseline, renamed into the target's new names, is read again)
    assert "replica check" not in calls and "layout inferred" not in calls, calls
    assert calls.get("parameter table", 0) <= 2, calls  # the renamed baseline's, once per edit
    assert diagnoses._REPLICA_RESULTS.hits - hits == (2 if replica_ran else 0)  # its finding, once per edit
    calls.clear()
    for t in (matched, unmatched):  # each edit answers as a full diagnose of the dumps with its mapping
        fresh = _fresh(t, target, base)
        assert _findings_json(t) == _findings_json(fresh)
        assert t.to_dict() == fresh.to_dict()
    assert calls.get("layout inferred", 0) >= 1 or case == "xfw"  # the fresh runs were read and inferred again
    assert "replica check" in calls or not replica_ran
