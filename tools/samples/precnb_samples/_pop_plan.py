"""Planning helpers shared by the dense and the MoE population draws: run ids, a draw's run registry, healthy pairs.

:mod:`precnb_samples._population` (dense draws) and :mod:`precnb_samples._pop_moe` (MoE draws) both plan with them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["healthy_pairs", "run_id", "run_registry"]


def run_id(spec: dict[str, Any]) -> str:
    """Content hash of a run spec (the run's folder name)."""
    return "r" + hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def run_registry() -> tuple[dict[str, dict[str, Any]], Callable[[dict[str, Any]], str]]:
    """``(runs, add)``: a draw's runs by content hash, and ``add(spec) -> run id`` (each spec once).

    >>> runs, add = run_registry()
    >>> add({"seed": 1}) == add({"seed": 1}), len(runs)
    (True, 1)
    """
    runs: dict[str, dict[str, Any]] = {}

    def add(spec: dict[str, Any]) -> str:
        rid = run_id(spec)
        runs.setdefault(rid, spec)
        return rid

    return runs, add


def healthy_pairs(seeds: list[int], reference: str, layouts: Iterable[str],
                  spec_of: Callable[[int, str], dict[str, Any]], add: Callable[[dict[str, Any]], str],
                  **extra: Any) -> list[dict[str, Any]]:
    """Per model seed, every layout against the *reference* layout of that seed (each run added once)."""
    out = []
    for s in seeds:
        ref = add(spec_of(s, reference))
        for lay in layouts:
            if lay != reference:
                out.append({"name": f"{lay}@{s}", "seed": s, "layout": lay, "run": add(spec_of(s, lay)),
                            "reference": ref, **extra})
    return out
