"""Pure analysis functions on canonical datasets."""

from __future__ import annotations

from precnb.analysis.masks import nonfinite, recorded, stat_vars
from precnb.analysis.summary import summarize

__all__ = ["nonfinite", "recorded", "stat_vars", "summarize"]
