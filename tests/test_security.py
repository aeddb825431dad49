"""Security: no code execution from tensor files, no writes to dumps, no network, no path traversal.

* Tensor files load only through ``numpy.load(allow_pickle=False)`` and
  ``torch.load(weights_only=True)``: pickles that would run code (a class whose ``__reduce__``
  writes a marker file) in a ``.pt`` (zip or raw pickle) or a ``.npy`` (object array, or a
  pickle in disguise) are refused with :class:`~precnb.errors.UnsafeFileError`, and the marker
  is never written — also with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``.
* A ``data_name`` that leaves ``dump_tensor_data/`` (``..``, absolute, a symlink) is refused.
* Dumps are byte-identical with unchanged mtimes (atime is not looked at) after loading every
  format and running every CLI command; no file is opened for writing inside them (audit hook);
  the CLI writes only the output it was asked for.
* Nothing reaches the network at import, load, analysis or export time: an audit hook in-process
  and in a subprocess (``sitecustomize``), and ``unshare -n`` when available.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import warnings
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np
import pytest

import precnb
from precnb.cli import main
from precnb.errors import PrecnbError, UnsafeFileError
from precnb.io.tensors import load_tensor, load_tensor_file, safe_join

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data_samples"
CORPUS = Path(__file__).resolve().parent / "corpus_broken"


class Evil:
    """Unpickling this runs code: it would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def open_quiet(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return precnb.open_run(path, **kw)


# ----------------------------------------------------------------------------- tensor files

def test_pickled_npy_files_are_refused_and_never_run(tmp_path):
    marker = tmp_path / "PWNED"
    obj_npy = tmp_path / "object_array.npy"
    np.save(obj_npy, np.array([Evil(marker)], dtype=object), allow_pickle=True)
    disguised = tmp_path / "disguised.npy"
    disguised.write_bytes(pickle.dumps(Evil(marker)))
    assert not marker.exists()
    with pytest.raises(UnsafeFileError, match=r"object_array.npy: holds pickled Python objects; refused "
                                              r"\(numpy.load\(allow_pickle=False\)\)"):
        load_tensor_file(obj_npy)
    with pytest.raises(UnsafeFileError, match=r"disguised.npy: a pickle, not a .npy array; refused"):
        load_tensor_file(disguised)
    assert not marker.exists()
    good = tmp_path / "good.npy"
    np.save(good, np.arange(6.0).reshape(2, 3))
    assert np.array_equal(load_tensor_file(good), np.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_raw_pickle_named_pt_is_refused_without_torch(tmp_path, protocol):
    marker = tmp_path / "PWNED"
    pt = tmp_path / "x.pt"
    pt.write_bytes(pickle.dumps(Evil(marker), protocol=protocol))
    with pytest.raises(UnsafeFileError, match=r"x.pt: a plain pickle or a legacy \(non-zip\) torch file; "
                                              r"loading it would need full unpickling; refused"):
        load_tensor_file(pt)
    assert not marker.exists()


@pytest.mark.needs_generator
def test_malicious_torch_zip_is_refused_and_never_runs(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "PWNED"
    pt = tmp_path / "evil.pt"
    torch.save({"weight": torch.ones(2), "payload": Evil(marker)}, pt)
    assert not marker.exists()
    for force in ("0", "1"):  # explicit weights_only=True wins over the environment
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", force)
        with pytest.raises(UnsafeFileError, match=r"evil.pt: contains objects that are not plain tensors; "
                                                  r"refused \(torch.load\(weights_only=True\)\)"):
            load_tensor_file(pt)
    assert not marker.exists()
    good = tmp_path / "good.pt"
    torch.save(torch.arange(4.0), good)
    assert torch.equal(load_tensor_file(good), torch.arange(4.0))
    broken = tmp_path / "broken.pt"
    broken.write_bytes(good.read_bytes()[:-40])
    with pytest.raises(PrecnbError):
        load_tensor_file(broken)


def test_refusal_in_a_fresh_interpreter(tmp_path):
    """End to end in a subprocess: the marker file is never created, the message is one clear line."""
    marker = tmp_path / "PWNED"
    npy = tmp_path / "evil.npy"
    np.save(npy, np.array([Evil(marker)], dtype=object), allow_pickle=True)
    code = textwrap.dedent(f"""
        import precnb
        from precnb.errors import UnsafeFileError
        try:
            precnb.load_tensor_file if hasattr(precnb, "load_tensor_file") else None
            from precnb.io.tensors import load_tensor_file
            load_tensor_file({str(npy)!r})
        except UnsafeFileError as e:
            print("REFUSED", e)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and p.stdout.startswith("REFUSED "), p.stderr
    assert not marker.exists()


def make_tensor_dump(root: Path, names: list[str]) -> Path:
    rank = root / "step0" / "rank0"
    (rank / "dump_tensor_data").mkdir(parents=True)
    out = [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
            "Norm": 1.0, "data_name": n} for n in names]
    doc = {"task": "tensor", "level": "L1", "framework": "pytorch",
           "dump_data_dir": str(rank / "dump_tensor_data"),
           "data": {"Functional.linear.0.forward": {"input_args": [], "input_kwargs": {}, "output": out}}}
    (rank / "dump.json").write_text(json.dumps(doc))
    return rank / "dump_tensor_data"


def test_data_name_path_traversal_is_refused(tmp_path):
    outside = tmp_path / "secret.npy"
    np.save(outside, np.array([42.0]))
    names = ["../../../secret.npy", str(outside), "ok.npy", "link.npy", "..\\..\\..\\secret.npy"]
    data = make_tensor_dump(tmp_path / "dump", names)
    np.save(data / "ok.npy", np.array([1.0, 2.0]))
    (data / "link.npy").symlink_to(outside)
    ds = open_quiet(tmp_path / "dump")
    label = "Functional.linear.0.forward.output.{}"
    for i in (0, 1, 3, 4):
        with pytest.raises(UnsafeFileError, match=r"points outside .*dump_tensor_data; refused"):
            load_tensor(ds, label.format(i), step=0, rank=0)
    assert np.array_equal(load_tensor(ds, label.format(2), step=0, rank=0), [1.0, 2.0])
    warns = precnb.load_report(ds).warnings
    assert len(warns) == 1 and "3 data_name(s) pointing outside dump_tensor_data" in warns[0]
    for bad in ("", " ", "a\x00b", "/etc/passwd", "../x", "C:\\x", "x/../../y"):
        with pytest.raises(UnsafeFileError):
            safe_join(data, bad)
    with pytest.raises(PrecnbError, match="no tensor"):
        load_tensor(ds, "nope", step=0, rank=0)


@pytest.mark.needs_generator
@pytest.mark.shared
def test_real_tensor_dump_loads_safely():
    from tests.conftest import shared_path

    torch = pytest.importorskip("torch")
    src = shared_path("data_samples", "msprobe", "S1_baseline", "tensor")
    ds = open_quiet(src, steps=[0])
    label = next(str(t) for t, n in zip(ds["tensor"].values, ds["data_name"].values[0, 0], strict=True) if n)
    t = load_tensor(ds, label, step=0, rank=0)
    assert isinstance(t, torch.Tensor)
    assert float(t.float().max()) == pytest.approx(float(ds["max"].sel(step=0, rank=0, tensor=label)), rel=1e-6)


# ----------------------------------------------------------------------------- dumps untouched

def snapshot(root: Path) -> dict[str, tuple]:
    """Content hash, size, mode and mtime of every file and folder (atime deliberately left out)."""
    out = {}
    for p in sorted([root, *root.rglob("*")]):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""
        out[str(p.relative_to(root))] = (digest, st.st_size if p.is_file() else 0, st.st_mode, st.st_mtime_ns)
    return out


_OPEN_LOG: list[tuple[str, str]] = []
_WATCH: list[str] = []
_NET_LOG: list[tuple[str, str]] = []
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_NET_EVENTS = {"socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
               "socket.sendto", "socket.sendmsg", "socket.bind", "urllib.Request", "http.client.connect"}


def _audit(event: str, args: tuple) -> None:
    if not _WATCH:
        return
    if event == "open":
        path, mode, flags = [*args, None, None, None][:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writing and isinstance(path, (str, bytes, os.PathLike)):
            p = os.fsdecode(os.fspath(path))
            if any(os.path.abspath(p).startswith(w) for w in _WATCH):
                _OPEN_LOG.append((p, str(mode or flags)))
    elif event in _NET_EVENTS:
        sock = args[0] if args else None
        if getattr(sock, "family", None) == getattr(__import__("socket"), "AF_UNIX", None):
            return  # local IPC (the parsing worker pool's forkserver), not the network
        _NET_LOG.append((event, repr(args)[:200]))


_HOOKED = False


@contextmanager
def watching(*roots: Path):
    """Record writes below *roots* and any network activity while the block runs."""
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)  # hooks cannot be removed: this one is idle outside the block
        _HOOKED = True
    _OPEN_LOG.clear()
    _NET_LOG.clear()
    _WATCH[:] = [str(r.resolve()) + os.sep for r in roots]
    try:
        yield
    finally:
        _WATCH.clear()


@pytest.fixture
def dumps(tmp_path):
    """Copies of every kind of input (their files keep their original mtimes)."""
    src = {
        "baseline": SAMPLES / "divergence" / "baseline",
        "target": SAMPLES / "divergence" / "target",
        "monitor": SAMPLES / "monitor" / "monitor_output",
        "kernel": CORPUS / "kernel_huge_shape",
        "broken": CORPUS / "msprobe_truncated",
        "compare": CORPUS / "compare_literals",
    }
    missing = [k for k, p in src.items() if not p.exists()]
    if missing:
        pytest.skip(f"bundled samples missing: {missing} (run `make samples`)")
    root = tmp_path / "inputs"
    for name, p in src.items():
        shutil.copytree(p, root / name, symlinks=True)
    return root


def _cli_commands(root: Path, out: Path, *, report: bool = True) -> list[list[str]]:
    b, t = str(root / "baseline"), str(root / "target")
    cmp_csv = str(next((root / "compare").glob("*.csv")))
    return [
        ["info", b], ["info", "--json", b], ["info", str(root / "monitor")], ["info", str(root / "kernel")],
        ["info", str(root / "broken")], ["info", cmp_csv],
        ["nan", b], ["nan", "--json", str(root / "monitor")], ["anomalies", b], ["anomalies", str(root / "monitor")],
        ["diff", b, t], ["diff", "--json", b, t], ["diff", cmp_csv],
        ["merge", b, "--layout", "tp=2"], ["merge", b, "--layout", "tp=2", "-o", str(out / "merged.zarr")],
        ["replicas", b, "--layout", "tp=2"], ["convert", b, "-o", str(out / "run.zarr")],
        ["convert", str(root / "monitor"), "-o", str(out / "mon.zarr")],
        *([["report", t, "--baseline", b, "-o", str(out / "report.html")]] if report and _has_command("report")
          else []),
    ]


def _has_command(name: str) -> bool:
    from precnb.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return name in sub.choices


def _outputs(report: bool = True) -> set[str]:
    return {"merged.zarr", "run.zarr", "mon.zarr", *({"report.html"} if report and _has_command("report") else set())}


def test_watcher_sees_writes_and_network(tmp_path):
    """The audit hook used below does notice a write and a name lookup (so silence means something)."""
    import socket

    with watching(tmp_path):
        (tmp_path / "w.txt").write_text("x")
        with open(tmp_path / "w.txt", "a") as fh:
            fh.write("y")
        fd = os.open(tmp_path / "w2", os.O_CREAT | os.O_WRONLY)
        os.close(fd)
        (tmp_path / "w.txt").read_text()
        with suppress(OSError):
            socket.getaddrinfo("localhost", 9)
    assert [m for _, m in _OPEN_LOG][:2] == ["w", "a"] and len(_OPEN_LOG) == 3
    assert [e for e, _ in _NET_LOG] == ["socket.getaddrinfo"]


@pytest.mark.slow
def test_dumps_are_never_modified_or_opened_for_writing(dumps, tmp_path, capsys):
    before = snapshot(dumps)
    out = tmp_path / "out"
    out.mkdir()
    with watching(dumps):
        for name in ("baseline", "target", "monitor", "kernel", "broken"):
            ds = open_quiet(dumps / name)
            ds.load()
        open_quiet(next((dumps / "compare").glob("*.csv")))
        codes = {}
        for argv in _cli_commands(dumps, out):
            codes[" ".join(argv)] = main(argv)
            capsys.readouterr()
    assert _OPEN_LOG == [], _OPEN_LOG
    assert _NET_LOG == [], _NET_LOG  # load, analysis and export (zarr, HTML report) stay offline
    assert snapshot(dumps) == before
    assert set(codes.values()) <= {0, 1}, codes  # 1: the deliberately broken input
    assert {p.name for p in out.iterdir()} == _outputs()


def _run_in_clean_dirs(dumps: Path, tmp_path: Path, report: bool) -> list[str]:
    """Run the commands in one subprocess with an empty cwd, HOME and TMPDIR; return what appeared there."""
    work = tmp_path / "work"
    for d in ("cwd", "home", "tmp", "out"):
        (work / d).mkdir(parents=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work / "home"),
           "TMPDIR": str(work / "tmp"), "PYTHONPATH": str(ROOT), "PRECNB_NO_DASK_CLIENT": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    before = snapshot(dumps)
    driver = (  # every command in one fresh interpreter (a process per command costs ~1.5 s each)
        "import json, sys\nfrom precnb.cli import main\n"
        "codes = [main(argv) for argv in json.loads(sys.argv[1])]\n"
        "sys.stderr.write('CODES ' + json.dumps(codes) + '\\n')\n")
    cmds = _cli_commands(dumps, work / "out", report=report)
    if report:
        cmds = [c for c in cmds if c[0] == "report"]
        assert cmds, "the command list always holds report commands"
    p = subprocess.run([sys.executable, "-c", driver, json.dumps(cmds)], cwd=work / "cwd", env=env,
                       capture_output=True, text=True, check=False)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    codes = json.loads(p.stderr.rsplit("CODES ", 1)[1])
    assert len(codes) == len(cmds) and set(codes) <= {0, 1}, list(zip(cmds, codes, strict=True))
    assert snapshot(dumps) == before
    written = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.parent.name in ("cwd", "home", "tmp",
                                                                                             "out"))
    return written


@pytest.mark.slow
def test_cli_writes_only_where_asked(dumps, tmp_path):
    """Every command but ``report`` in a fresh interpreter: only the asked outputs appear."""
    assert _run_in_clean_dirs(dumps, tmp_path, report=False) == sorted(f"out/{n}" for n in _outputs(report=False))


@pytest.mark.slow
def test_report_command_writes_only_where_asked(dumps, tmp_path):
    assert _run_in_clean_dirs(dumps, tmp_path, report=True) == ["out/report.html"]


# ----------------------------------------------------------------------------- no network

def test_no_network_in_process(dumps, tmp_path, capsys):
    with watching(tmp_path / "nowhere"):
        import precnb.analysis as analysis

        a, b = open_quiet(dumps / "baseline"), open_quiet(dumps / "target")
        analysis.first_divergence(a, b)
        analysis.nan_origin(a)
        analysis.anomalies(open_quiet(dumps / "monitor"))
        precnb.to_zarr(precnb.open_runs({"a": a, "b": b}), tmp_path / "both.zarr")
        precnb.open_run(tmp_path / "both.zarr")
        for argv in (["info", str(dumps / "baseline")], ["nan", str(dumps / "monitor")]):
            main(argv)
        capsys.readouterr()
    assert _NET_LOG == []


SITECUSTOMIZE = '''
import os, sys
_LOG = os.environ["PRECNB_NET_LOG"]
_EVENTS = {"socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
           "socket.sendto", "socket.sendmsg", "socket.bind", "urllib.Request", "http.client.connect"}
def _hook(event, args):
    if event in _EVENTS:
        with open(_LOG, "a") as fh:
            fh.write(f"{event} {args!r}\\n")
        raise OSError(f"network disabled by the test: {event}")
sys.addaudithook(_hook)
'''


def _net_commands(dumps: Path) -> list[list[str]]:
    b, t = str(dumps / "baseline"), str(dumps / "target")
    return [["info", b], ["nan", b], ["diff", b, t], ["anomalies", str(dumps / "monitor")],
            ["nan", "--json", str(dumps / "monitor")]]


@pytest.mark.slow
def test_cli_without_network_sitecustomize(dumps, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "net.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "PRECNB_NET_LOG": str(log),
           "PRECNB_NO_DASK_CLIENT": "1"}
    env.pop("PRECNB_JSON_WHOLE", None)
    p = subprocess.run([sys.executable, "-c", "import sitecustomize, precnb, precnb.io, precnb.analysis"],
                       env=env, capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    canary = subprocess.run([sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 9))"],
                            env={**env, "PRECNB_NET_LOG": str(tmp_path / "canary.log")}, capture_output=True,
                            text=True, check=False)
    assert canary.returncode != 0 and "socket." in (tmp_path / "canary.log").read_text()
    for argv in _net_commands(dumps):
        p = subprocess.run([sys.executable, "-m", "precnb", *argv], env=env, capture_output=True, text=True,
                           check=False)
        assert p.returncode == 0 and "Traceback" not in p.stderr, (argv, p.stderr)
        assert p.stdout.strip()
    assert not log.exists(), log.read_text()


def _unshare_available() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    p = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    return p.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _unshare_available(), reason="needs root and a working `unshare -n`")
def test_cli_in_a_network_namespace_without_network(dumps):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PRECNB_NO_DASK_CLIENT": "1"}
    for argv in _net_commands(dumps):
        p = subprocess.run(["unshare", "-n", sys.executable, "-m", "precnb", *argv], env=env, capture_output=True,
                           text=True, check=False)
        assert p.returncode == 0 and "Traceback" not in p.stderr, (argv, p.stderr)
        assert p.stdout.strip()
