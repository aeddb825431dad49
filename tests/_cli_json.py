"""The CLI's JSON answer as a user (and the accuracy benchmark) gets it: ``precnb VERB … --json`` (run in the test's
process by :func:`tests._inprocess_cli.run_cli`: the entry point `python -m precnb` calls)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from tests._inprocess_cli import run_cli


@cache
def cli_json(cwd: Path, *args: str) -> dict:
    """``precnb ARGS --json --workers 1`` run in *cwd* (cached per arguments); its parsed JSON output."""
    proc = run_cli(*args, "--json", "--workers", "1", cwd=cwd)  # in this process (tests/_inprocess_cli.py)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return json.loads(proc.stdout)
