"""Every front end gives the same first finding, (kind, step, rank, node), on every bundled sample.

The command line (``diff`` / ``nan`` / ``anomalies`` / ``replicas`` with ``--json``), the report (its
embedded ``precnb-findings`` JSON, most important first), the explorer (``Explorer.finding``),
``ds.prec`` and the Python pipeline all go through :func:`precnb.diagnose`.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

import precnb
from tests._inprocess_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data_samples"

# (case id, target, baseline, options as CLI flags, options as keyword arguments)
CASES = [
    ("healthy", "healthy", None, [], {}),
    ("dp_nan", "dp_nan", None, [], {}),
    ("monitor", "monitor", None, [], {}),
    ("divergence", "divergence/target", "divergence/baseline", [], {}),
    ("dp_sum", "dp_sum/target", "dp_sum/baseline", [], {}),
    ("dp_sum+layout", "dp_sum/target", "dp_sum/baseline", ["--target-layout", "dp=2"], {"target_layout": "dp=2"}),
    ("tp", "tp/tp2", "tp/tp1", ["--target-layout", "tp=2"], {"target_layout": "tp=2"}),
    ("tp replicas", "tp/tp2", None, ["--layout", "tp=2"], {"target_layout": "tp=2"}),
    ("renamed", "renamed/target", "renamed/baseline", [], {}),
    ("pp_local", "pp_local/pp2", "pp_local/pp1", ["--target-layout", "pp=2"], {"target_layout": "pp=2"}),
    ("tp_unsync", "tp_unsync/tp2", "tp_unsync/tp1", ["--target-layout", "tp=2"], {"target_layout": "tp=2"}),
    ("tp_unsync replicas", "tp_unsync/tp2", None, ["--layout", "tp=2"], {"target_layout": "tp=2"}),
    ("kernel_resume", "kernel_resume/bad", "kernel_resume/correct", [], {}),
    ("xfw same framework", "xfw/ms_bug", "xfw/ms_same", [], {}),
    ("xfw", "xfw/ms_bug", "xfw/pt", [], {}),
    ("tensor_bf16", "tensor_bf16/target", "tensor_bf16/baseline", [], {}),
    ("tensor_bug", "tensor_bug/target", "tensor_bug/baseline", [], {}),
]
for _name in ("spike_hardware", "spike_optimizer"):  # a dump of 3 steps, read with its monitor output and loss log
    _side = {"monitor": str(SAMPLES / _name / "monitor_output"), "loss": str(SAMPLES / _name / "loss_log.csv")}
    CASES.append((_name, f"{_name}/dump", None, ["--monitor", _side["monitor"], "--loss", _side["loss"]], _side))

VERB = {"first_divergence": "diff", "nan_origin": "nan", "anomaly": "anomalies", "replica_mismatch": "replicas",
        "loss_spike": "spike"}


def key(f: dict) -> tuple:
    return (f["kind"], f.get("step"), f.get("rank"), f.get("node"))


def cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args)  # `python -m precnb ARGS` in this process (tests/_inprocess_cli.py)


def pipeline_first(target, baseline, kw):
    t = precnb.diagnose(SAMPLES / target, baseline=SAMPLES / baseline if baseline else None, progress=False, **kw)
    first = t.finding
    # the diagnosis that produced the first finding (its own kind is "none" when it found nothing)
    producer = next(c["kind"] for c in t.checks if c["status"] != "not applicable"
                    and t.result(c["kind"]) is first)
    return t, first.to_dict(), producer


# 8-11 CPU s a case (each runs the CLI, the report and the explorer): make test-fast keeps one case with a baseline,
# make test runs them all (issue #53 item 8, benchmarks/RESULTS_tests.md)
FAST_CASES = {"divergence"}


@pytest.mark.parametrize("case", [pytest.param(c, id=c[0], marks=() if c[0] in FAST_CASES else pytest.mark.slow)
                                  for c in CASES])
def test_every_front_end_gives_the_same_first_finding(case, tmp_path):
    _id, target, baseline, flags, kw = case
    _triage, first, producer = pipeline_first(target, baseline, kw)
    want = key(first)

    # the command line verb of that diagnosis
    verb = VERB[producer]
    if verb == "diff":
        args = ["diff", str(SAMPLES / baseline), str(SAMPLES / target), *flags, "--json"]
    else:
        args = [verb, str(SAMPLES / target), *flags, "--json"]
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    assert key(json.loads(out.stdout)) == want, (args, out.stdout[:400])

    # the report's embedded findings (a list, most important first)
    html = tmp_path / "r.html"
    rargs = ["report", str(SAMPLES / target), "-o", str(html), *flags]
    if baseline:
        rargs += ["--baseline", str(SAMPLES / baseline)]
    out = cli(*rargs)
    assert out.returncode == 0, out.stderr
    m = re.search(r'<script type="application/json" id="precnb-findings">(.*?)</script>', html.read_text(),
                  re.S)
    assert m, "the report embeds its findings"
    embedded = json.loads(m.group(1))
    assert isinstance(embedded, list) and key(embedded[0]) == want

    # the explorer opens on it
    pytest.importorskip("ipywidgets")
    ex = precnb.explore(SAMPLES / target, baseline=SAMPLES / baseline if baseline else None, **kw)
    assert ex.finding is not None and key(ex.finding.to_dict()) == want
    if ex.finding.found:  # on its record: the origin, for a finding that has one (a loss spike's)
        from precnb.analysis.findings import shown_record

        shown = shown_record(ex.finding, [int(r) for r in ex.runs.ds["rank"].values])
        departing = ex.data.departing(ex.finding)  # a replica copy departs: its own record as dumped (issue 51)
        assert (ex.step, ex.rank) == (departing or shown)[:2] and ex.unmerged == (departing is not None)

    # ds.prec (and the Python API on opened datasets)
    ds = precnb.open_run(SAMPLES / target, progress=False)
    if producer == "first_divergence":
        base = precnb.open_run(SAMPLES / baseline, progress=False)
        got = base.prec.first_divergence(ds, **kw)
    elif producer == "nan_origin":
        got = ds.prec.nan_origin()
    elif producer == "anomaly":
        got = ds.prec.anomalies()
    else:
        got = ds.prec.diagnose(**kw).finding
    assert key(got.to_dict()) == want


def test_unsynced_random_op_is_the_first_finding_everywhere():
    """The held-out kind of TP run: the replica check, the diff and the report agree on the dropout at step 0."""
    gt = json.loads((SAMPLES / "tp_unsync" / "ground_truth.json").read_text())
    fault = gt["faults"][0]
    t = precnb.diagnose(SAMPLES / "tp_unsync/tp2", target_layout="tp=2", progress=False)
    f = t.finding
    assert (f.kind, f.step, f.node) == ("replica_mismatch", fault["step"], fault["node"])
    assert f.tensor == f"{fault['node']}.{fault['tensor']}" and f.evidence["ranks"] == fault["ranks"]
    pair = precnb.diagnose(SAMPLES / "tp_unsync/tp2", baseline=SAMPLES / "tp_unsync/tp1", target_layout="tp=2",
                           progress=False)
    kinds = [x.kind for x in pair.findings]
    assert kinds[:2] == ["first_divergence", "replica_mismatch"]
    assert all(x.step == 0 and x.node == fault["node"] for x in pair.findings[:2])


def test_explorer_takes_a_layout_and_compares_merged_shards():
    ex = precnb.explore(SAMPLES / "tp/tp2", baseline=SAMPLES / "tp/tp1", target_layout="tp=2")
    assert ex.triage.target_layout.tp == 2 and "target shards merged" in " ".join(ex.triage.notes)
    assert ex.finding.kind == "none"  # the merged TP=2 run matches TP=1: no confident false divergence
    assert int(ex.runs.ds.sizes["rank"]) == 1
