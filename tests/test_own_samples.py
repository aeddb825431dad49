"""Every command names the exact injection point of the project's own samples (data_samples/).

Expected answers are read from each sample's ground_truth.json (written by the generator from
the real msprobe output), not typed in here.
"""

from __future__ import annotations

import json
import math
import re

import pytest

import precnb
from precnb.analysis import Layout, anomaly_table, compare_runs, first_divergence, merge_shards, nan_origin
from precnb.cli import main
from tests.conftest import sample_path


def truth(name: str) -> dict:
    return json.loads(sample_path(name, "ground_truth.json").read_text())


def origin_fault(name: str, kind: str | None = None) -> dict:
    faults = [f for f in truth(name)["faults"] if f.get("role", "origin") == "origin"]
    if kind:
        faults = [f for f in faults if f["kind"] == kind]
    return faults[0]


def test_dp_nan_origin(capsys):
    want = origin_fault("dp_nan")
    spread = next(f for f in truth("dp_nan")["faults"] if f.get("role") == "spread")
    ds = precnb.open_run(sample_path("dp_nan"))
    f = nan_origin(ds)
    assert (f.kind, f.step, f.rank, f.node) == ("nan_origin", want["step"], want["rank"], want["node"])
    assert f.values["created_by_node"] is True
    inherited = [s for s in f.suspects if s["why"] == "inherited via communication"]
    assert inherited and (inherited[0]["step"], inherited[0]["rank"], inherited[0]["node"]) == (
        spread["step"], spread["rank"], spread["node"])
    assert main(["nan", str(sample_path("dp_nan")), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert (obj["step"], obj["rank"], obj["node"]) == (want["step"], want["rank"], want["node"])


def test_divergence_pair(capsys):
    want = origin_fault("divergence")
    base, target = sample_path("divergence", "baseline"), sample_path("divergence", "target")
    f = first_divergence(precnb.open_run(base), precnb.open_run(target))
    assert (f.kind, f.step, f.rank, f.node) == ("first_divergence", want["step"], want["rank"], want["node"])
    assert f.module == "blocks.0.mlp"
    assert f.evidence["first_module"] == "blocks.0.mlp"
    assert any("not dumped" in h for h in f.hints)  # the bf16 cast is not in dump.json
    assert main(["diff", str(base), str(target), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert (obj["kind"], obj["step"], obj["rank"], obj["node"]) == (
        "first_divergence", want["step"], want["rank"], want["node"])
    # restricting to the steps before the injection finds nothing
    assert first_divergence(precnb.open_run(base), precnb.open_run(target), steps=[0]).kind == "none"


def test_dp_sum_pair():
    want = origin_fault("dp_sum")
    g = truth("dp_sum")
    f = first_divergence(precnb.open_run(sample_path("dp_sum", "baseline")),
                         precnb.open_run(sample_path("dp_sum", "target")))
    assert (f.step, f.rank, f.node) == (want["step"], want["rank"], want["node"])
    only_b = {s["node"] for s in f.structural if s["only_in"] == "baseline"}
    expected = g["nodes_only_in_baseline"]
    expected = set(expected if isinstance(expected, list) else next(iter(expected.values())))
    assert only_b == expected
    assert not [s for s in f.structural if s["only_in"] == "target"]
    assert any("summed, not averaged" in h and "world size" in h for h in f.hints)


LEAF = re.compile(r"^(input_args|input_kwargs)\.")


def leaf_to_label(node: str, leaf: str) -> str:
    if ".parameters_grad" in node:
        return f"{node}.{leaf.rsplit('.', 1)[0]}"  # "weight.0" -> node.weight
    return f"{node}.{LEAF.sub('input.', leaf)}"


def test_tp_merge_matches_tp1_and_ground_truth(capsys):
    g = truth("tp")
    tp1 = precnb.open_run(sample_path("tp", "tp1"))
    tp2 = precnb.open_run(sample_path("tp", "tp2"))
    merged = merge_shards(tp2, Layout(2, tp=2), reference=tp1)
    kinds = merged["shard_kind_tp"].to_series()
    dims = merged["shard_dim_tp"].to_series()
    checked = 0
    for node, leaves in g["tensors"]["step0"].items():
        for leaf, relation in leaves.items():
            label = leaf_to_label(node, leaf)
            assert label in kinds.index, label
            if relation.startswith("sharded"):
                assert kinds[label] == "sharded", (label, relation)
                assert dims[label] == int(relation.split()[-1]), (label, relation)
            else:
                assert kinds[label] == relation, (label, relation)
            checked += 1
    assert checked > 250
    cmp = compare_runs(tp1, merged)
    assert float(cmp.rel.where(cmp.both).max()) < 1e-5
    assert first_divergence(tp1, merged).kind == "none"
    a, b = str(sample_path("tp", "tp1")), str(sample_path("tp", "tp2"))
    assert main(["diff", a, b, "--target-layout", "tp=2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "none"
    assert main(["diff", a, b, "--json"]) == 0
    # without the layout it is read from the dumps (issue 24): the ranks hold different values of the same
    # parameters, tp=2, and the answer is the one with the layout
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "none"


def test_monitor_anomalies_and_nan():
    g = truth("monitor")
    spike = next(f for f in g["faults"] if f["kind"] == "gradient_spike")
    nan = next(f for f in g["faults"] if f["kind"] == "nan")
    ds = precnb.open_run(sample_path("monitor"))
    f = precnb.anomalies(ds)
    assert (f.kind, f.step, f.rank) == ("anomaly", spike["step"], spike["rank"])
    first_nf = f.values["first_nonfinite"]
    assert (first_nf["step"], first_nf["rank"], first_nf["tensor"]) == (nan["step"], nan["rank"],
                                                                        f"actv/{nan['name']}")
    df = anomaly_table(ds)
    sp = df[(df.type == "spike") & (df.step == spike["step"]) & df.tensor.str.startswith("grad_unreduced/")]
    assert set(sp["rank"]) == {spike["rank"]}
    o = nan_origin(ds)
    assert (o.step, o.rank, o.tensor) == (nan["step"], nan["rank"], f"actv/{nan['name']}")


def test_healthy_is_clean():
    ds = precnb.open_run(sample_path("healthy"))
    assert nan_origin(ds).kind == "none"
    assert precnb.anomalies(ds).kind == "none"
    s = ds.prec.summary()
    assert s["nonfinite"]["nan_values"] == 0 and s["nonfinite"]["inf_values"] > 0


@pytest.mark.parametrize("name", ["healthy", "dp_nan", "divergence/baseline", "divergence/target",
                                  "dp_sum/baseline", "tp/tp1", "tp/tp2", "monitor"])
def test_info_on_every_sample(capsys, name):
    assert main(["info", str(sample_path(*name.split("/"))), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["tensors"] > 0 and s["records"] > 0 and not s["skipped_files"]
    assert math.prod([len(s["steps"]), len(s["ranks"])]) >= 1
