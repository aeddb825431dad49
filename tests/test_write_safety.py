"""Nothing a user owns is ever lost: every writer (convert, merge -o, report, template, to_zarr,
write_html, the explorer's export) refuses to write into, over or around an input, over anything
it did not create, through a symlink or into a missing folder; writes are atomic and concurrent
writers cannot leave a mixed store.

Every attack runs on a copy of a real sample (``data_samples/dp_nan``, plus a user folder, a
user file and a user zarr store beside it) and compares the sha256, size and mode of every file
and folder below the whole work area before and after: a refusal changes nothing at all, and
is one line naming the path and why, exit 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from precnb.cli import main
from precnb.errors import OutputRefusedError
from tests.conftest import open_quiet, sample_path


def snapshot(root: Path) -> dict[str, tuple]:
    """sha256, size and mode of every file, folder and link below *root* (mtimes of folders vary)."""
    out = {}
    for p in sorted([root, *root.rglob("*")]):
        st = p.lstat()
        if p.is_symlink():
            out[str(p.relative_to(root))] = ("link", os.readlink(p))
        elif p.is_file():
            out[str(p.relative_to(root))] = (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_size, st.st_mode)
        else:
            out[str(p.relative_to(root))] = ("dir", st.st_mode)
    return out


@pytest.fixture
def world(tmp_path, monkeypatch):
    """tmp/{RUN (dp_nan), mine/ (a user folder), user.html, user.ipynb, theirs.zarr (a user zarr store)}."""
    sample_path("dp_nan")
    root = tmp_path / "w"
    root.mkdir()
    shutil.copytree(sample_path("dp_nan"), root / "RUN")
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("my notes\n")
    (root / "user.html").write_text("<html><head></head><body>my page</body></html>")
    (root / "user.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    theirs = root / "theirs.zarr"
    theirs.mkdir()
    (theirs / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group",
                                                  "attributes": {"precnb_schema": "1.0"}}))
    monkeypatch.chdir(root)
    return root


def refused(capsys, argv: list[str], *needles: str) -> str:
    """Run the CLI; it must exit 1 with one line naming the refusal."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1, (argv, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "refusing to write" in lines[0], err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


W1 = ["--workers", "1"]

# (argv, words the one-line refusal must hold); run from inside the work area
ATTACKS = [
    # the attacks
    (["convert", "RUN/step0", "-o", "RUN", "--overwrite"], ["it is the input"]),
    (["convert", "RUN", "-o", "mine", "--overwrite"], ["mine", "not a precnb output"]),
    (["merge", "RUN/step0", "--tp", "2", "-o", "RUN", "--overwrite"], ["it is the input"]),
    (["convert", "RUN", "-o", "RUN/step0", "--overwrite"], ["inside the input"]),
    (["convert", "RUN", "-o", "RUN/run.zarr"], ["inside the input"]),
    (["report", "RUN", "-o", "RUN/step0/rank0/dump.json"], ["inside the input"]),
    (["report", "RUN", "-o", "RUN/step0/rank0/dump.json", "--overwrite"], ["inside the input"]),
    (["report", "RUN", "-o", "no/such/dir/r.html"], ["does not exist", "create it first"]),
    # an input given as a step folder, a rank folder or a file inside the dump protects the whole dump
    (["convert", "RUN/step0", "-o", "RUN/x.zarr"], ["inside the input"]),
    (["convert", "RUN/step0/rank0", "-o", "RUN/step1/x.zarr"], ["inside the input"]),
    (["convert", "RUN/step0/rank0/dump.json", "-o", "RUN/step0/x.zarr"], ["inside the input"]),
    (["report", "RUN/step1/rank1/dump.json", "-o", "RUN/r.html"], ["inside the input"]),
    (["merge", "RUN", "--tp", "2", "-o", "RUN/step0/rank0", "--overwrite"], ["inside the input"]),
    # folders above the input, the current folder, relative paths, trailing slashes, dot-dot
    (["convert", "RUN/step0", "-o", ".", "--overwrite"], ["the input", "is inside it"]),
    (["convert", "RUN", "-o", "./", "--overwrite"], ["the input", "is inside it"]),
    (["convert", "RUN/", "-o", "RUN/", "--overwrite"], ["it is the input"]),
    (["convert", "RUN", "-o", "mine/../RUN/step2/", "--overwrite"], ["inside the input"]),
    (["convert", "./RUN/step0/../", "-o", "RUN/step0/../x.zarr"], ["inside the input"]),
    (["report", "RUN", "-o", "RUN"], ["it is the input"]),
    (["report", "RUN", "-o", "out/"], ["names a folder"]),
    (["report", "RUN", "-o", ""], ["empty output path"]),
    (["convert", "RUN", "-o", "/"], ["names a folder"]),
    # existing things precnb did not write, with and without --overwrite
    (["convert", "RUN", "-o", "theirs.zarr", "--overwrite"], ["not a precnb output"]),
    (["convert", "RUN", "-o", "theirs.zarr"], ["not a precnb output"]),
    (["convert", "RUN", "-o", "user.html", "--overwrite"], ["not a folder"]),
    (["report", "RUN", "-o", "user.html"], ["not a precnb output"]),
    (["report", "RUN", "-o", "user.html", "--overwrite"], ["not a precnb output"]),
    (["report", "RUN", "-o", "mine", "--overwrite"], ["is a folder"]),
    (["report", "RUN", "-o", "mine/notes.txt", "--overwrite"], ["not a precnb output"]),
    (["template", "nan_origin", "-o", "user.ipynb", "--overwrite"], ["not a precnb output"]),
    (["template", "nan_origin", "-o", "RUN/t.ipynb", "-p", "run", "RUN"], ["inside the input"]),
    (["template", "nan_origin", "-o", "t.ipynb", "--html", "RUN/t.html", "-p", "run", "RUN"], ["inside the input"]),
    (["template", "nan_origin", "-o", "t.ipynb", "--html", "user.html", "--overwrite"], ["not a precnb output"]),
    (["convert", "RUN/step0", "-o", "..", "--overwrite"], ["the input", "is inside it"]),
    (["report", "RUN", "-o", "RUN/step0/rank0/dump.json/x.html"], ["is not a folder"]),
    (["report", "RUN", "-o", "RUN/step9/r.html"], ["does not exist"]),
    (["convert", "RUN", "-o", "RUN.zarr/inner.zarr"], ["does not exist"]),
    (["report", "RUN", "-o", "x" * 300 + ".html"], ["cannot access it"]),
    # precnb align -o (mapping files) follows the same rules
    (["align", "RUN/step0", "RUN/step1", "-o", "RUN/map.json"], ["inside the input"]),
    (["align", "RUN/step0", "RUN/step1", "-o", "mine/notes.txt", "--overwrite"], ["not a precnb output"]),
    (["align", "RUN/step0", "RUN/step1", "-o", "no/map.json"], ["does not exist"]),
    (["align", "RUN/step0", "RUN/step1", "-o", "RUN/step1/rank0/dump.json", "--overwrite"], ["inside the input"]),
    # precnb plan -o (dump plans, msprobe config.json) too
    (["plan", "RUN", "-o", "RUN/config.json"], ["inside the input"]),
    (["plan", "RUN", "-o", "mine/notes.txt", "--overwrite"], ["not a precnb output"]),
    (["plan", "RUN", "-o", "no/config.json"], ["does not exist"]),
    (["plan", "RUN/step1", "--baseline", "RUN/step0", "-o", "RUN/step0/config.json"], ["inside the input"]),
    # a baseline or a reference is an input too
    (["report", "RUN/step1", "--baseline", "RUN/step0", "-o", "RUN/step0/r.html"], ["inside the input"]),
    (["merge", "RUN", "--tp", "2", "--reference", "RUN", "-o", "RUN/m.zarr"], ["inside the input"]),
]


@pytest.mark.parametrize(("argv", "needles"), ATTACKS, ids=[" ".join(a) or "empty" for a, _ in ATTACKS])
def test_attack_is_refused_and_nothing_changes(world, capsys, argv, needles):
    before = snapshot(world)
    refused(capsys, [*argv, *(W1 if argv[0] in ("convert", "merge", "report", "align", "plan") else [])], *needles)
    assert snapshot(world) == before


def test_symlinks_into_the_input_or_as_the_output_are_refused(world, capsys):
    (world / "into_step").symlink_to(world / "RUN" / "step0", target_is_directory=True)
    (world / "run_link").symlink_to(world / "RUN", target_is_directory=True)
    assert main(["convert", "RUN", "-o", "ours.zarr", *W1]) == 0
    (world / "store_link").symlink_to(world / "ours.zarr", target_is_directory=True)
    assert main(["report", "RUN", "-o", "ours.html", *W1]) == 0
    (world / "report_link.html").symlink_to(world / "ours.html")
    (world / "dangling.html").symlink_to(world / "nowhere.html")
    capsys.readouterr()
    before = snapshot(world)
    refused(capsys, ["convert", "RUN", "-o", "into_step/x.zarr", *W1], "inside the input")
    refused(capsys, ["convert", "RUN", "-o", "run_link", "--overwrite", *W1], "it is the input")
    refused(capsys, ["convert", "run_link", "-o", "RUN/x.zarr", *W1], "inside the input")
    refused(capsys, ["convert", "into_step", "-o", "RUN/x.zarr", *W1], "inside the input")
    refused(capsys, ["report", "run_link/step0", "-o", "into_step/r.html", *W1], "inside the input")
    refused(capsys, ["convert", "RUN", "-o", "store_link", "--overwrite", *W1], "symbolic link")
    refused(capsys, ["report", "RUN", "-o", "report_link.html", "--overwrite", *W1], "symbolic link")
    refused(capsys, ["report", "RUN", "-o", "dangling.html", *W1], "symbolic link")
    (world / "run").symlink_to(world / "RUN", target_is_directory=True)  # another spelling of the input
    refused(capsys, ["convert", "RUN", "-o", "run/x.zarr", *W1], "inside the input")
    refused(capsys, ["convert", "run", "-o", "RUN/x.zarr", *W1], "inside the input")
    refused(capsys, ["report", "RUN", "-o", "run/step0/../r.html", *W1], "inside the input")
    assert snapshot(world) == before | {"run": ("link", str(world / "RUN"))}


def test_fifo_and_device_outputs_are_refused_without_blocking(world, capsys):
    os.mkfifo(world / "pipe.html")
    before = snapshot(world)
    refused(capsys, ["report", "RUN", "-o", "pipe.html", "--overwrite", *W1], "not a regular file")
    refused(capsys, ["report", "RUN", "-o", "/dev/null", "--overwrite", *W1], "not a regular file")
    assert snapshot(world) == before


def test_overwrite_replaces_only_precnb_outputs(world, capsys):
    assert main(["convert", "RUN", "-o", "ours.zarr", *W1]) == 0
    assert main(["report", "RUN", "-o", "r.html", *W1]) == 0
    assert main(["template", "nan_origin", "-o", "t.ipynb"]) == 0
    assert main(["align", "RUN", "RUN", "-o", "map.json", *W1]) == 0
    capsys.readouterr()
    before = snapshot(world)
    refused(capsys, ["align", "RUN", "RUN", "-o", "map.json", *W1], "exists (pass --overwrite")
    assert main(["align", "RUN", "RUN", "-o", "map.json", "--overwrite", *W1]) == 0
    capsys.readouterr()
    assert json.loads((world / "map.json").read_text())["precnb_output"]["kind"] == "mapping"
    before = snapshot(world)
    refused(capsys, ["convert", "RUN", "-o", "ours.zarr", *W1], "exists (pass --overwrite")
    refused(capsys, ["report", "RUN", "-o", "r.html", *W1], "exists (pass --overwrite")
    refused(capsys, ["template", "divergence", "-o", "t.ipynb"], "exists (pass --overwrite")
    refused(capsys, ["convert", "RUN", "-o", "r.html", "--overwrite", *W1], "not a folder")
    refused(capsys, ["report", "RUN", "-o", "ours.zarr", "--overwrite", *W1], "is a folder")
    refused(capsys, ["convert", "ours.zarr", "-o", "ours.zarr", "--overwrite", *W1], "it is the input")
    assert snapshot(world) == before
    # a user file dropped into a precnb store makes the store the user's: never replaced
    (world / "ours.zarr" / "my_notes.txt").write_text("keep me")
    before = snapshot(world)
    refused(capsys, ["convert", "RUN", "-o", "ours.zarr", "--overwrite", *W1], "not a precnb output")
    assert snapshot(world) == before
    (world / "ours.zarr" / "my_notes.txt").unlink()
    # precnb's own outputs are replaced, atomically, with a complete new one
    assert main(["convert", "RUN/step1", "-o", "ours.zarr", "--overwrite", *W1]) == 0
    assert main(["report", "RUN", "-o", "r.html", "--overwrite", "--title", "second", *W1]) == 0
    assert main(["template", "divergence", "-o", "t.ipynb", "--overwrite"]) == 0
    capsys.readouterr()
    assert [int(s) for s in open_quiet(world / "ours.zarr")["step"].values] == [1]
    assert "<title>precnb report — second</title>" in (world / "r.html").read_text(encoding="utf-8")
    assert json.loads((world / "t.ipynb").read_text())["metadata"]["precnb_output"]["kind"] == "notebook:divergence"
    leftovers = [p.name for p in world.iterdir() if "precnb-" in p.name]
    assert leftovers == []  # no temporary sibling left behind
    assert snapshot(world / "RUN") == snapshot(sample_path("dp_nan"))


def test_merge_and_convert_outputs_reopen_identical(world, capsys):
    import xarray as xr

    assert main(["convert", "RUN", "-o", "run.zarr", *W1]) == 0
    assert main(["merge", "RUN", "--tp", "2", "-o", "m.zarr", *W1]) == 0
    xr.testing.assert_identical(open_quiet("RUN", workers=1), open_quiet(world / "run.zarr"))
    assert "precnb_output" not in open_quiet(world / "run.zarr").attrs  # the marker stays in the store
    assert snapshot(world / "RUN") == snapshot(sample_path("dp_nan"))


# -- Python API ----------------------------------------------------------------------------------

def test_python_api_follows_the_same_rules(world):
    import precnb
    from precnb.report import write_html

    ds = open_quiet("RUN", workers=1)
    before = snapshot(world)
    for call, needle in [
        (lambda: precnb.to_zarr(ds, world / "RUN" / "x.zarr"), "inside the input"),
        (lambda: precnb.to_zarr(ds, world / "mine", mode="w"), "not a precnb output"),
        (lambda: precnb.to_zarr(world / "RUN", world / "RUN" / "step0", mode="w"), "inside the input"),
        (lambda: precnb.to_zarr(ds, world / "x.zarr", inputs=[world]), "inside the input"),
        (lambda: write_html(ds, world / "RUN" / "r.html"), "inside the input"),
        (lambda: write_html(ds, world / "user.html", overwrite=True), "not a precnb output"),
        (lambda: write_html(ds, world / "new" / "r.html"), "does not exist"),
    ]:
        with pytest.raises(OutputRefusedError, match=needle):
            call()
    with pytest.raises(ValueError, match="mode must be"):
        precnb.to_zarr(ds, world / "x.zarr", mode="a")
    assert snapshot(world) == before


def test_explorer_export_follows_the_same_rules(world):
    pytest.importorskip("ipywidgets")
    import precnb

    ex = precnb.explore(open_quiet("RUN", workers=1))
    before = snapshot(world)
    for target in ("RUN/step0/report.html", "user.html", "no/such/r.html", "mine"):
        ex.export.path.value = str(world / target)
        ex.export.overwrite.value = True
        assert ex.export.export() is None
        assert "refusing to write" in ex.export.status.value
    assert snapshot(world) == before
    ex.export.overwrite.value = False
    ex.export.path.value = str(world / "explored.html")
    assert ex.export.export() == world / "explored.html"
    assert ex.export.export() is None and "tick the replace box" in ex.export.status.value
    ex.export.overwrite.value = True
    assert ex.export.export() == world / "explored.html"


# -- concurrency and crashes ---------------------------------------------------------------------

def _cli(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "precnb", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_concurrent_converts_never_leave_a_mixed_store(world):
    import xarray as xr

    expected = open_quiet("RUN", workers=1)
    for extra, n in (([], 3), (["--overwrite"], 2)):
        procs = [_cli("convert", "RUN", "-o", "c.zarr", "--workers", "1", *extra, cwd=world) for _ in range(n)]
        results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
        for p in procs:
            p.stdout.close()
            p.stderr.close()
        codes = sorted(c for c, _ in results)
        assert codes[0] == 0, results
        for code, err in results:
            if code:
                lines = err.strip().splitlines()
                assert len(lines) == 1 and "refusing to write c.zarr" in lines[0], err
                assert "internal error" not in err
        xr.testing.assert_identical(expected, open_quiet(world / "c.zarr"))
        assert [p.name for p in world.iterdir() if "precnb-" in p.name] == []
    assert snapshot(world / "RUN") == snapshot(sample_path("dp_nan"))


def test_a_killed_writer_leaves_nothing_and_is_reclaimed(world):
    import xarray as xr

    proc = _cli("convert", "RUN", "-o", "k.zarr", "--workers", "1", cwd=world)
    partial = world / ".k.zarr.precnb-partial"
    deadline = time.time() + 60
    while not partial.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.close()
    proc.stderr.close()
    assert not (world / "k.zarr").exists() or open_quiet(world / "k.zarr") is not None  # complete or absent
    assert main(["convert", "RUN", "-o", "k2.zarr", "--workers", "1"]) == 0
    if not (world / "k.zarr").exists():  # the stale partial output of the killed writer is taken over
        assert main(["convert", "RUN", "-o", "k.zarr", "--workers", "1"]) == 0
    xr.testing.assert_identical(open_quiet("RUN", workers=1), open_quiet(world / "k.zarr"))
    assert [p.name for p in world.iterdir() if "precnb-" in p.name] == []


def test_a_partial_folder_of_another_live_writer_is_never_taken(world, capsys):
    import fcntl

    partial = world / ".busy.zarr.precnb-partial"
    partial.mkdir()
    (partial / ".precnb-writing").write_text("1")
    fd = os.open(partial, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        before = snapshot(world)
        refused(capsys, ["convert", "RUN", "-o", "busy.zarr", *W1], "another precnb process is writing it")
        assert snapshot(world) == before
    finally:
        os.close(fd)
    # not ours at all (no sentinel, not a store): left alone
    (partial / ".precnb-writing").unlink()
    (partial / "user_file").write_text("x")
    before = snapshot(world)
    refused(capsys, ["convert", "RUN", "-o", "busy.zarr", *W1], "was not left by precnb")
    assert snapshot(world) == before


def test_a_stale_partial_folder_is_reclaimed(world, capsys):
    import xarray as xr

    partial = world / ".s.zarr.precnb-partial"
    partial.mkdir()
    (partial / ".precnb-writing").write_text("99999")  # left by a writer that was killed: nobody holds its lock
    (partial / "zarr.json").write_text("{}")
    (partial / "max").mkdir()
    assert main(["convert", "RUN", "-o", "s.zarr", *W1]) == 0
    xr.testing.assert_identical(open_quiet("RUN", workers=1), open_quiet(world / "s.zarr"))
    assert not partial.exists()


# -- the _write API itself (what later writers use) ---------------------------------------------

def test_markers_recognise_each_kind_of_output(tmp_path):
    from precnb._marks import MARKER_KEY, html_marker, is_precnb_output, mark_folder, marker, text_marker

    cases = {
        "r.html": f"<!DOCTYPE html><html><head>{html_marker('report')}</head></html>",
        "n.ipynb": json.dumps({"cells": [], "metadata": {MARKER_KEY: marker("notebook")}, "nbformat": 4}),
        "m.json": json.dumps({MARKER_KEY: marker("mapping"), "pairs": []}),
        "plan.txt": text_marker("dump-plan") + "\nstep 3\n",
        "repro.py": text_marker("repro", comment="#") + "\nprint(1)\n",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        assert is_precnb_output(tmp_path / name), name
        (tmp_path / f"user_{name}").write_text(text.replace("precnb", "other"))
        assert not is_precnb_output(tmp_path / f"user_{name}"), name
    late = tmp_path / "late.html"
    late.write_text("<html>" + " " * 70_000 + html_marker("report"))  # a marker not in the head: not ours
    assert not is_precnb_output(late)
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    mark_folder(folder, "bundle")
    assert is_precnb_output(folder)
    (folder / "user.txt").write_text("mine")  # a file precnb did not write: the folder is the user's now
    assert not is_precnb_output(folder)
    os.mkfifo(tmp_path / "fifo.json")
    assert not is_precnb_output(tmp_path / "fifo.json")  # never opened (would block)
    (tmp_path / "link.html").symlink_to(tmp_path / "r.html")
    assert not is_precnb_output(tmp_path / "link.html")


def test_write_api_for_later_writers(tmp_path):
    from precnb._marks import mark_folder, text_marker
    from precnb._write import check_output, write_bytes, write_text, writing_file, writing_folder

    run = tmp_path / "RUN"
    shutil.copytree(sample_path("dp_nan"), run)
    before = snapshot(run)
    with pytest.raises(ValueError, match="no precnb marker"):
        write_text(tmp_path / "plain.txt", "no marker here")
    assert not (tmp_path / "plain.txt").exists()
    out = write_text(tmp_path / "plan.txt", text_marker("dump-plan") + "\nstep 1\n", inputs=[run])
    with pytest.raises(OutputRefusedError, match="exists"):
        write_text(out, text_marker("dump-plan") + "\nstep 2\n", inputs=[run])
    write_text(out, text_marker("dump-plan") + "\nstep 2\n", inputs=[run], overwrite=True)
    assert out.read_text().endswith("step 2\n")
    with pytest.raises(OutputRefusedError, match="inside the input"):
        write_bytes(run / "step0" / "plan.txt", (text_marker("x") + "\n").encode(), inputs=[run / "step0" / "rank0"])
    with pytest.raises(OutputRefusedError, match="inside the input"):
        check_output(run / "step1" / "map.json", inputs=[run / "step0" / "rank1" / "dump.json"])
    with writing_file(tmp_path / "repro.py", inputs=[run]) as tmp:
        tmp.write_text(text_marker("repro") + "\nprint('hi')\n")
    assert (tmp_path / "repro.py").read_text().endswith("print('hi')\n")
    with pytest.raises(ValueError, match="no precnb marker"), writing_file(tmp_path / "bad.py") as tmp:
        tmp.write_text("print('unmarked')\n")
    assert not (tmp_path / "bad.py").exists()
    with writing_folder(tmp_path / "bundle", inputs=[run]) as tmp:
        (tmp / "a.txt").write_text("a")
        mark_folder(tmp, "bundle")
    assert (tmp_path / "bundle" / "a.txt").read_text() == "a"
    with pytest.raises(RuntimeError), writing_folder(tmp_path / "bundle2") as tmp:  # an error mid-way
        (tmp / "half.txt").write_text("x")
        raise RuntimeError("writer failed")
    assert not (tmp_path / "bundle2").exists()
    assert [p.name for p in tmp_path.iterdir() if "precnb-" in p.name] == []
    assert snapshot(run) == before


def test_fallback_without_renameat2(tmp_path, monkeypatch):
    from precnb import _atomic
    from precnb._marks import text_marker
    from precnb._write import write_text

    monkeypatch.setattr(_atomic, "_renameat2", lambda src, dst: False)
    out = write_text(tmp_path / "a.txt", text_marker("x") + "\n")
    with pytest.raises(FileExistsError):
        _atomic.rename_noreplace(tmp_path / "a.txt", out)
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    with pytest.raises(FileExistsError):
        _atomic.rename_noreplace(tmp_path / "d1", tmp_path / "d2")  # plain rename would replace an empty folder
    assert out.read_text().startswith("# precnb_output")


def test_template_output_checks_are_usage_errors_before_anything_is_written(world, capsys):
    before = snapshot(world)
    assert main(["template", "nan_origin", "-o", "t.ipynb", "--html", "./t.ipynb"]) == 2
    assert "--html and -o name the same file" in capsys.readouterr().err
    assert main(["template", "nan_origin", "-o", "t.ipynb", "--execute", "--cwd", "no/such"]) == 2
    assert "is not an existing folder" in capsys.readouterr().err
    assert snapshot(world) == before


def test_odd_paths_from_python_are_refusals(world):
    from precnb._marks import text_marker
    from precnb._write import write_text

    for bad, needle in [("a\0b.txt", "NUL"), ("", "empty output path"), ("  ", "empty output path")]:
        with pytest.raises(OutputRefusedError, match=needle):
            write_text(bad, text_marker("x") + "\n")


# -- a zarr store is an input too (issue 23, item 6) ----------------------------------------------

def test_a_dataset_reopened_from_a_store_never_writes_inside_it(world, capsys):
    """Its ``source`` names the dump it was converted from; the store it was read from is protected as well."""
    import precnb
    from precnb._write import STORE_ATTR, dataset_inputs
    from precnb.report import write_html

    assert main(["convert", "RUN", "-o", "run.zarr", "--workers", "1"]) == 0
    store = world / "run.zarr"
    ds = open_quiet(store)
    assert ds.encoding[STORE_ATTR] == str(store) and str(store) in dataset_inputs(ds)
    assert STORE_ATTR not in ds.attrs  # the dataset stays identical to the one written
    assert str(store) in dataset_inputs(precnb.combine_runs({"a": ds, "b": open_quiet("RUN", workers=1)}))
    before = snapshot(world)
    for call in (lambda: write_html(ds, store / "report.html"),
                 lambda: write_html(ds.sel(step=[0]), store / "step" / ".." / "r.html"),
                 lambda: precnb.align(ds, ds).to_file(store / "map.json", inputs=dataset_inputs(ds)),
                 lambda: precnb.to_zarr(ds, store / "inner.zarr")):
        with pytest.raises(OutputRefusedError, match=f"inside the input {store}"):
            call()
    assert snapshot(world) == before
    # the store reopens as it was written, and `convert --overwrite` may still replace it
    assert main(["convert", "RUN", "-o", "run.zarr", "--overwrite", "--workers", "1"]) == 0, capsys.readouterr().err
    precnb.to_zarr(ds, world / "copy.zarr")
    assert STORE_ATTR not in json.loads((world / "copy.zarr" / "zarr.json").read_text())["attributes"]
    assert open_quiet(world / "copy.zarr").encoding[STORE_ATTR] == str(world / "copy.zarr")


def test_the_explorer_on_stores_never_saves_inside_them(world):
    pytest.importorskip("ipywidgets")
    import precnb

    for side in ("baseline", "target"):
        precnb.to_zarr(sample_path("renamed", side), world / f"{side}.zarr")
    ex = precnb.explore(open_quiet(world / "target.zarr"), baseline=open_quiet(world / "baseline.zarr"))
    assert {str(world / "target.zarr"), str(world / "baseline.zarr")} <= set(ex.input_paths())
    before = snapshot(world)
    panel = ex.panel("Alignment")
    for inside in (world / "target.zarr" / "map.json", world / "baseline.zarr" / "map.json"):
        panel.path.value = str(inside)
        panel.overwrite.value = True
        assert panel.do_save() is None and "refusing to write" in panel.output.value
        ex.export.path.value = str(inside.with_suffix(".html"))
        ex.export.overwrite.value = True
        assert ex.export.export() is None and "refusing to write" in ex.export.status.value
    assert snapshot(world) == before
    panel.path.value = str(world / "map.json")
    assert panel.do_save() == world / "map.json"
