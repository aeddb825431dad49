"""``python -m precnb ARGS`` run in the test's own process: :func:`precnb.cli.main`, the function
``precnb/__main__.py`` calls, with stdout and stderr captured (issue #53 item 8: ``make test-fast`` on 2 cores).

A subprocess costs ~0.8 CPU s before precnb reads anything (the interpreter, numpy, pandas, xarray, zarr); a test
worker has imported them once. The answer is what the subprocess gave: the exit code (``main``'s return value; a
``SystemExit`` as ``sys.exit`` would turn it), everything written to stdout and stderr, and Python's warnings,
printed to the captured stderr with the interpreter's default filters as a fresh process would (so a test that
wants a quiet stderr still sees a warning that leaks there). ``python -m precnb`` itself (the module, its start-up
time and imports) is tested in ``tests/test_cli_startup.py`` and ``tests/test_cli.py``.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the warning filters of ``python`` started without -W or PYTHONWARNINGS (the first matching filter applies)
_DEFAULT_FILTERS = (("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, None),
                    ("ignore", PendingDeprecationWarning, None), ("ignore", ImportWarning, None),
                    ("ignore", ResourceWarning, None))


def run_cli(*args: object, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``precnb ARGS`` in this process, in folder *cwd*: a CompletedProcess (returncode, stdout, stderr as text)."""
    from precnb.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        err.write(warnings.formatwarning(message, category, filename, lineno, line))

    old = os.getcwd()
    os.chdir(cwd)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.resetwarnings()
            for action, category, module in reversed(_DEFAULT_FILTERS):
                warnings.filterwarnings(action, category=category, module=module or "")
            warnings.showwarning = show
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(old)
    return subprocess.CompletedProcess([sys.executable, "-m", "precnb", *argv], code, out.getvalue(), err.getvalue())
