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

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["EXPORTERS", "exporter"]

#: exporter name -> ``"module:attribute"`` of the callable ``(source, path, **options) -> path``
EXPORTERS: dict[str, str] = {
    "html": "precnb.report:write_html",
}


def exporter(name: str) -> Callable[..., Any]:
    """Import and return the exporter registered as *name*.

    Parameters
    ----------
    name : str
        A key of :data:`EXPORTERS` (``"html"``).

    Returns
    -------
    callable

    Raises
    ------
    KeyError
        For an unknown name (the message lists the known ones).
    ImportError
        When the exporter's module cannot be imported (e.g. the ``notebook`` extra is not
        installed: :class:`precnb._extras.MissingExtraError`) or does not define it.
    """
    try:
        target = EXPORTERS[name]
    except KeyError:
        raise KeyError(f"no exporter {name!r}; known: {', '.join(sorted(EXPORTERS))}") from None
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ImportError(f"exporter {name!r}: {module_name} has no attribute {attribute!r}") from None
