"""Package hygiene: light import, public API, runnable docstring examples, layering."""

from __future__ import annotations

import ast
import doctest
import importlib
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
    "precnb._write", "precnb._marks",
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
