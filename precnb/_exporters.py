"""Named exporters: how a layer below the report reaches its writer without importing it.

The explorer's "Export report" button writes the HTML report, but :mod:`precnb.widgets` and
:mod:`precnb.report` are independent front ends (the import contracts in ``pyproject.toml``,
``[tool.importlinter]``, forbid either importing the other). The dependency is declared here
instead, as data: an exporter's name and the dotted path (``"module:attribute"``) of the
callable, imported when it is asked for. The import contracts see no edge, and the widget does
not need the report's dependencies (jinja2, vl-convert) until the button is pressed.

Examples
--------
>>> EXPORTERS["html"]
'precnb.report:write_html'
>>> exporter("pdf")
Traceback (most recent call last):
...
KeyError: "no exporter 'pdf'; known: html"
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from precnb._plugins import PluginRegistry

__all__ = ["ENTRY_POINT_GROUP", "EXPORTERS", "REGISTRY", "exporter", "exporter_names"]

ENTRY_POINT_GROUP = "precnb.exporters"

#: exporter name -> ``"module:attribute"`` of the callable ``(source, path, **options) -> path``
EXPORTERS: dict[str, str] = {
    "html": "precnb.report:write_html",
}


def _as_exporter(obj: Any, name: str) -> Callable[..., Any]:
    if not callable(obj):
        raise TypeError(f"exporter {name!r} is not callable but {type(obj).__name__}")
    return obj


#: the exporters: built-ins (:data:`EXPORTERS`), run-time ones and the ``precnb.exporters`` entry points
REGISTRY: PluginRegistry[Callable[..., Any]] = PluginRegistry(ENTRY_POINT_GROUP, kind="exporter", builtins=EXPORTERS,
                                                              convert=_as_exporter, cache_builtins=False)


def exporter_names() -> tuple[str, ...]:
    """Every exporter's name: built-ins, registered, then plug-ins (none imported to list them)."""
    return REGISTRY.names()


def exporter(name: str) -> Callable[..., Any]:
    """Import and return the exporter registered as *name*.

    Parameters
    ----------
    name : str
        A key of :data:`EXPORTERS` (``"html"``), or of a plug-in of the ``precnb.exporters``
        entry-point group (``name = "module:callable"``).

    Returns
    -------
    callable

    Raises
    ------
    KeyError
        For an unknown name (the message lists the known ones), or a plug-in that failed to
        load (with a warning).
    ImportError
        When a built-in exporter's module cannot be imported (e.g. the ``notebook`` extra is not
        installed: :class:`precnb._extras.MissingExtraError`) or does not define it.
    """
    return REGISTRY.get(name)
