"""Rank -> host and device (issue 28, item 1): HCCL rank tables and CSVs on the faulty-device samples.

Every finding that names a rank names its host and device too, from ``--rank-table`` (replicas,
diff, nan, report), ``Options(rank_table=...)`` or ``precnb.open_run(..., rank_table=...)``; a bad
table is one line naming the file and the problem.
"""

from __future__ import annotations

import json

import pytest

import precnb
from precnb.cli import main
from precnb.io.rank_table import RankTableError, read_rank_table

SDC = precnb.sample_path("sdc")
TABLES = SDC / "rank_tables"


def _gt(name: str) -> dict:
    return json.loads((precnb.sample_path(name) / "ground_truth.json").read_text())


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main([*args, "--workers", "1"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("job", ["job1", "job2"])
def test_hccl_json_and_csv_give_the_placement(job):
    want = {int(r): d for r, d in _gt("sdc")["placement"][job].items()}
    assert read_rank_table(TABLES / f"{job}.json") == want
    assert read_rank_table(TABLES / f"{job}.csv") == want
    assert want[1 if job == "job1" else 2] == {"host": "10.0.0.1", "device": "1"}  # the faulty device


@pytest.mark.parametrize(("text", "suffix", "problem"), [
    ('{"server_list": [{"server_id": "h"}]}', "json", "server_list[0]: no device list"),
    ('{"server_list": [{"server_id": "h", "device": [{"device_id": "0"}]}]}', "json",
     "server_list[0].device[0]: no rank_id"),
    ('{"server_list": [{"device": [{"device_id": "0", "rank_id": "0"}]}]}', "json", "server_list[0]: no server_id"),
    ('{"version": "1.0"}', "json", "not an HCCL rank table (no server_list list)"),
    ('{"server_list": [', "json", "not valid JSON at line 1 column 18: Expecting value"),
    ("rank,host,device\n0,h,0\n0,h,1\n", "csv", "line 3: rank 0 is given twice"),
    ("rank,host,device\n0,h,0\n1,h,0\n", "csv", "line 3: device h:0 serves rank 0 and rank 1"),
    ("rank,host,device\n-1,h,0\n", "csv", "line 2: rank '-1' is not a non-negative integer"),
    ("rank,host,device\n0,,0\n", "csv", "line 2: no host"),
    ("rank,node\n0,h\n", "csv", "CSV header rank,node lacks host, device (expected rank,host,device)"),
    ("rank,host,device\n", "csv", "the rank table lists no rank"),
])
def test_bad_tables_say_what_is_wrong(tmp_path, text, suffix, problem):
    p = tmp_path / f"t.{suffix}"
    p.write_text(text)
    with pytest.raises(RankTableError) as exc:
        read_rank_table(p)
    assert str(exc.value) == f"{p}: {problem}"


def test_cli_names_the_device_beside_every_rank(capsys):
    code, out, _ = cli(capsys, "replicas", str(SDC / "job1"), "--layout", "tp=2,dp=2", "--rank-table",
                       str(TABLES / "job1.json"), "--json")
    f = json.loads(out)
    assert code == 0 and (f["step"], f["rank"], f["node"]) == (1, 1, "Torch.rsqrt.0.forward")
    assert f["device"] == {"host": "10.0.0.1", "device": "1"}
    assert f["suspects"] and all(s["device"] == {"host": "10.0.0.1", "device": "1"} for s in f["suspects"]
                                 if s["rank"] == 1)
    code, out, _ = cli(capsys, "replicas", str(SDC / "job2"), "--layout", "tp=2,dp=2", "--rank-table",
                       str(TABLES / "job2.csv"))
    assert code == 0 and "step 2, rank 3 (host 10.0.0.2, device 0)" in out  # the later rank of the pair
    # without a table nothing changes: no "device" key at all
    code, out, _ = cli(capsys, "replicas", str(SDC / "job1"), "--layout", "tp=2,dp=2", "--json")
    assert "device" not in json.loads(out)


def test_diff_and_nan_take_a_rank_table(capsys):
    clean = precnb.sample_path("sdc_clean")
    code, out, _ = cli(capsys, "diff", str(clean), str(SDC / "job1"), "--rank-table", str(TABLES / "job1.csv"),
                       "--json")
    f = json.loads(out)
    assert code == 0 and f["kind"] == "first_divergence" and f["rank"] is not None
    assert f["device"] == _gt("sdc")["placement"]["job1"][str(f["rank"])]
    code, out, _ = cli(capsys, "nan", str(SDC / "job1"), "--rank-table", str(TABLES / "job1.csv"), "--json")
    assert code == 0 and json.loads(out)["kind"] == "none"


def test_cli_bad_table_is_one_line(capsys, tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("rank,host,device\n0,h,0\n1,h,1\n")
    code, out, err = cli(capsys, "replicas", str(SDC / "job1"), "--layout", "tp=2,dp=2", "--rank-table", str(bad))
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [f"precnb replicas: error: {bad}: the run has rank 2 (and 1 more), the table "
                                        "places ranks 0-1 only"]
    code, _, err = cli(capsys, "nan", str(SDC / "job1"), "--rank-table", str(tmp_path / "none.json"))
    assert code == 1 and len(err.strip().splitlines()) == 1 and "none.json: no such file or directory" in err


def test_python_api_open_run_and_options():
    ds = precnb.open_run(SDC / "job2", rank_table=TABLES / "job2.json", workers=1)
    assert json.loads(ds.attrs["rank_table"])["2"] == {"host": "10.0.0.1", "device": "1"}
    t = precnb.diagnose(ds, layout="tp=2,dp=2", kinds=["replica_mismatch"])
    assert t.finding.device == {"host": "10.0.0.2", "device": "0"} and t.rank_table[2]["device"] == "1"
    t = precnb.diagnose(SDC / "job2", layout="tp=2,dp=2", kinds=["replica_mismatch"],
                        rank_table={0: ("a", 0), 1: ("a", 1), 2: ("b", 0), 3: ("b", 1)}, workers=1)
    assert t.finding.device == {"host": "b", "device": "1"}
    with pytest.raises(RankTableError, match="the run has rank 3"):
        precnb.open_run(SDC / "job2", rank_table={0: ("a", 0), 1: ("a", 1), 2: ("b", 0)}, workers=1)


# -- issue #49: rank tables through the input-safety layer ---------------------------------------------------
import os as _os  # noqa: E402

import pytest as _pytest  # noqa: E402


def _refusal(path, match):
    from precnb.io.rank_table import RankTableError, read_rank_table

    with _pytest.raises(RankTableError, match=match) as e:
        read_rank_table(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_rank_table_fifo_and_dev_zero_are_refused(tmp_path):
    fifo = tmp_path / "devices.json"
    _os.mkfifo(fifo)
    _refusal(fifo, "FIFO")  # used to block forever
    zero = tmp_path / "zero.csv"
    zero.symlink_to("/dev/zero")
    _refusal(zero, "character device")  # used to grow to 5.4 GB


def test_rank_table_edge_cases(tmp_path):
    big = tmp_path / "big.json"
    big.write_text('{"server_list":[{"server_id":"a","device":[{"rank_id":' + "1" + "0" * 30 + ',"device_id":"0"}]}]}')
    _refusal(big, "larger than any job")  # was OverflowError (internal error)
    deep = tmp_path / "deep.json"
    deep.write_text('{"server_list":' + "[" * 100_000 + "]" * 100_000 + "}")
    _refusal(deep, "nested more than 64 levels at line 1")
    field = tmp_path / "field.csv"
    field.write_text("rank,host,device\n0," + "h" * (1 << 20) + ",0\n")
    _refusal(field, "malformed CSV at line 2: field larger than field limit")
    empty = tmp_path / "empty.json"
    empty.write_text("")
    _refusal(empty, "empty file \\(expected an HCCL rank table JSON object\\)")  # was "CSV header"
    sup = tmp_path / "sup.csv"
    sup.write_text("rank,host,device\n\u00b2,h,0\n")
    _refusal(sup, "is not a non-negative integer")
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"rank,host,device\n0,h\xed\xa0\x80,0\n")
    _refusal(bad, "not UTF-8 text: invalid byte 0xed at line 2 column 4")


def test_a_table_names_at_most_the_runs_ranks(tmp_path):
    from precnb.io.rank_table import within_run
    from precnb.pipeline.devices import resolve_rank_table

    rows = "".join(f"{i},h{i // 8},{i % 8}\n" for i in range(10_000))
    t = tmp_path / "cluster.csv"
    t.write_text("rank,host,device\n" + rows)
    import xarray as xr

    ds = xr.Dataset(coords={"rank": [0, 1, 2, 3]})
    assert sorted(resolve_rank_table(str(t), ds)) == [0, 1, 2, 3]  # no phantom devices
    assert within_run({0: {}, 5: {}}, [0]) == {0: {}}


def _cluster_table(tmp_path, job: str, extra: int) -> object:
    """*job*'s CSV table with *extra* rows for ranks the 4-rank run does not have."""
    text = (TABLES / f"{job}.csv").read_text()
    t = tmp_path / f"{job}_cluster.csv"
    t.write_text(text.rstrip("\n") + "\n" + "".join(f"{r},10.9.9.{r // 8},{r % 8}\n" for r in range(4, 4 + extra)))
    return t


def test_extra_rows_of_a_table_are_said_not_dropped_silently(capsys, tmp_path):
    t = _cluster_table(tmp_path, "job1", 60)
    note = (f"note: rank table {t}: 60 row(s) ignored: they place ranks the run does not have (ranks 4-63; the run "
            "has ranks 0-3)")
    code, out, err = cli(capsys, "nan", str(SDC / "job1"), "--rank-table", str(t), "--json")
    assert code == 0 and json.loads(out)["kind"] == "none"
    assert err.strip().splitlines() == [f"precnb nan: {note}"], err
    code, out, err = cli(capsys, "replicas", str(SDC / "job1"), "--layout", "tp=2,dp=2", "--rank-table", str(t),
                         "--json")
    assert code == 0 and json.loads(out)["device"] == {"host": "10.0.0.1", "device": "1"}
    assert err.strip().splitlines() == [f"precnb replicas: {note}"], err
    code, out, err = cli(capsys, "devices", str(SDC / "job1"), "--layout", "tp=2,dp=2", "--rank-table", str(t))
    assert code == 0 and err.strip().splitlines() == [f"precnb devices: {note}"], err
    # the table that fits the run exactly: no note
    code, out, err = cli(capsys, "nan", str(SDC / "job1"), "--rank-table", str(TABLES / "job1.csv"))
    assert code == 0 and "note" not in err, err


def test_extra_rows_are_a_note_of_the_triage_and_a_warning_of_open_run(tmp_path):
    t = _cluster_table(tmp_path, "job2", 1)
    tri = precnb.diagnose(SDC / "job2", kinds=["nan_origin"], rank_table=str(t), workers=1)
    assert [n for n in tri.notes if n.startswith("rank table ")] == [
        f"rank table {t}: 1 row(s) ignored: they place ranks the run does not have (rank 4; the run has ranks 0-3)"]
    with pytest.warns(UserWarning, match=r"1 row\(s\) ignored"):
        ds = precnb.open_run(SDC / "job2", rank_table=t, workers=1)
    assert sorted(json.loads(ds.attrs["rank_table"])) == ["0", "1", "2", "3"]
