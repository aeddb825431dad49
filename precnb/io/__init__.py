"""Readers: one per source format, each returning the canonical dataset.

See :mod:`precnb.schema` for the contract. Start with :func:`open_run`.
"""

from __future__ import annotations

from precnb.combine import combine_runs
from precnb.io._assemble import FileRecords, LoadReport, RecordBuilder, assemble
from precnb.io.api import FORMATS, available_steps, detect_format, load_report, open_run, open_runs

__all__ = [
    "FORMATS",
    "FileRecords",
    "LoadReport",
    "RecordBuilder",
    "assemble",
    "available_steps",
    "combine_runs",
    "detect_format",
    "load_report",
    "open_run",
    "open_runs",
]
