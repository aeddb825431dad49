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

    With pipeline parallelism the stages are stitched too (one rank per dense position, experts under their
    global indices) and checked in the stitched layout; each row then names the dump rank that recorded the
    entry (the stitch's ``source_rank``) and its group's dump ranks, so a healthy DP pair whose EP ranks hold
    other experts under the same local names is not a departure.
    """
    from precnb.analysis.layout.pp import relabel_pipeline

    relabelled, reduced = relabel_pipeline(ds, layout)
    got: list[dict[str, Any]] = []
    rows, checked = check(relabelled, layout if layout.pp == 1 else reduced, dims=dims, rtol=rtol, aside=got)
    if layout.pp > 1:
        rows = _dump_ranks(relabelled, rows)
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


def _dump_ranks(stitched: xr.Dataset, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of a stitched run with each rank (and group member) the dump rank that recorded the entry."""
    source = stitched["source_rank"].values if "source_rank" in stitched.data_vars else None
    if source is None:
        return rows
    steps = {int(s): i for i, s in enumerate(stitched["step"].values.tolist())}
    at = {int(r): i for i, r in enumerate(stitched["rank"].values.tolist())}
    cols = stitched.indexes["tensor"]

    def dump_rank(si: int, rank: int, k: int) -> int:
        got = int(source[si, at[rank], k]) if rank in at else -1
        return got if got >= 0 else rank

    for row in rows:
        si, k = steps[int(row["step"])], int(cols.get_loc(row["tensor"]))
        row["group"] = [dump_rank(si, int(r), k) for r in row["group"]]
        row["rank"] = dump_rank(si, int(row["rank"]), k)
    return rows
