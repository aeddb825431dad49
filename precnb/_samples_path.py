"""Locate the bundled samples: the checkout's ``data_samples/``, or the copy inside the installed package."""

from __future__ import annotations

import os
from pathlib import Path

from precnb.errors import NotADumpError

__all__ = ["sample_path", "samples_root"]

_CHECKOUT = Path(__file__).resolve().parents[1] / "data_samples"
_INSTALLED = Path(__file__).resolve().parent / "data_samples"


def samples_root() -> Path:
    """The folder holding the bundled samples.

    ``$PRECNB_SAMPLES`` when set; else ``data_samples/`` of the source checkout precnb is
    imported from (also an editable install); else the copy a wheel installs as package data
    (``precnb/data_samples/``).
    """
    env = os.environ.get("PRECNB_SAMPLES")
    if env:
        return Path(env)
    return _CHECKOUT if _CHECKOUT.is_dir() else _INSTALLED


def sample_path(name: str = "") -> Path:
    """Path of a bundled sample, e.g. ``sample_path("dp_nan")`` or ``sample_path("tp/tp2")``.

    The samples (real msprobe output with a ``ground_truth.json`` each, listed in
    ``data_samples/README.md``) ship with precnb: from a source checkout and from an installed
    wheel alike. ``$PRECNB_SAMPLES`` points elsewhere.

    Parameters
    ----------
    name : str
        A sample folder (``"healthy"``, ``"dp_nan"``, ``"divergence/target"``, ...); empty:
        the folder holding them all.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    NotADumpError
        When the sample is not there.

    Examples
    --------
    >>> sample_path("dp_nan").name
    'dp_nan'
    >>> "healthy" in {p.name for p in sample_path().iterdir() if p.is_dir()}
    True
    """
    root = samples_root()
    p = root / name if name else root
    if not p.exists():
        known = sorted(c.name for c in root.iterdir() if c.is_dir()) if root.is_dir() else []
        hint = (f"; bundled: {', '.join(known)}" if known
                else " (set PRECNB_SAMPLES, or run `make samples` in a checkout)")
        if known and root == _INSTALLED:
            hint += " (an installed wheel ships a few; every sample is in data_samples/ of the source repository)"
        raise NotADumpError(f"{p}: bundled sample not found{hint}")
    return p
