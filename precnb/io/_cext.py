"""The optional C extension of the msprobe parser (``precnb/io/_cwalk.c``), loaded once, or None.

The extension (:mod:`precnb.io._cwalk`, built by ``setup.py`` as an optional extension: an install
without a compiler has none) reads the common node records of a dump.json batch, their node names,
value columns and optimizer arguments in C; every caller keeps the pure Python code as the
reference and the fallback. It is loaded by name here, so that the modules which use it import
only this one (the extension imports nothing from precnb).

Examples
--------
>>> import os
>>> old = os.environ.get("PRECNB_PURE_PARSER")
>>> os.environ["PRECNB_PURE_PARSER"] = "1"
>>> cwalk() is None  # the pure Python parser, whether or not the extension is built
True
>>> _ = os.environ.pop("PRECNB_PURE_PARSER") if old is None else os.environ.update(PRECNB_PURE_PARSER=old)
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["CWALK", "cwalk"]

CWALK: ModuleType | None
try:
    CWALK = importlib.import_module("precnb.io._cwalk")
except ImportError:  # pragma: no cover - exercised on an install without the extension
    CWALK = None


def cwalk() -> ModuleType | None:
    """The extension, or None: not built, or ``PRECNB_PURE_PARSER`` set (read at each call: tests switch it)."""
    return None if CWALK is None or os.environ.get("PRECNB_PURE_PARSER") else CWALK
