"""The replica check of an expert-parallel run: experts under global indices, reported in the dump's names."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import xarray as xr

from precnb.analysis.layout import Layout

__all__ = ["expert_parallel_mismatches"]


def expert_parallel_mismatches(ds: xr.Dataset, layout: Layout, dims: Sequence[str], rtol: float, check: Any
                               ) -> tuple[list[dict[str, Any]], int, list[dict[str, Any]]]:
    """*check* (:func:`precnb.analysis.replicas._replica_mismatches`) on an expert-parallel run, in the dump's names.

    Each rank holds other experts under the same local names (``local_experts.0`` is global expert 0 on EP
    rank 0 and 2 on EP rank 1) and numbers its API calls over its own experts: the run is checked with its
    experts under their global indices and its calls numbered as one rank holding every expert would
    (:func:`precnb.analysis.layout.pp.relabel_pipeline`), so an expert is compared with its replicas only (the
    expert data-parallel group) and an extra call on one rank does not shift the others' labels.
    """
    from precnb.analysis.layout.pp import relabel_pipeline

    relabelled, _ = relabel_pipeline(ds, layout)
    got: list[dict[str, Any]] = []
    rows, checked = check(relabelled, layout, dims=dims, rtol=rtol, aside=got)
    try:
        sources = json.loads(relabelled.attrs.get("stitch_sources") or "{}")
    except (TypeError, ValueError):
        sources = {}

    def own(node: str, rank: int) -> str:
        return str(sources.get(node, {}).get(str(rank), node))

    for row in rows:
        node, rank = str(row["node"]), int(row["rank"])
        local = own(node, rank)
        if local != node:
            row["tensor"] = local + str(row["tensor"])[len(node):]
            row["node"] = local
    for a in got:
        if a.get("node"):
            a["node"] = own(str(a["node"]), int(ds["rank"].values[0]))
    return rows, checked, got
