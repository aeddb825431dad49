"""The optional C extension of the msprobe parser (``precnb/io/_craw.c``), loaded once, or None.

The extension (:mod:`precnb.io._craw`, built by ``setup.py`` as an optional extension: an install
without a compiler has none) reads the common node records of a dump.json batch straight from its
bytes, splits their node names and reads a plain construct.json; every caller keeps the pure Python
code (the standard library's ``json`` and the Python walk) as the reference and the fallback, and
``PRECNB_PURE_PARSER=1`` selects it. It is loaded by name here, so that the modules which use it
import only this one (the extension imports nothing from precnb).

Examples
--------
>>> import os
>>> old = os.environ.get("PRECNB_PURE_PARSER")
>>> os.environ["PRECNB_PURE_PARSER"] = "1"
>>> craw() is None  # the pure Python parser, whether or not the extension is built
True
>>> _ = os.environ.pop("PRECNB_PURE_PARSER") if old is None else os.environ.update(PRECNB_PURE_PARSER=old)
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["CRAW", "craw"]

CRAW: ModuleType | None
try:  # the common records read from a batch's bytes (precnb/io/_craw.c)
    CRAW = importlib.import_module("precnb.io._craw")
except ImportError:  # pragma: no cover - exercised on an install without the extension
    CRAW = None


def craw() -> ModuleType | None:
    """The extension, or None: not built, or ``PRECNB_PURE_PARSER`` set (read at each call: tests switch it)."""
    return None if CRAW is None or os.environ.get("PRECNB_PURE_PARSER") else CRAW
