"""The tensor-mode samples (tensor_bf16, tensor_bug): their ground truth re-checked against the dumps.

Parsed with Python's json (no precnb reader), like ``test_samples_generator``; the last test
regenerates them with the real msprobe and compares bit for bit.
"""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from collections import Counter

import pytest

from tests.test_samples_generator import DATA, ROOT, _have, gt, leaves, load


def _data(name: str, side: str) -> dict:
    return load(DATA / name / side / "step0" / "rank0" / "dump.json")["data"]


def _tensor_leaves(data: dict) -> dict:
    return {(n, p): leaf for n, rec in data.items() for p, leaf in leaves(rec)
            if str(leaf.get("type", "")).startswith("torch.")}


def _same(a, b) -> bool:
    return (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)) or a == b


def test_tensor_bf16_ground_truth_holds():
    g = gt("tensor_bf16")
    b, t = _data("tensor_bf16", "baseline"), _data("tensor_bf16", "target")
    assert list(b) == list(t) and g["checks"]["nodes"] == len(t)
    lb, lt = _tensor_leaves(b), _tensor_leaves(t)
    assert not any(leaf["dtype"] == "torch.bfloat16" for leaf in lb.values())
    changed = [k for k, leaf in lt.items() if leaf["dtype"] == "torch.bfloat16"]
    assert all(lb[k]["dtype"] == "torch.float32" for k in changed)
    p = g["precision"]
    assert p["tensors_float32_in_baseline_bfloat16_in_target"] == len(changed)
    fams = Counter(".".join(n.split(".")[:2]) for n, _ in changed if not n.startswith("Module."))
    assert dict(sorted(fams.items())) == p["api_families_changed"]
    assert next(n for n in t if any(k[0] == n for k in changed)) == p["first_node_with_bfloat16"]
    assert not [k for k in changed if k[1].startswith("parameters")]
    rows = _compare_rows("tensor_bf16")
    assert len(rows) == g["msprobe_compare"]["rows"]
    assert dict(Counter(r["Result"] for r in rows)) == g["msprobe_compare"]["result_counts"]
    # msprobe marks exactly the rows whose dtype differs as errors (the dtype rule)
    assert {r["NPU Name"] for r in rows if r["Result"] == "error"} == {
        r["NPU Name"] for r in rows if r["NPU Dtype"] != r["Bench Dtype"]}


def _compare_rows(name: str) -> list[dict]:
    (path,) = sorted((DATA / name / "msprobe_compare").glob("compare_result_*.csv"))
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_tensor_bug_ground_truth_holds():
    g = gt("tensor_bug")
    (f,) = g["faults"]
    b, t = _data("tensor_bug", "baseline"), _data("tensor_bug", "target")
    assert list(b) == list(t)

    def differs(n):
        lb, lt = dict(leaves(b[n])), dict(leaves(t[n]))
        return sorted(p for p in lb if any(not _same(lb[p].get(k), lt[p].get(k))
                                             for k in ("dtype", "shape", "Max", "Min", "Mean", "Norm", "value")))

    first = next(n for n in t if differs(n))
    assert first == f["node"] and differs(first) == sorted(f["differing_leaves"])
    construct = load(DATA / "tensor_bug" / "target" / "step0" / "rank0" / "construct.json")
    assert construct[first] == f["module_node"] == f"Module.{f['module']}.Block.forward.0"
    assert t[first]["input_args"][1] == {"type": "float", "value": 0.5}
    assert b[first]["input_args"][1] == {"type": "float", "value": 1.0}
    out_b, out_t = b[first]["output"][0], t[first]["output"][0]
    assert out_t["Max"] == pytest.approx(out_b["Max"] * 0.5, rel=1e-6)
    rows = {r["NPU Name"]: r for r in _compare_rows("tensor_bug")}
    assert rows[f["tensor"]]["Cosine"] == "1.0" and rows[f["tensor"]]["One Thousandth Err Ratio"] == "0.0"


@pytest.mark.slow
@pytest.mark.needs_generator
@pytest.mark.skipif(not (_have("torch") and _have("msprobe")), reason="needs torch and msprobe")
def test_regenerate_tensor_samples_bit_identical(tmp_path):
    names = ["tensor_bf16", "tensor_bug"]
    out = subprocess.run([sys.executable, "-m", "precnb_samples", "--out", str(tmp_path), "--only", *names,
                          "--no-readme"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for name in names:
        new, old = tmp_path / name, DATA / name
        pts = sorted(p.relative_to(new) for p in new.rglob("*.pt"))
        assert pts == sorted(p.relative_to(old) for p in old.rglob("*.pt")) and len(pts) > 800
        assert all((new / p).read_bytes() == (old / p).read_bytes() for p in pts)
        for side in ("baseline", "target"):
            rel = f"{side}/step0/rank0/dump.json"
            assert load(new / rel)["data"] == load(old / rel)["data"]
        keep = ("faults", "precision", "checks", "losses")
        assert {k: load(new / "ground_truth.json").get(k) for k in keep} == {
            k: load(old / "ground_truth.json").get(k) for k in keep}
