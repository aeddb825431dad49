"""Readers: one per source format (:mod:`precnb.io.readers`), each returning the canonical dataset.

See :mod:`precnb.schema` for the contract. Start with :func:`open_run`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from precnb.combine import combine_runs
    from precnb.io._assemble import FileRecords, LoadReport, RecordBuilder, assemble
    from precnb.io.api import available_steps, detect_format, load_report, open_run, open_runs
    from precnb.io.losslog import read_loss_log
    from precnb.io.readers import Reader, get_reader, reader_names, register

#: name -> module; imported on first use (the CLI's parser reads the readers' names without xarray or pandas)
_LAZY = {
    "combine_runs": "precnb.combine",
    "FileRecords": "precnb.io._assemble", "LoadReport": "precnb.io._assemble",
    "RecordBuilder": "precnb.io._assemble", "assemble": "precnb.io._assemble",
    "available_steps": "precnb.io.api", "detect_format": "precnb.io.api", "load_report": "precnb.io.api",
    "open_run": "precnb.io.api", "open_runs": "precnb.io.api",
    "read_loss_log": "precnb.io.losslog",
    "Reader": "precnb.io.readers", "get_reader": "precnb.io.readers", "reader_names": "precnb.io.readers",
    "register": "precnb.io.readers",
}

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
        return importlib.import_module("precnb.io.readers").reader_names()
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
