"""``make demo`` prints no line wider than 120 columns where precnb lays out the text itself (issue #53, item 7).

A finding's summary wraps its long lines (reason, hints, causes, plan, ``key=value`` rows) at 120 columns with a
hanging indent (:func:`precnb.analysis.findings.wrap_lines`). Two kinds of line are printed whole, whatever
their width, and are the exceptions here: a stack frame (``    File …, line N, in f,   code``: msprobe's text,
kept as it is so that it can be searched for and opened) and a statement to paste (``    capture     PrecisionDebugger
.register_custom_api(…)``; its comment is wrapped below it). A single word longer than the width would stay whole
too (none of the demo's is).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from precnb.analysis.findings import Finding, wrap_lines

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 120
# printed whole (see the module docstring)
VERBATIM = re.compile(r"^    (?:File .+, line \d+, in |capture     PrecisionDebugger\.register_custom_api\()")


def _demo_commands() -> list[list[str]]:
    """The ``precnb`` commands of the Makefile's ``demo`` target that print text (not those writing a report)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    body = re.search(r"^demo:.*?\n((?:\t.*\n)+)", text, re.M)
    assert body
    cmds = [shlex.split(line.split("/bin/precnb", 1)[1]) for line in body.group(1).splitlines()
            if "/bin/precnb " in line]
    return [c for c in cmds if "-o" not in c]


def test_the_demo_has_text_commands():
    cmds = _demo_commands()
    assert len(cmds) >= 5 and ["nan", "data_samples/dp_nan"] in cmds


@pytest.mark.slow
@pytest.mark.parametrize("cmd", _demo_commands(), ids=lambda c: " ".join(c))
def test_demo_output_fits_120_columns(cmd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}  # the width does not follow the terminal
    proc = subprocess.run([sys.executable, "-m", "precnb", *cmd], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wide = [line for line in proc.stdout.splitlines()
            if len(line) > WIDTH and not VERBATIM.match(line) and len(line.split()) > 1]
    assert not wide, wide[:3]


def test_wrapping_keeps_every_word_and_the_json():
    reason = ("an input differs before any recorded op changed it: " + "Functional.gelu.0.forward.input.0 " * 6).strip()
    f = Finding(kind="first_divergence", step=1, rank=0, reason=reason,
                hints=["dtype differs " * 20 + "end", "x" * 150],
                values={"baseline": {"max": 1.5, "min": -2.0, "shape": [2, 8, 32], "dtype": "torch.float32",
                                     **{f"stat{i}": 0.123456 for i in range(12)}}},
                evidence={"stack": ["File /a/very/long/" + "path/" * 30 + "x.py, line 1, in f, \n y = g(x)  # note"]})
    before = f.to_json()
    plain, wrapped = f.summary(), f.summary(WIDTH)
    assert plain.split() == wrapped.split()  # the same words, in order
    assert "shape=[2, 8, 32]" in wrapped  # a list is not broken
    lines = wrapped.splitlines()
    assert all(len(x) <= WIDTH for x in lines if not x.startswith("    File ") and len(x.split()) > 1)
    assert any(x.startswith("    File /a/very/long/") and len(x) > WIDTH for x in lines)  # a frame stays whole
    assert any(x.strip() == "x" * 150 for x in lines)  # a word longer than the width stays whole
    assert f.to_json() == before  # the JSON does not change


def test_short_lines_are_not_touched():
    lines = ["  hint: short", "    File x.py, line 1, in f"]
    assert wrap_lines(lines, WIDTH) == lines and wrap_lines(lines, None) == lines
