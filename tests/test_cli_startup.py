"""The command line answers --help and --version without xarray or pandas (issue #50 item 6)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import contextlib, io, sys
import precnb.cli
from precnb.cli import build_parser
commands = list(build_parser()._subparsers._group_actions[0].choices)
for argv in [["--version"], ["--help"]] + [[c, "--help"] for c in commands]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            precnb.cli.main(argv)
        except SystemExit:
            pass
print(len(commands), sorted(m for m in ("xarray", "pandas", "dask", "numpy.ma") if m in sys.modules))
"""


def test_help_and_version_import_neither_xarray_nor_pandas():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    n, heavy = out.stdout.split(" ", 1)
    assert int(n) > 15 and heavy.strip() == "[]", out.stdout


def test_the_accessor_is_there_once_xarray_is_imported():
    code = ("import sys, precnb; assert 'xarray' not in sys.modules; import xarray as xr; "
            "print(hasattr(xr.Dataset, 'prec'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]


def test_xarray_first_imported_from_inside_precnb_registers_the_accessor():
    # a Dask worker unpickling a reader's task imports precnb.io.records -> precnb.schema -> xarray: the accessor is
    # registered there, while precnb.schema is still initialising (a circular import broke --scheduler once)
    for first in ("precnb.schema", "precnb.io.records", "precnb.analysis.layout.merge"):
        code = f"import {first}; import xarray as xr; print(hasattr(xr.Dataset, 'prec'))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert out.returncode == 0 and out.stdout.strip() == "True", (first, out.stderr[-2000:])
