"""A reference run read in a sharded run's names, by where each call is made rather than by its counter.

A merge asks an unsharded reference run for the whole shape of each tensor by label. msprobe's API labels carry
per-rank call counters (``Tensor.sum.4``), and a sharded layout runs calls the whole model does not (an MoE
layer's token-count exchange under expert parallelism, TP glue): from there on the same label names another call
in the two runs, and a lookup by label reads the shape of an unrelated tensor. :func:`in_target_names` renames the
reference's API labels to the sharded run's by a counter-free key — the calling module call (``parent``), the op,
its place among that module call's calls of the same op, the direction and the tensor slot; a reference label whose
name the sharded run gives to another call it found elsewhere gives way to that call.

Examples
--------
>>> from precnb.schema import empty_dataset
>>> in_target_names(empty_dataset(), empty_dataset()).sizes["tensor"]
0
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import xarray as xr

from precnb.naming import parse_node

__all__ = ["call_keys", "in_target_names"]


def call_keys(ds: xr.Dataset) -> dict[str, tuple[Any, ...]]:
    """Per API label: ``(parent, op, place among the parent's calls of that op, direction, slot)``.

    Module labels are left out (their names carry no counter of their own).
    """
    nodes = [str(n) for n in ds["node"].values]
    labels = [str(t) for t in ds["tensor"].values]
    parents = ds["parent"].values
    kinds = ds["kind"].values
    present = ds["present"].values if ds.sizes.get("step", 0) and ds.sizes.get("rank", 0) else None
    seq = ds["seq"].values if present is not None else None
    first_seq: dict[str, int] = {}
    where: dict[str, int] = {}
    for j, n in enumerate(nodes):
        if kinds[j] != "api":
            continue
        where.setdefault(n, j)
        if seq is not None and present is not None:
            col = present[:, :, j]
            if col.any():
                si, ri = np.argwhere(col)[0]
                q = int(seq[si, ri, j])
                first_seq[n] = min(first_seq.get(n, q), q)
    forward: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
    for n, j in where.items():
        p = parse_node(n)
        if p.direction == "forward" and p.call >= 0:
            forward[(str(parents[j] or ""), p.api)].append((first_seq.get(n, 1 << 40), p.call, n))
    place: dict[str, tuple[str, str, int]] = {}
    for (parent, api), calls in forward.items():
        for k, (_, _, n) in enumerate(sorted(calls)):
            place[n[: -len(".forward")]] = (parent, api, k)
    out: dict[str, tuple[Any, ...]] = {}
    for lbl, n, kind in zip(labels, nodes, kinds, strict=True):
        if kind != "api":
            continue
        p = parse_node(n)
        stem = n.rsplit(".", 1)[0] if p.direction else n
        at = place.get(stem)
        if at is None:
            continue
        out[lbl] = (*at, p.direction, lbl[len(n):])
    return out


def in_target_names(reference: xr.Dataset, ds: xr.Dataset) -> xr.Dataset:
    """*reference* with its API labels renamed to *ds*'s where both make the same call (see the module).

    Labels whose call is not found keep their name, unless a renamed call takes it. The reference comes back
    unchanged when every shared label names the same call in both.
    """
    if "present" not in reference.data_vars or "present" not in ds.data_vars:
        return reference
    mine, theirs = call_keys(ds), call_keys(reference)
    if not theirs:
        return reference
    by_key = {k: lbl for lbl, k in mine.items()}
    ref_labels = [str(t) for t in reference["tensor"].values]
    named: list[str | None] = []
    for lbl in ref_labels:  # a call found under another label is renamed; one not found keeps its name (its
        key = theirs.get(lbl)  # parent may just be named otherwise: msprobe's parent of a 1F1B call is stale)
        target = by_key.get(key) if key is not None else None
        named.append(target if target is not None else lbl)
    renamed = {t for t, lbl in zip(named, ref_labels, strict=True) if t is not None and t != lbl}
    keep: list[int] = []
    new: list[str] = []
    for j, (lbl, target) in enumerate(zip(ref_labels, named, strict=True)):
        if target is None or (target == lbl and lbl in renamed) or target in new[-1:]:
            continue
        keep.append(j)
        new.append(target)
    if len(keep) == len(ref_labels) and new == ref_labels:
        return reference
    if len(set(new)) != len(new):  # two reference calls on one name: the first
        seen: set[str] = set()
        pick = [k for k, t in enumerate(new) if not (t in seen or seen.add(t))]  # type: ignore[func-returns-value]
        keep, new = [keep[k] for k in pick], [new[k] for k in pick]
    out = reference.isel(tensor=keep)
    return out.assign_coords(tensor=np.asarray(new, dtype=object))
