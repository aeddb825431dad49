"""The one triage pipeline: :func:`diagnose` → :class:`Triage`.

Every front end (command line, report, explorer, notebook templates, ``ds.prec``) calls
:func:`diagnose` with an :class:`Options`; the options' defaults are stated once, in
:data:`precnb.pipeline.options.DEFAULTS`.

Examples
--------
>>> from precnb.pipeline import Options
>>> Options().crc
'report'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from precnb.pipeline.options import DEFAULTS, Options

if TYPE_CHECKING:
    from precnb.pipeline.run import ReadRun, Triage, diagnose, merge_layouts

__all__ = ["DEFAULTS", "Options", "ReadRun", "Triage", "diagnose", "merge_layouts"]


def __getattr__(name: str) -> object:
    # the triage (xarray, the analysis) on first use: a parser that reads the options' defaults stays light
    if name in ("ReadRun", "Triage", "diagnose", "merge_layouts"):
        value = getattr(importlib.import_module("precnb.pipeline.run"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
