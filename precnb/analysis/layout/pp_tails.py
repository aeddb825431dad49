"""Pipeline stages' step tails merged: what every stage runs after its last module call, as one run makes it once.

After the backward pass each pipeline stage finishes its own step over its own layers: Megatron's
``finalize_model_grads`` all-reduces the stage's sequence-parallel gradients (one flat buffer), the routers'
token counts per expert (a tensor stacked over the stage's MoE layers) and updates the expert biases from them.
A run without pipeline parallelism makes each of these calls once over every layer: one buffer of all the
sequence-parallel gradients, one ``[layers, experts]`` stack. Stitched stage by stage
(:func:`precnb.analysis.layout.pp.relabel_pipeline`), the stages' calls stand one after the other under
their own labels, and a single-stage run's one call has two half-size namesakes, one of them the wrong op.

:func:`merge_stage_tails` makes the stages' tails one tail, when every stage ran the same ops in the same
order there: the k-th call of each stage becomes one call whose tensors are the stages' tensors concatenated
(statistics combined exactly: Max of the Maxes, Min of the Mins, the element-weighted Mean, the root of the
summed squared norms; shape stacked on the first dimension when the others agree, else flat). The optimizer's
calls are left alone (:func:`precnb.analysis.layout.pp_tree._stage_local_optimizer` names those). Used by
the shard merge, which compares with runs of another layout; a check between replicas of one layout keeps
each stage's own records (it names the rank that departs).
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import xarray as xr

from precnb.analysis.layout import Layout
from precnb.analysis.layout.pp_l1 import _is_p2p
from precnb.naming import parse_node

__all__ = ["merge_stage_tails"]

#: the variables a merge combines; a dataset with others (checksums, monitor counts) is left as it is
_MERGEABLE = frozenset({"max", "min", "mean", "norm", "present", "null_stats", "seq", "numel", "source_rank",
                        # per-entry facts of the op, the same on each stage's call: the first stage's are kept
                        "undefined", "scalar_sig", "reduce_op"})


def _kinds(raw: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Per tensor of the dump: an API call's record, and a forward API call's that may end a step (not P2P)."""
    parsed = [parse_node(str(n)) for n in raw["node"].values]
    is_api = np.array([p.kind == "api" for p in parsed], bool)
    # a stage's last P2P hand-over (its input gradient to the stage before) is not part of its step's end
    tail_ok = np.array([p.kind == "api" and p.direction == "forward" and not _is_p2p(p) for p in parsed], bool)
    return is_api, tail_ok


def _raw_tails(raw: xr.Dataset, si: int, is_api: np.ndarray, tail_ok: np.ndarray) -> dict[int, dict[str, int]]:
    """Dump rank -> its API calls (forward records) after its last module record at step index *si*, -> seq."""
    nodes, present, seq = raw["node"].values, raw["present"].values[si], raw["seq"].values[si]
    out: dict[int, dict[str, int]] = {}
    for ri, r in enumerate(raw["rank"].values.tolist()):
        pres = present[ri]
        mods = pres & ~is_api
        if not mods.any():
            continue
        last = int(seq[ri][mods].max())
        here: dict[str, int] = {}
        for j in np.flatnonzero(pres & tail_ok & (seq[ri] > last)).tolist():
            n = str(nodes[j])
            here[n] = min(here.get(n, 1 << 40), int(seq[ri, j]))
        out[int(r)] = here
    return out


def _tails(ds: xr.Dataset, si: int, ri: int, raw_tails: dict[int, dict[str, int]],
           back: dict[tuple[int, str], str], layout: Layout) -> dict[int, list[str]]:
    """Stage -> the stitched names of its step tail on stitched rank *ri*, in its execution order."""
    src = ds["source_rank"].values[si, ri] if "source_rank" in ds else None
    pres = ds["present"].values[si, ri]
    if src is None:
        return {}
    members = {int(r) for r in np.unique(src[pres]).tolist() if int(r) >= 0}
    out: dict[int, list[str]] = defaultdict(list)
    for r in sorted(members, key=lambda r: layout.coords(r)["pp"]):
        tail = raw_tails.get(r, {})
        for _q, old in sorted((q, n) for n, q in tail.items()):
            new = back.get((r, old))
            if new is not None:
                out[layout.coords(r)["pp"]].append(new)
    return out


def _shape(shapes: list[list[int]]) -> list[int]:
    """The shape of tensors stacked on their first dimension (flat when the other dimensions differ).

    >>> _shape([[1, 4], [1, 4]]), _shape([[96], [112]]), _shape([[2, 3], [4]])
    ([2, 4], [208], [10])
    """
    if all(s and s[1:] == shapes[0][1:] for s in shapes):
        return [sum(s[0] for s in shapes), *shapes[0][1:]]
    return [int(sum(int(np.prod(s)) for s in shapes))]


def _combine(v: dict[str, np.ndarray], cols: list[int]) -> dict[str, float]:
    """One entry's statistics from the entries *cols* (one (step, rank)) holding parts of one tensor."""
    n = np.array([max(int(v["numel"][j]), 0) for j in cols], float)
    mean = np.array([v["mean"][j] for j in cols])
    norm = np.array([v["norm"][j] for j in cols])
    return {"max": float(np.max([v["max"][j] for j in cols])), "min": float(np.min([v["min"][j] for j in cols])),
            "mean": float(np.sum(mean * n) / n.sum()) if n.sum() > 0 else float("nan"),
            "norm": float(np.sqrt(np.sum(norm * norm))), "numel": float(n.sum())}


def merge_stage_tails(ds: xr.Dataset, raw: xr.Dataset, layout: Layout) -> xr.Dataset:
    """Merge the stitched stages' step tails into one tail (see the module docstring).

    Parameters
    ----------
    ds : xarray.Dataset
        A run stitched by :func:`precnb.analysis.layout.pp.relabel_pipeline` (``attrs["stitch_sources"]``,
        ``source_rank``).
    raw : xarray.Dataset
        The run as dumped, before stitching (each rank's own execution order).
    layout : Layout
        The layout it was stitched from (pp > 1).

    Returns
    -------
    xarray.Dataset
        *ds* itself when there is nothing to merge; else a copy whose later stages' tail entries are absent
        and whose first stage's tail entries hold every stage's part.

    Examples
    --------
    >>> from precnb.analysis.layout import Layout
    >>> import xarray as xr
    >>> ds = xr.Dataset()
    >>> merge_stage_tails(ds, ds, Layout(1)) is ds  # one stage: nothing to merge
    True
    """
    if layout.pp <= 1 or not set(v for v in ds.data_vars if "tensor" in ds[v].dims) <= _MERGEABLE:
        return ds
    try:
        sources = json.loads(ds.attrs.get("stitch_sources") or "{}")
        by_step = json.loads(ds.attrs.get("stitch_step_sources") or "{}")
    except (TypeError, ValueError):
        return ds
    back = {(int(r), str(old)): str(new) for new, by in sources.items() for r, old in by.items()}
    labels, nodes = ds["tensor"].values, ds["node"].values
    col_of: dict[str, list[int]] = defaultdict(list)
    for j, n in enumerate(nodes.tolist()):
        col_of[str(n)].append(j)
    opt = {str(n) for n, m in zip(nodes, ds["module"].values, strict=True) if str(m) == "optimizer"}
    suffix = {j: str(labels[j])[len(str(nodes[j])):] for j in range(len(labels))}
    values = {k: ds[k].values.copy() for k in ("max", "min", "mean", "norm", "present", "null_stats", "numel",
                                                 "source_rank") if k in ds}
    shape0 = ds["shape"].values
    shapes = shape0.copy()
    raw_steps = [int(x) for x in raw["step"].values]
    is_api, tail_ok = _kinds(raw)  # once, not per step
    changed = False
    for si in range(ds.sizes["step"]):
        step = int(ds["step"].values[si])
        if step not in raw_steps:
            continue
        raw_tails = _raw_tails(raw, raw_steps.index(step), is_api, tail_ok)
        here = dict(back)  # the stitch numbers each step on its own: this step's names where they differ
        here.update({(int(r), old): new for new, by in by_step.get(str(step), {}).items() for r, old in by.items()})
        for ri in range(ds.sizes["rank"]):
            tails = _tails(ds, si, ri, raw_tails, here, layout)
            stages = sorted(tails)
            calls = [[n for n in tails[p] if n not in opt] for p in stages]
            if len(stages) < 2 or not calls[0] or any(
                    [parse_node(n).api for n in c] != [parse_node(n).api for n in calls[0]] for c in calls):
                continue
            at = {k: v[si, ri] for k, v in values.items()}
            for group in zip(*calls, strict=True):
                parts = [{suffix[j]: j for j in col_of[n] if at["present"][j]} for n in group]
                for suf, keep in parts[0].items():
                    cols = [p.get(suf) for p in parts]
                    if any(c is None for c in cols):
                        continue
                    got = _combine(at, [int(c) for c in cols if c is not None])
                    for k in ("max", "min", "mean", "norm", "numel"):
                        at[k][keep] = got[k]
                    at["null_stats"][keep] = np.bitwise_or.reduce([at["null_stats"][c] for c in cols])
                    try:
                        parts_shape = [json.loads(str(shape0[c])) for c in cols if c is not None]
                        shapes[keep] = json.dumps(_shape(parts_shape))
                    except (TypeError, ValueError):
                        pass
                    for c in cols[1:]:
                        at["present"][c] = False
                        for k in ("max", "min", "mean", "norm"):
                            at[k][c] = np.nan
                        at["numel"][c] = -1
                        at["null_stats"][c] = 0
                        at["source_rank"][c] = -1
                    changed = True
    if not changed:
        return ds
    out = ds.copy()
    for k, v in values.items():
        out[k] = (ds[k].dims, v)
    out["seq"] = (ds["seq"].dims, np.where(values["present"], ds["seq"].values, -1).astype(ds["seq"].dtype))
    return out.assign_coords(shape=("tensor", shapes))
