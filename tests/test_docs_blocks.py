"""Every code block of the documentation runs (issue #52 item 6), against the bundled samples.

The incident guides' ``console`` and ``python`` blocks are run and their output compared in ``tests/test_docs.py``.
Here: every other page of ``docs/`` (the user guide, the architecture page, the reference, the index):

* a ``bash`` block runs line by line in ``bash -e`` (``precnb`` is this checkout's ``python -m precnb``,
  ``python`` this interpreter), in a temporary folder where ``data_samples`` is the bundled samples: what a
  command writes (``-o mapping.json``) lands there;
* the ``python`` blocks of a page run in order in one interpreter (as notebook cells), in such a folder;
* ``json`` and ``toml`` blocks parse; ``text`` blocks are output shown, not code.

A block that cannot run here (it needs a cluster, a package index or ``make``) carries the marker
``<!-- docs-test: skip (why) -->`` on the line before its fence. The markers are counted: :data:`SKIPPED` is the
whole list (docs/README.md shows it), and a marker that is not on it, or a listed one that is gone, fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: the blocks that do not run in CI: (page, first line of the block) -> why. Keep it short.
SKIPPED = {
    ("README.md", "make docs"): "builds this site: the docs build test runs it",
    ("guide/getting-started.md", "make demo   # creates .venv, installs precnb, runs it on the bundled samples in "
     "data_samples/"): "creates a virtualenv and installs from the network",
    ("guide/getting-started.md", "pip install precnb                 # core: read, convert, diagnose on the "
     "command line (info, diff, nan, ...)"): "installs from a package index",
    ("guide/scale.md", "dask scheduler --scheduler-file ~/sched.json &           # anywhere the workers can "
     "reach"): "starts a Dask cluster (tests/test_scheduler*.py run one on 127.0.0.1)",
    ("guide/scale.md", "from dask_jobqueue import SLURMCluster          # pip install dask-jobqueue"):
        "needs a SLURM cluster",
    ("guide/scale.md", "from dask_kubernetes.operator import KubeCluster   # pip install dask-kubernetes"):
        "needs a Kubernetes cluster",
}

MARKER = re.compile(r"^<!-- docs-test: skip \((.+?)\) -->$")
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if p.parent.name != "incidents")


def _blocks() -> list[tuple[str, str, str, bool]]:
    """``(page, lang, body, skipped)`` of every fenced block outside docs/incidents."""
    out = []
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            out.append((page.relative_to(DOCS).as_posix(), m.group(1), m.group(2), bool(MARKER.match(before))))
    return out


BLOCKS = _blocks()


def test_the_skipped_blocks_are_the_documented_list():
    """Every skip marker is on :data:`SKIPPED` and every entry there still has its marker; docs/README.md lists them."""
    marked = {(page, body.split("\n", 1)[0]) for page, _lang, body, skipped in BLOCKS if skipped}
    assert marked == set(SKIPPED), (sorted(marked - set(SKIPPED)), sorted(set(SKIPPED) - marked))
    readme = (DOCS / "README.md").read_text(encoding="utf-8")
    for page, _first in SKIPPED:
        assert f"`{page}`" in readme, f"docs/README.md does not list the skipped block of {page}"


def test_every_block_has_a_known_language():
    langs = {lang for _page, lang, _body, _skipped in BLOCKS}
    assert langs <= {"bash", "python", "json", "toml", "text", "console"}, langs


@pytest.mark.parametrize(("page", "body"), [(p, b) for p, lang, b, s in BLOCKS if lang == "json" and not s])
def test_json_blocks_parse(page, body):
    json.loads(body)


@pytest.mark.parametrize(("page", "body"), [(p, b) for p, lang, b, s in BLOCKS if lang == "toml" and not s])
def test_toml_blocks_parse(page, body):
    tomllib.loads(body)


@pytest.fixture
def workdir(tmp_path):
    """A temporary working folder in which ``data_samples`` is the bundled samples."""
    (tmp_path / "data_samples").symlink_to(ROOT / "data_samples")
    return tmp_path


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "COLUMNS": "120", "PRECNB_NO_DASK_CLIENT": "1", "MPLBACKEND": "Agg"}


BASH = [(p, b) for p, lang, b, s in BLOCKS if lang in ("bash", "console") and not s]


@pytest.mark.slow
@pytest.mark.parametrize(("page", "body"), BASH, ids=[f"{p}:{i}" for i, (p, _) in enumerate(BASH)])
def test_bash_blocks_run(page, body, workdir):
    """Each command of a ``bash`` block exits 0 (``precnb`` is this checkout, run in a folder with the samples)."""
    assert not body.startswith("$ "), f"{page}: a bash block holds commands only (console blocks show output)"
    script = (f'set -e\nprecnb() {{ "{sys.executable}" -m precnb "$@"; }}\n'
              f'python() {{ "{sys.executable}" "$@"; }}\n' + body)
    proc = subprocess.run(["bash", "-c", script], cwd=workdir, env=_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"{page}: {proc.stderr[-3000:]}"


PYTHON_PAGES = sorted({p for p, lang, _b, s in BLOCKS if lang == "python" and not s})


@pytest.mark.slow
@pytest.mark.parametrize("page", PYTHON_PAGES)
def test_python_blocks_run(page, workdir):
    """The ``python`` blocks of a page run, in order, in one interpreter (as notebook cells)."""
    code = "\n".join(b for p, lang, b, s in BLOCKS if p == page and lang == "python" and not s)
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"{page}: {proc.stderr[-3000:]}"
