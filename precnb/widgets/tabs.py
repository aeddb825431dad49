"""The explorer's built-in tabs (panels of :mod:`precnb.widgets.panel`), in order.

Kept apart from the protocol module, which the panels import, so that no panel imports a module
that imports it back.
"""

from __future__ import annotations

from precnb.widgets.panel import PanelFactory

__all__ = ["default_panels"]


def default_panels() -> list[PanelFactory]:
    """The built-in tabs, in order: Finding, Triage options, Alignment, Shards, Hierarchy, Export."""
    from precnb.widgets.alignment import AlignmentPanel
    from precnb.widgets.export import ExportPanel
    from precnb.widgets.findings import FindingPanel
    from precnb.widgets.hierarchy import HierarchyPanel
    from precnb.widgets.options import TriagePanel
    from precnb.widgets.shards import ShardPanel

    return [p.create for p in (FindingPanel, TriagePanel, AlignmentPanel, ShardPanel, HierarchyPanel, ExportPanel)]
