"""Every assumption of the pipeline is said (issue 47, item 8): text, finding JSON, triage, report and explorer.

On the bundled samples: ``megatron/tp1pp1`` vs ``megatron/tp2pp1`` (the target's tp=2 read from
its dumps; nodes paired by structure and by value; the target dumps step 0 only), the same with
``--target-layout tp=2`` (no inferred layout), a resumed run (``healthy`` steps 1-2 renumbered
0-1: the offset is detected), ``renamed`` (Hugging Face vs Megatron names: nodes paired by value)
and a one-run diagnosis that assumes nothing (``assumptions: []``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import precnb
from precnb.pipeline.assumptions import layout_spec
from tests._inprocess_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data_samples"
TP1, TP2 = DATA / "megatron" / "tp1pp1", DATA / "megatron" / "tp2pp1"


def cli(*args: object) -> subprocess.CompletedProcess:
    return run_cli(*args)  # `python -m precnb ARGS` in this process (tests/_inprocess_cli.py)


def kinds(assumptions: list[dict]) -> dict[str, dict]:
    return {a["kind"]: a for a in assumptions}


@pytest.fixture(scope="module")
def megatron_pair() -> precnb.Triage:
    return precnb.diagnose(TP2, baseline=TP1)


def test_inferred_layout_in_the_text_and_the_json():
    text = cli("diff", TP1, TP2)
    assert text.returncode == 0, text.stderr
    block = text.stdout.split("  assumed:\n", 1)[1]
    assert "target layout tp=2 read from the dumps (not given)" in block
    got = cli("diff", TP1, TP2, "--json")
    f = json.loads(got.stdout)
    assert f["kind"] == "none"  # nothing found still says what it assumed
    a = kinds(f["assumptions"])
    lay = a["inferred_layout"]
    assert (lay["role"], lay["layout"]) == ("target", "tp=2") and "tensor parallelism tp=2" in lay["why"]
    # the pairs found without names, with their counts (the tp2 dump names some calls differently)
    assert a["aligned_by_structure"]["count"] >= 1 and a["aligned_by_value"]["count"] >= 1
    ex = a["aligned_by_structure"]["examples"][0]
    assert ex["baseline"] != ex["target"]
    # the tp2 dump holds step 0 only: its offset against steps 0-1 was detected, not given
    off = a["step_offset"]
    assert (off["offset"], off["baseline_steps"], off["target_steps"]) == (0, [0, 1], [0])


def test_a_given_layout_is_no_assumption():
    got = cli("diff", TP1, TP2, "--target-layout", "tp=2", "--json")
    assert got.returncode == 0, got.stderr
    a = kinds(json.loads(got.stdout)["assumptions"])
    assert "inferred_layout" not in a
    assert "aligned_by_structure" in a  # the alignment is still assumed


def test_one_list_in_the_triage_every_finding_and_its_json(megatron_pair):
    t = megatron_pair
    assert [a["kind"] for a in t.assumptions] == ["inferred_layout", "step_offset", "aligned_by_structure",
                                                  "aligned_by_value"]
    assert layout_spec(t.target_layout) == "tp=2"
    for f in t.findings:
        assert f.assumptions == t.assumptions and f.to_dict()["assumptions"] == t.assumptions
    assert json.loads(t.to_json())["assumptions"] == t.assumptions
    assert "  assumed:\n    target layout tp=2" in t.finding.summary()


def test_detected_step_offset_of_a_resumed_run():
    base = precnb.open_run(DATA / "healthy")
    resumed = base.sel(step=[1, 2]).assign_coords(step=[0, 1])  # the counter restarted at the resume
    t = precnb.diagnose(resumed, baseline=base)
    off = kinds(t.finding.to_dict()["assumptions"])["step_offset"]
    assert (off["offset"], off["baseline_steps"], off["target_steps"]) == (-1, [0, 1, 2], [0, 1])
    assert "step offset -1 detected from parameter statistics" in t.finding.summary()
    given = precnb.diagnose(resumed, baseline=base, step_offset=-1)
    assert "step_offset" not in kinds(given.assumptions) and given.step_offset == -1


def test_renamed_runs_say_which_nodes_were_paired_by_value():
    got = cli("diff", DATA / "renamed" / "baseline", DATA / "renamed" / "target", "--json")
    assert got.returncode == 0, got.stderr
    a = kinds(json.loads(got.stdout)["assumptions"])
    v = a["aligned_by_value"]
    assert v["count"] >= 10 and v["modules"] >= 1
    assert any(e["baseline"].startswith("Module.model.") and e["target"] != e["baseline"] for e in v["examples"])
    assert "inferred_layout" not in a and "step_offset" not in a  # one rank, the same steps


def test_nothing_assumed_is_an_empty_list():
    got = cli("nan", DATA / "healthy", "--json")
    f = json.loads(got.stdout)
    assert f["assumptions"] == []
    assert "assumed:" not in cli("nan", DATA / "healthy").stdout


def test_report_and_explorer_show_them(megatron_pair):
    from bs4 import BeautifulSoup

    from precnb.report import to_html
    from precnb.widgets.findings import finding_html

    soup = BeautifulSoup(to_html(megatron_pair), "html.parser")
    items = soup.select("#assumed li")
    assert [li["data-kind"] for li in items] == [a["kind"] for a in megatron_pair.assumptions]
    assert items[0].get_text() == megatron_pair.assumptions[0]["text"]
    box = BeautifulSoup(finding_html(megatron_pair.finding), "html.parser").select(".precnb-finding-assumed li")
    assert [li.get_text() for li in box] == [a["text"] for a in megatron_pair.assumptions]


def test_hostile_text_is_escaped():
    from precnb.analysis import Finding
    from precnb.widgets.findings import finding_html

    f = Finding(kind="none", reason="x", assumptions=[{"kind": "aligned_by_value", "text": "<script>x</script>"}])
    out = finding_html(f)
    assert "<script>" not in out and "&lt;script&gt;" in out
