"""What the pipeline adds to every finding after its diagnosis: gap, ratio evidence, dump plan.

* a **first divergence** whose first differing tensor is an input no captured op produced gets
  its coverage gap (:func:`precnb.analysis.causal.coverage.find_gap`, "bad" = differs from the baseline);
* a first divergence whose first *value* difference has norms in an integer ratio gets the ratio
  hint even when a structural difference is reported first (e.g. the missing ``Tensor.div_``
  of gradients summed, not averaged);
* a finding whose tensor label names another op on other ranks (their call counters are shifted
  by an op one rank runs and the others do not) says so (:func:`label_elsewhere`), so that no one
  reads the other ranks' module, shape or stack as the finding's;
* every found finding gets its msprobe dump plan (:func:`precnb.analysis.findings.plan.plan_dump`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.findings.evidence import label_elsewhere
from precnb.analysis.findings.plan import attach_plans

__all__ = ["enrich", "integer_ratio_hint", "label_elsewhere_hint", "origin_ratio_hint"]


def _value_difference(f: Any) -> tuple[str | None, int | None, int | None]:
    """(tensor, baseline step, rank) of the first value difference of a divergence finding."""
    fvd = f.evidence.get("first_value_difference") if isinstance(f.evidence, dict) else None
    if fvd:
        return fvd.get("tensor"), fvd.get("step"), fvd.get("rank")
    return f.tensor, f.step, f.rank


def integer_ratio_hint(nb: np.ndarray, nt: np.ndarray, world_size: int, names: tuple[str, str], *,
                       min_count: int = 1, what: str = "differing tensors have norms") -> str | None:
    """Norms *nt* / *nb* (target / baseline) mostly in one integer ratio k >= 2 (within 1%); k = world size says DP.

    Examples
    --------
    >>> integer_ratio_hint(np.array([1.0, 2.0]), np.array([4.0, 8.0]), 4, ("baseline", "target"))[:46]
    '2 of 2 differing tensors have norms exactly 4×'
    """
    nb, nt = np.asarray(nb, float), np.asarray(nt, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = np.isfinite(nb) & np.isfinite(nt) & (np.abs(nb) > 0) & (np.abs(nt) > 0)
    if ok.sum() < min_count:
        return None
    ratio = nt[ok] / nb[ok]
    for inverse in (False, True):
        r = 1 / ratio if inverse else ratio
        k = round(float(np.median(r)))
        if k < 2:
            continue
        near = np.abs(r - k) <= 0.01 * k
        if near.mean() < 0.5:
            continue
        big, small = (names[0], names[1]) if inverse else (names[1], names[0])
        msg = f"{int(near.sum())} of {int(ok.sum())} {what} exactly {k}× larger in {big} than in {small}"
        if k == world_size:
            msg += (f"; {k} is the data-parallel world size: gradients summed, not averaged "
                    "(missing division by world size after the all-reduce)")
        return msg
    return None


def origin_ratio_hint(base: xr.Dataset, targ: xr.Dataset, *, node: str, step: int, target_step: int,
                      names: tuple[str, str] = ("baseline", "target")) -> str | None:
    """Norms of *node*'s tensors (every rank, at *step*) in one integer ratio target/baseline, e.g. the DP size."""
    if step not in base["step"].values or target_step not in targ["step"].values:
        return None
    mine = np.asarray([str(n) for n in targ["node"].values]) == node
    labels = [t for t in targ["tensor"].values[mine] if t in base.indexes["tensor"]]
    if not labels:
        return None
    ranks = [r for r in targ["rank"].values if r in base["rank"].values]
    nb = base["norm"].sel(step=step, rank=ranks, tensor=labels).values
    nt = targ["norm"].sel(step=target_step, rank=ranks, tensor=labels).values
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(nb) & np.isfinite(nt) & (np.abs(nb) > 0) & (np.abs(nt) > 0)
        ok &= np.abs(nt - nb) > 1e-6 * np.abs(nb)  # the tensors that differ
    if not ok.any():
        return None
    msg = integer_ratio_hint(nb[ok], nt[ok], int(targ.sizes["rank"]), names, what="differing tensor norms are")
    return f"at the first value difference ({node}, step {step}) {msg}" if msg else None


def _divergence_gap(f: Any, base: xr.Dataset, targ: xr.Dataset) -> dict[str, Any] | None:
    from precnb.analysis.causal.coverage import find_gap
    from precnb.analysis.causal.dataflow import StepFlow

    tensor, step, rank = _value_difference(f)
    if tensor is None or step is None or rank is None or tensor not in targ.indexes["tensor"]:
        return None
    tstep = int(f.values.get("target_step", step)) if "target_step" in f.values else int(step)
    if tstep not in targ["step"].values or step not in base["step"].values:
        return None
    rtol = float(f.values.get("rtol") or (f.values.get("first_value_difference") or {}).get("rtol") or 1e-4)
    bflow = StepFlow(base, int(step), int(rank))

    def differs(flow: StepFlow, j: int) -> bool:
        k = bflow.index.get(flow.labels[j])
        if k is None or not bflow.present[k]:
            return False
        a, b = flow.stats[j], bflow.stats[k]
        both = np.isfinite(a) & np.isfinite(b)
        if (np.isfinite(a) != np.isfinite(b)).any():
            return True
        scale = np.maximum(np.abs(b), 1e-30)
        return bool((np.abs(a - b)[both] > rtol * scale[both]).any())

    return find_gap(targ, step=tstep, rank=int(rank), tensor=str(tensor), bad=differs, what="difference")


def label_elsewhere_hint(tensor: str, elsewhere: Sequence[dict[str, Any]], *, rank: int) -> str:
    """One sentence: on which ranks the label *tensor* names another op, and which one.

    Examples
    --------
    >>> label_elsewhere_hint("Torch.sqrt.0.forward.output.0", [{"module": "blocks.0.attn_norm", "shape": "[]",
    ...                      "parent": "", "ranks": [0], "steps": [0, 1]}], rank=1)[:60]
    'Torch.sqrt.0.forward.output.0 names another op on rank 0 (mo'
    """
    parts = []
    for g in elsewhere[:3]:
        ranks = ", ".join(str(r) for r in g["ranks"][:8]) + ("…" if len(g["ranks"]) > 8 else "")
        parts.append(f"rank{'s' if len(g['ranks']) > 1 else ''} {ranks} (module {g['module'] or '—'}, "
                     f"shape {g['shape'] or '—'})")
    return (f"{tensor} names another op on {'; '.join(parts)} than on rank {rank}: the ranks' call counters "
            "differ (one rank runs an op the others do not), so compare ranks by their own records (module, "
            "shape, stack), not by label")


def _note_label_elsewhere(f: Any, target: xr.Dataset) -> None:
    if f.tensor is None or f.step is None or f.rank is None or "run" in target.dims:
        return
    step = int(f.values.get("target_step", f.step)) if isinstance(f.values, dict) else int(f.step)
    if step not in target.indexes["step"] or int(f.rank) not in target.indexes["rank"]:
        return
    other = label_elsewhere(target, str(f.tensor), step=step, rank=int(f.rank))
    if other:
        f.evidence["label_elsewhere"] = other
        f.hints.append(label_elsewhere_hint(str(f.tensor), other, rank=int(f.rank)))


def divergence_evidence(f: Any, target: xr.Dataset, baseline: xr.Dataset) -> None:
    """The first divergence's evidence from both runs (its ``finding.enrich`` hook): coverage gap, ratio hint."""
    from precnb.analysis.causal.coverage import gap_hint

    if "shifted_calls" in f.evidence and "first_value_difference" not in f.evidence:
        return  # a call made in one run only, no value difference (precnb.analysis.divergence.shifted)
    try:
        if f.gap is None:
            f.gap = _divergence_gap(f, baseline, target)
            if f.gap is not None:
                f.hints.insert(0, gap_hint(f.gap))
        if not any(("×" in h and "larger in" in h) or "× those in" in h for h in f.hints):
            tensor, step, _rank = _value_difference(f)
            node = str(target["node"].values[list(target["tensor"].values).index(tensor)]) \
                if tensor in target.indexes["tensor"] else None
            fvd = f.values.get("first_value_difference") or f.values
            tstep = int(fvd.get("target_step", step)) if step is not None else None
            if node and step is not None and tstep is not None:
                h = origin_ratio_hint(baseline, target, node=node, step=int(step), target_step=tstep)
                if h:
                    f.hints.insert(0, h)
    except (KeyError, ValueError, IndexError):  # evidence is best effort; the finding stands
        pass


NO_GRADS = ("parameter gradients were not captured (the dump holds no parameters_grad records: msprobe records "
            "them at level mix or L0, not at L1)")


def missing_gradients(f: Any, target: xr.Dataset) -> dict[str, Any] | None:
    """What a first divergence at an input no recorded op produced cannot show when the dump has no gradients.

    An input that differs before any recorded op changed it, at a step after the first, is often a parameter
    that the previous step's gradient or update changed; at level L1 msprobe records no ``parameters_grad``, so
    the gradient that departed is not in the dump. Returns ``{"why", "module", "steps", "text"}`` (None when
    the finding is not such an input or the dump has gradients).

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> from precnb.analysis.findings import Finding
    >>> missing_gradients(Finding(kind="none", reason=""), empty_dataset()) is None
    True
    """
    if not getattr(f, "found", False) or f.step is None or not f.tensor or f.tensor not in target.indexes["tensor"]:
        return None
    if "an input differs before any recorded op changed it" not in str(f.reason):
        return None
    if (target["kind"].values == "param_grad").any():
        return None
    steps = [int(s) for s in target["step"].values]
    step = int(f.step)
    module = str(f.module or "") or None
    where = f"dump level mix for {module}" if module else "dump level mix (the module that owns this input in list)"
    before = [s for s in steps if s < step]
    at = [before[-1], step] if before else [step]
    text = (f"{NO_GRADS}: the difference in {f.tensor} may come from a parameter's gradient or its update, which "
            f"this dump cannot show; {where} at step(s) {', '.join(map(str, at))} to see which gradient departs")
    return {"why": NO_GRADS, "module": module, "steps": at, "text": text}


def _plan_missing_gradients(f: Any, target: xr.Dataset, missing: dict[str, Any]) -> None:
    """The finding's plan asks for what the dump lacks: level mix over the module, at the steps that show it."""
    from precnb.analysis.findings.plan import DEFAULT_DUMP_PATH, generic_plan

    steps, ranks = missing["steps"], ([int(f.rank)] if f.rank is not None else [])
    plan = generic_plan(f, target, task="statistics", steps=steps, module=missing["module"]) \
        if missing["module"] else None
    if plan is None:  # no module names the owner (an L1 dump has no module tree): every module's gradients
        config = {"task": "statistics", "dump_path": DEFAULT_DUMP_PATH, "rank": ranks, "step": steps, "level": "mix",
                  "async_dump": False, "statistics": {"scope": [], "list": [], "data_mode": ["all"],
                                                      "summary_mode": "statistics"}}
        plan = {"config": config, "selects": {"list": [], "modules": [], "nodes": [], "node_count": 0},
                "estimated_bytes": 0, "estimate": "unknown", "steps": steps, "ranks": ranks,
                "register_custom_api": None,
                "summary": (f"task statistics, level mix, step {', '.join(map(str, steps))}, rank "
                            f"{', '.join(map(str, ranks))}, every module (no module tree names the input's owner)"),
                "notes": []}
    plan["notes"].insert(0, missing["text"])
    plan["summary"] = "to capture parameter gradients: " + plan["summary"]
    f.dump_plan = plan


def note_global_expert(f: Any, target: xr.Dataset) -> str | None:
    """A finding inside an expert of an expert-parallel run: its module under the global expert index (in place).

    msprobe names experts by their local index on each EP rank (``local_experts.0`` on EP rank 1 is global expert
    2 with two experts per rank); ``evidence["global_module"]`` names the whole model's module, without the model
    chunk prefix. Returns it (None when the finding is not inside an expert or the run is not expert-parallel).
    """
    import re

    if not f.module or f.rank is None or "run" in target.dims or "global_module" in f.evidence:
        return None
    m = re.match(r"^(?:\d+\.)?(?P<head>.*?experts\.(?:local_experts\.)?)(?P<local>\d+)(?P<tail>(?:\..*)?)$",
                 str(f.module))
    if m is None or int(f.rank) not in {int(r) for r in target["rank"].values}:
        return None
    from precnb.analysis.layout.infer import infer_layout

    layout = infer_layout(target).layout
    if layout is None or layout.ep <= 1:
        return None
    rank = int(f.rank)
    i = [int(r) for r in target["rank"].values].index(rank)
    container = m.group("head")
    present: list[bool] = np.asarray(target["present"].values[:, i, :].any(axis=0), bool).tolist()
    held = {int(x.group(1)) for t, ok in zip(target["tensor"].values.tolist(), present, strict=True)
            if ok and (x := re.search(re.escape(container) + r"(\d+)\.", str(t)))}
    per_rank = len(held) or 1
    glob = layout.expert_owner(rank, int(m.group("local")), per_rank)
    name = f"{container}{glob}{m.group('tail')}"
    f.evidence["global_module"] = name
    f.evidence["global_expert"] = glob
    return name


def note_starved_experts(f: Any, target: xr.Dataset) -> list[dict[str, Any]]:
    """Experts that received no token at the finding's step, beside a finding that involves one (in place).

    The finding's evidence gets ``starved_experts`` (rows of :func:`precnb.analysis.experts.starved_experts`) and,
    when its module is inside one of them on its rank, a first hint naming it ("expert 2 of decoder.layers.1
    (local_experts.0 on rank 1) received 0 tokens at step 1"). Returns the rows.

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> from precnb.analysis.findings import Finding
    >>> note_starved_experts(Finding(kind="none", reason=""), empty_dataset())
    []
    """
    from precnb.analysis.experts import describe_starved, expert_of, starved_experts

    if f.step is None or "run" in target.dims or "starved_experts" in f.evidence:
        return []
    rows = starved_experts(target, steps=[int(f.step)])
    if not rows:
        return []
    from precnb.analysis.layout.infer import infer_layout

    layout = infer_layout(target).layout
    if layout is not None and layout.ep > 1:
        rows = starved_experts(target, layout, steps=[int(f.step)])
    f.evidence["starved_experts"] = rows
    mine = expert_of(str(f.module or "")) if f.module else None
    hit = [r for r in rows if mine is not None and (r["layer"], r["local"]) == mine
           and (f.rank is None or r["rank"] == int(f.rank))]
    if hit:
        f.hints.insert(0, f"{describe_starved(hit[0])}: an expert with no token runs on empty tensors (null "
                          "statistics); a division by its token count there is 0/0 = NaN")
    else:
        f.hints.append("experts with no token at this step: " + "; ".join(describe_starved(r) for r in rows[:4]))
    return rows


def enrich(findings: Sequence[Any], target: xr.Dataset | None, baseline: xr.Dataset | None = None) -> None:
    """Add per-rank label notes, each diagnosis's own evidence from both runs and the dump plan (in place)."""
    from precnb.analysis.registry import lookup

    for f in findings:
        if not getattr(f, "found", False):
            continue
        if target is not None:
            _note_label_elsewhere(f, target)
        d = lookup(f.kind)
        if d is not None and d.finding.enrich is not None and target is not None and baseline is not None \
                and "run" not in target.dims:
            d.finding.enrich(f, target, baseline)
    attach_plans(findings, target)
    if target is None or "run" in target.dims:
        return
    from precnb.analysis.findings.optimizer import note_optimizer_parameter

    for f in findings:
        if getattr(f, "found", False):
            note_global_expert(f, target)
            note_starved_experts(f, target)
            note_optimizer_parameter(f, target)
        missing = missing_gradients(f, target) if getattr(f, "found", False) else None
        if missing is not None:  # the finding says what the dump could not show, and the plan asks for it
            f.evidence["missing_records"] = missing
            f.hints.insert(0, missing["text"])
            _plan_missing_gradients(f, target, missing)
