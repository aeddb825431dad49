"""Shared fixtures: paths to bundled samples and to ../shared (skipped when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data_samples"
SHARED = Path(os.environ.get("PRECNB_SHARED", ROOT.parent / "shared"))

os.environ.setdefault("PRECNB_NO_DASK_CLIENT", "1")


def shared_path(*parts: str) -> Path:
    """Path below ../shared, or skip the test when it is not there."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not available (../shared is absent on this machine)")
    return p


def sample_path(*parts: str) -> Path:
    """Path below data_samples/ (committed: a missing sample is a failure, never a skip)."""
    p = SAMPLES.joinpath(*parts)
    if not p.exists():
        pytest.fail(f"bundled sample {p} is missing: data_samples/ is committed (regenerate it with "
                    "`make samples` and commit it)")
    return p


@pytest.fixture
def shared():
    return shared_path


@pytest.fixture
def samples():
    return sample_path


def open_quiet(path, **kw):
    """``precnb.open_run`` without progress bar or load warnings (tests check the load report)."""
    import warnings

    import precnb

    kw.setdefault("progress", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return precnb.open_run(path, **kw)


@pytest.fixture
def fresh_pool():
    """Stop the parsing worker processes after the test (the next load starts new ones)."""
    from precnb.io import _pool

    yield
    _pool.shutdown()
