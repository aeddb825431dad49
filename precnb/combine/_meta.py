"""Per-entry metadata of joined runs: each part's own values kept where they differ from the joined table.

When steps or runs are joined (:func:`precnb.combine.concat_steps`, :func:`precnb.combine.combine_runs`), one
table of shapes, dtypes, modules and stacks per tensor cannot hold what differs between parts; the values that
differ are kept per (step, rank) and rebased onto the joined table here, with the layout facts of the parts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from precnb.schema import (
    META_FIELDS,
    dtype_changes,
    encode_entry_changes,
    encode_meta_changes,
    encode_stack_changes,
    encode_undefined,
    entry_changes,
    meta_changes,
    side_table,
    stack_changes,
    undefined_table,
)


def _json_attr(ds: xr.Dataset, key: str, default: Any) -> Any:
    raw = ds.attrs.get(key)
    if not raw:
        return default
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return default


def _rebase(ds: xr.Dataset, own: dict[str, dict[tuple[int, int], str]], name: str,
            coord: dict[str, Any] | np.ndarray) -> dict[str, dict[tuple[int, int], str]]:
    """*own* (tensor → {(step, rank): value} for coordinate *name*) relative to another coordinate *coord*.

    *coord*: tensor → value, or the values aligned with *ds*'s tensors.
    """
    labels = ds["tensor"].values
    if isinstance(coord, np.ndarray):
        base_v = np.asarray(["" if v is None else str(v) for v in coord.tolist()], dtype=object)
    else:
        base_v = np.asarray([str(coord.get(str(t)) or "") for t in labels.tolist()], dtype=object)
    mine = np.asarray(["" if v is None else str(v) for v in ds[name].values.tolist()], dtype=object)
    moved = np.flatnonzero((mine != base_v) & (mine != "") & (base_v != ""))  # the part's coordinate differs
    out: dict[str, dict[tuple[int, int], str]] = {}
    if len(moved):
        present = np.asarray(ds["present"].values)
        steps = [int(x) for x in ds["step"].values]
        ranks = [int(x) for x in ds["rank"].values]
        for j in moved.tolist():  # every recorded entry without its own exception has this part's value
            lbl, here, base = str(labels[j]), str(mine[j]), str(base_v[j])
            kept = {(steps[a], ranks[b]): here for a, b in np.argwhere(present[:, :, j]).tolist()}
            kept.update(own.get(lbl, {}))
            kept = {k: d for k, d in kept.items() if d != base}
            if kept:
                out[lbl] = kept
    if own:
        pos = {str(t): j for j, t in enumerate(labels.tolist())} if len(own) > 8 else None
        done = {str(labels[j]) for j in moved.tolist()}
        for lbl, where in own.items():
            if lbl in done:
                continue
            at: int | None = pos.get(lbl) if pos is not None else (
                int(ds.indexes["tensor"].get_loc(lbl)) if lbl in ds.indexes["tensor"] else None)
            base = str(base_v[at]) if at is not None else ""
            kept = {k: d for k, d in where.items() if d != base}
            if kept:
                out[lbl] = kept
    return out


def rebase_meta_changes(ds: xr.Dataset, coords: Mapping[str, dict[str, Any] | np.ndarray]
                        ) -> dict[str, dict[str, dict[tuple[int, int], str]]]:
    """*ds*'s per-entry ``module`` / ``parent`` / ``shape`` exceptions relative to other coordinates.

    As :func:`rebase_dtype_changes`, for each of :data:`precnb.schema.META_FIELDS` (*coords*:
    field → tensor → the joined dataset's coordinate, or field → values aligned with *ds*'s tensors).
    """
    own = meta_changes(ds)
    out = {}
    for f in META_FIELDS:
        if f in ds.coords and f in coords:
            moved = _rebase(ds, own.get(f, {}), f, coords[f])
            if moved:
                out[f] = moved
    return out


def _joined_entry_meta(parts: list[xr.Dataset], labels: list[str], coords: dict[str, np.ndarray],
                       stacks_text: str) -> dict[str, str]:
    """``meta_changes`` / ``stack_changes`` of *parts* joined into one dataset (its coordinates and stacks)."""
    order = {lbl: j for j, lbl in enumerate(labels)}
    meta: dict[str, dict[str, dict[tuple[int, int], str]]] = {}
    for ds in parts:
        idx = np.fromiter((order[str(t)] for t in ds["tensor"].values), np.int64, ds.sizes["tensor"])
        final: dict[str, Any] = {f: np.asarray(coords[f])[idx] for f in META_FIELDS if f in coords}  # ds order
        for f, by_tensor in rebase_meta_changes(ds, final).items():
            for t, where in by_tensor.items():
                meta.setdefault(f, {}).setdefault(t, {}).update(where)
    stacks: dict[str, dict[tuple[int, int], list[str]]] = {}
    joined = json.loads(stacks_text) if len(parts) > 1 else None
    for k, ds in enumerate(parts):
        for node, frames_at in stack_changes(ds).items():
            stacks.setdefault(node, {}).update(frames_at)
        if joined is None or k == 0 or ds.attrs.get("stacks") == stacks_text:
            continue
        nodes, present = ds["node"].values, None
        for node, frames in side_table(ds, "stacks").items():  # frames this part records otherwise
            if joined.get(node, frames) == frames:
                continue
            cols = np.flatnonzero(nodes == node)
            if not len(cols):
                continue
            if present is None:
                present = np.asarray(ds["present"].values)
            for a, b in np.argwhere(present[:, :, cols].any(axis=2)).tolist():
                key = (int(ds["step"].values[a]), int(ds["rank"].values[b]))
                stacks.setdefault(node, {}).setdefault(key, list(frames))
    out = {}
    if meta:
        out["meta_changes"] = encode_meta_changes(meta)
    if stacks:
        out["stack_changes"] = encode_stack_changes(stacks)
    return out


def rebase_dtype_changes(ds: xr.Dataset, coord: dict[str, Any]) -> dict[str, dict[tuple[int, int], str]]:
    """*ds*'s per-entry dtype exceptions relative to another ``dtype`` coordinate.

    When datasets are joined, a tensor's ``dtype`` coordinate is the first part's; entries
    of the other parts whose dtype is not that one become exceptions (and exceptions that
    equal it disappear).

    Parameters
    ----------
    ds : xarray.Dataset
        One run.
    coord : dict
        tensor → the joined dataset's ``dtype`` coordinate.

    Returns
    -------
    dict
        tensor → {(step, rank): dtype}, as :func:`precnb.schema.dtype_changes`.
    """
    return _rebase(ds, dtype_changes(ds), "dtype", coord)


def _merged_layout_facts(parts: list[xr.Dataset], labels: list[str], shapes: np.ndarray,  # noqa: C901
                         construct: dict[str, Any]) -> dict[str, str]:
    """The attributes parallel runs are read with, joined as a whole load writes them.

    (:mod:`precnb.analysis.undefined`, :mod:`precnb.analysis.layout.rank_args`, :mod:`precnb.analysis.layout.pp`.)
    """
    out: dict[str, str] = {}
    und: dict[str, tuple[str, set[tuple[int, int]]]] = {}
    for ds in parts:
        for label, (why, pairs) in undefined_table(ds).items():
            und.setdefault(label, (why, set()))[1].update(pairs)
    if und:
        out["undefined"] = encode_undefined(und)
    sigs: dict[str, dict[str, Any]] = {}
    for ds in parts:
        for node, by_step in _json_attr(ds, "scalar_signatures", {}).items():
            sigs.setdefault(node, {}).update(by_step)
    if sigs:
        out["scalar_signatures"] = json.dumps({n: dict(sorted(v.items(), key=lambda kv: int(kv[0])))
                                               for n, v in sorted(sigs.items())})
    ops: dict[str, dict[str, set[int]]] = {}
    for ds in parts:
        for node, by_op in _json_attr(ds, "reduce_ops", {}).items():
            for op, rs in by_op.items():
                ops.setdefault(node, {}).setdefault(op, set()).update(int(r) for r in rs)
    if ops:
        out["reduce_ops"] = json.dumps({n: {op: sorted(r) for op, r in sorted(v.items())}
                                        for n, v in sorted(ops.items())})
    peers: dict[int, set[int]] = {}
    for ds in parts:
        for r, ps in _json_attr(ds, "p2p_peers", {}).items():
            peers.setdefault(int(r), set()).update(int(p) for p in ps)
    if peers:
        out["p2p_peers"] = json.dumps({str(r): sorted(p) for r, p in sorted(peers.items())})
    final = dict(zip(labels, shapes.tolist(), strict=True))
    shape_ch: dict[str, dict[tuple[int, int], str]] = {}
    for ds in parts:
        for t, where in _rebase(ds, entry_changes(ds, "shape_changes"), "shape", final).items():
            shape_ch.setdefault(t, {}).update(where)
    if shape_ch:
        out["shape_changes"] = encode_entry_changes(shape_ch)
    parents: dict[str, dict[str, str]] = {}
    for ds in parts:  # a call's parent in a file, where it is not the joined table's
        own = side_table(ds, "construct")
        mine = _json_attr(ds, "construct_ranks", {})
        steps = [int(x) for x in ds["step"].values]
        ranks = [int(x) for x in ds["rank"].values]
        nodes = ds["node"].values
        present = np.asarray(ds["present"].values)
        for node, parent in own.items():
            if node.startswith(("Module.", "Cell.")):
                continue
            exc = dict(mine.get(node, {}))
            if parent != construct.get(node, parent):
                cols = np.flatnonzero(nodes == node)
                if len(cols):
                    files = [f"{steps[a]},{ranks[b]}" for a, b in np.argwhere(present[:, :, cols].any(axis=2)).tolist()]
                else:  # a call construct.json names but dump.json does not hold (a low-risk API): every file
                    files = list(_json_attr(ds, "rank_dirs", {}))
                for at in files:
                    exc.setdefault(at, parent)
            exc = {k: v for k, v in exc.items() if v != construct.get(node)}
            if exc:
                parents.setdefault(node, {}).update(exc)
    if parents:
        out["construct_ranks"] = encode_construct_ranks(parents)
    return out


def encode_construct_ranks(table: dict[str, dict[str, str]]) -> str:
    """The ``construct_ranks`` attribute text: node → "step,rank" → parent, both sorted.

    Examples
    --------
    >>> encode_construct_ranks({"b": {"1,0": "M", "0,1": "N"}})
    '{"b": {"0,1": "N", "1,0": "M"}}'
    """
    return json.dumps({n: dict(sorted(by.items(), key=lambda kv: tuple(int(x) for x in kv[0].split(","))))
                       for n, by in sorted(table.items())})
