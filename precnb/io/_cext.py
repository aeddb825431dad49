"""The optional C extensions of the msprobe parser (``precnb/io/_cwalk.c``, ``_craw.c``), loaded once, or None.

The extension (:mod:`precnb.io._cwalk`, built by ``setup.py`` as an optional extension: an install
without a compiler has none) reads the common node records of a dump.json batch, their node names,
value columns and optimizer arguments in C; every caller keeps the pure Python code as the
reference and the fallback. It is loaded by name here, so that the modules which use it import
only this one (the extension imports nothing from precnb). :mod:`precnb.io._craw` reads the common
records of a batch straight from its bytes (no JSON parse into Python objects) for the loads that
need no scalar-argument signatures; it hands every other record back to the same code.

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

__all__ = ["CRAW", "CWALK", "craw", "cwalk"]

CWALK: ModuleType | None
try:
    CWALK = importlib.import_module("precnb.io._cwalk")
except ImportError:  # pragma: no cover - exercised on an install without the extension
    CWALK = None
CRAW: ModuleType | None
try:  # the common records read from a batch's bytes (precnb/io/_craw.c)
    CRAW = importlib.import_module("precnb.io._craw")
except ImportError:  # pragma: no cover - exercised on an install without the extension
    CRAW = None


def cwalk() -> ModuleType | None:
    """The extension, or None: not built, or ``PRECNB_PURE_PARSER`` set (read at each call: tests switch it)."""
    return None if CWALK is None or os.environ.get("PRECNB_PURE_PARSER") else CWALK


def craw() -> ModuleType | None:
    """The bytes reader :mod:`precnb.io._craw`, or None: not built, or ``PRECNB_PURE_PARSER`` / ``PRECNB_NO_CRAW`` set.

    ``PRECNB_NO_CRAW=1`` keeps the C walk of parsed objects (:func:`cwalk`) but parses every batch with
    orjson or the standard library (to measure one against the other).
    """
    env = os.environ
    return None if CRAW is None or env.get("PRECNB_PURE_PARSER") or env.get("PRECNB_NO_CRAW") else CRAW
