"""Optimizer list entries in a comparison: a fused call's list elements, and which runs' lists were renamed.

Used by :mod:`precnb.analysis.divergence.carried` (an L1 gradient entry's noise).
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_list_entry", "lists_renamed"]


def lists_renamed(ds: Any) -> bool:
    """Whether a run of the comparison had its optimizer lists renamed by parameter (``run_attrs`` kept per run)."""
    import json

    raw = ds.attrs.get("run_attrs")
    try:
        per = (json.loads(raw) if isinstance(raw, str) else raw) or {}
    except ValueError:
        return False
    return bool(ds.attrs.get("optimizer_lists_renamed")) or any(
        isinstance(v, dict) and v.get("optimizer_lists_renamed") for v in per.values())


def is_list_entry(label: str, node: str, lists: tuple[int, ...] | None = None) -> bool:
    """An element of a fused optimizer call's list argument (``Torch._fused_adamw_.0.forward.input.1.7``).

    >>> is_list_entry("Torch._fused_adamw_.0.forward.input.1.7", "Torch._fused_adamw_.0.forward")
    True
    >>> is_list_entry("Torch.matmul.0.forward.input.1", "Torch.matmul.0.forward")
    False
    """
    from precnb.analysis.layout.rank_args import is_optimizer_api

    slot = label[len(node):]
    parts = slot.split(".")  # ["", "input", LIST, ENTRY]
    if len(parts) < 4 or not is_optimizer_api(node.rsplit(".", 2)[0]):
        return False
    return lists is None or (parts[2].isdigit() and int(parts[2]) in lists)
