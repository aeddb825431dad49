"""The core install has no dask: every verb runs without it, and what needs it names the extra (issue #53 item 3).

dask and distributed are the ``dask`` extra (``pip install 'precnb[dask]'``). Here they are made unimportable
in a subprocess (``sys.modules[name] = None``: ``import dask`` raises ImportError and ``find_spec`` finds
nothing), as in a venv holding the wheel and its core dependencies only (tests/test_package.py installs one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_BLOCK = textwrap.dedent("""\
    import sys
    for name in ("dask", "distributed"):
        sys.modules[name] = None  # as if not installed
""")


def _python(code: str, *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("PRECNB_")}, "PYTHONPATH": str(ROOT),
            **(env or {})}
    return subprocess.run([sys.executable, "-c", _BLOCK + code], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=300)


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return _python(f"from precnb.cli import main\nsys.exit(main({list(argv)!r}))", env=env)


def test_nan_runs_without_dask():
    proc = _cli("nan", "data_samples/dp_nan", "--json")
    assert proc.returncode == 0, proc.stderr
    f = json.loads(proc.stdout)
    assert (f["kind"], f["step"], f["rank"], f["node"]) == ("nan_origin", 1, 1, "Torch.sqrt.0.forward")


def test_scheduler_without_dask_names_the_extra():
    for argv, env in ((["nan", "data_samples/dp_nan", "--scheduler", "tcp://127.0.0.1:1"], None),
                      (["info", "data_samples/healthy"], {"PRECNB_SCHEDULER": "tcp://127.0.0.1:1"})):
        proc = _cli(*argv, env=env)
        assert proc.returncode == 2, (argv, proc.stderr)  # a usage error, not an unreadable input
        assert proc.stderr.count("\n") == 1 and "pip install 'precnb[dask]'" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
        assert proc.stdout == ""


def test_open_run_and_a_store_without_dask(tmp_path):
    store = tmp_path / "run.zarr"
    code = textwrap.dedent(f"""\
        import precnb
        from precnb._extras import MissingExtraError
        ds = precnb.open_run("data_samples/healthy")  # the default path: parsed into numpy arrays
        assert ds["max"].chunks is None and dict(ds.sizes)["rank"] == 1
        precnb.to_zarr(ds, {str(store)!r})
        back = precnb.open_run({str(store)!r})
        assert back["max"].chunks is None and back.sizes == ds.sizes
        for call in (lambda: precnb.open_run("data_samples/healthy", lazy=True),
                     lambda: precnb.tensor_metrics("data_samples/tensor_bug/baseline", "data_samples/tensor_bug/target",
                                                   lazy=True)):
            try:
                call()
            except MissingExtraError as exc:
                assert "pip install 'precnb[dask]'" in str(exc), exc
            else:
                raise AssertionError("lazy=True without dask")
        m = precnb.tensor_metrics("data_samples/tensor_bug/baseline", "data_samples/tensor_bug/target")
        assert m.sizes["tensor"] > 0
        print("ok", sorted(k for k in sys.modules if k.split(".")[0] in ("dask", "distributed") and sys.modules[k]))
    """)
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "ok []"
