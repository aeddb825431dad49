"""Keep xarray from importing ``dask.array`` (~0.6 s) just to learn that a numpy array is not one.

xarray asks for the dask array type the first time it wraps any array and imports dask.array
to answer. No dask array can exist before dask.array is imported, so until then the answer is
"no" without the import; afterwards the check is the real one. This patches a private cache of
xarray's: it is applied only when that cache has the expected shape, and
``PRECNB_NO_LAZY_DASK=1`` turns it off. ``benchmarks/bench_startup.py`` measures what it saves
on a command-line call (keep it only while that row shows it pays).
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["defer_dask_array_import"]


class _LazyDaskArrayMeta(type):
    """``isinstance(x, <dask array type>)`` without importing dask.array before anyone else does."""

    def __instancecheck__(cls, obj: Any) -> bool:
        mod = sys.modules.get("dask.array")
        return mod is not None and isinstance(obj, mod.Array)

    def __subclasscheck__(cls, sub: type) -> bool:
        mod = sys.modules.get("dask.array")
        return mod is not None and issubclass(sub, mod.Array)


class _LazyDaskArray(metaclass=_LazyDaskArrayMeta):
    """Stands for ``dask.array.Array`` in xarray's duck-array type checks until dask.array is imported."""


def defer_dask_array_import() -> None:
    """Keep xarray from importing dask.array (~0.6 s) just to learn that a numpy array is not one.

    xarray asks for the dask array type the first time it wraps any array (``isinstance(data,
    array_type("dask"))``) and imports dask.array to answer. No dask array can exist before
    dask.array is imported, so until then the answer is "no" without the import; afterwards the
    check is the real one. Installed only when xarray has the cache this relies on and has not
    filled it yet; anything else leaves xarray untouched. Saves most of a second per CLI call.
    """
    if "dask.array" in sys.modules or os.environ.get("PRECNB_NO_LAZY_DASK"):
        return
    try:
        from xarray.namedarray import pycompat
    except ImportError:  # pragma: no cover - other xarray layouts
        return
    cache = getattr(pycompat, "_cached_duck_array_modules", None)
    base: Any = getattr(pycompat, "DuckArrayModule", None)
    if not isinstance(cache, dict) or base is None or "dask" in cache:
        return

    class _LazyDaskModule(base):
        def __init__(self) -> None:  # no import here
            self.type = (_LazyDaskArray,)
            self._real: Any = None

        def _resolve(self) -> Any:
            if self._real is None:
                self._real = base("dask")
            return self._real

        module = property(lambda self: self._resolve().module)
        version = property(lambda self: self._resolve().version)
        available = property(lambda self: self._resolve().available)

    cache["dask"] = _LazyDaskModule()
    # the same question asked through ``is_dask_collection`` imports dask itself (~0.15 s)
    try:
        from xarray.namedarray import utils as nutils
    except ImportError:  # pragma: no cover
        return
    real: Any = getattr(nutils, "is_dask_collection", None)
    if callable(real) and "dask" not in sys.modules and not getattr(real, "_precnb_lazy", False):
        def is_dask_collection(x: object) -> bool:
            return "dask" in sys.modules and bool(real(x))

        is_dask_collection._precnb_lazy = True  # type: ignore[attr-defined]
        is_dask_collection.__doc__ = real.__doc__
        setattr(nutils, "is_dask_collection", is_dask_collection)  # noqa: B010 - a typed module attribute
