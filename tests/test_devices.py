"""``precnb devices`` (issue 28, item 3): replica departures followed to hosts and devices across jobs.

sdc: device 10.0.0.1:1 flips a bit at steps 1 and 3 of job1 (rank 1) and step 2 of job2 (rank 2);
sdc_rank: an unsynchronised seed on TP rank 1 in both jobs (follows the rank); sdc_clean: nothing.
"""

from __future__ import annotations

import json

import pytest

import precnb
from precnb.analysis.replicas.devices import device_verdicts
from precnb.cli import main

KEYS = ["host", "device", "ranks", "departures", "verdict", "why"]


def _gt(name: str) -> dict:
    return json.loads((precnb.sample_path(name) / "ground_truth.json").read_text())


def devices(capsys, sample: str, jobs: tuple[str, ...], *extra: str) -> list[dict]:
    root = precnb.sample_path(sample)
    runs = [str(root / j) if j else str(root) for j in jobs]
    tables = [a for j in jobs for a in ("--rank-table", str(root / "rank_tables" / f"{j or 'job1'}.json"))]
    code = main(["devices", *runs, *tables, "--layout", "tp=2,dp=2", "--json", "--workers", "1", *extra])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and list(out) == ["devices"]
    assert all(list(d) == KEYS and d["verdict"] in ("suspect", "clean", "inconclusive") for d in out["devices"])
    return out["devices"]


def test_the_faulty_device_is_suspect_across_two_jobs(capsys):
    got = devices(capsys, "sdc", ("job1", "job2"))
    g = _gt("sdc")
    top = got[0]
    assert (top["host"], top["device"], top["verdict"]) == (g["faulty_device"]["host"], g["faulty_device"]["device"],
                                                            "suspect")
    assert [d["verdict"] for d in got] == ["suspect", "clean", "clean", "clean"]
    assert "it follows the device" in top["why"]
    # every device: the rank it served in each job and the departures it took part in, as the ground truth says
    want = {(d["host"], d["device"]): (d["ranks"], d["departures"]) for d in g["devices"]}
    assert {(d["host"], d["device"]): (d["ranks"], d["departures"]) for d in got} == want
    assert "explained by the other side, 10.0.0.1:1" in got[1]["why"]


def test_one_job_is_at_most_suspect_one_event(capsys):
    got = devices(capsys, "sdc", ("job1",))
    assert [(d["device"], d["verdict"]) for d in got[:2]] == [("0", "inconclusive"), ("1", "inconclusive")]
    got = devices(capsys, "sdc", ("job1",), "--baseline", str(precnb.sample_path("sdc_clean")))
    assert (got[0]["host"], got[0]["device"], got[0]["verdict"]) == ("10.0.0.1", "1", "suspect")
    assert got[0]["why"].startswith("suspect (one event): ") and "the clean run names it the wrong side at job1 " \
        "step 1" in got[0]["why"]
    assert all(d["verdict"] == "clean" for d in got[1:])


@pytest.mark.parametrize("baseline", [False, True])
def test_a_departure_that_follows_the_rank_points_at_code(capsys, baseline):
    extra = ("--baseline", str(precnb.sample_path("sdc_clean"))) if baseline else ()
    got = devices(capsys, "sdc_rank", ("job1", "job2"), *extra)
    assert all(d["verdict"] == "clean" for d in got)
    assert all("unsynchronised seed" in d["why"] for d in got)
    if baseline:  # TP rank 1 (ranks 1 and 3) departs wherever it runs
        assert all("the departure follows rank" in d["why"] and "code or data" in d["why"] for d in got)
        wrong = {(d["host"], d["device"]): sorted((x["run"], x["step"], x["rank"]) for x in d["departures"])
                 for d in got}
        want = {(d["host"], d["device"]): sorted((x["run"], x["step"], x["rank"]) for x in d["wrong_side"])
                for d in _gt("sdc_rank")["devices"]}
        assert wrong == want
    else:
        want = {(d["host"], d["device"]): (d["ranks"], d["departures"]) for d in _gt("sdc_rank")["devices"]}
        assert {(d["host"], d["device"]): (d["ranks"], d["departures"]) for d in got} == want


def test_the_negative_control_finds_no_device(capsys):
    got = devices(capsys, "sdc_clean", ("",))
    assert [d["verdict"] for d in got] == ["clean"] * 4 and not any(d["departures"] for d in got)


def test_text_and_usage(capsys):
    root = precnb.sample_path("sdc")
    code = main(["devices", str(root / "job1"), str(root / "job2"), "--rank-table", str(root / "rank_tables/job1.csv"),
                 "--rank-table", str(root / "rank_tables/job2.csv"), "--tp", "2", "--workers", "1"])
    out = capsys.readouterr().out
    assert code == 0 and out.splitlines()[:2] == ["DEVICES: 1 suspect of 4 (most suspect first)",
                                                  "  SUSPECT      10.0.0.1:1  (job1 rank 1, job2 rank 2)"]
    code = main(["devices", str(root / "job1"), str(root / "job2"), "--tp", "2"])
    assert code == 2 and "give --rank-table" in capsys.readouterr().err
    t = str(root / "rank_tables/job1.csv")
    code = main(["devices", str(root / "job1"), str(root / "job2"), str(root / "job1"), "--rank-table", t,
                 "--rank-table", t, "--tp", "2"])
    assert code == 2 and "3 runs and 2 rank tables" in capsys.readouterr().err


def test_majority_decided_events_make_a_device_suspect_in_one_job():
    tables = {"a": {r: {"host": "h", "device": str(r)} for r in range(4)}}
    ev = {"step": 1, "rank": 2, "node": "Torch.rsqrt.0.forward", "inputs_identical": True, "cause": "compute_fault",
          "group": [0, 1, 2, 3], "candidates": [2], "wrong_side": [2], "decided_by": "majority"}
    out = device_verdicts({"a": [ev]}, tables)
    assert (out[0]["device"], out[0]["verdict"]) == ("2", "suspect")
    assert "majority of its replicas" in out[0]["why"] and out[0]["why"].startswith("suspect (one event)")
    inherited = {**ev, "inputs_identical": False, "cause": "inherited"}
    out = device_verdicts({"a": [inherited]}, tables)
    assert all(d["verdict"] == "clean" for d in out)  # inherited: a consequence, never an origin
    dev2 = next(d for d in out if d["device"] == "2")
    assert dev2["departures"] == [{"run": "a", "step": 1, "rank": 2, "node": "Torch.rsqrt.0.forward",
                                   "inputs_identical": False}]


def test_one_job_undecided_pair_names_both_candidates_and_what_decides(capsys):
    """One job, no clean run, two replicas: both devices are candidates, each why names the other and what decides."""
    got = devices(capsys, "sdc", ("job1",))
    pair = {d["device"]: d for d in got if d["host"] == "10.0.0.1"}
    assert [d["verdict"] for d in got] == ["inconclusive", "inconclusive", "clean", "clean"]
    for me, other in (("0", "1"), ("1", "0")):
        why = pair[me]["why"]
        assert why.startswith(f"candidate: departed with identical inputs (job1 steps 1, 3 as rank {me}) each time "
                              f"together with 10.0.0.1:{other} (job1 rank {other}): a pair cannot say which side is "
                              "wrong, so both are candidates"), why
        assert "with one job the verdict is at most 'suspect (one event)'" in why and "--baseline" in why
    # job2 alone: one departure (step 2, ranks 2 and 3), the same verdict for its two devices
    got = devices(capsys, "sdc", ("job2",))
    cand = [d for d in got if d["verdict"] == "inconclusive"]
    assert sorted(f"{d['host']}:{d['device']}" for d in cand) == ["10.0.0.1:1", "10.0.0.2:0"]
    assert all(" together with " in d["why"] and "each time" not in d["why"] for d in cand)
    assert all(d["verdict"] == "clean" for d in got if d not in cand)


def test_one_job_undecided_pairs_with_different_partners_make_the_common_device_suspect():
    """Rank 1 departs with its TP replica (rank 0) at step 1 and its DP replica (rank 3) at step 2, undecided."""
    tables = {"a": {r: {"host": "h", "device": str(r)} for r in range(4)}}

    def ev(step: int, group: list[int]) -> dict:
        return {"step": step, "rank": 1, "node": "Torch.rsqrt.0.forward", "inputs_identical": True,
                "cause": "compute_fault", "group": group, "candidates": group, "wrong_side": [], "decided_by": None}

    out = device_verdicts({"a": [ev(1, [0, 1]), ev(2, [1, 3])]}, tables)
    assert [(d["device"], d["verdict"]) for d in out] == [("1", "suspect"), ("0", "clean"), ("3", "clean"),
                                                          ("2", "clean")]
    assert out[0]["why"].startswith("suspect (one event): departed with identical inputs (a steps 1, 2 as rank 1) "
                                    "at 2 steps, with other replicas (h:0 (a rank 0), h:3 (a rank 3)): the one "
                                    "device common to those departures"), out[0]["why"]
    assert "explained by the other side, h:1" in out[1]["why"]
    # one undecided departure alone: its two devices stay candidates
    out = device_verdicts({"a": [ev(1, [0, 1])]}, tables)
    assert [(d["device"], d["verdict"]) for d in out][:2] == [("0", "inconclusive"), ("1", "inconclusive")]
    assert "together with h:1 (a rank 1)" in out[0]["why"] and "together with h:0 (a rank 0)" in out[1]["why"]
