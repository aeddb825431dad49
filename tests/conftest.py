"""Shared fixtures: paths to bundled samples and to ../shared (skipped when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _time_budget import addoption, logreport, makereport, sessionfinish, sessionstart, setup, summary

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data_samples"
SHARED = Path(os.environ.get("PRECNB_SHARED", ROOT.parent / "shared"))

os.environ.setdefault("PRECNB_NO_DASK_CLIENT", "1")
# subprocesses (`python -m precnb`, `python -m precnb_samples`) import this checkout's precnb, whatever the venv's
# install points at (a git worktree beside the checkout the venv was installed from), and the sample generator
# (tools/samples, outside the wheel; pyproject's pytest `pythonpath` puts it on this process's sys.path)
GENERATOR = ROOT / "tools" / "samples"
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), str(GENERATOR), os.environ.get("PYTHONPATH", "")) if p)

_DESELECTED_GENERATOR: list[str] = []


def pytest_addoption(parser):
    addoption(parser)


@pytest.hookimpl(tryfirst=True)  # before xdist starts its workers: the run's wall time includes theirs
def pytest_sessionstart(session):
    sessionstart(session)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    setup(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    cpu = makereport(item, call)
    outcome = yield
    if cpu is not None:
        outcome.get_result().user_properties.append(("cpu_s", cpu))


def pytest_runtest_logreport(report):
    logreport(report)


def pytest_sessionfinish(session):
    sessionfinish(session)


def pytest_deselected(items):
    """Remember the needs_generator tests that `-m "not needs_generator"` (make test) left out."""
    _DESELECTED_GENERATOR.extend(i.nodeid for i in items if i.get_closest_marker("needs_generator"))


def pytest_terminal_summary(terminalreporter):
    summary(terminalreporter)
    if _DESELECTED_GENERATOR:
        terminalreporter.write_line(
            f"needs_generator: {len(_DESELECTED_GENERATOR)} test(s) deselected: they need torch, msprobe or "
            "MindSpore (sample generation / cross-checks); run them with `make test-generator`")


def shared_path(*parts: str) -> Path:
    """Path below ../shared, or skip the test when it is not there."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not available (../shared is absent on this machine)")
    return p


def sample_path(*parts: str) -> Path:
    """Path below data_samples/ (committed: a missing sample is a failure, never a skip)."""
    p = SAMPLES.joinpath(*parts)
    if not p.exists():
        pytest.fail(f"bundled sample {p} is missing: data_samples/ is committed (regenerate it with "
                    "`make samples` and commit it)")
    return p


@pytest.fixture
def shared():
    return shared_path


@pytest.fixture
def samples():
    return sample_path


def open_quiet(path, **kw):
    """``precnb.open_run`` without progress bar or load warnings (tests check the load report)."""
    import warnings

    import precnb

    kw.setdefault("progress", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return precnb.open_run(path, **kw)


@pytest.fixture
def fresh_pool():
    """Stop the parsing worker processes after the test (the next load starts new ones)."""
    from precnb.io import _pool

    yield
    _pool.shutdown()


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory):
    """A wheel built from a copy of the sources (as `pip wheel .` in a fresh clone does)."""
    import shutil
    import subprocess
    import sys

    src = tmp_path_factory.mktemp("wheel_src")
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("precnb", "data_samples", "notebooks"):  # what setup.py and MANIFEST.in put in the package
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns(
            "__pycache__", "*.pyc", ".ipynb_checkpoints", "*.so"))  # (a fresh clone has no extension built in place)
    out = tmp_path_factory.mktemp("wheels")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"cannot build the wheel (the test extra installs setuptools>=77 and wheel): " \
                                 f"{proc.stderr[-2000:]}"
    return next(out.glob("precnb-*.whl"))


@pytest.fixture(scope="session")
def executed_templates(tmp_path_factory):
    """Every notebook template filled (``report=<its folder>/report.html``) and executed once, two at a time.

    ``{name: (executed notebook path, its folder, error or None)}``; shared by the template tests
    and the browser tests of their offline export (executing them is the slow part).
    """
    from concurrent.futures import ThreadPoolExecutor

    pytest.importorskip("papermill")
    pytest.importorskip("nbformat")
    from precnb.report import notebooks

    sample_path()
    root = tmp_path_factory.mktemp("executed_templates")

    def run(name: str):
        folder = root / name
        folder.mkdir()
        try:
            # an absolute report path: papermill changes the process's folder while a kernel starts, and two
            # notebooks run at once
            nb_path = notebooks.fill_template(name, folder / f"{name}.ipynb", {"report": str(folder / "report.html")})
            notebooks.execute(nb_path, cwd=folder, timeout=300)
        except Exception as exc:  # reported by the test of this template only
            return name, (folder / f"{name}.ipynb", folder, exc)
        return name, (nb_path, folder, None)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, notebooks.list_templates()))


def spy_batches(monkeypatch) -> list:
    """Record the files whose batched JSON parse gave up (NotBatchableError): the list it returns fills up."""
    from precnb.io.msprobe import _json

    gave_up: list = []
    real, real_raw = _json.parts, _json.raw_parts

    def spy(path):
        try:
            yield from real(path)
        except _json.NotBatchableError:
            gave_up.append(path)
            raise

    def spy_raw(path, name_hashes):  # the fast path's batches (precnb.io._craw reads their text)
        try:
            yield from real_raw(path, name_hashes)
        except _json.NotBatchableError:
            gave_up.append(path)
            raise

    monkeypatch.setattr(_json, "parts", spy)
    monkeypatch.setattr(_json, "raw_parts", spy_raw)
    return gave_up
