"""The typed core is mypy-clean: the files listed in pyproject's ``[tool.mypy] files``.

They are schema, io, analysis, pipeline and widgets.

Extend the list there; this test and ``make typecheck`` read it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_typed_core_is_mypy_clean():
    if importlib.util.find_spec("mypy") is None:  # a skip would hide the check from make test
        pytest.fail("mypy is in the [test] extra: pip install -e '.[test]'")
    files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert {"precnb/schema", "precnb/io", "precnb/analysis", "precnb/pipeline", "precnb/widgets"} <= set(files)
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
