"""Data checks: the runs read the same data (two runs), distinct DP replicas read distinct data (each run).

The batch is fingerprinted by the statistics of the run's first forward record: the first
module's inputs and outputs (the embedding's token ids and its output), or, without module
records, the first API's first input and outputs; a config_check pack's ``dataset`` features.
Two ranks holding the same parameters (DP replicas) that compute bit-identical statistics for it
read the same batch — the embedding output is a float function of the ids, so equal float
statistics are strong evidence; equal integer extremes alone (token-id max and min, with the
mean and norm of an integer tensor recorded as null) are no evidence: two batches of one vocabulary
share them. Non-finite statistics are no evidence either way (a NaN run computes NaN everywhere).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.preflight._common import check, fmt, names_list, worst

__all__ = ["check_coverage", "check_data", "check_dp_data", "model_input"]

_STATS = ("max", "min", "mean", "norm")


def model_input(ds: xr.Dataset) -> tuple[str, list[str], list[str]] | None:
    """``(node, input labels, output labels)`` of the first forward record of *ds* (None without one)."""
    if ds.sizes.get("tensor", 0) == 0 or ds.sizes.get("step", 0) == 0 or ds.sizes.get("rank", 0) == 0:
        return None
    node = ds["node"].values.astype(str)
    kind, role, direction = ds["kind"].values, ds["role"].values, ds["direction"].values
    ok = ((direction == "forward") & np.isin(kind, ["api", "module"]) & np.isin(role, ["input", "output"])
          & ~np.char.startswith(node, "Distributed.") & ~np.char.startswith(node, "MintDistributed."))
    present = ds["present"].values
    for si in range(ds.sizes["step"]):
        for ri in range(ds.sizes["rank"]):
            here = ok & present[si, ri]
            if not here.any():
                continue
            seq = ds["seq"].values[si, ri]
            for want in ("module", "api"):
                sel = here & (kind == want)
                if sel.any():
                    first = node[np.flatnonzero(sel)[np.argmin(seq[sel])]]
                    labels = ds["tensor"].values.astype(str)
                    mine = ok & (node == first)
                    ins = [str(x) for x in labels[mine & (role == "input")]]
                    if want == "api":  # an API's other inputs are weights: keep the first argument
                        ins = [x for x in ins if x == f"{first}.input.0" or x.startswith(f"{first}.input.0.")]
                    outs = [str(x) for x in labels[mine & (role == "output")]]
                    return str(first), ins, outs
    return None


def _fp(ds: xr.Dataset, labels: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(step, rank, k, 4)`` statistics and ``(step, rank, k)`` presence of *labels*."""
    sub = ds[[*_STATS, "present"]].sel(tensor=labels)
    vals = np.stack([np.asarray(sub[s].values, np.float64) for s in _STATS], axis=-1)
    return vals, np.asarray(sub["present"].values, bool)


def _compare(a: np.ndarray, pa: np.ndarray, b: np.ndarray, pb: np.ndarray, *,
             extremes_tell: bool = True) -> tuple[bool | None, bool]:
    """(equal? — None when nothing finite to compare, float evidence?) of two fingerprints (k, 4).

    With ``extremes_tell=False``, equal values say "same batch" only when a mean or norm, or a
    non-integer value, is among them: integer extremes alone (token-id max and min, an integer
    tensor's mean and norm being null) are shared by distinct batches, and the answer is None.
    Unequal values always say "different".
    """
    use = pa[:, None] & pb[:, None] & np.isfinite(a) & np.isfinite(b)
    if not use.any():
        return None, False
    equal = bool(np.all(a[use] == b[use]))
    fractional = bool(np.any(a[use] % 1 != 0))
    if equal and not extremes_tell and not fractional and not use[:, 2:].any():
        return None, False
    return equal, fractional


def _replica_groups(ds: xr.Dataset, layout: Any) -> tuple[list[list[int]], str]:
    ranks = [int(r) for r in ds["rank"].values]
    groups: list[list[int]] = []
    if layout is not None:
        groups = [[r for r in g if r in ranks] for g in layout.groups("dp")]
        return [g for g in groups if len(g) > 1], f"layout {layout.describe()}: DP groups"
    role = ds["role"].values
    params = np.flatnonzero(role == "parameter")
    if not len(params):
        return ([ranks] if len(ranks) > 1 else []), "no parameter record: every rank taken as a DP replica"
    sub = ds.isel(tensor=params)
    si = 0
    vals = np.stack([np.asarray(sub[s].values[si], np.float64) for s in _STATS], axis=-1)  # (rank, k, 4)
    pres = np.asarray(sub["present"].values[si], bool)
    for i, r in enumerate(ranks):
        for g in groups:
            j = ranks.index(g[0])
            if np.array_equal(pres[i], pres[j]) and np.array_equal(vals[i], vals[j], equal_nan=True):
                g.append(r)
                break
        else:
            groups.append([r])
    return [g for g in groups if len(g) > 1], "replicas = ranks holding identical parameters (no layout given)"


def _dp_one(name: str, ds: xr.Dataset, layout: Any) -> dict[str, Any]:
    from precnb.analysis.summary import format_ranges

    first = model_input(ds)
    if ds.sizes.get("rank", 0) < 2:
        return {"status": "skip", "text": f"{name}: one rank"}
    if first is None:
        return {"status": "skip", "text": f"{name}: no forward record to fingerprint the batch"}
    node, ins, outs = first
    groups, how = _replica_groups(ds, layout)
    if not groups:
        return {"status": "skip", "text": f"{name}: no two DP replicas ({how}; ranks with different parameters "
                f"are TP/PP shards)"}
    vals, pres = _fp(ds, ins + outs)
    ranks = [int(r) for r in ds["rank"].values]
    steps = [int(s) for s in ds["step"].values]
    dup: dict[tuple[int, ...], list[int]] = {}
    strong = False
    checked = 0
    told = 0  # (step, group) comparisons whose statistics could tell two batches apart
    for si, s in enumerate(steps):
        for g in groups:
            clusters: list[list[int]] = []
            for r in g:
                ri = ranks.index(r)
                for c in clusters:
                    cj = ranks.index(c[0])
                    eq, fl = _compare(vals[si, ri], pres[si, ri], vals[si, cj], pres[si, cj], extremes_tell=False)
                    told += eq is not None
                    if eq:
                        c.append(r)
                        strong = strong or fl
                        break
                else:
                    clusters.append([r])
            checked += 1
            for c in clusters:
                if len(c) > 1:
                    dup.setdefault(tuple(c), []).append(s)
    detail = {"node": node, "inputs": ins, "outputs": outs, "groups": groups, "replicas": how,
              "same_batch": [{"ranks": list(c), "steps": st} for c, st in dup.items()]}
    if not told:
        return {"status": "skip", "text": f"{name}: cannot tell whether DP replicas read distinct batches: {node}'s "
                "statistics hold nothing that tells two batches apart (non-finite values, integer ids recorded "
                "without mean and norm)", **detail}
    if dup:
        items = [f"ranks {', '.join(map(str, c))} at step{'s' if len(st) > 1 else ''} {format_ranges(st)}"
                 for c, st in dup.items()]
        what = "input and output" if outs else "input"
        text = (f"{name}: DP replicas read the same batch: {names_list(items, 4)} — {node} {what} identical in every "
                f"statistic ({', '.join(_STATS)}); distinct DP replicas must read distinct data ("
                + (f"{how} {_groups(groups)})" if layout is not None else
                   f"{how}; give --layout when ranks share a batch by design: TP, CP, PP)"))
        return {"status": "fail" if strong else "warn", "text": text, "confidence": "high" if strong else "low",
                **detail}
    return {"status": "pass", "text": f"{name}: DP replicas (ranks {_groups(groups)}) read distinct batches at "
            f"{len(steps)} step(s) ({node})", "confidence": "high", **detail}


def _groups(groups: list[list[int]]) -> str:
    from precnb.analysis.summary import format_ranges

    return "; ".join(format_ranges(g) for g in groups)


def check_dp_data(runs: list[tuple[str, xr.Dataset, Any]]) -> dict[str, Any]:
    """Distinct DP replicas read distinct data (each run; *runs* = [(name, dataset, layout)])."""
    parts = [_dp_one(n, ds, lay) for n, ds, lay in runs]
    status = worst(p["status"] for p in parts)
    ordered = sorted(parts, key=lambda p: -["skip", "pass", "warn", "fail"].index(p["status"]))
    conf = next((p.get("confidence") for p in ordered if p["status"] == status), None)
    return check("dp_data", "Distinct data per DP replica", status, "; ".join(p["text"] for p in ordered),
                 confidence=conf, basis="compared", runs={n: {k: v for k, v in p.items() if k != "text"}
                                                          for (n, _, _), p in zip(runs, parts, strict=True)})


def check_data(base: xr.Dataset, target: xr.Dataset, off: int, names: tuple[str, str]) -> dict[str, Any]:
    """The runs read the same data: the first record's inputs at every common (step, rank)."""
    title = "Same input data"
    fb, ft = model_input(base), model_input(target)
    if fb is None or ft is None:
        return check("data", title, "skip", "no forward record to fingerprint the batch")
    node, ins, _ = fb
    ins = [x for x in ins if x in target.indexes["tensor"]]
    if not ins or ft[0] != node:
        return check("data", title, "skip", f"the runs' first records differ ({node} vs {ft[0]})")
    vb, pb = _fp(base, ins)
    vt, pt = _fp(target, ins)
    tsteps, tranks = [int(s) for s in target["step"].values], [int(r) for r in target["rank"].values]
    differ, same, unjudged = [], 0, []
    for si, s in enumerate(int(x) for x in base["step"].values):
        if s + off not in tsteps:
            continue
        for ri, r in enumerate(int(x) for x in base["rank"].values):
            if r not in tranks:
                continue
            a, b = vb[si, ri], vt[tsteps.index(s + off), tranks.index(r)]
            eq, _ = _compare(a, pb[si, ri], b, pt[tsteps.index(s + off), tranks.index(r)])
            if eq is None:  # no finite statistic to compare in one run: counted, and named below
                unjudged.append((s, r))
                continue
            if eq:
                same += 1
                continue
            k, j = np.argwhere((a != b) & np.isfinite(a) & np.isfinite(b))[0]
            differ.append({"step": s, "rank": r, "tensor": ins[int(k)], "stat": _STATS[int(j)],
                           "baseline": float(a[k, j]), "target": float(b[k, j])})
    if not differ and not same:
        return check("data", title, "skip", "no (step, rank) with a finite model input in both runs")
    common = len(differ) + same + len(unjudged)
    rest = (f"; {len(unjudged)} could not be compared (no finite statistic in one run), e.g. step "
            f"{unjudged[0][0]} rank {unjudged[0][1]}" if unjudged else "")
    if differ:
        d = differ[0]
        return check("data", title, "fail", f"the runs read different data at {len(differ)} of {common} "
                     f"(step, rank) entries: step {d['step']} rank {d['rank']} {d['tensor']} {d['stat']} "
                     f"{fmt(d['baseline'])} ({names[0]}) vs {fmt(d['target'])} ({names[1]}){rest}", confidence="high",
                     basis="compared", node=node, differ=differ[:50], not_compared=unjudged[:50])
    if unjudged:
        return check("data", title, "warn", f"same model input ({node}) at {same} of {common} common (step, rank) "
                     f"entries{rest}", confidence="medium", basis="compared", node=node, not_compared=unjudged[:50])
    return check("data", title, "pass", f"same model input ({node}) at all {same} common (step, rank) entries",
                 confidence="high", basis="compared", node=node)


def check_coverage(runs: list[tuple[str, xr.Dataset, Any]]) -> dict[str, Any]:
    """Every rank recorded every step; no file was skipped."""
    from precnb.analysis.summary import format_ranges

    parts, status = [], "pass"
    details: dict[str, Any] = {}
    for name, ds, _ in runs:
        steps, ranks = [int(s) for s in ds["step"].values], [int(r) for r in ds["rank"].values]
        if not steps or not ranks or ds.sizes.get("tensor", 0) == 0:
            parts.append(f"{name}: no record")
            status = "warn"
            continue
        any_rec = np.asarray(ds["present"].any("tensor").values, bool)
        missing = [(steps[i], ranks[j]) for i, j in zip(*np.nonzero(~any_rec), strict=True)]
        raw = ds.attrs.get("load_report")
        skipped = len(json.loads(raw).get("skipped", [])) if isinstance(raw, str) and raw else 0
        text = f"{name}: {len(steps)} step(s) ({format_ranges(steps)}) x {len(ranks)} rank(s)"
        if missing:
            status = "warn"
            text += f", {len(missing)} (step, rank) without any record, e.g. step {missing[0][0]} rank {missing[0][1]}"
        if skipped:
            status = "warn"
            text += f", {skipped} file(s) skipped"
        if not missing and not skipped:
            text += ", complete"
        parts.append(text)
        details[name] = {"steps": steps, "ranks": ranks, "missing": missing[:50], "skipped_files": skipped}
    return check("coverage", "Steps and ranks recorded", status, "; ".join(parts), basis="read", runs=details)
