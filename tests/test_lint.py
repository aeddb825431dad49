"""ruff (style, docstrings, security rules and complexity, pyproject's ``[tool.ruff]``) is clean, as ``make lint``.

``RUF100`` is on: a ``# noqa`` that no longer silences anything fails too, so the complexity exceptions of
``tests/test_code_size.py`` cannot outlive their reason.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_ruff_is_clean():
    if importlib.util.find_spec("ruff") is None:  # a skip would hide the check from make test
        pytest.fail("ruff is in the [test] extra: pip install -e '.[test]'")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--extend-select", "RUF100",
                          "precnb", "tests", "benchmarks", "tools"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
