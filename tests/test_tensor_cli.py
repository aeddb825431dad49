"""``precnb metrics`` and the tensor-aware ``precnb diff`` on the bundled tensor-mode samples."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest

from tests._inprocess_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args)  # `python -m precnb ARGS` in this process (tests/_inprocess_cli.py)


def _strict(text: str):
    def bad(token):
        raise AssertionError(f"non-strict JSON token {token}")

    return json.loads(text, parse_constant=bad)


def test_metrics_json_is_strict_and_complete(samples):
    b, t = samples("tensor_bug", "baseline"), samples("tensor_bug", "target")
    p = cli("metrics", str(b), str(t), "--json")
    assert p.returncode == 0, p.stderr
    doc = _strict(p.stdout)
    assert doc["schema"] == "precnb.tensor_metrics/1" and doc["pairs"] == 434 == len(doc["rows"])
    assert doc["status_counts"] == {"ok": 432, "zero_d": 2}
    row = next(r for r in doc["rows"] if r["tensor"] == "Tensor.__mul__.6.forward.output.0")
    assert row["module"] == "blocks.1" and row["cosine"] == 1.0 and row["max_rel_err"] == 0.5
    assert row["ulp_err"] is None  # NaN (fp32 pair) is null
    sub = _strict(cli("metrics", str(b), str(t), "--json", "--tensors", "blocks.1.attn").stdout)
    assert sub["pairs"] and all(r["module"].startswith("blocks.1.attn") for r in sub["rows"])
    two = _strict(cli("metrics", str(b), str(t), "--json", "--tensors",
                      "Functional.linear.0.forward.output.0,Torch.matmul.0.forward.output.0").stdout)
    assert [r["tensor"] for r in two["rows"]] == ["Functional.linear.0.forward.output.0",
                                                  "Torch.matmul.0.forward.output.0"]


@pytest.mark.slow
def test_metrics_csv_and_output_file(samples, tmp_path):
    b, t = samples("tensor_bf16", "baseline"), samples("tensor_bf16", "target")
    out = tmp_path / "m.csv"
    p = cli("metrics", str(b), str(t), "--csv", "-o", str(out))
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert not text.startswith("#")  # a plain table (issue 23 item 11): the marker is a sidecar
    assert (tmp_path / ".m.csv.precnb_output").is_file()  # what --overwrite recognises
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 430 and {"cosine", "euc_dist", "ulp_err", "bitwise_equal", "status"} <= set(rows[0])
    bf = [r for r in rows if r["target_dtype"] == "torch.bfloat16"]
    assert bf and all(float(r["ulp_err"]) >= 0 for r in bf)
    p = cli("metrics", str(b), str(t), "--csv", "-o", str(out))  # an existing file needs --overwrite
    assert p.returncode == 1 and "exists" in p.stderr
    p = cli("metrics", str(b), str(t), "--csv", "-o", str(out), "--overwrite")  # a precnb output: replaced
    assert p.returncode == 0, p.stderr
    text = cli("metrics", str(b), str(t), "--top", "3")
    assert text.returncode == 0 and "430 tensor pair(s)" in text.stdout and "lowest cosine first" in text.stdout
    bad = cli("metrics", str(b), str(t), "--tensors", "no_such_module_or_regex_xyz")
    assert bad.returncode == 2 and "matches no" in bad.stderr
    healthy = cli("metrics", str(samples("healthy")), str(samples("healthy")))
    assert healthy.returncode == 1 and "task=tensor" in healthy.stderr


@pytest.mark.slow
def test_diff_uses_tensor_metrics_and_states_the_precision(samples):
    p = cli("diff", str(samples("tensor_bf16", "baseline")), str(samples("tensor_bf16", "target")), "--json")
    f = _strict(p.stdout)
    assert f["kind"] == "none" and "target runs in bf16: compared with bf16 tolerance" in f["reason"]
    assert f["stats"]["tensor_judged_records"] == 430
    p = cli("diff", str(samples("tensor_bf16", "baseline")), str(samples("tensor_bf16", "target")), "--json",
            "--no-tensor-metrics")
    f = _strict(p.stdout)
    assert f["kind"] == "none" and "tensor_judged_records" not in f["stats"]
    p = cli("diff", str(samples("tensor_bug", "baseline")), str(samples("tensor_bug", "target")), "--json")
    f = _strict(p.stdout)
    assert (f["node"], f["module"]) == ("Tensor.__mul__.6.forward", "blocks.1")
    assert f["values"]["tensor_metrics"]["cosine"] == 1.0


@pytest.mark.slow
def test_report_detail_table_has_the_tensor_metric_columns(samples, tmp_path):
    from bs4 import BeautifulSoup

    out = tmp_path / "r.html"
    p = cli("report", str(samples("tensor_bug", "target")), "--baseline", str(samples("tensor_bug", "baseline")),
            "-o", str(out))
    assert p.returncode == 0, p.stderr
    soup = BeautifulSoup(out.read_text(encoding="utf-8"), "html.parser")
    table = next(t for t in soup.find_all("table") if "cosine" in [th.get_text() for th in t.find_all("th")])
    head = [th.get_text() for th in table.find_all("th")]
    assert head[-4:] == ["cosine", "max abs err", "max rel err", "1‰ err ratio"]
    rows = {tr.find_all("td")[1].get_text(): [td.get_text() for td in tr.find_all("td")]
            for tr in table.find_all("tr") if tr.find_all("td")}
    origin = rows["Tensor.__mul__.6.forward.output.0"]
    assert origin[-4:] == ["1", "0.415933", "0.5", "0"]  # cosine blind to the scale; the 1‰ ratio is 0
    plain = cli("report", str(samples("divergence", "target")), "--baseline", str(samples("divergence", "baseline")),
                "-o", str(tmp_path / "s.html"))
    assert plain.returncode == 0 and "1‰ err ratio" not in (tmp_path / "s.html").read_text(encoding="utf-8")
