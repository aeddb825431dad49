"""Sub-commands backed by :mod:`precnb.analysis` (diff, nan, anomalies)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["register"]


def register(sub: Any, add_load_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the analysis sub-commands to *sub*."""
