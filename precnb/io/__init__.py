"""Readers: one per source format (:mod:`precnb.io.readers`), each returning the canonical dataset.

See :mod:`precnb.schema` for the contract. Start with :func:`open_run`.
"""

from __future__ import annotations

from precnb.combine import combine_runs
from precnb.io._assemble import FileRecords, LoadReport, RecordBuilder, assemble
from precnb.io.api import available_steps, detect_format, load_report, open_run, open_runs
from precnb.io.losslog import read_loss_log
from precnb.io.readers import Reader, get_reader, reader_names, register

__all__ = [
    "FORMATS",
    "FileRecords",
    "LoadReport",
    "Reader",
    "RecordBuilder",
    "assemble",
    "available_steps",
    "combine_runs",
    "detect_format",
    "get_reader",
    "load_report",
    "open_run",
    "open_runs",
    "read_loss_log",
    "reader_names",
    "register",
]


def __getattr__(name: str) -> object:
    if name == "FORMATS":  # the registry's names, plug-ins included
        return reader_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
