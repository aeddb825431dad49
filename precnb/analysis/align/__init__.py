"""Aligning two runs whose names differ: a framework port, renamed modules, restructured code.

:func:`align` pairs modules, then the calls inside paired modules, then tensors, with no
mapping file in the common cases (module tree, execution order, classes, parameter shapes,
op families across frameworks, and values where names fail), completed or overridden by
mapping files. Exact-name pairing is the special case where every pair is found by name.

Examples
--------
>>> from precnb.schema import empty_dataset
>>> align(empty_dataset(), empty_dataset()).identical
True
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis._memo import DatasetMemo
from precnb.analysis.align.alignment import ALIGNMENT_SCHEMA, Alignment, Pair
from precnb.analysis.align.fused import fuse_pair
from precnb.analysis.align.hints import hints_from
from precnb.analysis.align.pairing import Hints, pair_runs
from precnb.analysis.align.tree import RunTree, run_tree

__all__ = ["ALIGNMENT_SCHEMA", "Alignment", "Pair", "align", "mapping_specs"]

_COORDS = ("node", "module", "api", "kind", "direction", "role", "parent", "call", "micro_step")


def mapping_specs(mapping: Any) -> list[Any]:
    """Mapping files / documents / an Alignment → a list of :class:`precnb.mapping.MappingSpec`.

    Accepts a path, a parsed document (dict or list), an :class:`Alignment` (its user and
    confirmed pairs), or a sequence of those.
    """
    from precnb.mapping import MappingSpec, load_mapping, parse_mapping

    if mapping is None:
        return []
    if isinstance(mapping, Alignment):
        doc = mapping.with_pairs()
        return [parse_mapping({"modules": [{"baseline": b, "target": t} for b, t in doc["modules"].items()],
                               "nodes": [{"baseline": b, "target": t} for b, t in doc["nodes"].items()],
                               "tensors": [{"baseline": b, "target": t} for b, t in doc["tensors"].items()],
                               "unpair": doc["unpair"]})]
    if isinstance(mapping, MappingSpec):
        return [mapping]
    if isinstance(mapping, (str, os.PathLike)):
        return [load_mapping(mapping)]
    if isinstance(mapping, Mapping):
        if set(mapping) <= {"modules", "nodes", "tensors", "unpair"} and all(
                isinstance(v, (Mapping, list, tuple, set)) for v in mapping.values()):
            def pairs(key: str) -> list[dict[str, str]]:
                v = mapping.get(key) or {}
                if isinstance(v, Mapping):
                    return [{"baseline": str(b), "target": str(t)} for b, t in v.items()]
                out = []
                for item in v:
                    if isinstance(item, Mapping):
                        out.append({"baseline": str(item["baseline"]), "target": str(item["target"])})
                    else:
                        b, t = item
                        out.append({"baseline": str(b), "target": str(t)})
                return out

            return [parse_mapping({"modules": pairs("modules"), "nodes": pairs("nodes"),
                                   "tensors": pairs("tensors"), "unpair": list(mapping.get("unpair") or [])})]
        return [parse_mapping(dict(mapping))]
    if isinstance(mapping, Iterable):
        out: list[Any] = []
        items = list(mapping)
        if items and all(isinstance(x, Mapping) and "ms_api" in x for x in items):
            return [parse_mapping(items)]
        for item in items:
            out.extend(mapping_specs(item))
        return out
    raise TypeError(f"mapping: expected a path, a mapping document or an Alignment, got {type(mapping).__name__}")


def _identical(tb: RunTree, tt: RunTree) -> bool:
    return set(tb.labels) == set(tt.labels)


def _identity(tb: RunTree, tt: RunTree) -> Alignment:
    mods = [Pair(p, p, "name", 1.0) for p in sorted(set(tb.modules) & set(tt.modules)) if p]
    nodes = [Pair(n, n, "name", 1.0) for n in sorted(set(tb.nodes) & set(tt.nodes))]
    tensors = [Pair(t, t, "name", 1.0) for t in tt.labels]
    return Alignment(modules=mods, nodes=nodes, tensors=tensors, frameworks=(tb.framework, tt.framework),
                     identical=True)


def align(baseline: xr.Dataset, target: xr.Dataset, *, mapping: Any = None) -> Alignment:
    """Pair the modules, nodes and tensors of two runs.

    Parameters
    ----------
    baseline, target : xarray.Dataset
        Two single-run canonical datasets (any frameworks; shards merged first if needed).
    mapping : path, mapping document, Alignment or a sequence of them, optional
        msprobe layer / cell / API / data mapping YAML or precnb's own mapping file
        (:meth:`Alignment.mapping_document`); its pairs are kept (``how="user"``) and the rest
        is completed automatically.

    Returns
    -------
    Alignment

    Examples
    --------
    >>> import precnb
    >>> a = precnb.align(precnb.open_run("pt_dump/"), precnb.open_run("ms_dump/"))  # doctest: +SKIP
    >>> a.module_map()["layers.0.attention.wq"]  # doctest: +SKIP
    'blocks.0.attn.q_proj'
    """
    return _align(baseline, target, mapping=mapping)


_TREES = DatasetMemo(size=4)


def _tree(ds: xr.Dataset) -> RunTree:
    """:func:`run_tree` of *ds*, reused while *ds* is the same, unchanged dataset (a rerun on the same runs).

    A tree is read, never changed, by the pairing: it is shared, not copied.
    """
    return _TREES.get([ds], "run_tree", lambda: run_tree(ds), copy=False)


def _align(baseline: xr.Dataset, target: xr.Dataset, *, mapping: Any = None, fast: bool = True) -> Alignment:
    """:func:`align`; ``fast=False`` scores every pair (no identity shortcut, no proof by name), for tests."""
    specs = mapping_specs(mapping)
    if fast and not specs and baseline.indexes["tensor"].equals(target.indexes["tensor"]):
        tb, tt = _tree(baseline), _tree(target)
        return _identity(tb, tt)
    baseline, target = fuse_pair(baseline, target)  # fused projections against separate ones: combined
    tb, tt = _tree(baseline), _tree(target)
    if fast and not specs and _identical(tb, tt):
        return _identity(tb, tt)
    hints = hints_from(specs, tb, tt) if specs else Hints()
    p = pair_runs(tb, tt, hints, fast=fast)
    index, every = _target_coords(tt)
    target_coords = {t: every[t] for t in p.tensors if t in every}
    modules = [Pair(b, t, how, conf) for b, (t, how, conf) in p.modules.items()]
    modules.sort(key=lambda q: (tt.modules[q.target].seq if q.target in tt.modules else 1 << 41, q.target))
    nodes = [Pair(b, t, how, conf) for b, (t, how, conf) in p.nodes.items()]
    nodes.sort(key=lambda q: (tt.nodes[q.target].seq, q.target))
    tensors = [Pair(b, t, how, conf) for t, (b, how, conf) in p.tensors.items()]
    tensors.sort(key=lambda q: index.get(q.target, 1 << 41))
    unpaired: dict[str, list[dict[str, str]]] = {"baseline": [], "target": [], "glue": []}
    for side, tree in (("baseline", tb), ("target", tt)):
        for node, why in sorted(p.left[side].items(), key=lambda kv: tree.nodes[kv[0]].seq):
            if why.startswith("unpaired"):
                unpaired[side].append({"node": node, "why": why.split(": ", 1)[-1]})
            else:
                unpaired["glue"].append({"side": side, "node": node, "why": why})
    identical = (not specs and all(q.baseline == q.target for q in nodes) and not unpaired["baseline"]
                 and not unpaired["target"] and not unpaired["glue"] and len(tensors) == len(tt.labels))
    user_unpaired = sorted(hints.unpair_nodes & set(tt.nodes))
    return Alignment(modules=modules, nodes=nodes, tensors=tensors, unpaired=unpaired,
                     frameworks=(tb.framework, tt.framework), identical=identical, target_coords=target_coords,
                     sources=[s.source or s.kind for s in specs], user_unpaired=user_unpaired,
                     mapping_problems=list(hints.problems))


def _target_coords(tt: RunTree) -> tuple[dict[str, int], dict[str, tuple[Any, ...]]]:
    """(position of each target label, its tensor coordinates as :attr:`Alignment.target_coords` holds them).

    Read once per target tree (a tree is never changed: every alignment against it reads the same).
    """
    kept = getattr(tt, "_target_coords", None)
    if kept is None:
        none = [None] * len(tt.labels)
        cols = [_plain_values(tt.coords[name]) if name in tt.coords else none for name in _COORDS]
        index = {lbl: j for j, lbl in enumerate(tt.labels)}
        every = dict(zip(tt.labels, zip(*cols, strict=False), strict=False))  # a label: its row, in label order
        kept = tt._target_coords = (index, every)  # type: ignore[attr-defined]
    return kept


def _plain_values(values: np.ndarray) -> list[Any]:
    """Each value of a coordinate as :func:`_plain` gives it (a numeric column converted at once)."""
    if values.dtype != object:
        return values.tolist()
    kinds = (np.generic, np.ndarray)
    return [v.item() if isinstance(v, kinds) else v for v in values.tolist()]


def _plain(v: Any) -> Any:
    try:
        return v.item()
    except AttributeError:
        return v
