"""One generic plug-in registry: readers, diagnoses, explorer panels and exporters are instances of it.

In the spirit of altair's ``PluginRegistry`` and xarray's backend entry points: a registry has a
name per plug-in, built-ins named by ``"module:attribute"`` (imported when first asked for),
plug-ins registered at run time (:meth:`PluginRegistry.register`), and third-party plug-ins
declared in an entry-point group of an installed distribution::

    [project.entry-points."precnb.readers"]      # or precnb.diagnoses, precnb.panels, precnb.exporters
    myformat = "mypkg.precnb_reader:READER"

Listing the names imports nothing (entry points are listed, not loaded); a plug-in is imported
when it is first asked for. A plug-in that cannot be imported, is of the wrong type, or reuses a
built-in name is skipped with a :class:`RuntimeWarning`; it never stops precnb. Setting the
environment variable ``PRECNB_NO_PLUGINS`` disables every entry-point group.

Examples
--------
>>> reg = PluginRegistry("precnb.examples", kind="example", builtins={"json": "json:dumps"})
>>> reg.names()
('json',)
>>> reg.get("json")([1])
'[1]'
>>> reg.get("nope")
Traceback (most recent call last):
...
KeyError: "no example 'nope'; known: json"
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["GROUPS", "PluginRegistry", "load_object"]

T = TypeVar("T")

#: the entry-point groups precnb reads, one per registry
GROUPS = ("precnb.readers", "precnb.diagnoses", "precnb.panels", "precnb.exporters")


def load_object(target: str) -> Any:
    """Import ``"module:attribute"`` (or ``"module"``) and return the object."""
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    if not attribute:
        return module
    obj: Any = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"{module_name} has no attribute {attribute!r}") from None
    return obj


class PluginRegistry(Generic[T]):
    """Named plug-ins of one kind: built-ins, run-time registrations and one entry-point group.

    Parameters
    ----------
    group : str
        The entry-point group (``"precnb.readers"``).
    kind : str
        What a plug-in is, for messages (``"reader"``).
    builtins : mapping, optional
        Built-in name -> ``"module:attribute"`` (or the object itself), in listing order. The
        mapping is read live, so a module may keep its own dict of built-ins.
    convert : callable, optional
        ``convert(obj, name) -> T``: checks (and may adapt) a loaded plug-in; raises
        ``TypeError`` for a wrong object. Default: the object as loaded.
    builtin_word : str, optional
        The word in "reuses a built-in ... name" (default *kind*).
    cache_builtins : bool
        Keep a built-in once imported (default). False: import it on every :meth:`get` (cheap once
        imported; a module made unimportable later, as a test does, then fails as it would).
    """

    def __init__(self, group: str, *, kind: str, builtins: Mapping[str, Any] | None = None,
                 convert: Callable[[Any, str], T] | None = None, builtin_word: str | None = None,
                 cache_builtins: bool = True) -> None:
        self.group = group
        self.kind = kind
        self.builtins: Mapping[str, Any] = builtins if builtins is not None else {}
        self._convert = convert
        self._word = builtin_word or kind
        self._cache_builtins = cache_builtins
        self._loaded: dict[str, T] = {}
        self._extra: dict[str, T] = {}
        self._plugins: dict[str, Any] | None = None  # name -> entry point, or the loaded plug-in

    # -- entry points ---------------------------------------------------------------------------
    def entry_points(self) -> dict[str, Any]:
        """The group's entry points by name (listed once, not loaded; built-in names left out, with a warning)."""
        if self._plugins is None:
            found: dict[str, Any] = {}
            if not os.environ.get("PRECNB_NO_PLUGINS"):
                try:
                    from importlib.metadata import entry_points

                    for ep in entry_points(group=self.group):
                        if ep.name in self.builtins:
                            warnings.warn(f"precnb {self.kind} plug-in {ep.name!r} ({ep.value}) reuses a built-in "
                                          f"{self._word} name; ignored", RuntimeWarning, stacklevel=3)
                            continue
                        found.setdefault(ep.name, ep)
                except Exception as exc:  # broken metadata of some installed package
                    warnings.warn(f"precnb: cannot list {self.kind} plug-ins ({self.group}): "
                                  f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=3)
            self._plugins = found
        return self._plugins

    def _as(self, obj: Any, name: str) -> T:
        return self._convert(obj, name) if self._convert is not None else obj

    def _load_plugin(self, name: str) -> T | None:
        plugins = self.entry_points()
        if name not in plugins:
            return None
        ep = plugins[name]
        if not hasattr(ep, "load") or not hasattr(ep, "value"):
            return ep  # already loaded
        try:
            obj = self._as(ep.load(), name)
        except Exception as exc:  # ImportError, a bug at import, a wrong object: warn, never break precnb
            warnings.warn(f"precnb {self.kind} plug-in {name!r} ({ep.value}) could not be loaded: "
                          f"{type(exc).__name__}: {exc}; ignored", RuntimeWarning, stacklevel=4)
            del plugins[name]
            return None
        plugins[name] = obj
        return obj

    # -- lookup ---------------------------------------------------------------------------------
    def names(self) -> tuple[str, ...]:
        """Every name: built-ins, then registered, then plug-ins (sorted; none imported to list them)."""
        return (*self.builtins, *[n for n in self._extra if n not in self.builtins],
                *sorted(n for n in self.entry_points() if n not in self.builtins and n not in self._extra))

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def get(self, name: str) -> T:
        """The plug-in called *name* (a built-in's import errors propagate).

        Raises
        ------
        KeyError
            When no plug-in has that name, or its plug-in failed to load (with a warning).
        """
        if name in self._loaded:
            return self._loaded[name]
        if name in self.builtins:
            target = self.builtins[name]
            obj = self._as(load_object(target) if isinstance(target, str) else target, name)
            if not self._cache_builtins:
                return obj
        elif name in self._extra:
            obj = self._extra[name]
        else:
            found = self._load_plugin(name)
            if found is None:
                raise KeyError(f"no {self.kind} {name!r}; known: {', '.join(self.names())}")
            obj = found
        self._loaded[name] = obj
        return obj

    def items(self) -> list[tuple[str, T]]:
        """``(name, plug-in)`` for every one that loads, in :meth:`names` order (broken ones warned about)."""
        out = []
        for name in self.names():
            try:
                out.append((name, self.get(name)))
            except KeyError:
                continue
        return out

    # -- run time -------------------------------------------------------------------------------
    def register(self, name: str, obj: T, *, replace: bool = False) -> T:
        """Add *obj* as *name* for this process; returns it.

        Raises
        ------
        ValueError
            When *name* is a built-in, or already registered (unless *replace*).
        """
        if name in self.builtins:
            raise ValueError(f"{name!r} is a built-in {self._word}")
        if name in self._extra and not replace and self._extra[name] is not obj:
            raise ValueError(f"a {self.kind} {name!r} is already registered")
        self._extra[name] = obj
        self._loaded.pop(name, None)
        return obj

    def unregister(self, name: str) -> None:
        """Remove a plug-in added with :meth:`register`."""
        self._extra.pop(name, None)
        self._loaded.pop(name, None)

    def registered(self) -> dict[str, T]:
        """The plug-ins added with :meth:`register`, by name."""
        return dict(self._extra)

    def refresh(self) -> None:
        """Forget the entry points found so far (after installing a plug-in in a running kernel, say)."""
        self._plugins = None
        for name in [n for n in self._loaded if n not in self.builtins]:
            del self._loaded[name]
