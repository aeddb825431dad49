"""The CLI's JSON answer as a user (and the accuracy benchmark) gets it: ``python -m precnb VERB … --json``."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path


@cache
def cli_json(cwd: Path, *args: str) -> dict:
    """``precnb ARGS --json --workers 1`` run in *cwd* (cached per arguments); its parsed JSON output."""
    proc = subprocess.run([sys.executable, "-m", "precnb", *args, "--json", "--workers", "1"], cwd=cwd,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return json.loads(proc.stdout)
