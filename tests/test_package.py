"""Package hygiene: light import, public API, runnable docstring examples, layering, and the wheel.

The wheel is built from a copy of the sources and installed in a fresh venv with only its core
dependencies (pip resolves them, from its cache when it can): the CLI, ``precnb.sample_path``
(the samples ship as package data) and the clear "install the notebook extra" errors are
exercised there, from another folder, as a new user would.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

import precnb

PKG = pathlib.Path(precnb.__file__).parent


def test_import_is_light():
    code = ("import sys, precnb; heavy = [m for m in ('altair', 'ipywidgets', 'jinja2', 'dask', "
            "'distributed', 'zarr', 'torch') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_public_api_resolves():
    for name in precnb.__all__:
        assert getattr(precnb, name) is not None, name


@pytest.mark.parametrize("module", [
    "precnb.schema", "precnb.naming", "precnb.analysis.layout", "precnb.analysis.findings",
    "precnb.analysis.tolerance", "precnb.analysis.masks", "precnb.analysis.summary", "precnb.analysis.pp",
    "precnb.io._assemble", "precnb.io._jsonio", "precnb.combine", "precnb.accessor", "precnb.io.ms_kernel_tensors",
    "precnb.io._ms_names", "precnb.io._ms_files", "precnb.analysis.preflight", "precnb.analysis._pf_common",
    "precnb.analysis._pf_optim", "precnb.io._runfacts", "precnb.io.config_check", "precnb.analysis.registry",
    "precnb._write", "precnb._marks", "precnb._extras", "precnb._samples_path", "precnb.io._dupes", "precnb.io._why",
    "precnb.cli._args", "precnb.cli._term", "precnb.report._assets", "precnb.viz.selections",
    "precnb.io.readers", "precnb.io._fs", "precnb.io.executor", "precnb.io.records", "precnb.io._memory",
    "precnb.io.msprobe", "precnb.io.msprobe._json", "precnb.io.msprobe.values", "precnb.io.msprobe.sides",
    "precnb.io.msprobe.parse", "precnb.io.msprobe.discover", "precnb.io.backend", "precnb.io.detect",
    "precnb.io._pool", "precnb.analysis.scalars", "precnb.io.msprobe.records",
])
def test_docstring_examples_run(module):
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize(("layer", "forbidden"), [
    ("io", ("precnb.analysis", "precnb.viz", "precnb.widgets", "precnb.report", "precnb.cli")),
    ("analysis", ("precnb.io", "precnb.viz", "precnb.widgets", "precnb.report", "precnb.cli")),
])
def test_layers_flow_one_way(layer, forbidden):
    for path in (PKG / layer).rglob("*.py"):
        bad = [m for m in _imports(path) if m.startswith(forbidden)]
        assert not bad, f"{path.relative_to(PKG)} imports {bad}"


def test_schema_module_depends_on_nothing_of_ours():
    assert not [m for m in _imports(PKG / "schema.py") if m.startswith("precnb")]


# -- installed from a wheel, as a new user does ------------------------------------------------


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory, built_wheel):
    """A fresh venv holding the wheel and only its core dependencies (resolved by pip, from its cache)."""
    venv = tmp_path_factory.mktemp("venv") / "core"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(built_wheel)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"pip install of the wheel with its core dependencies failed: {proc.stderr[-3000:]}"
    return venv


def _run(venv, *args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRECNB_", "PYTHON"))}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_wheel_with_core_dependencies_works_as_the_readme_says(core_venv, tmp_path):
    py, cli = str(core_venv / "bin" / "python"), str(core_venv / "bin" / "precnb")
    site = core_venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    heavy = _run(core_venv, py, "-c", "import importlib.util as u; print([m for m in ('altair', 'ipywidgets', "
                 "'nbformat', 'jinja2', 'torch') if u.find_spec(m)])", cwd=tmp_path)
    assert "altair" not in heavy.stdout and "ipywidgets" not in heavy.stdout and "nbformat" not in heavy.stdout
    where = _run(core_venv, py, "-c", "import precnb; print(precnb.__file__); "
                 "print(precnb.sample_path('dp_nan'))", cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    mod, sample = where.stdout.split()
    assert pathlib.Path(mod).is_relative_to(site)
    assert pathlib.Path(sample) == site / "precnb" / "data_samples" / "dp_nan"
    assert _run(core_venv, cli, "--version", cwd=tmp_path).stdout.startswith("precnb ")
    nan = _run(core_venv, cli, "nan", "--json", sample, cwd=tmp_path)
    assert nan.returncode == 0, nan.stderr
    f = json.loads(nan.stdout)
    assert (f["kind"], f["step"], f["rank"], f["node"]) == ("nan_origin", 1, 1, "Torch.sqrt.0.forward")
    mon = str(pathlib.Path(sample).parent / "monitor")
    anom = _run(core_venv, cli, "anomalies", mon, cwd=tmp_path)  # stderr is a pipe: no progress bar
    assert anom.returncode == 0 and anom.stdout.startswith("FIRST ANOMALY") and "\r" not in anom.stderr
    assert anom.stderr == ""
    conv = _run(core_venv, cli, "convert", sample, "-o", "run.zarr", cwd=tmp_path)
    assert conv.returncode == 0 and (tmp_path / "run.zarr").is_dir(), conv.stderr
    for argv in (["report", sample, "-o", "r.html"], ["template", "--list"],
                 ["template", "nan_origin", "-o", "t.ipynb"]):
        proc = _run(core_venv, cli, *argv, cwd=tmp_path)
        assert proc.returncode == 1, (argv, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "pip install 'precnb[notebook]'" in proc.stderr, proc.stderr
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "t.ipynb").exists()
    api = _run(core_venv, py, "-c", "import precnb; precnb.write_html", cwd=tmp_path)
    assert api.returncode == 1 and "pip install 'precnb[notebook]'" in api.stderr


def test_package_metadata_is_true():
    import tomllib

    meta = tomllib.loads((PKG.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert meta["requires-python"] == ">=3.11"  # zarr>=3 needs 3.11
    assert sys.version_info >= (3, 11)
    assert meta["license"] == "Apache-2.0"  # an SPDX string, not the deprecated table
    readme = (PKG.parent / "README.md").read_text(encoding="utf-8")
    assert "Python ≥ 3.11" in readme and "precnb.sample_path" in readme
