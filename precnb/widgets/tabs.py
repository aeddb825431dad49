"""The explorer's tabs (panels of :mod:`precnb.widgets.panel`): built-in ones, in order, then plug-ins.

Kept apart from the protocol module, which the panels import, so that no panel imports a module
that imports it back. :data:`REGISTRY` is an instance of the generic plug-in registry
(:class:`precnb._plugins.PluginRegistry`): third-party tabs come from the ``precnb.panels``
entry-point group (``name = "mypkg.panel:MyPanel"``, a :class:`~precnb.widgets.panel.Panel`
subclass or a factory ``factory(api) -> panel | None``), or :meth:`REGISTRY.register` at run time.
"""

from __future__ import annotations

from typing import Any

from precnb._plugins import PluginRegistry
from precnb.widgets.panel import PanelFactory

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "REGISTRY", "default_panels"]

ENTRY_POINT_GROUP = "precnb.panels"

#: built-in tabs in order: name -> "module:class"
BUILTIN: dict[str, str] = {
    "finding": "precnb.widgets.findings:FindingPanel",
    "triage": "precnb.widgets.options:TriagePanel",
    "alignment": "precnb.widgets.alignment:AlignmentPanel",
    "shards": "precnb.widgets.shards:ShardPanel",
    "hierarchy": "precnb.widgets.hierarchy:HierarchyPanel",
    "experts": "precnb.widgets.experts:ExpertsPanel",
    "export": "precnb.widgets.export:ExportPanel",
}


def _as_factory(obj: Any, name: str) -> PanelFactory:
    factory = getattr(obj, "create", obj)  # a Panel subclass: its factory classmethod
    if not callable(factory):
        raise TypeError(f"panel {name!r} is neither a Panel class nor a factory but {type(obj).__name__}")
    return factory


REGISTRY: PluginRegistry[PanelFactory] = PluginRegistry(ENTRY_POINT_GROUP, kind="panel", builtins=BUILTIN,
                                                        convert=_as_factory)


def default_panels() -> list[PanelFactory]:
    """The tabs' factories: Finding, Triage options, Alignment, Shards, Hierarchy, Experts, Export, then plug-ins."""
    return [factory for _, factory in REGISTRY.items()]
