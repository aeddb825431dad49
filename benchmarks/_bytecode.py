"""precnb's bytecode written once before a benchmark times anything.

An installed package has its ``.pyc`` files; a checkout run with ``PYTHONDONTWRITEBYTECODE=1`` (or a fresh clone)
does not, and a timed child process would then compile every precnb submodule it imports inside the measurement
(about 1 s of a 3 s load, 2026-12-04). Every benchmark script that times precnb calls :func:`compile_precnb` first,
so the figures are an installed package's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compile_precnb() -> None:
    """Write the bytecode of this checkout's ``precnb`` package (quietly; a failure is left to the timed run).

    ``python -m compileall`` writes ``.pyc`` files whatever ``PYTHONDONTWRITEBYTECODE`` says, and skips the
    modules whose bytecode is current, so a second call costs a directory walk.
    """
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "precnb")], check=False, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
