"""Register the ``ds.prec`` accessor when xarray is imported, not when precnb is.

``import precnb`` must not cost xarray's import (about a second on a loaded machine) for ``precnb --help`` or
``--version``, yet ``ds.prec`` must work on any dataset once precnb is imported. If xarray is already imported the
accessor is registered at once; otherwise a one-shot import hook registers it right after xarray's own import.

Examples
--------
>>> import sys, precnb, xarray
>>> hasattr(xarray.Dataset, "prec")
True
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

__all__ = ["register_accessor_with_xarray"]


def _register() -> None:
    import precnb.accessor  # noqa: F401  (registers ``ds.prec`` on import)


class _Loader(importlib.abc.Loader):
    """xarray's own loader, then the accessor."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _register()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps xarray's loader once, then steps aside."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "xarray":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


def register_accessor_with_xarray() -> None:
    """Register ``ds.prec`` now if xarray is imported, else right after it is."""
    if "xarray" in sys.modules:
        _register()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
