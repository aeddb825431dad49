"""A pipeline run's optimizer lists in another run's order: each stage's entries named by the parameter they hold.

Each pipeline stage calls its fused optimizer (``Torch._fused_adamw_``) on its own parameters, in its own list
order; stitched into the whole model they are separate calls (``…_fused_adamw_.0`` for stage 0, ``.1`` for stage
1) with no counterpart in an unsharded run, so an optimizer-state fault was seen only one step later, in the
parameters it changed. The optimizer runs after the backward and before any parameter changes, so entry *k* of
its parameter list (``input.0.k``) holds, bit for bit, the statistics of one parameter record of that step: the
parameter identifies the entry in both runs, and every list of the call (gradients, moments, step counts) follows
the parameter list's order. :func:`align_optimizer_lists` renames the stitched run's entries to the other run's
labels when every entry is identified in both, one to one; otherwise nothing is renamed. Where neither run records
parameters (level L1), an entry is identified by its parameter's values at the first step both runs hold (before
any update the two runs hold the same initial weights). Parameters whose
statistics are equal (layernorm weights of ones, zero biases, before their first update) are told apart by the
list's order: a stage's list holds its parameters in the model's order.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np
import xarray as xr

__all__ = ["align_optimizer_lists"]

_ENTRY = re.compile(r"^(?P<node>.+\.(?P<call>\d+)\.forward)\.input\.(?P<list>\d+)\.(?P<entry>\d+)$")
_PARAM = re.compile(r"^(?P<owner>.+?)\.(?:forward|backward)\.\d+\.parameters\.(?P<name>[^.]+)$")
_STATS = ("max", "min", "mean", "norm")


def _entries(ds: xr.Dataset) -> dict[tuple[str, int], dict[int, int]]:
    """(optimizer node, entry) -> {list: column} of the fused optimizer calls' list entries."""
    from precnb.analysis.layout.rank_args import is_optimizer_api

    out: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
    for j, (t, api) in enumerate(zip(ds["tensor"].values.tolist(), ds["api"].values.tolist(), strict=True)):
        m = _ENTRY.match(str(t))
        if m is not None and is_optimizer_api(str(api)):
            out[(m["node"], int(m["entry"]))][int(m["list"])] = j
    return out


def _identities(ds: xr.Dataset, entries: dict[tuple[str, int], dict[int, int]]) -> dict[tuple[str, int], str]:
    """(optimizer node, entry) -> the parameter its parameter-list entry holds (``owner/name``), where one does."""
    params: list[tuple[int, str]] = []
    for j, t in enumerate(ds["tensor"].values.tolist()):
        if ds["role"].values[j] == "parameter":
            m = _PARAM.match(str(t))
            if m is not None:
                params.append((j, f"{m['owner']}/{m['name']}"))
    if not params:
        return {}
    # the statistics and the element count (zero biases of different sizes are told apart)
    cols = [np.asarray(ds[s].values, np.float64) for s in _STATS]
    if "numel" in ds.data_vars:
        cols.append(np.asarray(ds["numel"].values, np.float64))
    stats = np.stack(cols, axis=-1)  # (step, rank, tensor, 4 or 5)
    present = np.asarray(ds["present"].values, bool)
    pcols = np.array([j for j, _ in params])
    pnames = [n for _, n in params]
    out: dict[tuple[str, int], str] = {}
    tied: dict[frozenset[str], list[tuple[str, int]]] = defaultdict(list)
    for key, lists in entries.items():
        if 0 not in lists:
            continue
        j = lists[0]
        cands: set[str] | None = None
        for si, ri in np.argwhere(present[:, :, j]):
            if not np.isfinite(stats[si, ri, j]).all():
                continue
            same = present[si, ri, pcols] & (stats[si, ri, pcols] == stats[si, ri, j]).all(axis=-1)
            here = {pnames[i] for i in np.flatnonzero(same)}
            cands = here if cands is None else cands & here
            if not cands:
                break
        if cands is not None and len(cands) == 1:
            out[key] = cands.pop()
        elif cands:
            tied[frozenset(cands)].append(key)
    # parameters with equal statistics (layernorm weights of ones, zero biases before the first update): as many
    # entries as parameters, the list in the model's order (a stage's list is its parameters in module order)
    first: dict[str, int] = {}
    for i, n in enumerate(pnames):
        first.setdefault(n, i)
    for group, keys in tied.items():
        if len(keys) == len(group):
            for key, name in zip(sorted(keys), sorted(group, key=first.__getitem__), strict=True):
                out[key] = name
    return out


def _raw_identities(raw: xr.Dataset, ds: xr.Dataset, entries: dict[tuple[str, int], dict[int, int]]
                    ) -> dict[tuple[str, int], str]:
    """The identities of *ds*'s (a stitched, merged run's) entries, read on each rank of *raw* (the run as dumped).

    On a rank as dumped, entry *k* of its optimizer's parameter list and its parameter record are the same shard:
    statistics and element count equal, ties (zeros before the first update) in the rank's own order. The rank's
    local names become the whole model's through the stitch (``attrs["stitch_sources"]``); the TP ranks of a
    stage must agree.
    """
    import json

    try:
        sources = json.loads(ds.attrs.get("stitch_sources") or "{}")
    except (TypeError, ValueError):
        return {}
    glob = {(int(r), str(old)): str(new) for new, by in sources.items() for r, old in by.items()}
    if not glob:
        return {}
    out: dict[tuple[str, int], str] = {}
    bad: set[tuple[str, int]] = set()
    lists = _entries(raw)  # the labels are the run's, on every rank: found once
    for ri, r in enumerate(int(x) for x in raw["rank"].values):
        own = _identities(raw.isel(rank=[ri]), lists)
        for (node, k), ident in own.items():
            owner, _, name = ident.rpartition("/")
            call = glob.get((r, node))
            holder = next((glob[(r, n)] for n in (f"{owner}.forward.0", f"{owner}.backward.0") if (r, n) in glob),
                          None)
            if call is None or holder is None:
                continue
            key, ident = (call, k), f"{holder.rpartition('.forward.')[0] or holder}/{name}"
            if out.get(key, ident) != ident:
                bad.add(key)
            out[key] = ident
    for key in bad:
        out.pop(key, None)
    return {key: v for key, v in out.items() if key in entries}


def _by_parameter(ds: xr.Dataset, ref: xr.Dataset, mine: dict[tuple[str, int], dict[int, int]],
                  theirs: dict[tuple[str, int], dict[int, int]], raw: xr.Dataset | None
                  ) -> dict[tuple[str, int], tuple[str, int]] | None:
    """Each entry of *ds* -> *ref*'s entry for the same parameter, one to one for every entry of both, or None."""
    ref_params = (ref["role"].values == "parameter").any()
    if not ref_params and not (ds["role"].values == "parameter").any():  # level L1 on both sides
        return _by_first_values(ds, ref, mine, theirs)
    ids = _raw_identities(raw, ds, mine) if raw is not None else _identities(ds, mine)
    ref_ids = _identities(ref, theirs)
    if len(ids) != len(mine) or len(ref_ids) != len(theirs):
        return None
    by_param = {p: key for key, p in ref_ids.items()}
    if len(by_param) != len(ref_ids) or len(set(ids.values())) != len(ids) or set(ids.values()) != set(by_param):
        return None
    return {key: by_param[ids[key]] for key in mine}


def _by_first_values(ds: xr.Dataset, ref: xr.Dataset, mine: dict[tuple[str, int], dict[int, int]],
                     theirs: dict[tuple[str, int], dict[int, int]], rtol: float = 1e-4
                     ) -> dict[tuple[str, int], tuple[str, int]] | None:
    """Entries paired by their parameter's values at the steps both runs hold (no parameter records: level L1).

    Before the first update both runs hold the initial weights, and one update later they still agree to rounding:
    a parameter-list entry's statistics and element count name the parameter in the other run too (a merged
    shard's statistics are the whole tensor's to rounding). The distance of two entries at a step is their
    largest statistic difference in units of *rtol* times the entry's magnitude (its norm for the norm; the
    element count must be equal, or a multiple for a parameter still all zeros, which a merge may have taken as
    replicas: distance 1/2), capped at 2; summed over the steps, the entries are paired nearest first, one
    to one, entries equally near (layernorm weights of ones, zero biases) in the lists' order (the model's).
    Every pair must be close (distance at most 1) at one step at least, else nothing is paired.
    """
    steps = sorted({int(x) for x in ds["step"].values} & {int(x) for x in ref["step"].values})
    keys_a, keys_b = sorted(mine), sorted(theirs)
    if not steps or len(keys_a) != len(keys_b):
        return None
    cost = np.zeros((len(keys_a), len(keys_b)))
    close = np.zeros(cost.shape, bool)
    for step in steps:
        a, b = _list_values(ds, mine, keys_a, step), _list_values(ref, theirs, keys_b, step)
        d = np.stack([_distance(b, a[i], rtol) for i in range(len(keys_a))])
        cost += np.minimum(d, 2.0)
        close |= d <= 1.0
    n = len(keys_a)
    order = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]) / (n * n + 1.0)  # ties: the lists' order
    flat = np.argsort((cost + order).ravel(), kind="stable")
    out: dict[tuple[str, int], tuple[str, int]] = {}
    used_a: set[int] = set()
    used_b: set[int] = set()
    for f in flat.tolist():
        i, c = divmod(f, n)
        if i in used_a or c in used_b or not close[i, c]:
            continue
        out[keys_a[i]] = keys_b[c]
        used_a.add(i)
        used_b.add(c)
    return out if len(out) == n else None


def _distance(b: np.ndarray, a: np.ndarray, rtol: float) -> np.ndarray:
    """Per row of *b* (max, min, mean, norm, numel): its distance to *a* (see :func:`_by_first_values`)."""
    scale = np.fmax(np.fmax(np.abs(b[:, 0]), np.abs(b[:, 1])), 1e-30)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.max(np.abs(b[:, :3] - a[:3]) / (rtol * scale[:, None]), axis=1)
        d = np.fmax(d, np.abs(b[:, 3] - a[3]) / (rtol * np.fmax(np.abs(b[:, 3]), 1e-30)))
    # a parameter still all zeros (a bias before its first update) merged as replicas holds one shard's count
    zeros = (b[:, :4] == 0).all(axis=1) & bool((a[:4] == 0).all()) & (a[4] > 0) & (np.mod(b[:, 4], max(a[4], 1)) == 0)
    ok = ((b[:, 4] == a[4]) | zeros) & np.isfinite(b).all(axis=1) & bool(np.isfinite(a).all())
    d = np.where(b[:, 4] == a[4], d, 0.5)  # an exact count first
    return np.where(ok & np.isfinite(d), d, np.inf)


def _list_values(d: xr.Dataset, entries: dict[tuple[str, int], dict[int, int]], keys: list[tuple[str, int]],
                 step: int) -> np.ndarray:
    """(entry, statistic + element count) of each parameter-list entry at *step* on its first rank (NaN: absent)."""
    si = [int(x) for x in d["step"].values].index(step)
    cols = [np.asarray(d[v].values[si], np.float64) for v in (*_STATS, "numel")]
    present = np.asarray(d["present"].values[si], bool)
    out = np.full((len(keys), len(cols)), np.nan)
    for i, key in enumerate(keys):
        j = entries[key].get(0)
        if j is not None and present[:, j].any():
            r = int(np.flatnonzero(present[:, j])[0])
            out[i] = [c[r, j] for c in cols]
    return out


def align_optimizer_lists(ds: xr.Dataset, ref: xr.Dataset, raw: xr.Dataset | None = None
                          ) -> tuple[xr.Dataset, int]:
    """*ds* with its fused optimizer list entries renamed to *ref*'s labels for the same parameters.

    *raw*: *ds* as dumped, before its stages were stitched and its shards merged (the entries are identified on
    each rank, where a list entry and its parameter record are the same shard). Returns ``(dataset, entries
    renamed)``; *ds* unchanged (0) unless every optimizer entry of *ds* and of *ref*
    is identified by its parameter (unique statistics among the parameter records, at every step and rank that
    has it), one to one, and some label changes. Renamed tensors lose a pipeline stitch's stage-local mark.

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> align_optimizer_lists(empty_dataset(), empty_dataset())[1]
    0
    """
    mine, theirs = _entries(ds), _entries(ref)
    if not mine or not theirs:
        return ds, 0
    pairs = _by_parameter(ds, ref, mine, theirs, raw)
    if pairs is None:
        return ds, 0
    labels = [str(t) for t in ds["tensor"].values]
    nodes = ds["node"].values.copy()
    moved: dict[int, int] = {}  # column in ds -> column in ref
    for key, lists in mine.items():
        target = theirs[pairs[key]]
        if set(lists) != set(target):
            return ds, 0
        for lst, j in lists.items():
            moved[j] = target[lst]
    ref_labels = ref["tensor"].values
    new = list(labels)
    for j, k in moved.items():
        new[j] = str(ref_labels[k])
        nodes[j] = ref["node"].values[k]
    if len(set(new)) != len(new) or new == labels:
        return ds, 0
    cols = np.array(sorted(moved))
    src = np.array([moved[j] for j in cols])
    coords: dict[str, Any] = {"tensor": np.array(new, dtype=object), "node": ("tensor", nodes)}
    for name in ("call", "shape"):
        if name in ds.coords and name in ref.coords and ds[name].dims == ("tensor",):
            vals = ds[name].values.copy()
            vals[cols] = ref[name].values[src]
            coords[name] = ("tensor", vals)
    for name in ("shard_kind_pp", "shard_reason_pp"):
        if name in ds.coords:
            vals = ds[name].values.copy()
            vals[cols] = ""
            coords[name] = ("tensor", vals)
    out = ds.assign_coords(coords)
    out.attrs["optimizer_lists_renamed"] = "by the parameter each entry holds"  # read by the aligner
    return out, len(moved)
