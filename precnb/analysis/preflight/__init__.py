"""Pre-flight checks: whether a layer-by-layer comparison is meaningful at all.

Before comparing a target run with its baseline layer by layer, the two must train the same
parameters (names, shapes, count, dtype), freeze the same ones, use the same optimizer
hyper-parameters, start from the same weights and read the same data; within one run, distinct
data-parallel replicas must read distinct batches. :func:`preflight` checks all of that from the
dumps alone (or from msprobe ``config_check`` packs opened as datasets) and returns a list of
checks in the JSON contract::

    [{"name": "parameters" | "frozen" | "hyperparameters" | "initial_weights" | "data" | "dp_data"
              | "coverage" | "env" | "packages" | "random",
      "title": str, "status": "pass" | "warn" | "fail" | "skip", "message": str,
      "confidence": "high" | "medium" | "low" | None, "basis": "read" | "inferred" | "compared" | None,
      "details": {...}}, ...]

Every message names the parameters, figures (the two counts, the ratio) and ranks it is about.
:func:`preflight_finding` turns the list into a :class:`~precnb.analysis.Finding` of kind
``preflight`` (when a check fails) for the diagnosis pipeline.

Examples
--------
>>> from precnb.schema import empty_dataset
>>> [c["name"] for c in preflight(empty_dataset())][:3]
['parameters', 'frozen', 'hyperparameters']
"""

from __future__ import annotations

from typing import Any

import xarray as xr

from precnb._args import baseline_keyword
from precnb.analysis.findings import Finding
from precnb.analysis.preflight._common import (
    Param,
    check,
    fmt,
    names_list,
    optimizer_tensors,
    parameter_table,
    worst,
)
from precnb.analysis.preflight._frozen import check_frozen
from precnb.dtypes import same_values

__all__ = ["CHECKS", "preflight", "preflight_finding"]

#: the checks, in the order they are listed
CHECKS = ("parameters", "frozen", "hyperparameters", "initial_weights", "data", "dp_data", "coverage", "env",
          "packages", "random")


def _describe(p: Param) -> str:
    bits = [p.name]
    if p.shape:
        bits.append(p.shape)
    if p.dtype:
        bits.append(p.dtype.replace("torch.", ""))
    return " ".join(bits)


def _no_parameter_records(ds: xr.Dataset | None) -> str:
    """Why a dump holds no parameter record: its level, else its msprobe release (releases up to 1.1.1 record none).

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> ds = empty_dataset()
    >>> ds.attrs["level"] = "L1"
    >>> _no_parameter_records(ds)
    'level L1 dumps record no parameters: dump with level L0 or mix'
    >>> ds.attrs["level"] = "mix"
    >>> _no_parameter_records(ds)[:80]
    'a level mix dump without parameter records: msprobe releases up to 1.1.1 record '
    """
    attrs = ds.attrs if ds is not None else {}
    level = str(attrs.get("level", "") or "")
    levels = {x for x in level.split(",") if x}
    if levels and levels <= {"L1", "L2"}:
        return f"level {level} dumps record no parameters: dump with level L0 or mix"
    release = str(attrs.get("msprobe_release", "") or "")
    written = f"; this one was written by msprobe {release}" if release else ""
    if levels & {"L0", "mix"}:
        return (f"a level {level} dump without parameter records: msprobe releases up to 1.1.1 record none, 1.2.0 "
                f"and later do{written}")
    return f"dump with level L0 or mix (msprobe 1.2.0 or later records parameters){written}"


def _elements(params: dict[str, Param]) -> int | None:
    vals = [p.numel for p in params.values()]
    return sum(vals) if vals and all(v >= 0 for v in vals) else None


def _inventory(params: dict[str, Param]) -> dict[str, Any]:
    return {"count": len(params), "elements": _elements(params),
            "parameters": [{"name": p.name, "shape": p.shape, "dtype": p.dtype} for p in params.values()]}


def _count_text(params: dict[str, Param]) -> str:
    el = _elements(params)
    return f"{len(params)} parameters" + (f" ({fmt(el)} elements)" if el is not None else "")


# ------------------------------------------------------------------------------------- parameters
def _optimizer_inventory(ob: tuple[str, list[str]] | None, ot: tuple[str, list[str]] | None,
                         names: tuple[str, str], merged: bool = False) -> dict[str, Any] | None:
    """The inventory check from the optimizer's parameter lists (dumps without parameter records).

    *merged*: a run's shards were merged: a merged rank's optimizer list is one member's own tensors (its TP
    shards, its pipeline stage's layers), which without names cannot be matched to the other layout's.
    """
    from collections import Counter

    if ob is None or ot is None:
        return None
    bn, tn = names
    extra_t = list((Counter(ot[1]) - Counter(ob[1])).elements())
    extra_b = list((Counter(ob[1]) - Counter(ot[1])).elements())
    text = f"the optimizer updates {len(ob[1])} tensors in the {bn} and {len(ot[1])} in the {tn} ({ot[0]})"
    details = {"optimizer": {"baseline": ob[1], "target": ot[1]}, "extra_shapes_in_target": extra_t,
               "extra_shapes_in_baseline": extra_b}
    if (extra_t or extra_b) and merged:
        return check("parameters", "Parameter inventory", "skip", f"{text}: in different layouts each rank's "
                     "optimizer updates its own shards and stage, and without parameter records their names are "
                     "unknown, so the lists cannot be matched (dump with level L0 or mix to compare the "
                     "parameters)", confidence="low", basis="read", **details)
    if extra_t or extra_b:
        shapes = "; ".join(x for x in (f"{tn} has {', '.join(extra_t)} more" if extra_t else "",
                                       f"{bn} has {', '.join(extra_b)} more" if extra_b else "") if x)
        return check("parameters", "Parameter inventory", "fail", f"{text}: {shapes} (no parameter records: "
                     "names unknown; dump with level L0 or mix to name them)", confidence="medium", basis="read",
                     **details)
    return check("parameters", "Parameter inventory", "pass", f"{text}, with the same shapes (no parameter records: "
                 "names not compared)", confidence="medium", basis="read", **details)


def check_parameters(pb: dict[str, Param] | None, pt: dict[str, Param], names: tuple[str, str],
                     base: xr.Dataset | None = None, target: xr.Dataset | None = None) -> dict[str, Any]:
    """Parameter inventory: names, shapes, count, dtype (two runs), or the inventory of one."""
    title = "Parameter inventory"
    bn, tn = names
    if not pt and not pb:
        if base is not None and target is not None:
            merged = bool(base.attrs.get("merged_layout") or target.attrs.get("merged_layout"))
            alt = _optimizer_inventory(optimizer_tensors(base), optimizer_tensors(target), names, merged)
            if alt is not None:
                return alt
        why = _no_parameter_records(target if target is not None else base)
        return check("parameters", title, "skip", f"no parameter or gradient record in the dump(s) ({why})")
    if pb is None:
        return check("parameters", title, "pass", f"{tn}: {_count_text(pt)}", basis="read", target=_inventory(pt))
    if not pt or not pb:  # one run records none (its level or its msprobe release): nothing to compare, no failure
        empty, other, full, ds = (tn, bn, pb, target) if not pt else (bn, tn, pt, base)
        return check("parameters", title, "skip", f"the {empty} has no parameter records to compare "
                     f"({_no_parameter_records(ds)}); the {other} has {_count_text(full)}", basis="read",
                     baseline=_inventory(pb), target=_inventory(pt))
    only_b = [pb[n] for n in pb if n not in pt]
    only_t = [pt[n] for n in pt if n not in pb]
    common = [n for n in pb if n in pt]
    shapes = [(n, pb[n].shape, pt[n].shape) for n in common if pb[n].shape and pt[n].shape
              and pb[n].shape != pt[n].shape]
    dtypes = [(n, pb[n].dtype, pt[n].dtype) for n in common if pb[n].dtype and pt[n].dtype
              and not same_values(pb[n].dtype, pt[n].dtype)]
    counts = f"parameter counts {len(pb)} ({bn}) vs {len(pt)} ({tn})"
    eb, et = _elements(pb), _elements(pt)
    if eb is not None and et is not None:
        counts += f", {fmt(eb)} vs {fmt(et)} elements"
    details = {"baseline": _inventory(pb), "target": _inventory(pt),
               "only_in_baseline": [_describe(p) for p in only_b], "only_in_target": [_describe(p) for p in only_t],
               "shape_mismatch": [{"name": n, "baseline": a, "target": b} for n, a, b in shapes],
               "dtype_mismatch": [{"name": n, "baseline": a, "target": b} for n, a, b in dtypes]}
    if len(common) * 2 < max(len(pb), len(pt)):  # mostly other names: another framework or model wrapper
        same_shapes = sorted(p.shape for p in pb.values()) == sorted(p.shape for p in pt.values())
        status = "warn" if same_shapes and len(pb) == len(pt) else "fail"
        return check("parameters", title, status, f"{counts}; only {len(common)} parameter name(s) in common: the "
                     "runs name their parameters differently (another framework or model wrapper?); compared by "
                     f"count and shapes: the shapes {'match' if same_shapes else 'do not match'} as multisets",
                     confidence="low" if status == "warn" else "medium", basis="read", **details)
    parts = []
    if only_t:
        parts.append(f"only in the {tn}: {names_list([_describe(p) for p in only_t])}")
    if only_b:
        parts.append(f"only in the {bn}: {names_list([_describe(p) for p in only_b])}")
    if shapes:
        parts.append("shapes differ: " + names_list([f"{n} {a} vs {b}" for n, a, b in shapes]))
    if parts:
        hint = ""
        if shapes and not only_b and not only_t:
            hint = " (sharded parameters? give the runs' layouts, e.g. --target-layout tp=2)"
        return check("parameters", title, "fail", f"{counts}: " + "; ".join(parts) + hint, confidence="high",
                     basis="read", **details)
    if dtypes:
        return check("parameters", title, "warn", f"same {len(pb)} parameters, dtypes differ: "
                     + names_list([f"{n} {a} vs {b}" for n, a, b in dtypes]), confidence="high", basis="read",
                     **details)
    return check("parameters", title, "pass", f"same {_count_text(pt)} in both runs (names, shapes and dtypes)",
                 confidence="high", basis="read", **details)


# ------------------------------------------------------------------------------------------ entry
@baseline_keyword()
def preflight(target: xr.Dataset, *, baseline: xr.Dataset | None = None, target_layout: Any = None,
              baseline_layout: Any = None, step_offset: int | None = 0, names: tuple[str, str] = ("baseline", "target"),
              raw_target: xr.Dataset | None = None, raw_baseline: xr.Dataset | None = None) -> list[dict[str, Any]]:
    """Run every pre-flight check that applies; see the module docstring for the JSON shape.

    Parameters
    ----------
    target : xarray.Dataset
        The run checked (with a baseline: the run compared; shards merged when it has a layout).
    baseline : xarray.Dataset, optional
        The run it is compared with: keyword-only (a second positional run is a ``TypeError``;
        :func:`precnb.preflight` is the public one, ``preflight(base, target)``).
    target_layout, baseline_layout : Layout, optional
        Which ranks share a batch by design (TP, CP, PP groups): only distinct DP replicas must read
        distinct data. Without one, ranks whose parameters are identical count as DP replicas.
    step_offset : int
        Target step = baseline step + offset.
    names : (str, str)
        Display names (baseline, target).
    raw_target, raw_baseline : xarray.Dataset, optional
        The runs before shard merging (the data-parallel check reads these; default: the runs).

    Returns
    -------
    list of dict
    """
    from precnb.analysis.preflight._common import clear_cache

    try:
        return _preflight(target, baseline, target_layout=target_layout, baseline_layout=baseline_layout,
                          step_offset=step_offset, names=names, raw_target=raw_target, raw_baseline=raw_baseline)
    finally:
        clear_cache()


def _preflight(target: xr.Dataset, baseline: xr.Dataset | None, *, target_layout: Any, baseline_layout: Any,
               step_offset: int | None, names: tuple[str, str], raw_target: xr.Dataset | None,
               raw_baseline: xr.Dataset | None) -> list[dict[str, Any]]:
    from precnb.analysis.preflight._data import check_coverage, check_data, check_dp_data
    from precnb.analysis.preflight._optim import check_hyperparameters
    from precnb.analysis.preflight._pack import pack_checks
    from precnb.analysis.preflight._weights import check_initial_weights

    off = int(step_offset or 0)
    names = (str(names[0] or "baseline"), str(names[1] or "target"))
    pt = parameter_table(target)
    pb = parameter_table(baseline) if baseline is not None else None
    out = [check_parameters(pb, pt, names, baseline, target), check_frozen(baseline, target, pb, pt, names),
           check_hyperparameters(baseline, target, pb, pt, off, names)]
    if baseline is not None and pb is not None:
        out.append(check_initial_weights(baseline, target, pb, pt, off, names))
        out.append(check_data(baseline, target, off, names))
    runs = [(names[1], raw_target if raw_target is not None else target, target_layout)]
    if baseline is not None:
        runs.insert(0, (names[0], raw_baseline if raw_baseline is not None else baseline, baseline_layout))
    out.append(check_dp_data(runs))
    out.append(check_coverage(runs))
    out.extend(pack_checks(baseline, target, names))
    return out


def preflight_finding(checks: list[dict[str, Any]]) -> Finding:
    """The pipeline's finding: kind ``preflight`` when a check fails, else ``"none"``; the checks in evidence.

    Examples
    --------
    >>> f = preflight_finding([{"name": "frozen", "title": "Frozen parameters", "status": "fail",
    ...                         "message": "frozen in the target only: w", "details": {}}])
    >>> f.kind, f.values["checks"]
    ('preflight', {'frozen': 'fail'})
    """
    failed = [c for c in checks if c["status"] == "fail"]
    warned = sorted((c for c in checks if c["status"] == "warn"),  # a likely root cause (a zero weight) first
                    key=lambda c: not (c.get("details") or {}).get("root_cause"))
    counts = {s: sum(1 for c in checks if c["status"] == s) for s in ("fail", "warn", "pass", "skip")}
    summary = {c["name"]: c["status"] for c in checks}
    if failed:
        reason = (f"pre-flight check{'s' if len(failed) > 1 else ''} failed: "
                  + "; ".join(f"{c['name']}: {c['message']}" for c in failed))
        hints = [f"{c['title']}: {c['message']}" for c in failed]
        hints.append("later differences (a first divergence, shifted call counters, structural noise) may be "
                     "consequences of the failing pre-flight check(s): fix them before comparing layer by layer")
        kind = "preflight"
    elif warned:  # no failure, but not "passed": the warnings may be the cause (a weight left at zero)
        reason = (f"no pre-flight check failed, {len(warned)} warning{'s' if len(warned) > 1 else ''} "
                  f"({counts['pass']} pass, {counts['warn']} warn, {counts['skip']} skip): "
                  + "; ".join(f"{c['name']}: {c['message']}" for c in warned))
        hints = [f"{c['title']}: {c['message']}" for c in warned]
        kind = "none"
    else:
        reason = f"pre-flight checks passed ({counts['pass']} pass, {counts['skip']} skip)"
        hints = []
        kind = "none"
    return Finding(kind=kind, reason=reason, values={"checks": summary}, hints=hints,
                   evidence={"checks": checks, "diagnosis": "preflight"},
                   stats={"status": worst(c["status"] for c in checks), **counts})
