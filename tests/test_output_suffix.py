"""An output's name must fit what precnb writes into it (issue 23, items 7 and 11).

``align -o m.yaml``, ``report -o r.json``, ``metrics -o m.json`` without ``--json``, ``repro -o
r.json``, ... used to end in "internal error: ValueError: ... the content carries no precnb
marker" after the whole computation. Each is now one line naming the suffix to use (exit 1),
before anything is read or written. ``metrics --csv -o`` writes a plain table that
``pandas.read_csv`` reads as it is (marked by a sidecar, not a ``# precnb_output`` line it would
take as the header), and ``--overwrite`` still recognises it. A full disk names the output.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from precnb.cli import main

ROOT = Path(__file__).resolve().parents[1]
S = ROOT / "data_samples"
RENAMED = [str(S / "renamed" / "baseline"), str(S / "renamed" / "target")]
TENSORS = [str(S / "tensor_bug" / "baseline"), str(S / "tensor_bug" / "target")]
DP = str(S / "dp_nan")

# (argv before -o, output name, what the message must ask for)
VARIANTS = [
    (["align", *RENAMED], "m.yaml", "precnb writes JSON here: give it a .json name"),
    (["align", *RENAMED], "m.txt", "precnb writes JSON here: give it a .json name"),
    (["align", *RENAMED], "m.html", "precnb writes JSON here: give it a .json name"),
    (["plan", DP], "p.txt", "precnb writes JSON here: give it a .json name"),
    (["plan", DP], "p.html", "precnb writes JSON here: give it a .json name"),
    (["report", DP], "r.json", "precnb writes an HTML page here: give it a .html name"),
    (["report", DP], "r.txt", "precnb writes an HTML page here: give it a .html name"),
    (["metrics", *TENSORS], "m.json", "precnb writes text here"),
    (["metrics", *TENSORS, "--json"], "m.txt", "precnb writes JSON here: give it a .json name"),
    (["metrics", *TENSORS, "--csv"], "m.json", "precnb writes text here"),
    (["repro", TENSORS[0], "Functional.gelu.0.forward"], "r.json", "precnb writes text here"),
    (["repro", TENSORS[0], "Functional.gelu.0.forward"], "r.html", "precnb writes text here"),
    (["template", "nan_origin"], "t.html", "precnb writes a notebook here: give it a .ipynb name"),
    (["template", "nan_origin", "--html", "{tmp}/t.json"], "t.ipynb", "precnb writes an HTML page here"),
]


@pytest.mark.parametrize("argv, name, needle", VARIANTS, ids=[f"{v[0][0]}-{v[1]}" for v in VARIANTS])
def test_a_name_that_does_not_fit_the_content_is_one_line(tmp_path, capsys, argv, name, needle):
    out = tmp_path / name
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    refused = Path(argv[argv.index("--html") + 1]) if "--html" in argv else out
    code = main([*argv, "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.count("\n") == 1 and "internal error" not in err and "precnb marker" not in err, err
    assert f"refusing to write {refused}" in err and needle in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_right_names_still_work(tmp_path, capsys):
    assert main(["align", *RENAMED, "-o", str(tmp_path / "m.json")]) == 0
    assert main(["metrics", *TENSORS, "-o", str(tmp_path / "m.txt")]) == 0
    assert main(["repro", TENSORS[0], "Functional.gelu.0.forward", "-o", str(tmp_path / "r.py")]) == 0
    assert main(["metrics", *TENSORS, "--json", "-o", str(tmp_path / "metrics.json")]) == 0
    capsys.readouterr()


def test_metrics_csv_is_a_plain_table_pandas_reads(tmp_path, capsys):
    pd = pytest.importorskip("pandas")
    out = tmp_path / "m.csv"
    assert main(["metrics", *TENSORS, "--csv", "-o", str(out)]) == 0
    capsys.readouterr()
    frame = pd.read_csv(out)
    assert list(frame.columns[:3]) == ["step", "rank", "tensor"] and len(frame) > 100
    assert not out.read_text().startswith("#")
    side = tmp_path / ".m.csv.precnb_output"
    assert side.is_file()
    # precnb recognises its table: --overwrite replaces it, without it the file is kept
    assert main(["metrics", *TENSORS, "--csv", "-o", str(out)]) == 1
    assert "pass --overwrite" in capsys.readouterr().err
    assert main(["metrics", *TENSORS, "--csv", "-o", str(out), "--overwrite"]) == 0
    # a user's own table (or one edited since) is never replaced
    out.write_text(out.read_text() + "mine,1\n")
    assert main(["metrics", *TENSORS, "--csv", "-o", str(out), "--overwrite"]) == 1
    assert "not a precnb output" in capsys.readouterr().err and out.read_text().endswith("mine,1\n")
    theirs = tmp_path / "t.csv"
    (tmp_path / ".t.csv.precnb_output").write_text("my notes")
    assert main(["metrics", *TENSORS, "--csv", "-o", str(theirs)]) == 1
    assert "is not precnb's; it is left alone" in capsys.readouterr().err and not theirs.exists()


def test_a_full_disk_names_the_output(tmp_path, monkeypatch, capsys):
    import precnb._write._files as w  # where a file is written and flushed

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(w.os, "fsync", full)
    out = tmp_path / "m.json"
    assert main(["align", *RENAMED, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"refusing to write {out}: cannot write it: No space left on device: the file system holding it is " \
           "full" in err, err
    assert not list(tmp_path.iterdir())  # no temporary file left behind


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tiny tmpfs needs root")
def test_a_full_disk_names_the_store_and_leaves_nothing(tmp_path):
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tiny)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        p = subprocess.run([sys.executable, "-m", "precnb", "convert", DP, "-o", str(tiny / "run.zarr")],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert p.returncode == 1 and f"refusing to write {tiny / 'run.zarr'}: cannot write it: No space left" \
            in p.stderr, p.stderr
        assert list(tiny.iterdir()) == []
    finally:
        subprocess.run(["umount", str(tiny)], check=False)
