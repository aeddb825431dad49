"""What differs between msprobe releases is read, recorded and explained, never found as a divergence.

Committed fixtures (``tests/fixtures/msprobe_sections``, see the README there): ``inplace/new`` and
``inplace/old`` are AdamW's step counter incremented in place as 26.x and as 8.1.x record it (the input after the
op ran); ``params/new`` / ``params/old`` one Linear at L0 as 26.x and as releases up to 1.1.1 record it (no
parameters, no parameter gradients). The conformance matrix's dumps (``tests/fixtures/msprobe_releases``, one per
release, from the matrix generator) are checked when they are on the branch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import precnb
from precnb.analysis.divergence.versions import counters_continue, releases_of
from precnb.analysis.preflight import preflight
from precnb.io.msprobe.release import RELEASES, release_range

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "msprobe_sections"
MATRIX = ROOT / "tests" / "fixtures" / "msprobe_releases"


def _open(path: Path):
    return precnb.open_run(path, progress=False)


@pytest.mark.parametrize(("fixture", "release"), [
    ("inplace/new", "26.1.0–26.2.0"), ("inplace/old", "8.1.0–8.3.3"), ("params/new", "26.0.0–26.2.0"),
    ("params/old", "1.0.3–1.1.1"), ("ms", "1.2.1 or later"), ("pt", "1.2.1–26.0.0")])
def test_the_release_is_recorded_as_far_as_the_dump_says(fixture, release):
    ds = _open(FIX / fixture)
    ev = json.loads(ds.attrs["msprobe_release_evidence"])
    if release.endswith("or later"):  # a range open at the top is written out as its releases
        first = release.split()[0]
        assert ev["candidates"] == list(RELEASES[RELEASES.index(first):])
    else:
        assert ds.attrs["msprobe_release"] == release
    assert ev["evidence"] and all(isinstance(e, str) for e in ev["evidence"])


def test_contradicting_facts_leave_no_release():
    cands, _ = release_range([{"backward": "grad"}, {"framework_key": True}])
    assert cands == []
    odd = _open(FIX / "odd")  # 1.0.1's grad_input/grad_output beside is_recompute (1.2.2 on): no release fits
    ev = json.loads(odd.attrs["msprobe_release_evidence"])
    assert odd.attrs["msprobe_release"] == "" and ev["candidates"] == []
    assert "backward records hold grad_input/grad_output (1.0.1)" in ev["evidence"]


def _matrix_runs() -> list[tuple[str, Path]]:
    if not MATRIX.is_dir():
        return []
    return sorted((v.name, m) for v in MATRIX.iterdir() if v.is_dir() for m in v.iterdir()
                  if m.is_dir() and m.name.startswith("pt_"))


@pytest.mark.skipif(not _matrix_runs(), reason="no tests/fixtures/msprobe_releases on this branch")
@pytest.mark.parametrize(("release", "run"), _matrix_runs(), ids=[f"{v}/{m.name}" for v, m in _matrix_runs()])
def test_each_release_fits_the_range_read_from_its_own_dump(release, run):
    ds = _open(run)
    assert release in releases_of(ds), (ds.attrs["msprobe_release"], ds.attrs["msprobe_release_evidence"])
    assert not precnb.load_report(ds).unread
    assert (ds["role"].values != "").all()  # 1.0.1's grad_input/grad_output included


# ------------------------------------------------------------------------------------------ in-place inputs
def test_an_inplace_input_recorded_after_the_op_is_a_version_difference():
    t = precnb.diagnose(FIX / "inplace" / "old", baseline=FIX / "inplace" / "new", progress=False)
    f = t.result("first_divergence")
    assert f.kind == "none", f.summary()
    assert f.stats["version_differences"] == 1
    hint = next(h for h in f.hints if h.startswith("an in-place op input recorded after the op ran"))
    assert "Tensor.__iadd__.0.forward.input.0 in target (written by msprobe 8.1.0–8.3.3" in hint
    assert not t.found
    # the flagged records (the explorer's and the report's) leave it out too
    assert t.flagged().count == 0


def test_the_same_values_from_a_release_that_records_before_the_op_are_a_divergence(tmp_path):
    """26.x records in-place inputs before the op: an input equal to the output there is a real difference."""
    bad = tmp_path / "bad"
    shutil.copytree(FIX / "inplace" / "new", bad)
    dump = bad / "step0" / "proc7" / "dump.json"
    doc = json.loads(dump.read_text())
    leaf = doc["data"]["Tensor.__iadd__.0.forward"]["input_args"][0]
    leaf.update({"Max": 1.0, "Min": 1.0, "Mean": 1.0, "Norm": 1.0})
    dump.write_text(json.dumps(doc, indent=1))
    assert releases_of(_open(bad)) == ["26.1.0", "26.1.0.post1", "26.2.0"]
    f = precnb.diagnose(bad, baseline=FIX / "inplace" / "new", progress=False).result("first_divergence")
    assert (f.kind, f.tensor) == ("first_divergence", "Tensor.__iadd__.0.forward.input.0")
    assert "version_differences" not in f.stats


# ------------------------------------------------------------------------------------------ parameters
def test_a_target_without_parameter_records_is_a_skip_that_says_why():
    checks = {c["name"]: c for c in preflight(_open(FIX / "params" / "old"), baseline=_open(FIX / "params" / "new"))}
    c = checks["parameters"]
    assert c["status"] == "skip", c
    assert c["message"].startswith("the target has no parameter records to compare (a level L0 dump without "
                                   "parameter records: msprobe releases up to 1.1.1 record none, 1.2.0 and later "
                                   "do; this one was written by msprobe 1.0.3–1.1.1); the baseline has 1 parameters")
    assert "parameter counts" not in c["message"]
    t = precnb.diagnose(FIX / "params" / "old", baseline=FIX / "params" / "new", progress=False)
    assert not t.found, [f.summary() for f in t.found]
    f = t.result("first_divergence")
    assert any("parameter-gradient record(s) only in baseline" in h and "1.0.3–1.1.1" in h for h in f.hints)


def test_the_no_parameter_message_names_the_dumps_level(tmp_path):
    l1 = {c["name"]: c for c in preflight(_open(FIX / "inplace" / "new"))}["parameters"]
    assert "level L1 dumps record no parameters: dump with level L0 or mix" in l1["message"]
    mix = tmp_path / "mix"
    shutil.copytree(FIX / "params" / "old", mix)
    dump = mix / "step0" / "rank" / "dump.json"
    dump.write_text(dump.read_text().replace('"level": "L0"', '"level": "mix"'))
    c = {c["name"]: c for c in preflight(_open(mix))}["parameters"]
    assert "level L1" not in c["message"]
    assert "a level mix dump without parameter records: msprobe releases up to 1.1.1 record none" in c["message"]


# ------------------------------------------------------------------------------------------ counters
def _two_step_run(root: Path, calls: tuple[int, int]) -> Path:
    leaf = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
            "Norm": 1.0, "requires_grad": False}
    for step, first in enumerate(calls):
        data = {f"Functional.linear.{first + k}.forward": {"input_args": [leaf], "input_kwargs": {}, "output": [leaf]}
                for k in range(2)}
        data.update({f"Functional.relu.{first // 2}.forward": {"input_args": [leaf], "input_kwargs": {},
                                                               "output": [leaf]}})
        (root / f"step{step}" / "rank").mkdir(parents=True)
        (root / f"step{step}" / "rank" / "dump.json").write_text(json.dumps(
            {"task": "statistics", "level": "L1", "dump_data_dir": None, "data": data}))
    return root


def test_call_counters_that_go_on_across_steps_are_explained(tmp_path):
    going = _open(_two_step_run(tmp_path / "going", (0, 2)))
    assert counters_continue(going) == {"api": "Functional.linear", "kind": "api", "step": 1, "first_call": 2,
                                        "previous_last": 1}
    assert counters_continue(_open(_two_step_run(tmp_path / "reset", (0, 0)))) is None
    f = precnb.diagnose(tmp_path / "going", baseline=tmp_path / "reset", progress=False).result("first_divergence")
    assert f.kind == "none"
    # where the names of its later steps are left unpaired, the records in one run only are explained
    assert not f.structural or any(h.startswith("target's API call counters do not restart at each step")
                                   for h in f.hints), f.hints


def test_the_counter_hint_names_the_run_and_the_step(tmp_path):
    from precnb.analysis.divergence.versions import version_structural_hints

    going = _open(_two_step_run(tmp_path / "going", (0, 2)))
    reset = _open(_two_step_run(tmp_path / "reset", (0, 0)))
    structural = [{"node": "Functional.linear.2.forward", "only_in": "target", "step": 1, "rank": 0, "count": 1}]
    hints = version_structural_hints(structural, ("baseline", "target"), (reset, going))
    assert hints == ["target's API call counters do not restart at each step (msprobe 1.0.1 numbers API calls, "
                     "26.0.0 parameter gradients, across steps): at step 1 its Functional.linear records are numbered "
                     "from 2 (step 0 ended at 1), so those steps' records are not paired by name with the other "
                     "run's: the records in one run only there are a version difference (written by msprobe "
                     f"{releases_of(going)[0]}–{releases_of(going)[-1]})"]
    assert version_structural_hints([], ("baseline", "target"), (reset, going)) == []
