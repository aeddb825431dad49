"""Replica departures, classified: the first one in execution order, why it happened, what followed.

:func:`precnb.analysis.replicas.replica_mismatches` lists every record that departs from its replica
group. This module turns that list into *events*: in each step and replica group the first departing
record in execution order is the event's origin, everything after it in that step is a consequence.
Each origin says

* whether the op's **inputs were identical** across the replicas: its tensor inputs (every statistic,
  and the CRC in md5 dumps, equal on every member) and, when the dump's records can be read, its
  **scalar arguments**. An op given a per-rank argument differs by design and is set aside, not a
  departure;
* its **cause**: inputs identical and a random op (``torch.normal``, dropout, ...) outside a
  model-parallel RNG region → ``unsynchronised_seed``; inputs identical otherwise → ``compute_fault``
  (a compute fault on that device, or a non-deterministic kernel); inputs that already differ →
  ``inherited`` (from an earlier event, or from a difference no checked tensor shows);
* its **candidates**: with two replicas either side may be wrong, so both ranks are named unless a clean
  run of the same training (*baseline*) decides (the side whose output differs from the clean run while
  every member's inputs still match it); with three or more the majority decides.

Random ops (``torch.normal(0, 1, size)``) have no tensor input: the replica check counts their outputs as
replicated (they read only their scalar arguments and the shared random state); in md5 dumps
:func:`crc_rows` adds the departures only the CRC shows.

:func:`check_departures` is the replica diagnosis of :func:`precnb.diagnose` (kind ``replica_mismatch``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis._memo import DatasetMemo
from precnb.analysis.findings import Finding
from precnb.analysis.findings.evidence import entry_values, node_evidence
from precnb.analysis.layout import Layout
from precnb.analysis.replicas.departure_inputs import RANDOM_OPS, _equal, crc_rows, is_random_op, scalar_args
from precnb.analysis.replicas.departure_text import aside_text, departure_reason
from precnb.analysis.replicas.returned_grad import returned_grad_departures
from precnb.schema import entry_meta, meta_changes

__all__ = ["RANDOM_OPS", "check_departures", "crc_rows", "departure_events", "is_random_op", "scalar_args"]

STATS = ("max", "min", "mean", "norm")
CAUSE_TEXT = {
    "compute_fault": "inputs identical across the replicas, output differs: a compute fault on that device, or a "
                     "non-deterministic kernel",
    "unsynchronised_seed": "a random op whose output differs across the replicas while its inputs are identical, "
                           "outside any model-parallel RNG region: an unsynchronised seed",
    "inherited": "its inputs already differ across the replicas: inherited from an earlier difference",
}
_MAX_RECORD_READS = 32  # origins whose scalar arguments are read from the dump's records


class _Run:
    """Per-run lookups the classification needs (tensor columns of a node, values at (step, rank))."""

    def __init__(self, ds: xr.Dataset) -> None:
        self.ds = ds
        self.col = {str(t): j for j, t in enumerate(ds["tensor"].values.tolist())}
        self.step = {int(s): i for i, s in enumerate(ds["step"].values.tolist())}
        self.rank = {int(r): i for i, r in enumerate(ds["rank"].values.tolist())}
        self.inputs: dict[str, list[int]] = {}
        for j, (n, r) in enumerate(zip(ds["node"].values.tolist(), ds["role"].values.tolist(), strict=True)):
            if r == "input":
                self.inputs.setdefault(str(n), []).append(j)
        self.crc = ds["crc"].values if "crc" in ds.data_vars else None
        self.vals = {s: ds[s].values for s in STATS}
        self.present = ds["present"].values

    def key(self, step: int, rank: int, col: int) -> tuple[Any, ...] | None:
        si, ri = self.step.get(step), self.rank.get(rank)
        if si is None or ri is None or not self.present[si, ri, col]:
            return None
        crc = self.crc[si, ri, col] if self.crc is not None else None
        return (*(float(self.vals[s][si, ri, col]) for s in STATS), crc if isinstance(crc, str) and crc else None)


_RUNS = DatasetMemo(size=2)


def _run_of(ds: xr.Dataset) -> _Run:
    """The lookups of *ds*, made once while it is the same, unchanged dataset (a rerun; read, never changed)."""
    return _RUNS.get([ds], "departure_run", lambda: _Run(ds), copy=False)


def _same(a: tuple[Any, ...] | None, b: tuple[Any, ...] | None, rtol: float) -> bool:
    if a is None or b is None:
        return False
    if a[-1] is not None and b[-1] is not None and a[-1] != b[-1]:
        return False  # CRC: bitwise
    x, y = np.array(a[:-1], float), np.array(b[:-1], float)
    return bool(_equal(x, y, rtol).all())


def _inputs_identical(run: _Run, step: int, group: list[int], node: str, rtol: float) -> bool | None:
    """Tensor inputs of *node* equal on every member (None: the node records no tensor input)."""
    cols = run.inputs.get(node, [])
    if not cols:
        return None
    for j in cols:
        keys = [run.key(step, r, j) for r in group]
        if any(k is None for k in keys) or not all(_same(keys[0], k, rtol) for k in keys[1:]):
            return False
    return True


def _decide(run: _Run, base: _Run | None, ev: dict[str, Any], rtol: float) -> None:
    """Which side of the departure is wrong: the majority (three or more replicas), else the clean run."""
    group, step = ev["group"], ev["step"]
    if len(group) >= 3:
        ev["wrong_side"], ev["decided_by"] = sorted(ev["departing_ranks"]), "majority"
        return
    ev["wrong_side"], ev["decided_by"] = [], None
    if ev["role"] == "grad" and (own := returned_grad_departures(run.ds, ev["tensor"], step=step, ranks=list(group))):
        ev["wrong_side"], ev["decided_by"], ev["own_records"] = [own["rank"]], "own_records", own["why"]
        return
    if base is None:
        return
    col, bcol = run.col[ev["tensor"]], base.col.get(ev["tensor"])
    if bcol is None:
        ev["baseline"] = {"decides": False, "why": "the clean run does not record this tensor"}
        return
    ins_match = all(_same(run.key(step, r, j), base.key(step, r, base.col[str(run.ds["tensor"].values[j])]), rtol)
                    for r in group for j in run.inputs.get(ev["node"], [])
                    if str(run.ds["tensor"].values[j]) in base.col)
    agree = [r for r in group if _same(run.key(step, r, col), base.key(step, r, bcol), rtol)]
    differ = [r for r in group if r not in agree]
    decides = ins_match and bool(agree) and bool(differ)
    ev["baseline"] = {"agree_with_baseline": agree, "differ_from_baseline": differ, "inputs_match_baseline":
                      ins_match, "decides": decides}
    if decides:
        ev["wrong_side"], ev["decided_by"] = differ, "baseline"


def _signature_check(ds: xr.Dataset, run: _Run) -> Callable[[int, list[int], str], bool | None]:
    """``check(step, group, tensor)``: whether the op's scalar arguments agree on *group*, from the reader's checksums.

    The msprobe reader notes a checksum of every API call's scalar arguments and keeps those that vary
    across ranks (``attrs["scalar_signatures"]``, :mod:`precnb.analysis.layout.rank_args`); a call it does not list
    has the same scalar arguments on every rank. None where the run does not say (another reader, a
    tensor not in it). Looked up per call: no (step, rank, tensor) array is built.
    """
    import json

    var = ds["scalar_sig"] if "scalar_sig" in ds.data_vars else None  # carried by pipeline stitching
    try:
        table = json.loads(ds.attrs.get("scalar_signatures") or "{}")
    except (TypeError, ValueError):
        table = None
    complete = str(ds.attrs.get("source_format", "")) == "msprobe" and isinstance(table, dict)

    def check(step: int, group: list[int], tensor: str) -> bool | None:
        j, si = run.col.get(tensor), run.step.get(step)
        if j is None or si is None or any(r not in run.rank for r in group):
            return None
        if var is not None:
            return len({int(var[si, run.rank[r], j].item()) for r in group}) == 1
        if not complete:
            return None
        entry = (table.get(str(ds["node"].values[j])) or {}).get(str(step))
        if not isinstance(entry, dict):
            return True  # not listed: the same scalar arguments on every rank
        at = entry.get("at") or {}
        return len({at.get(str(r), entry.get("default")) for r in group}) == 1

    return check


def departure_events(
    ds: xr.Dataset,
    rows: Sequence[Mapping[str, Any]],
    *,
    rtol: float = 1e-6,
    records: Callable[[int, int, str], Mapping[str, Any] | None] | None = None,
    baseline: xr.Dataset | None = None,
    rng_regions: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Group departure *rows* into events (one per step and replica group) and classify their origins.

    Parameters
    ----------
    ds : xarray.Dataset
        The run the rows come from (ranks as dumped).
    rows : sequence of dict
        :func:`precnb.analysis.replicas.replica_mismatches` rows (and :func:`crc_rows`).
    rtol : float
        Relative tolerance on statistics (CRCs compare exactly).
    records : callable, optional
        ``records(step, rank, node)`` → the node's dump record: its scalar arguments are compared. Without
        it (or where it cannot say), the checksums of the scalar arguments the msprobe reader keeps
        (``attrs["scalar_signatures"]``) are compared.
    baseline : xarray.Dataset, optional
        A clean run of the same training (same ranks and steps): decides two-replica departures.
    rng_regions : sequence of str
        Module path prefixes inside a model-parallel RNG region: a random op there differs by design.

    Returns
    -------
    (events, set_aside)
        Events in (step, execution position) order, and what was set aside as differing by design.
    """
    run = _run_of(ds)
    base = _run_of(baseline) if baseline is not None else None
    by_event: dict[tuple[int, tuple[int, ...], str], list[Mapping[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (r["step"], r["seq"], r["rank"])):
        by_event.setdefault((int(r["step"]), tuple(r["group"]), str(r["dim"])), []).append(r)
    events: list[dict[str, Any]] = []
    aside: list[dict[str, Any]] = []
    reads = 0
    sig_args = _signature_check(ds, run)
    changes = meta_changes(ds)  # a label can name another module's call on another stage or step
    for (step, group, dim), rs in sorted(by_event.items(), key=lambda kv: (kv[0][0], kv[1][0]["seq"], kv[0][1])):
        first = rs[0]
        node, tensor = str(first["node"]), str(first["tensor"])
        module = entry_meta(ds, tensor, step, group[0], changes)["module"] if tensor in run.col else ""
        api = str(ds["api"].values[run.col[tensor]]) if tensor in run.col else node
        role = str(ds["role"].values[run.col[tensor]]) if tensor in run.col else ""
        tin = _inputs_identical(run, step, list(group), node, rtol) if role == "output" else False
        sargs: bool | None = None
        if records is not None and role == "output" and reads < _MAX_RECORD_READS:
            reads += 1
            try:
                got = [records(step, r, node) for r in group]
            except Exception:  # evidence is optional: classified from the tensors alone
                got = []
            if got and all(g is not None for g in got):
                sa = [scalar_args(g) for g in got]
                sargs = all(x == sa[0] for x in sa[1:])
        if sargs is None and role == "output":  # the reader's checksums of the scalar arguments
            sargs = sig_args(step, list(group), tensor)
        random = is_random_op(api)
        in_region = random and bool(module) and any(module.startswith(p) for p in rng_regions)
        if sargs is False or in_region:
            why = ("the op's scalar arguments differ across the replicas (a per-rank argument): different by "
                   "design" if sargs is False else "a random op inside a model-parallel RNG region: different by "
                   "design")
            aside.append({"step": step, "group": list(group), "node": node, "why": why, "entries": len(rs)})
            continue
        identical = tin is not False and role == "output"
        cause = ("unsynchronised_seed" if random else "compute_fault") if identical else "inherited"
        departing = sorted({int(r["rank"]) for r in rs if r["tensor"] == tensor})
        ev: dict[str, Any] = {
            "step": step, "dim": dim, "group": list(group), "rank": int(first["rank"]), "departing_ranks": departing,
            "node": node, "tensor": tensor, "module": module or None, "api": api, "role": role,
            "seq": int(first["seq"]),
            "inputs_identical": identical, "tensor_inputs_identical": tin, "scalar_args_identical": sargs,
            "random_op": random, "cause": cause, "cause_text": CAUSE_TEXT[cause].replace(
                "the replicas", f"the {dim.upper()} replicas"),
            "consequences": {"tensors": len(rs) - 1, "nodes": len({r["node"] for r in rs[1:]} - {node}),
                             "first": str(rs[1]["tensor"]) if len(rs) > 1 else None,
                             "last": str(rs[-1]["tensor"]) if len(rs) > 1 else None},
        }
        if cause == "inherited":
            earlier = [e for e in events if e["group"] == list(group) and e["step"] < step]
            ev["inherited_from"] = ({"step": earlier[-1]["step"], "node": earlier[-1]["node"]} if earlier else None)
        _decide(run, base, ev, rtol)
        if not ev["wrong_side"] and first.get("copy_held_by"):  # the others hold the value replicated on all
            ev["wrong_side"], ev["decided_by"] = [int(first["rank"])], "replicated_copy"
        ev["candidates"] = [{"rank": r, "wrong_side": r in ev["wrong_side"]} for r in
                            (ev["wrong_side"] or (list(group) if len(group) == 2 else departing))]
        events.append(ev)
    return events, aside


def _has_experts(ds: xr.Dataset) -> bool:
    """Whether the run records MoE experts (``...experts.local_experts.N`` modules)."""
    return any(".experts.local_experts." in str(n) for n in ds["node"].values)


def check_departures(
    ds: xr.Dataset,
    layout: Layout | None = None,
    *,
    dims: Sequence[str] = ("dp", "tp"),
    rtol: float = 1e-6,
    limit: int = 50,
    records: Callable[[int, int, str], Mapping[str, Any] | None] | None = None,
    baseline: xr.Dataset | None = None,
    rng_regions: Sequence[str] = (),
) -> Finding:
    """The replica check with its first departure classified (kind ``replica_mismatch``, or ``none``).

    Parameters
    ----------
    ds : xarray.Dataset
        One run, ranks as dumped.
    layout : Layout, optional
        Defaults to pure data parallelism over all ranks.
    dims, rtol, limit
        As :func:`precnb.analysis.replicas.check_replicas`.
    records, baseline, rng_regions
        As :func:`departure_events`.

    Returns
    -------
    Finding
        The first event's origin (step, rank, node, tensor); ``evidence["departure"]`` classifies it,
        ``evidence["departures"]`` lists every event (origins at later steps included), ``evidence["candidates"]``
        names the ranks that may be wrong, ``stats["consequences"]`` counts the later mismatches and their steps.

    Examples
    --------
    >>> import precnb
    >>> run = precnb.open_run(precnb.sample_path("sdc/job1"), workers=1)
    >>> f = check_departures(run, precnb.Layout.parse("tp=2,dp=2", world_size=4))
    >>> f.step, f.node, f.evidence["departure"]["cause"], f.evidence["departure"]["group"]
    (1, 'Torch.rsqrt.0.forward', 'compute_fault', [0, 1])
    """
    from precnb.analysis.replicas import replica_mismatches

    ranks = [int(r) for r in ds["rank"].values]
    layout = layout or Layout(len(ranks))
    if sorted(ranks) != list(range(layout.world_size)):
        raise ValueError(f"layout {layout.describe()} does not match the run's ranks {ranks[:8]}")
    rank_args: list[dict[str, Any]] = []  # set aside by the check itself (undefined values, rank-dependent ops)
    rows, checked = replica_mismatches(ds, layout, dims=dims, rtol=rtol, aside=rank_args)
    seen = {(r["step"], r["group"][0], r["tensor"]) for r in rows}
    rows += [r for r in crc_rows(ds, layout, dims=dims) if (r["step"], r["group"][0], r["tensor"]) not in seen]
    events, aside = departure_events(ds, rows, rtol=rtol, records=records, baseline=baseline,
                                     rng_regions=rng_regions)
    if layout.pp > 1:  # each rank numbers its own records: the pipeline orders the stages' departures
        from precnb.analysis.replicas.pipeline_order import pipeline_order

        events = pipeline_order(events, lambda r: int(layout.coords(r)["pp"]))
    aside = rank_args + aside
    stats: dict[str, Any] = {"checked_records": checked, "mismatches": len(rows), "layout": layout.describe(),
                             "events": len(events)}
    evidence_aside = {"set_aside": aside} if aside else {}
    if not events:
        hints = [aside_text(a) for a in aside[:4]]
        if layout.ep > 1 and layout.edp == 1:  # what this check cannot see, said
            hints.insert(0, f"the experts have no replicas in this layout ({layout.describe()}: each expert lives on "
                            "one rank): a fault inside an expert cannot show as a replica departure; compare with a "
                            "healthy run (precnb diff) or trace NaN (precnb nan)")
        elif layout.world_size > 1 and _has_experts(ds):
            hints.insert(0, "each expert's copies on these ranks compute their gradients over their own tokens and "
                            "agree only after the gradient reduction: a fault in one copy's expert gradient before "
                            "the reduction cannot show as a replica departure; compare with a healthy run of the same "
                            "layout (precnb diff, rank by rank, names the copy) or with the unsharded run (step and "
                            "expert, not the copy)")
        return Finding(kind="none", reason="all replicas agree", stats=stats, hints=hints, evidence=evidence_aside)
    first = events[0]
    origins = [e for e in events if e["inputs_identical"]]
    inherited = [e for e in events[1:] if not e["inputs_identical"]]
    later = first["consequences"]["tensors"] + sum(e["consequences"]["tensors"] + 1 for e in inherited)
    later_steps = sorted({first["step"]} if first["consequences"]["tensors"] else set()
                         | {e["step"] for e in inherited})
    stats["consequences"] = {"count": later, "steps": later_steps}
    stats["origins"] = len(origins)
    rank = first["wrong_side"][0] if first["wrong_side"] else first["rank"]
    hints = []
    more = [e for e in origins if e is not first]
    if more:
        where = ", ".join(f"step {e['step']} ranks {e['group']}" for e in more[:6]) + (" ..." if len(more) > 6 else "")
        hints.append(f"{len(more)} more departure(s) with identical inputs ({where}): separate events, not "
                     "consequences; `precnb devices` follows them to hosts and devices across jobs")
    if first["cause"] == "unsynchronised_seed":
        hints.append(f"{first['api']} draws other numbers on the {first['dim'].upper()} ranks: seed the generator "
                     "identically across the group outside the model-parallel RNG region (or move the op into it)")
    if len(first["group"]) == 2 and not first["wrong_side"]:
        hints.append("a pair cannot say which side is wrong: a clean run of the same training (--baseline RUN), a "
                     "third replica, or the same departure on another job's device decides")
    hints += [aside_text(a) for a in aside[:4]]
    values = {f"rank{r}": entry_values(ds, step=first["step"], rank=r, tensor=first["tensor"]) for r in first["group"]}
    suspects = [{k: v for k, v in r.items() if k != "seq"} for r in
                sorted(rows, key=lambda r: (r["step"], r["seq"], r["rank"]))
                if (r["step"], r["tensor"], r["rank"]) != (first["step"], first["tensor"], first["rank"])][:limit]
    brief = [{k: e[k] for k in ("step", "rank", "node", "inputs_identical", "cause", "dim", "group")} | {
        "candidates": [c["rank"] for c in e["candidates"]], "wrong_side": e["wrong_side"],
        "decided_by": e["decided_by"]} for e in events]
    evidence = {**node_evidence(ds, first["node"]), "ranks": list(first["group"]),
                "departing_ranks_at_step": sorted({int(r["rank"]) for r in rows if r["step"] == first["step"]}),
                "departure": first, "departures": brief, "candidates": [dict(c) for c in first["candidates"]],
                **evidence_aside}
    return Finding(kind="replica_mismatch", reason=departure_reason(first, later, later_steps), step=first["step"],
                   rank=rank,
                   node=first["node"], tensor=first["tensor"], module=first["module"], values=values, hints=hints,
                   suspects=suspects, evidence=evidence, stats=stats)
