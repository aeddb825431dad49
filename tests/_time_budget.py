"""The time budget of ``make test-fast`` (issue #53): a guard that fails the run, not a report to read.

Each test's CPU seconds are counted in the process that runs it (its own and its reaped child processes', setup to
teardown), so that a budget holds on a shared machine whose load stretches wall time (measured: 4-5x at a load of
10 on 2 cores) but barely CPU time:

- ``--max-test-cpu N``: a test not marked ``slow`` that used more than N CPU seconds fails the session (exit status
  1) and is listed with its time: mark it ``slow`` (``make test`` still runs it) or make it faster;
- ``--max-session-cpu N``: the same for the sum over every test (``make test-fast`` on 2 cores takes at least that
  sum / 2 of wall time);
- ``--max-test-seconds N`` / ``--max-session-seconds N``: the same in wall time (for a quiet machine).

Under pytest-xdist the reports reach the controller, which keeps the account; the workers keep none. All off by
default (``make test`` sets none).
"""

from __future__ import annotations

import resource
import time
from collections import defaultdict

import pytest

_WALL: dict[str, float] = defaultdict(float)
_CPU: dict[str, float] = {}
_SLOW: set[str] = set()
_START: list[float] = []  # the session's start (time.monotonic)
_REPORT: list[str] = []  # the totals line, then the budgets exceeded
_OPTIONS = {"--max-test-cpu": "a test not marked slow uses more than N CPU seconds (its process and its children's)",
            "--max-session-cpu": "the tests use more than N CPU seconds in all",
            "--max-test-seconds": "a test not marked slow takes more than N s of wall time (setup to teardown)",
            "--max-session-seconds": "the run takes more than N s of wall time"}


def addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("time budget (make test-fast)")
    for flag, what in _OPTIONS.items():
        group.addoption(flag, type=float, default=None, metavar="N", help=f"fail the run if {what}")


def _cpu_now() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def sessionstart(session: pytest.Session) -> None:
    _START[:] = [time.monotonic()]


def setup(item: pytest.Item) -> None:
    item.stash[_CPU0] = _cpu_now()


_CPU0 = pytest.StashKey[float]()


def makereport(item: pytest.Item, call: pytest.CallInfo) -> float | None:
    """The CPU seconds of *item* so far, at the end of its teardown (None before)."""
    if call.when != "teardown" or _CPU0 not in item.stash:
        return None
    return _cpu_now() - item.stash[_CPU0]


def logreport(report: pytest.TestReport) -> None:
    _WALL[report.nodeid] += report.duration
    for name, value in report.user_properties:  # (str, object) pairs
        if name == "cpu_s":  # put by the worker that ran the test (conftest: pytest_runtest_makereport)
            _CPU[report.nodeid] = float(value)  # type: ignore[arg-type]
    if "slow" in report.keywords:
        _SLOW.add(report.nodeid)


def over_budget(times: dict[str, float], limit: float) -> list[tuple[float, str]]:
    """(seconds, node id) of the tests not marked slow over ``limit``, slowest first."""
    return sorted(((d, n) for n, d in times.items() if d > limit and n not in _SLOW), reverse=True)


def sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller judges
        return
    opt = session.config.getoption
    lines: list[str] = []
    for flag, times, unit in (("--max-test-cpu", _CPU, "CPU seconds"), ("--max-test-seconds", _WALL, "s")):
        limit = opt(flag)
        over = over_budget(times, limit) if limit is not None else []
        if over:
            lines.append(f"time budget: {len(over)} test(s) not marked slow took more than {limit:g} {unit} "
                         "(mark them @pytest.mark.slow, make test runs them, or make them faster):")
            lines += [f"  {d:7.1f} {unit}  {n}" for d, n in over]
    wall = time.monotonic() - (_START[0] if _START else time.monotonic())
    for flag, total, unit in (("--max-session-cpu", sum(_CPU.values()), "CPU seconds"),
                              ("--max-session-seconds", wall, "s of wall time")):
        limit = opt(flag)
        if limit is not None and total > limit:
            lines.append(f"time budget: the tests took {total:.0f} {unit}, over the budget of {limit:g}")
    _REPORT[:] = [f"time budget: {len(_CPU)} tests, {sum(_CPU.values()):.0f} CPU seconds, {wall:.0f} s wall", *lines]
    if lines and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def summary(terminalreporter) -> None:
    if not _REPORT or all(terminalreporter.config.getoption(f) is None for f in _OPTIONS):
        return
    terminalreporter.write_line(_REPORT[0])
    for line in _REPORT[1:]:
        terminalreporter.write_line(line, red=True)
