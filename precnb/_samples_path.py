"""Locate the bundled samples (``data_samples/`` of a source checkout)."""

from __future__ import annotations

import os
from pathlib import Path

from precnb.errors import NotADumpError

__all__ = ["sample_path"]


def sample_path(name: str = "") -> Path:
    """Path of a bundled sample, e.g. ``sample_path("dp_nan")`` or ``sample_path("tp/tp2")``.

    The samples live in ``data_samples/`` of the source checkout (``PRECNB_SAMPLES`` overrides).

    Examples
    --------
    >>> sample_path("healthy").name  # doctest: +SKIP
    'healthy'
    """
    env = os.environ.get("PRECNB_SAMPLES")
    root = Path(env) if env else Path(__file__).resolve().parents[1] / "data_samples"
    p = root / name if name else root
    if not p.exists():
        raise NotADumpError(f"{p}: bundled sample not found (set PRECNB_SAMPLES, or run "
                            "`make samples` in a source checkout)")
    return p
