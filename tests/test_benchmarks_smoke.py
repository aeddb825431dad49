"""Every benchmark script runs end to end at a tiny size, so ``make bench`` cannot rot unseen.

The figures of these runs mean nothing (a few ranks, one repetition, a busy machine): what is checked is
that each script completes, writes its results where it is told (never into ``benchmarks/``), and that the
answers it reports are the injected ones where the script checks answers.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

BENCH = ROOT / "benchmarks"
pytestmark = pytest.mark.slow


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module", autouse=True)
def benchmarks_untouched():
    before = _digest(BENCH)
    yield
    assert _digest(BENCH) == before, "a smoke run wrote into benchmarks/"


def _run(*args: str, cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_run_py_smoke(tmp_path):
    """Load throughput (in-process, local workers, LocalCluster), the CLI rows and the scale path."""
    out = tmp_path / "RESULTS.md"
    _run(str(BENCH / "run.py"), "--smoke", "--no-msprobe", "--workdir", str(tmp_path / "work"), "--out", str(out),
         timeout=900)
    res = json.loads(out.with_suffix(".json").read_text())
    assert set(res["load"]) == {"4", "8"} and res["scale_ranks"] == 8
    wheres = {row["where"] for row in res["load"]["4"]["rows"]}
    assert any("LocalCluster" in w for w in wheres) and any("local processes" in w for w in wheres)
    rows = res["cli"]["4"]["rows"]
    assert {(r["case"], r["scope"]) for r in rows} == {("diff", "step"), ("diff", "run"), ("nan", "step"),
                                                        ("nan", "run")}
    assert all(r["precnb_correct"] for r in rows), rows
    sc = res["scale"]
    assert sc["divergence"] == {k: sc["truth"]["divergence"][k] for k in ("step", "rank", "node")}
    assert sc["nan"] == {k: sc["truth"]["nan"][k] for k in ("step", "rank", "node")}
    assert "error" not in sc["stream"] and "viz_error" not in sc
    assert "## 3. Scale: 8 ranks" in out.read_text()


def test_run_py_smoke_refuses_the_committed_results():
    proc = subprocess.run([sys.executable, str(BENCH / "run.py"), "--smoke"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "--out" in proc.stderr


def test_run_py_msprobe_must_be_an_executable(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / "run.py"), "--msprobe", str(tmp_path / "nope"), "--smoke",
                           "--out", str(tmp_path / "R.md")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not an executable file" in proc.stderr


def test_bench_large_smoke(tmp_path):
    results = tmp_path / "RESULTS_large.md"
    _run(str(BENCH / "bench_large.py"), "--size", "3e6", "--reps", "1", "--out", str(tmp_path / "w"),
         "--results", str(results))
    res = json.loads(results.with_suffix(".json").read_text())
    assert {"floor", "precnb", "floor_gc_off", "precnb_pure"} <= set(res["medians"])
    text = results.read_text()
    assert "open_run ≥ 2× json.loads with the garbage collector paused" in text and "peak RSS ≤ 2× the file" in text


def test_bench_startup_smoke(tmp_path):
    results = tmp_path / "RESULTS_startup.md"
    _run(str(BENCH / "bench_startup.py"), "--reps", "1", "--results", str(results))
    assert len(json.loads(results.with_suffix(".json").read_text())) == 2
    # a timing run keeps the installed sizes `--sizes` wrote (it builds venvs from PyPI: not run here)
    sizes = "## Installed size\n\nWritten by `benchmarks/bench_startup.py --sizes`: a table\n"
    results.write_text(results.read_text() + "\n" + sizes)
    js = results.with_suffix(".json")
    js.write_text(json.dumps({**json.loads(js.read_text()), "installed_size": {"wheel": "w"}}))
    _run(str(BENCH / "bench_startup.py"), "--reps", "1", "--results", str(results))
    text = results.read_text()
    assert text.startswith("# Command-line start-up") and text.endswith("\n" + sizes) and text.count("## ") == 2
    assert json.loads(js.read_text())["installed_size"] == {"wheel": "w"}


def test_bench_startup_sizes_section_replaced_in_place():
    sys.path.insert(0, str(BENCH))
    try:
        from bench_startup import SIZES, _section, _with_section
    finally:
        sys.path.remove(str(BENCH))
    text = f"# T\n\nintro\n\n{SIZES}\n\nold\n\n## Later\n\nkept\n"
    new = _with_section(text, SIZES, [SIZES, "", "new"])
    assert new == f"# T\n\nintro\n\n{SIZES}\n\nnew\n\n## Later\n\nkept\n"
    assert _section(new, SIZES) == [SIZES, "", "new"] and _section("# T\n", SIZES) is None
    assert _with_section("# T\n\nintro\n", SIZES, [SIZES, "", "x"]) == f"# T\n\nintro\n\n{SIZES}\n\nx\n"


def test_bench_explorer_smoke(tmp_path):
    table = tmp_path / "explorer.md"
    proc = _run(str(BENCH / "bench_explorer.py"), "--ranks", "8", "--repeat", "1", "--markdown", str(table))
    assert "explorer opened" in proc.stdout and "Worst interaction" in table.read_text()


def test_bench_align_smoke(tmp_path):
    md = tmp_path / "align.md"
    proc = _run(str(BENCH / "bench_align.py"), "--ranks", "2", "--small-ranks", "2", "--reps", "1", "--ms-reps", "0",
                "--out", str(tmp_path / "w"), "--markdown", str(md))
    res = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert res["findings"]["same names"]["node"] == "Functional.gelu.1.forward"
    assert res["findings"]["names agree, one op fewer"]["kind"] == "first_divergence"
    assert "aligned / no alignment" in md.read_text()


def test_bench_memory_smoke(tmp_path):
    md = tmp_path / "memory.md"
    _run(str(BENCH / "bench_memory.py"), "--size", "3e5", "--reps", "1", "--modes", "precnb", "--out",
         str(tmp_path / "m"), "--markdown", str(md))
    text = md.read_text()
    assert all(layout in text for layout in ("indented", "one line", "records shuffled", "a record per line"))


def test_bench_kernel_tensors_smoke():
    bundled = ROOT / "data_samples" / "kernel_resume"
    proc = _run(str(BENCH / "bench_kernel_tensors.py"), str(bundled / "correct" / "dump"), "--reps", "1")
    assert "correct" in proc.stdout


def test_bench_tensors_smoke(tmp_path):
    """The bundled pair, precnb's side (msprobe and the larger pair need the generator's venv)."""
    out = tmp_path / "RESULTS_tensors.md"
    _run(str(BENCH / "bench_tensors.py"), "--repeat", "1", "--no-msprobe", "--no-large", "--workdir",
         str(tmp_path / "w"), "--out", str(out))
    res = json.loads(out.with_suffix(".json").read_text())
    (pair,) = res["pairs"].values()
    assert pair["tensor_pairs"] > 100 and pair["agreement"] is None
    assert "msprobe not run" in out.read_text()


def test_bench_scheduler_smoke(tmp_path):
    out = tmp_path / "RESULTS_scheduler.md"
    _run(str(BENCH / "bench_scheduler.py"), "--ranks", "4", "--reps", "1", "--workdir", str(tmp_path / "w"),
         "--out", str(out))
    res = json.loads(out.with_suffix(".json").read_text())
    assert all(tuple(a) == tuple(res["truth"]) for a in res["answers"].values()), res


def test_bench_spike_smoke(tmp_path):
    """Loss spike vs anomalies on the same input (issue 29), and the spike's answer on the hardware sample."""
    out = tmp_path / "RESULTS_spike.md"
    _run(str(BENCH / "bench_spike.py"), "--smoke", "--out", str(out))
    res = json.loads(out.with_suffix(".json").read_text())
    rows = res["rows"]
    assert {r["ranks"] for r in rows} == {2, 4} and all(r["spike"] > 0 and r["anomalies"] > 0 for r in rows)
    assert rows[0]["answer"] == [6, 1, "Module.lm_head.Linear.parameters_grad.0", "hardware"]
    assert "Worst ratio" in out.read_text()


def test_bench_ranks_smoke(tmp_path):
    results = tmp_path / "RESULTS_ranks.md"
    _run(str(BENCH / "bench_ranks.py"), "--ranks", "4", "--long-ranks", "2", "--out", str(tmp_path / "w"),
         "--results", str(results))
    res = json.loads(results.with_suffix(".json").read_text())
    injected = res["manifest"]
    assert res["api"]["divergence"] == injected["divergence"] and res["api"]["nan"] == injected["nan"]
    assert {k: res["diff"]["finding"][k] for k in ("step", "rank", "node")} == injected["divergence"]
    first = res["first_answer"]  # the 100-step run: its divergence at step 0, only the first steps read
    assert (first["finding"]["step"], first["finding"]["node"]) == (0, injected["divergence"]["node"])
    assert set(first["opened"]) <= {"0", "1"}
    assert "ranks × 4 steps: precnb against json.loads on all cores" in results.read_text()


def test_bench_compare_memory_smoke(tmp_path):
    results = tmp_path / "compare_memory.json"
    _run(str(BENCH / "bench_compare_memory.py"), "--ranks", "4", "--out", str(tmp_path / "w"),
         "--results", str(results))
    rows = json.loads(results.read_text())["rows"]
    manifest = json.loads(next((tmp_path / "w").rglob("manifest.json")).read_text())
    assert rows and all(r["finding"] == manifest["divergence"] for r in rows), rows


@pytest.mark.skipif(not (ROOT / "data_samples" / "megatron_pop" / "ground_truth.json").exists(),
                    reason="data_samples/megatron_pop missing")
def test_bench_accuracy_smoke(tmp_path):
    """The committed subset of the Megatron population scored (no Megatron needed): every case answers."""
    results = tmp_path / "RESULTS_accuracy.md"
    _run(str(BENCH / "bench_accuracy.py"), "--smoke", "--verbs", "diff_ref,diff_twin,nan", "--results",
         str(results))
    res = json.loads(results.with_suffix(".json").read_text())
    rows = res["rows"]
    assert {r["verb"] for r in rows} == {"diff_ref", "diff_twin", "nan"} and not any(r.get("error") for r in rows)
    faults = [r for r in rows if r["kind"] != "healthy"]
    assert faults and all(r["truth_step"] is not None and r["truth_node"] for r in faults)
    assert "## Healthy pairs: false alarms" in results.read_text()


def test_bench_accuracy_smoke_refuses_the_committed_results():
    proc = subprocess.run([sys.executable, str(BENCH / "bench_accuracy.py"), "--smoke"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--results" in proc.stderr
