"""Replica consistency: tensors that must be identical across replicas, and ranks that are not.

Across a data-parallel group, parameters (``role == "parameter"``; monitor families
``param_origin``, ``param_updated``, ``grad_reduced``, ``exp_avg``, ``exp_avg_sq``) must agree.
Across a tensor-parallel group two rules say what must be replicated:

* **cause**: an op whose tensor inputs are identical on every rank of the group must produce
  identical outputs (the ops are the same on every rank). A random op on the replicated
  residual stream whose seed is not synchronised, a non-deterministic kernel or a wrong rank
  argument breaks this at the op itself, at the first step;
* **history**: tensors replicated (and not all zero) at most of the steps recorded on the group.

The check walks steps, then execution order, and reports the first tensor that departs from its
group, with the ranks; a rank that departs from the majority is a *silent divergence* there.

The replica family:

* this module — :func:`check_replicas` and :func:`replica_mismatches` (every record that departs);
* :mod:`~precnb.analysis.replicas.departures` — those departures as classified events (issue #28), with
  :mod:`~precnb.analysis.replicas.departure_inputs` (random ops, scalar arguments, CRC-only departures)
  and :mod:`~precnb.analysis.replicas.departure_plan` (the md5 dump that confirms one);
* :mod:`~precnb.analysis.replicas.devices` — departures followed to hosts and devices across jobs;
* tensor-parallel glue (ops whose rank-dependent constants make their outputs differ by design, set aside by
  the replica check, the merge, the comparison and the aligner) is :mod:`precnb.analysis.layout.rank_args`,
  below every one of them (``precnb.analysis.replicas.rank_args`` re-exports it).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis._memo import DatasetMemo
from precnb.analysis.causal.dataflow import scalar_only_nodes
from precnb.analysis.findings import Finding
from precnb.analysis.findings.evidence import entry_values, node_evidence
from precnb.analysis.layout import Layout
from precnb.analysis.replicas.candidates import REPLICATED_MONITOR_FAMILIES, candidates
from precnb.dtypes import dtype_kind
from precnb.schema import STATS, entry_meta

__all__ = ["REPLICATED_MONITOR_FAMILIES", "check_replicas", "replica_mismatches"]



_MEMO = DatasetMemo()


def _same_across(ds: xr.Dataset, idx: list[int], rtol: float, present: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(step, tensor) masks: recorded on all ranks *idx*, and equal on them (every statistic)."""
    pres = present
    allp: np.ndarray = np.all(pres[:, idx, :], axis=1)
    same = np.ones(allp.shape, bool)
    for s in STATS:
        v = ds[s].values[:, idx, :]
        ref = v[:, :1, :]
        scale = np.fmax(np.abs(ref), 1e-30)
        with np.errstate(invalid="ignore"):
            ok = (np.abs(v - ref) <= rtol * scale) | (np.isnan(v) & np.isnan(ref)) | (v == ref)
        same &= ok.all(axis=1)
    return allp, same


_UNDEFINED_CONTENT = ("empty", "empty_like", "empty_strided", "new_empty")


def _caused(ds: xr.Dataset, groups: list[list[int]], ranks: list[int], rtol: float, present: np.ndarray,
            families: list[int]) -> np.ndarray:
    """(family, step, tensor): outputs of API calls whose tensor inputs are identical across every group member.

    A family holds the groups of one pipeline stage: another stage's ops share API labels, not ops.
    An op with no tensor input at all (``torch.normal(0, 1, size)``, ``torch.randn``) qualifies: it
    reads only its scalar arguments and the random state, which the group shares (not ``empty``,
    whose content is whatever the memory held).
    """
    from precnb.naming import is_communication

    nodes = ds["node"].values
    roles = ds["role"].values
    kinds = ds["kind"].values
    apis = ds["api"].values
    scalar_only = scalar_only_nodes(ds)
    by_node: dict[str, tuple[list[int], list[int]]] = {}
    for j, (n, r, k) in enumerate(zip(nodes.tolist(), roles.tolist(), kinds.tolist(), strict=True)):
        if k != "api" or ".backward" in n or is_communication(n):
            continue
        ins, outs = by_node.setdefault(n, ([], []))
        (ins if r == "input" else outs if r == "output" else []).append(j)
    out = np.zeros((max(families, default=0) + 1, ds.sizes["step"], ds.sizes["tensor"]), bool)
    for g, fam in zip(groups, families, strict=True):
        idx = [ranks.index(r) for r in g]
        allp, same = _same_across(ds, idx, rtol, present)
        floats = np.fromiter((dtype_kind(str(d)) == "float" for d in ds["dtype"].values), bool, ds.sizes["tensor"])
        mean_of = ds["mean"].values[:, idx[0], :]  # (step, tensor) on the group's first member
        for node, (ins, outs) in by_node.items():
            if not outs or (not ins and node not in scalar_only):
                continue
            if not ins:  # scalar arguments only: identical on every member unless it reads the rank
                if str(apis[outs[0]]).rsplit(".", 1)[-1] in _UNDEFINED_CONTENT:
                    continue
                ok = np.ones(ds.sizes["step"], bool)
            else:
                ins_f = [j for j in ins if floats[j]]
                if not ins_f:  # integer / boolean inputs only: equal max and min are weak evidence
                    # (precnb.dtypes.weak_identity): proof only with a mean
                    ins_f = ins
                    if np.isnan(mean_of[:, ins]).all():
                        continue
                ok = (allp[:, ins_f] & same[:, ins_f]).all(axis=1)  # (step,) inputs identical everywhere
                rest = [j for j in ins if j not in ins_f]
                if rest:  # an index or count is identical only when it is seen to be: a mean besides max and min
                    ok &= ((same[:, rest] & ~np.isnan(mean_of[:, rest])) | ~allp[:, rest]).all(axis=1)
            for j in outs:
                out[fam, :, j] |= ok & allp[:, j]
    return out


def _no_tensor_input(ds: xr.Dataset, j: int, scalar_only: set[str] | None = None) -> bool:
    """Tensor *j*'s node reads no tensor (:func:`precnb.analysis.causal.dataflow.scalar_only_nodes`).

    *scalar_only*: that set when the caller already has it (it walks every record: once per run,
    not once per mismatch).
    """
    nodes = scalar_only if scalar_only is not None else scalar_only_nodes(ds)
    return str(ds["node"].values[j]) in nodes


def replica_mismatches(ds: xr.Dataset, layout: Layout, *, dims: Sequence[str] = ("dp", "tp"),
                       rtol: float = 1e-6, aside: list[dict[str, Any]] | None = None
                       ) -> tuple[list[dict[str, Any]], int]:
    """Every record that departs from its replica group, in causal order, and the records checked.

    Each row: ``step, rank, group, dim, tensor, node, seq, inputs_identical, why``, sorted by step,
    execution position and rank (what :func:`check_replicas` reports first comes first).

    Entries with no defined value (:mod:`precnb.analysis.undefined`) are not checked, nor the tensors of a
    rank-dependent op (its tensor inputs agree across the group, its scalar arguments do not: a TP rank's
    vocabulary offset, :mod:`precnb.analysis.layout.rank_args`) and what it computes before a collective. What was
    set aside, and why, is appended to *aside*.

    The result is reused while the same *ds* object (unchanged) is checked again with the same
    layout, dims and tolerance (:class:`precnb.analysis._memo.DatasetMemo`: an explorer's rerun
    after another tolerance or a Match / Unmatch, which change neither the target nor its layout).
    """
    def compute() -> tuple[list[dict[str, Any]], int, list[dict[str, Any]]]:
        got: list[dict[str, Any]] = []
        if layout.ep > 1 and layout.vpp == 1:  # experts under global indices (stages stitched), API calls
            from precnb.analysis.replicas.experts import expert_parallel_mismatches

            return expert_parallel_mismatches(ds, layout, dims, rtol, _replica_mismatches)  # numbered across EP
        rows, checked = _replica_mismatches(ds, layout, dims=dims, rtol=rtol, aside=got)
        return rows, checked, got

    rows, checked, got = _MEMO.get([ds], ("replica_mismatches", repr(layout), tuple(dims), float(rtol)), compute,
                                   copy=_copied)
    if aside is not None:
        aside += got
    return rows, checked


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """New row dicts (their list and dict values new too; numbers and strings are shared: immutable)."""
    def one(v: Any) -> Any:
        if isinstance(v, list):
            return [one(x) for x in v]
        if isinstance(v, dict):
            return {k: one(x) for k, x in v.items()}
        return v

    return [one(r) for r in rows]


def _copied(value: tuple[list[dict[str, Any]], int, list[dict[str, Any]]]
            ) -> tuple[list[dict[str, Any]], int, list[dict[str, Any]]]:
    """A copy of a memoised result a caller may change (rows are extended, sorted, annotated)."""
    rows, checked, aside = value
    return _rows(rows), checked, _rows(aside)


def _replica_mismatches(ds: xr.Dataset, layout: Layout, *, dims: Sequence[str] = ("dp", "tp"),
                        rtol: float = 1e-6, aside: list[dict[str, Any]] | None = None
                        ) -> tuple[list[dict[str, Any]], int]:
    """:func:`replica_mismatches`, computed."""
    from precnb.analysis.undefined import set_aside, undefined_mask

    ranks = [int(r) for r in ds["rank"].values]
    rows: list[dict[str, Any]] = []
    checked = 0
    scalar_only: set[str] | None = None
    undefined = undefined_mask(ds)
    present = ds["present"].values & ~undefined
    if aside is not None:
        aside += set_aside(ds, undefined)
    for dim in dims:
        if layout.size(dim) <= 1:
            continue
        groups = layout.groups(dim)
        families = [layout.coords(g[0])["pp"] for g in groups]  # one pipeline stage: the same ops under one label
        if dim != "dp":  # rank-dependent by design: not replicas
            from precnb.analysis.layout.rank_args import glue_aside, rank_dependent

            glue, glue_why = rank_dependent(ds, groups, present)
            if glue.any():
                present = present & ~glue[None, None, :]
                if aside is not None:
                    aside += glue_aside(ds, glue, glue_why)
        cand = candidates(ds, dim, groups, ranks, rtol, present, families)
        mirror: np.ndarray | None = None
        if dim != "dp":  # a copy of a value replicated at that step: a candidate one step shows by itself
            from precnb.analysis.replicas.mirrors import copy_candidates

            mirror = copy_candidates(ds, groups, ranks, present, families, cand)
        caused = _caused(ds, groups, ranks, rtol, present, families) if dim != "dp" else \
            np.zeros(cand.shape, bool)
        cols = np.flatnonzero(cand.any(axis=(0, 1)) | caused.any(axis=(0, 1)))
        if not len(cols):
            continue
        pres = present[:, :, cols]
        vals = np.stack([ds[s].values[:, :, cols] for s in STATS], axis=-1)  # (step, rank, t, 4)
        seq = ds["seq"].values[:, :, cols]
        for g, fam in zip(groups, families, strict=True):
            idx = [ranks.index(r) for r in g]
            by_cause = caused[fam][:, cols] & ~cand[fam][:, cols]  # (step, t): replicated as its inputs are
            v = vals[:, idx]  # (step, n, t, 4)
            p: np.ndarray = np.all(pres[:, idx], axis=1)  # (step, t)
            checked += int(p.sum()) * len(g)
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                med = np.nanmedian(np.where(np.isfinite(v), v, np.nan), axis=1, keepdims=True)
                scale = np.fmax(np.abs(med), 1e-30)
                bad = ~((np.abs(v - med) <= rtol * scale) | (np.isnan(v) & np.isnan(med)))
            bad = bad.any(axis=-1) & p[:, None, :]  # (step, n, t)
            bad &= (cand[fam][:, cols][:, None, :] | caused[fam][:, cols][:, None, :])
            n = len(g)
            # (step, n, t): the member's copy is a value replicated on the whole group (TP/CP groups only)
            copy = mirror[:, idx][:, :, cols] if mirror is not None else np.zeros(bad.shape, bool)
            decided = np.asarray(copy.any(axis=1) & ~copy.all(axis=1), bool)
            bad &= ~(decided[:, None, :] & copy)  # a member holding the replicated value does not depart
            for si, k, tj in np.argwhere(bad):
                if n == 2 and k == 0 and bad[si, 1, tj]:
                    continue  # a pair: report the later rank only
                if by_cause[si, tj] and scalar_only is None:
                    scalar_only = scalar_only_nodes(ds)  # once, and only when a row needs it
                held = [g[m] for m in range(n) if copy[si, m, tj]] if decided[si, tj] else []
                why = _why(dim, list(g), g[k], bool(by_cause[si, tj]),
                           bool(by_cause[si, tj]) and _no_tensor_input(ds, cols[tj], scalar_only), held)
                rows.append({"step": int(ds["step"].values[si]), "rank": g[k], "group": list(g), "dim": dim,
                             "tensor": str(ds["tensor"].values[cols[tj]]),
                             "node": str(ds["node"].values[cols[tj]]),
                             "seq": int(seq[si, idx[k], tj]), "inputs_identical": bool(by_cause[si, tj]),
                             **({"copy_held_by": held} if held else {}), "why": why})
    rows.sort(key=lambda r: (r["step"], r["seq"], r["rank"]))
    return rows, checked


def _why(dim: str, group: list[int], rank: int, inputs_identical: bool, no_tensor_input: bool,
         held: list[int]) -> str:
    """A replica mismatch row's text: whose copies it differs from, and what its inputs or copies say."""
    others = [r for r in group if r != rank]
    if no_tensor_input:
        why = (f"differs from its {dim} replicas {others} although the op has no tensor input (it reads only its "
               f"scalar arguments and the random state): the op computed differently on rank {rank}")
    elif inputs_identical:
        why = (f"differs from its {dim} replicas {others} although the op's inputs are identical on ranks {group}: "
               f"the op computed differently on rank {rank}")
    else:
        why = f"differs from its {dim} replicas {others}"
    if held:
        return why + (f": rank(s) {held} hold a value identical on every rank of the group at this step (the same "
                      f"statistics, bit for bit), rank {rank} does not: rank {rank} departs")
    return why + (" (a pair: either side may be wrong)" if len(group) == 2 else "")


def check_replicas(
    ds: xr.Dataset,
    layout: Layout | None = None,
    *,
    dims: Sequence[str] = ("dp", "tp"),
    rtol: float = 1e-6,
    limit: int = 50,
) -> Finding:
    """Report ranks whose copy of a replicated tensor differs from their group's majority.

    Parameters
    ----------
    ds : xarray.Dataset
        One run.
    layout : Layout, optional
        Defaults to pure data parallelism over all ranks.
    dims : sequence of {"dp", "tp", "cp"}
        Which replica groups to check.
    rtol : float
        Relative tolerance (on each statistic, relative to its magnitude).
    limit : int
        How many mismatches to list as suspects.

    Returns
    -------
    Finding
        Kind ``replica_mismatch`` naming the first (step, rank, tensor) in execution order
        that departs from its replicas, or ``none``.

    Examples
    --------
    >>> import precnb
    >>> f = precnb.check_replicas(run, precnb.Layout(4))  # doctest: +SKIP
    """
    ranks = [int(r) for r in ds["rank"].values]
    layout = layout or Layout(len(ranks))
    if sorted(ranks) != list(range(layout.world_size)):
        raise ValueError(f"layout {layout.describe()} does not match the run's ranks {ranks[:8]}")
    aside: list[dict[str, Any]] = []
    rows, checked = replica_mismatches(ds, layout, dims=dims, rtol=rtol, aside=aside)
    stats = {"checked_records": checked, "mismatches": len(rows), "layout": layout.describe()}
    aside_hint = ("set aside, not replica mismatches: " + "; ".join(
        f"{a.get('node') or a['examples'][0]['tensor']}: {a['why']}" for a in aside[:4])) if aside else None
    if not rows:
        return Finding(kind="none", reason="all replicas agree", stats=stats,
                       hints=[aside_hint] if aside_hint else [], evidence={"set_aside": aside})
    first = rows[0]
    ranks_bad = sorted({r["rank"] for r in rows if r["step"] == first["step"]})
    reason = (f"{first['tensor']} on rank {first['rank']} at step {first['step']} {first['why']}")
    hints = []
    if first.get("inputs_identical"):
        api = str(ds["api"].sel(tensor=first["tensor"]).values)
        got = ("has no tensor input" if _no_tensor_input(ds, int(ds.indexes["tensor"].get_loc(first["tensor"])))
               else "received identical inputs")
        hints.append(f"{api} {got} on ranks {first['group']} but produced different outputs: "
                     "a random op whose seed is not synchronised across the group (e.g. dropout on the "
                     "replicated hidden states outside the model-parallel RNG tracker), a non-deterministic "
                     "kernel, or an op given a rank-dependent argument")
    if len(ranks_bad) == 1:
        hints.append(f"only rank {ranks_bad[0]} departs at step {first['step']}: a silent divergence on "
                     "that rank (hardware fault, non-deterministic kernel, or a missed synchronisation)")
    values = {f"rank{r}": entry_values(ds, step=first["step"], rank=r, tensor=first["tensor"])
              for r in first["group"]}
    evidence_ranks = {"ranks": list(first["group"]), "departing_ranks_at_step": ranks_bad, "set_aside": aside}
    if aside_hint:
        hints.append(aside_hint)
    return Finding(kind="replica_mismatch", reason=reason, step=first["step"], rank=first["rank"],
                   node=first["node"], tensor=first["tensor"],
                   module=entry_meta(ds, first["tensor"], first["step"], first["rank"])["module"] or None,
                   values=values,
                   hints=hints, suspects=[{k: v for k, v in r.items() if k != "seq"} for r in rows[1:limit + 1]],
                   evidence={**node_evidence(ds, first["node"], step=first["step"], rank=first["rank"],
                                             tensor=first["tensor"]), **evidence_ranks}, stats=stats)
