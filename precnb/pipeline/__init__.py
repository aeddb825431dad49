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

from precnb.pipeline.options import DEFAULTS, Options
from precnb.pipeline.triage import ReadRun, Triage, diagnose, merge_layouts

__all__ = ["DEFAULTS", "Options", "ReadRun", "Triage", "diagnose", "merge_layouts"]
