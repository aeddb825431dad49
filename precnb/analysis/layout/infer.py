"""A run's parallel layout read from its dumps, and a given layout checked against them.

What the records show (msprobe dumps of Megatron-style training):

* **pipeline**: the ranks a rank exchanges activations with by point-to-point calls (the P2P ops'
  ``peer`` of ``Distributed.batch_isend_irecv`` / ``send`` / ``recv``: ``attrs["p2p_peers"]``) form
  its pipeline; the stage that holds the embedding is the first;
* **virtual pipeline**: model-chunk prefixes ``Module.<chunk>.`` (more than one chunk on a rank);
* **tensor parallelism**: a collective's recorded group (``attrs["comm_groups"]``) whose ranks hold
  *different* values of the same parameters (shards; data-parallel replicas hold the same ones).

Megatron's rank order ``tp-cp-ep-dp-pp`` is assumed (consecutive ranks form a TP group, the stage varies
slowest); a recorded group that does not fit it is reported. :func:`infer_layout` returns the layout and the
evidence, :func:`check_layout` the ways a given layout disagrees with the dumps.

Examples
--------
>>> from precnb.schema import empty_dataset
>>> infer_layout(empty_dataset()).layout is None
True
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.layout import Layout, LayoutError

__all__ = ["Inferred", "check_layout", "infer_layout"]

_CHUNK = re.compile(r"^(?:Module|Cell)\.(\d+)\.")


@dataclass
class Inferred:
    """What the dumps say about a run's layout.

    Attributes
    ----------
    layout : Layout or None
        None when the run has no rank (or the evidence does not make a layout).
    evidence : list of str
        One sentence per fact used.
    pipelines : list of list of int
        Ranks connected by point-to-point calls, first stage first.
    tp_groups : list of list of int
        Recorded groups whose ranks hold different shards of the same parameters.
    dp_groups : list of list of int
        Recorded groups whose ranks hold the same parameters.
    chunks : int
        Model chunks per rank (virtual pipeline stages).
    """

    layout: Layout | None
    evidence: list[str] = field(default_factory=list)
    pipelines: list[list[int]] = field(default_factory=list)
    tp_groups: list[list[int]] = field(default_factory=list)
    dp_groups: list[list[int]] = field(default_factory=list)
    chunks: int = 1


def _json(ds: xr.Dataset, key: str, default: Any) -> Any:
    try:
        return json.loads(ds.attrs.get(key) or "null") or default
    except (TypeError, ValueError):
        return default


def _pipelines(ds: xr.Dataset, ranks: list[int]) -> list[list[int]]:
    """Connected components of the P2P graph (ranks without P2P calls stand alone)."""
    peers = {int(r): {int(p) for p in ps} for r, ps in _json(ds, "p2p_peers", {}).items()}
    seen: set[int] = set()
    comps = []
    for r in ranks:
        if r in seen:
            continue
        comp, todo = [], [r]
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen.add(x)
            comp.append(x)
            todo += [p for p in peers.get(x, set()) | {q for q, ps in peers.items() if x in ps} if p not in seen]
        comps.append(sorted(comp))
    return comps


def _chunks(ds: xr.Dataset) -> int:
    found = {int(m.group(1)) for n in set(ds["node"].values.tolist()) if (m := _CHUNK.match(str(n)))}
    return max(found) + 1 if len(found) > 1 else 1


_EXPERT_IN = re.compile(r"(?<![A-Za-z0-9_])experts\.(?:local_experts\.)?(\d+)(?=\.)")
_ROUTER = re.compile(r"(?<![A-Za-z0-9_])router\.[A-Za-z0-9_]*Router\.forward\.\d+\.parameters\.weight$")


def _is_expert(labels: np.ndarray) -> np.ndarray:
    """Which labels belong to an MoE expert (``experts.local_experts.N`` / ``experts.N`` in the path)."""
    return np.fromiter((bool(_EXPERT_IN.search(str(t))) for t in labels), bool, len(labels))


def _expert_parallel(ds: xr.Dataset, tp: int, pp: int) -> tuple[int, str]:
    """(ep, evidence): the experts' count (rows of a router's weight) over the local experts a rank holds.

    Megatron numbers experts locally on every expert-parallel rank (``local_experts.0 …``); the router scores
    every expert, so its weight has one row per global expert.
    """
    labels = ds["tensor"].values
    shapes = ds["shape"].values
    total = 0
    for j, t in enumerate(labels.tolist()):
        if _ROUTER.search(str(t)):
            try:
                total = max(total, int(json.loads(str(shapes[j]))[0]))
            except (ValueError, TypeError, IndexError, json.JSONDecodeError):
                continue
    if total < 2:
        return 1, ""
    pres: np.ndarray = np.asarray(ds["present"].values.any(axis=0), bool)  # (rank, tensor)
    local = 0
    for i in range(pres.shape[0]):
        idx = {int(m.group(1)) for t in labels[pres[i]].tolist() if (m := _EXPERT_IN.search(str(t)))}
        local = max(local, len(idx))
    if not local or total % local or total == local:
        return 1, ""
    ep = total // local
    world = ds.sizes["rank"]
    if world % (ep * pp):
        return 1, ""
    fold = "" if world % (tp * ep * pp) == 0 else f", folded onto TP (etp=1: tp×ep×pp = {tp * ep * pp} > world {world})"
    return ep, (f"routers score {total} experts and each rank holds {local} (local_experts.0 … {local - 1}): "
                f"expert parallelism ep={ep}{fold}")


def _param_groups(ds: xr.Dataset, groups: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """Split recorded groups into (shard groups, replica groups) by their members' parameter statistics.

    Expert parameters say nothing here: expert-parallel ranks hold different experts under the same local names.
    """
    if ds.sizes.get("step", 0) == 0:
        return [], []
    params = np.flatnonzero((ds["role"].values == "parameter") & ~_is_expert(ds["tensor"].values))
    if not len(params):  # no parameter records (level L1): the parameters the fused optimizer updates
        params = _optimizer_params(ds)
    ranks = [int(r) for r in ds["rank"].values]
    pres = ds["present"].values
    stats = {s: ds[s].values for s in ("max", "min", "mean", "norm")}
    shards: list[list[int]] = []
    replicas: list[list[int]] = []
    for g in groups:
        idx = np.asarray([ranks.index(r) for r in g if r in ranks], np.int64)
        if len(idx) < 2 or len(idx) != len(g):
            continue
        si = next((i for i in range(ds.sizes["step"]) if pres[i][np.ix_(idx, params)].all(axis=0).any()), None)
        if si is None:
            continue
        cols = params[pres[si][np.ix_(idx, params)].all(axis=0)]
        differ = False
        for v in stats.values():
            a = v[si][np.ix_(idx, cols)]
            with np.errstate(invalid="ignore"):
                differ |= bool(np.any(~((a == a[:1]) | (np.isnan(a) & np.isnan(a[:1])))))
        (shards if differ else replicas).append(sorted(g))
    return shards, replicas


def _optimizer_params(ds: xr.Dataset) -> np.ndarray:
    """Columns of the parameter list a fused optimizer call reads (its first argument), e.g. at level L1.

    >>> from precnb.schema import empty_dataset
    >>> _optimizer_params(empty_dataset()).tolist()
    []
    """
    from precnb.analysis.layout.rank_args import is_optimizer_api

    nodes, labels = ds["node"].values, ds["tensor"].values
    return np.flatnonzero(np.fromiter(
        (is_optimizer_api(str(n)) and str(lbl).startswith(f"{n}.input.0.") for n, lbl in zip(nodes, labels,
                                                                                              strict=True)),
        bool, len(labels)))


def _holds(ds: xr.Dataset, ranks: list[int], word: str) -> list[int]:
    """Ranks that recorded a module whose path has *word* (``embedding``, ``output_layer``)."""
    mods = ds["module"].values
    kinds = ds["kind"].values
    cols = np.flatnonzero((kinds == "module") & np.fromiter((word in str(m) for m in mods), bool, len(mods)))
    if not len(cols):
        return []
    pres = np.asarray(ds["present"].values[:, :, cols].any(axis=(0, 2)), bool)
    return [r for r, ok in zip(ranks, pres.tolist(), strict=True) if ok]


def infer_layout(ds: xr.Dataset) -> Inferred:
    """The layout a run's dumps show (see the module docstring), with the evidence."""
    ranks = [int(r) for r in ds["rank"].values]
    world = len(ranks)
    if not world:
        return Inferred(None)
    if world == 1:
        return Inferred(Layout(1), ["one rank"])
    ev: list[str] = []
    pipes = _pipelines(ds, ranks)
    sizes = {len(p) for p in pipes}
    pp = sizes.pop() if len(sizes) == 1 else 1
    if pp > 1:
        firsts = set(_holds(ds, ranks, "embedding"))
        pipes = [sorted(p, key=lambda r: (r not in firsts, r)) for p in pipes]
        ev.append(f"ranks {pipes[0]} exchange activations by point-to-point calls: pipelines of {pp} stages "
                  f"({len(pipes)} of them)")
    chunks = _chunks(ds)
    if chunks > 1:
        ev.append(f"{chunks} model chunks per rank (Module.0. … Module.{chunks - 1}.): virtual pipeline vpp={chunks}")
    recorded = [sorted(int(x) for x in g["ranks"]) if isinstance(g, dict) else sorted(int(x) for x in g)
                for g in _json(ds, "comm_groups", [])]
    recorded = [g for g in {tuple(g): g for g in recorded if 1 < len(g) <= world}.values()]
    shards, reps = _param_groups(ds, recorded)
    tp = 1
    if shards:
        tp = min(len(g) for g in shards)
        ev.append(f"ranks {shards[0]} hold different values of the same parameters and run collectives "
                  f"together: tensor parallelism tp={tp}")
    if reps:
        ev.append(f"ranks {reps[0]} hold the same parameters and reduce together: data-parallel replicas")
    if not recorded and world > pp:  # no group recorded (collectives on the default group): the stages' ranks
        stage_groups = [list(g) for g in zip(*pipes, strict=False)] if pp > 1 else [ranks]
        shards, reps = _param_groups(ds, [g for g in stage_groups if len(g) > 1])
        if shards and not reps:
            tp = len(shards[0])
            ev.append(f"ranks {shards[0]} hold different values of the same parameters (no collective records its "
                      f"group): tensor parallelism tp={tp}")
        elif reps and not shards:
            ev.append(f"ranks {reps[0]} hold the same parameters: data-parallel replicas")
    if not ev:
        return Inferred(None, ["nothing in the dumps shows how the ranks share the model"], pipes, shards, reps,
                        chunks)
    ep, why = _expert_parallel(ds, tp, pp)
    if ep > 1:
        ev.append(why)
    try:
        lay = Layout(world, tp=tp, pp=pp, vpp=chunks, ep=ep)
    except LayoutError as exc:
        ev.append(f"no Megatron layout fits: {exc}")
        return Inferred(None, ev, pipes, shards, reps, chunks)
    return Inferred(lay, ev, pipes, shards, reps, chunks)


def check_layout(ds: xr.Dataset, layout: Layout) -> list[str]:
    """The ways *layout* disagrees with what the dumps show (empty: consistent, or nothing to check).

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> check_layout(empty_dataset(), Layout(1))
    []
    """
    got = infer_layout(ds)
    if got.layout is None:
        return []
    problems = []
    has_p2p = bool(_json(ds, "p2p_peers", {}))
    if has_p2p:
        want = sorted(sorted(g) for g in layout.groups("pp"))
        have = sorted(sorted(p) for p in got.pipelines)
        if want != have:
            problems.append(f"layout pp={layout.pp} makes pipelines {want[:4]}, but the dumps' point-to-point calls "
                            f"connect ranks {have[:4]}")
    elif layout.pp > 1 and len(got.tp_groups) + len(got.dp_groups) > 0:
        problems.append(f"layout pp={layout.pp}, but no rank makes a point-to-point call (no pipeline stages)")
    if got.chunks != layout.vpp and (got.chunks > 1 or layout.vpp > 1):
        problems.append(f"layout vpp={layout.vpp}, but the dumps hold {got.chunks} model chunk(s) per rank "
                        f"(Module.<chunk>. prefixes)")
    tp_groups = {tuple(g) for g in layout.groups("tp")}
    for g in got.tp_groups:
        if tuple(g) not in tp_groups and not (layout.cp > 1 or layout.ep > 1):
            problems.append(f"ranks {g} hold different shards of the same parameters (a TP group), but layout "
                            f"tp={layout.tp} groups them {sorted(tp_groups)[:4]}")
            break
    # ranks holding the same parameters in one declared TP group: a contradiction when the run shards its
    # parameters elsewhere (a run that shards nothing cannot show its TP groups: a small replicated model)
    for g in got.dp_groups if got.tp_groups else []:
        if layout.tp > 1 and any(set(g) <= set(t) for t in tp_groups):
            problems.append(f"layout tp={layout.tp} puts ranks {g} in one TP group, but they hold the same "
                            "parameters (data-parallel replicas)")
            break
    return problems
