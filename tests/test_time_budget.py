"""The time budget of ``make test-fast`` can fail (tests/_time_budget.py; issue #53)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _burn(cpu_s: float) -> None:
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass


def test_burner():  # the subject of the runs below (a test not marked slow)
    _burn(0.3)


@pytest.mark.slow
def test_slow_burner():  # marked slow: outside the per-test budget
    _burn(0.3)


def _pytest(*args: str) -> subprocess.CompletedProcess:
    # without the installed plugins' entry points (jupyter, playwright, ...: ~10 s of start-up each run)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "burner",
                           str(Path(__file__).relative_to(ROOT)), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow  # make test runs it; make test-fast stays under 5 minutes (RESULTS_tests.md)
def test_a_test_over_budget_fails_the_run_under_xdist():
    out = _pytest("-p", "xdist", "-n", "2", "--dist", "loadfile", "--max-test-cpu", "0.1")
    assert out.returncode == 1, out.stdout[-3000:]
    assert "2 passed" in out.stdout and "1 test(s) not marked slow took more than 0.1 CPU seconds" in out.stdout, \
        out.stdout[-3000:]
    listed = [ln for ln in out.stdout.splitlines() if ln.strip().endswith("burner")]
    assert len(listed) == 1 and listed[0].endswith("::test_burner"), out.stdout[-3000:]


def test_within_budget_passes_and_the_session_budgets_fail():
    assert _pytest("--max-test-cpu", "60", "--max-test-seconds", "60").returncode == 0
    out = _pytest("--max-session-cpu", "0.4", "--max-session-seconds", "0")
    assert out.returncode == 1, out.stdout[-3000:]
    assert "over the budget of 0.4" in out.stdout and "over the budget of 0\n" in out.stdout, out.stdout[-3000:]
