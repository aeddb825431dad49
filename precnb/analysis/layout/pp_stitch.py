"""Stitching pipeline stages into one rank: each stitched label taken from the stage that makes it, in order.

Used by :func:`precnb.analysis.layout.pp.relabel_pipeline` once every stage's labels are renamed to the whole model's.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Hashable
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.layout import Layout
from precnb.naming import parse_node
from precnb.schema import ENTRY_CHANGE_ATTRS

__all__ = ["CHUNK", "assemble_groups"]

#: a VPP model chunk's prefix of a node (``Module.{chunk}.``)
CHUNK = re.compile(r"^(Module|Cell)\.(\d+)\.")



def _entry_table(ds: xr.Dataset, attr: str) -> dict[tuple[str, int, int], str]:
    """``(label, step, rank) -> value`` of a reader's per-entry exception table (``shape_changes``, ...)."""
    try:
        table = json.loads(ds.attrs.get(attr) or "{}")
    except (TypeError, ValueError):
        return {}
    out: dict[tuple[str, int, int], str] = {}
    for label, by_value in (table.items() if isinstance(table, dict) else ()):
        for value, where in (by_value.items() if isinstance(by_value, dict) else ()):
            for st, r in where:
                out[(str(label), int(st), int(r))] = str(value)
    return out


def _position(node: str, stage: int, layout: Layout) -> int:
    """The pipeline position of a record: its virtual stage (``chunk * pp + stage``), or its stage."""
    m = CHUNK.match(node) if layout.vpp > 1 else None
    return int(m.group(2)) * layout.pp + stage if m else stage


def _pick(role: str, direction: str, cands: list[int]) -> int:
    if len(cands) == 1:
        return cands[0]
    late = (direction == "forward" and role == "output") or (direction == "backward" and role == "input")
    return cands[-1] if late else cands[0]


def assemble_groups(ds: xr.Dataset, layout: Layout, reduced: Layout, groups: dict[int, list[int]],
                    label_maps: dict[int, np.ndarray],
                    orders: dict[tuple[int, int], dict[str, tuple[Any, ...]]] | None = None) -> xr.Dataset:
    """The stitched dataset; ``label_maps[r]`` is (step, tensor): each entry's stitched label ("" dropped).

    *orders*: (member, step index) -> node -> its place in the one-rank execution order; without it the
    stages' records follow each other (stage 0's, then stage 1's).
    """
    ranks = [int(r) for r in ds["rank"].values]
    labels, per_group = _chosen(ds, layout, groups, label_maps)
    pos = {lbl: k for k, lbl in enumerate(labels)}
    new_ranks = sorted(groups)
    coords_src = np.full(len(labels), -1, np.int64)  # original tensor index for coordinates
    src_at: dict[int, tuple[int, int]] = {}  # stitched column -> the (step, rank) its coordinates come from
    steps = [int(x) for x in ds["step"].values]
    for new in new_ranks:
        for si, picked in enumerate(per_group[new]):
            for lbl, (r, j) in picked.items():
                if coords_src[pos[lbl]] < 0:
                    coords_src[pos[lbl]] = j
                    src_at[pos[lbl]] = (steps[si], r)
    picks: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # (gi, si) -> columns
    for gi, new in enumerate(new_ranks):
        for si, picked in enumerate(per_group[new]):
            if picked:
                items = list(picked.items())
                picks[(gi, si)] = (np.fromiter((pos[lbl] for lbl, _ in items), np.int64, len(items)),
                                   np.fromiter((ranks.index(r) for _, (r, _j) in items), np.int64, len(items)),
                                   np.fromiter((j for _, (_r, j) in items), np.int64, len(items)))
    data = _stitched_vars(ds, picks, (ds.sizes["step"], len(groups), len(labels)), ranks)
    # seq: the one-rank execution order (micro-batch, forward then backward, stage), else stage after stage
    _stitched_seq(data["seq"][1], per_group, new_ranks, groups, pos, ds["node"].values, orders)
    coords = _stitched_coords(ds, labels, coords_src, src_at, new_ranks)
    # per-entry dtype exceptions are keyed by the old labels and ranks: not carried over (the
    # dtype coordinate, first seen, stays)
    out = xr.Dataset(data, coords=coords, attrs={k: v for k, v in ds.attrs.items() if k not in ENTRY_CHANGE_ATTRS})
    out.attrs["pipeline_stitched"] = f"pp={layout.pp} vpp={layout.vpp} ep={layout.ep} -> {reduced.describe()}"
    return out


def _chosen(ds: xr.Dataset, layout: Layout, groups: dict[int, list[int]], label_maps: dict[int, np.ndarray]
            ) -> tuple[list[str], dict[int, list[dict[str, tuple[int, int]]]]]:
    """(stitched labels in first-seen order, per new rank and step: label -> the (dump rank, column) it is taken from).

    A label several stages record (a tied embedding, a stage boundary) is taken from the stage that makes it
    last (a forward output, a backward input) or first, in pipeline order.
    """
    roles, dirs, nodes = ds["role"].values, ds["direction"].values, ds["node"].values
    order: dict[str, int] = {}
    per_group: dict[int, list[dict[str, tuple[int, int]]]] = {}
    for new in sorted(groups):
        steps_chosen = []
        for si in range(ds.sizes["step"]):
            chosen: dict[str, list[tuple[int, int]]] = defaultdict(list)
            for r in groups[new]:
                row = label_maps[r][si]
                for j in np.flatnonzero(row != "").tolist():
                    lbl = row[j]
                    chosen[lbl].append((r, j))
                    order.setdefault(lbl, len(order))
            for c in chosen.values():  # pipeline order: (virtual) stage of each copy
                if len(c) > 1:
                    c.sort(key=lambda x: _position(str(nodes[x[1]]), layout.coords(x[0])["pp"], layout))
            steps_chosen.append({lbl: (c[_pick(str(roles[c[0][1]]), str(dirs[c[0][1]]), list(range(len(c))))])
                                 for lbl, c in chosen.items()})
        per_group[new] = steps_chosen
    return list(order), per_group


def _stitched_vars(ds: xr.Dataset, picks: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]],
                   shape: tuple[int, int, int], ranks: list[int]) -> dict[Hashable, Any]:
    """Every (step, rank, tensor) variable of the stitched run, and ``source_rank`` (the dump rank of each entry)."""
    data: dict[Hashable, Any] = {}
    for name, var in ds.data_vars.items():
        if var.dims != ("step", "rank", "tensor"):
            continue
        fill: Any = {"b": False, "i": -1, "u": 0, "f": np.nan}.get(var.dtype.kind, "")
        arr = np.full(shape, fill, dtype=var.dtype)
        vals = var.values
        for (gi, si), (dst, src_r, src_j) in picks.items():
            arr[si, gi, dst] = vals[si, src_r, src_j]
        data[name] = (("step", "rank", "tensor"), arr)
    source = np.full(shape, -1, np.int64)  # the dump rank each stitched entry was taken from
    for (gi, si), (dst, src_r, _src_j) in picks.items():
        source[si, gi, dst] = np.asarray(ranks, np.int64)[src_r]
    data["source_rank"] = (("step", "rank", "tensor"), source)
    return data


def _stitched_seq(seq: np.ndarray, per_group: dict[int, list[dict[str, tuple[int, int]]]], new_ranks: list[int],
                  groups: dict[int, list[int]], pos: dict[str, int], nodes: np.ndarray,
                  orders: dict[tuple[int, int], dict[str, tuple[Any, ...]]] | None) -> None:
    """*seq* (in place): the one-rank execution order when *orders* says it, else stage after stage."""
    for gi, new in enumerate(new_ranks):
        for si, picked in enumerate(per_group[new]):
            if orders:
                placed = sorted((orders.get((r, si), {}).get(str(nodes[j]), (1 << 31, 0, 0, 0)), r, pos[lbl])
                                for lbl, (r, j) in picked.items())
                for place, (_, _, col) in enumerate(placed):
                    if seq[si, gi, col] >= 0:
                        seq[si, gi, col] = place
                continue
            base = 0
            for r in groups[new]:
                cols = [pos[lbl] for lbl, (rr, _j) in picked.items() if rr == r]
                if not cols:
                    continue
                block = seq[si, gi, cols]
                seq[si, gi, cols] = np.where(block >= 0, block + base, -1)
                base = int(seq[si, gi, cols].max()) + 1


def _stitched_coords(ds: xr.Dataset, labels: list[str], coords_src: np.ndarray, src_at: dict[int, tuple[int, int]],
                     new_ranks: list[int]) -> dict[Hashable, Any]:
    """The stitched run's coordinates: each label's from the entry it was first taken from, node/module renamed."""
    coords: dict[Hashable, Any] = {"step": ds["step"].values, "rank": np.asarray(new_ranks, np.int64),
                                   "tensor": np.asarray(labels, dtype=object)}
    for name, c in ds.coords.items():
        if c.dims == ("tensor",) and name != "tensor":
            coords[name] = ("tensor", c.values[coords_src])
    # a stage's own shape and dtype where another stage records the same (local) label otherwise
    old_labels = ds["tensor"].values
    for name, attr in (("shape", "shape_changes"), ("dtype", "dtype_changes")):
        own = _entry_table(ds, attr)
        if own and name in coords:
            fixed = np.asarray(coords[name][1], dtype=object).copy()
            for col_k, (st, r) in src_at.items():
                v = own.get((str(old_labels[coords_src[col_k]]), st, r))
                if v is not None:
                    fixed[col_k] = v
            coords[name] = ("tensor", fixed)
    # node/module/parent follow the renamed labels
    new_node = []
    for lbl, j in zip(labels, coords_src.tolist(), strict=True):
        old_node, old_label = str(ds["node"].values[j]), str(ds["tensor"].values[j])
        suffix = old_label[len(old_node):]
        new_node.append(lbl[: len(lbl) - len(suffix)] if suffix and lbl.endswith(suffix) else lbl)
    coords["node"] = ("tensor", np.asarray(new_node, dtype=object))
    modules = []
    for n, m in zip(new_node, coords["module"][1], strict=True):
        p = parse_node(n)
        modules.append(p.module if p.kind != "api" else str(m))
    coords["module"] = ("tensor", np.asarray(modules, dtype=object))
    return coords
