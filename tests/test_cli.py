"""The precnb command line: output, exit codes, JSON shape."""

from __future__ import annotations

import json
import subprocess
import sys

import xarray as xr

import precnb
from precnb.cli import main
from tests.conftest import shared_path

S = ("data_samples", "msprobe")


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_info_summary(capsys):
    code, out, _ = run(capsys, "info", str(shared_path(*S, "S1_baseline", "statistics")))
    assert code == 0
    assert "steps      0-4  (5)" in out and "ranks      0  (1)" in out
    assert "task=statistics" in out and "level=mix" in out and "framework=pytorch" in out
    assert "0 NaN and 20 ±inf" in out
    code, out, _ = run(capsys, "info", "--json", str(shared_path(*S, "S5_tp_shards", "tp2")))
    s = json.loads(out)
    assert s["ranks"] == [0, 1] and s["steps"] == [0, 1] and s["tensors"] == 891


def test_info_broken_rank_exits_1_and_names_file(capsys, tmp_path):
    import shutil

    dst = tmp_path / "tp2"
    shutil.copytree(shared_path(*S, "S5_tp_shards", "tp2"), dst)
    f = dst / "step0" / "rank1" / "dump.json"
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    code, out, _ = run(capsys, "info", str(dst))
    assert code == 1
    assert "ranks      0-1  (2)" in out
    assert "SKIPPED" in out and "step0/rank1/dump.json" in out and "line" in out


def test_convert_round_trip(capsys, tmp_path):
    src = shared_path(*S, "S1_baseline", "md5")
    out_store = tmp_path / "run.zarr"
    code, _out, _ = run(capsys, "convert", str(src), "-o", str(out_store))
    assert code == 0 and out_store.is_dir()
    xr.testing.assert_identical(precnb.open_run(src), precnb.open_run(out_store))
    code, _, err = run(capsys, "convert", str(src), "-o", str(out_store))
    assert code == 1 and "exists" in err


def test_exit_codes(capsys, tmp_path):
    assert run(capsys, "info", str(tmp_path / "missing"))[0] == 1
    assert run(capsys, "info", str(tmp_path), "--steps", "x")[0] == 2
    assert main(["nan"]) == 2  # missing positional: one line, exit 2
    assert main([]) == 2


def test_diff_json_one_object(capsys):
    a = str(shared_path(*S, "S1_baseline", "md5"))
    b = str(shared_path(*S, "S1_baseline", "md5_rerun"))
    code, out, _ = run(capsys, "diff", a, b, "--json")
    assert code == 0
    obj = json.loads(out)  # exactly one JSON object
    assert obj["kind"] == "none" and obj["stats"]["crc_only_records"] == 107
    code, out, _ = run(capsys, "diff", a, b, "--step", "1", "--json")
    assert json.loads(out)["stats"]["steps"] == [1]


def test_nan_and_anomalies_json(capsys):
    code, out, _ = run(capsys, "nan", str(shared_path(*S, "S1_baseline", "statistics")), "--json")
    assert code == 0 and json.loads(out)["kind"] == "none"
    code, out, _ = run(capsys, "anomalies", str(shared_path(*S, "S1_baseline", "statistics")), "--json")
    assert code == 0 and json.loads(out)["kind"] == "none"
    code, out, _ = run(capsys, "anomalies", str(shared_path(*S, "S6_monitor", "monitor_output")), "--json")
    obj = json.loads(out)
    assert obj["values"]["first_nonfinite"]["tensor"] == "actv/blocks.1.attn.output"
    code, out, _ = run(capsys, "nan", str(shared_path(*S, "S6_monitor", "monitor_output")))
    assert "step 4, rank 1" in out and "blocks.1.attn.output" in out


def test_cli_subprocess_no_traceback(tmp_path):
    p = subprocess.run([sys.executable, "-m", "precnb", "nan", str(tmp_path / "nope")],
                       capture_output=True, text=True, check=False)
    assert p.returncode == 1 and "Traceback" not in p.stderr and "no such file" in p.stderr
