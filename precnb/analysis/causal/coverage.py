"""Coverage gaps: a bad value first seen in a captured tensor whose producer is not in the dump.

When a NaN (or a difference) first shows in an *input* — the gradient entering a backward node,
or a forward input — nothing recorded created it: the op that did is missing from the dump (a
custom op / kernel msprobe does not hook, a low-risk API filtered out by ``risk_level``, code
outside the dumped region, or a level that records modules only). :func:`find_gap` names that
uncaptured region from the data flow (:mod:`precnb.analysis.causal.dataflow`):

* **backward** — the bad tensor is ``X.backward.input.i``, the gradient of ``X.forward``'s
  ``output.i``. In the forward, that output went into an op no captured input matches; the
  first later forward input no captured output produced is where the region ends. The region's
  module is the innermost module enclosing both ends; the gradient entering the region (the
  backward output of that re-entry op) is the last clean captured tensor.
* **forward** — the bad tensor is an input no captured output produced; the region starts at the
  captured outputs before it (in the same module) that no captured op consumed.

The gap says how to capture the region: register the op (``PrecisionDebugger.register_custom_api``)
when the dump already records APIs, or dump at level ``mix`` with the module in ``list``.

Examples
--------
>>> import precnb
>>> ds = precnb.open_run(precnb.sample_path("custom_op_gap"))  # doctest: +SKIP
>>> find_gap(ds, step=1, rank=1, tensor="Functional.linear.7.backward.input.0")["module"]  # doctest: +SKIP
'blocks.1.attn'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.causal.dataflow import StepFlow, module_of_node, to_backward, to_forward

__all__ = ["find_gap", "gap_hint"]


def _ancestor_in(flow: StepFlow, node: str, module_node: str) -> bool:
    return module_node in flow.ancestors(node)


def _orphan_inputs_after(flow: StepFlow, seq: int, bad: Callable[[int], bool] | None = None) -> list[int]:
    """Forward API inputs after *seq* that no captured output produced, in execution order."""
    cand = np.flatnonzero(flow.forward_api("input") & flow.matchable & (flow.seq > seq))
    cand = cand[np.argsort(flow.seq[cand], kind="stable")]
    return [int(k) for k in cand if flow.is_new_input(int(k))]


def _orphan_outputs_before(flow: StepFlow, seq: int, module_node: str | None) -> list[int]:
    """Forward API outputs before *seq* (inside *module_node*) that no captured input consumed."""
    cand = np.flatnonzero(flow.forward_api("output") & flow.matchable & (flow.seq < seq))
    cand = cand[np.argsort(flow.seq[cand], kind="stable")]
    out = []
    for k in cand:
        node = str(flow.nodes[k])
        if module_node is not None and not _ancestor_in(flow, node, module_node):
            continue
        if not [c for c in flow.consumers(int(k)) if flow.seq[c] < seq]:
            out.append(int(k))
    return out


def _module_info(flow: StepFlow, module_node: str | None) -> dict[str, Any]:
    if not module_node:
        return {"module": None, "module_node": None, "module_backward": None}
    info: dict[str, Any] = {"module": module_of_node(module_node) or None, "module_node": module_node}
    bwd = to_backward(module_node)
    ins, outs = flow.tensors_of(bwd, "input"), flow.tensors_of(bwd, "output")
    if ins or outs:
        info["module_backward"] = {
            "node": bwd,
            "grad_in_clean": all(flow.finite(k) for k in ins) if ins else None,
            "grad_out_clean": all(flow.finite(k) for k in outs) if outs else None,
        }
    else:
        info["module_backward"] = None
    return info


def _capture(flow: StepFlow, level: str, module_node: str | None, frames: list[str]) -> dict[str, Any]:
    """How to record the region on the next run."""
    where = "; ".join(f for f in frames if f)
    out: dict[str, Any] = {"level": "mix", "list": [], "register_custom_api": None}
    module = module_of_node(module_node) if module_node else ""
    if module_node and module:
        # "Module.blocks.1.attn." : the trailing dot keeps "blocks.1.attn_norm" and "blocks.11" out
        out["list"] = [f"{module_node.split('.', 1)[0]}.{module}."]
    if level in ("L0",):
        out["why"] = ("the dump is at level L0 (modules only): no API inside a module is recorded; dump at level "
                      "mix with the module in list")
    else:
        out["why"] = ("the dump records APIs (level " + (level or "mix") + ") but not this op: either a low-risk API "
                      "that risk_level filters out (view, transpose, Tensor.to, ...) — dumping the module with list "
                      "records those — or not a torch API msprobe hooks (a custom op / fused kernel): register it")
        out["register_custom_api"] = (
            "PrecisionDebugger.register_custom_api(<module or class holding the op>, \"<op function name>\", "
            "api_prefix=\"Custom\")  # after PrecisionDebugger(...), before start()"
            + (f"; the op is called between {where}" if where else ""))
    return out


def find_gap(
    ds: xr.Dataset,
    *,
    step: int,
    rank: int,
    tensor: str,
    bad: Callable[[StepFlow, int], bool] | None = None,
    what: str = "NaN",
) -> dict[str, Any] | None:
    """The uncaptured region that produced the bad input *tensor* at (*step*, *rank*), or None.

    Parameters
    ----------
    ds : xarray.Dataset
        One run (the one where *tensor* is bad).
    step, rank : int
    tensor : str
        The first bad tensor (an input of a backward or forward node).
    bad : callable, optional
        ``bad(flow, j)``: whether tensor *j* is bad (default: a non-finite statistic).
    what : str
        What "bad" is, for the text ("NaN", "difference").

    Returns
    -------
    dict or None
        ``direction``, ``first_bad`` (tensor description), ``gradient_of`` (backward: the forward
        output whose gradient it is), ``last_clean`` (captured tensors entering the region, all
        clean), ``region_inputs`` / ``region_outputs`` (forward tensors at its boundary),
        ``module``, ``module_node``, ``module_backward``, ``source`` (user stack frames at
        both ends), ``missing`` (one sentence), ``capture`` (how to record it: ``level``,
        ``list``, ``register_custom_api``, ``why``). None when *tensor* is not an input or its
        producer is in the dump.
    """
    if tensor not in ds.indexes["tensor"]:
        return None
    flow = StepFlow(ds, step, rank)
    j = flow.index[tensor]
    if flow.roles[j] != "input" or flow.kinds[j] not in ("api", "module"):
        return None
    is_bad = (lambda k: bad(flow, k)) if bad is not None else (lambda k: not flow.finite(k))
    node = str(flow.nodes[j])
    level = str(ds.attrs.get("level", "") or "")
    if flow.directions[j] == "backward":
        gap = _backward_gap(flow, j, node, is_bad)
    else:
        gap = _forward_gap(flow, j, node, is_bad)
    if gap is None:
        return None
    frames = [gap.pop("_from_frame", None), gap.pop("_to_frame", None)]
    gap["source"] = [f for f in frames if f]
    gap["capture"] = _capture(flow, level, gap.get("module_node"), gap["source"])
    gap["step"], gap["rank"] = int(step), int(rank)
    gap["first_bad"] = flow.describe(j)
    gap["what"] = what
    return gap


def _region_end(flow: StepFlow, start_seq: int, anchor: str) -> tuple[int | None, str | None]:
    """The first later forward input no captured output produced, and the module enclosing both ends."""
    for k in _orphan_inputs_after(flow, start_seq):
        module = flow.common_module([anchor, str(flow.nodes[k])])
        if module is not None:
            return k, module
    return None, None


def _module_making_it(flow: StepFlow, node: str, is_bad: Callable[[int], bool]) -> str | None:
    """The innermost module enclosing *node* whose backward record has a clean incoming gradient and a bad one out."""
    for m in flow.ancestors(node):
        bwd = to_backward(m)
        ins, outs = flow.tensors_of(bwd, "input"), flow.tensors_of(bwd, "output")
        if ins and outs and not any(is_bad(i) for i in ins) and any(is_bad(o) for o in outs):
            return m
    return None


def _backward_gap(flow: StepFlow, j: int, node: str, is_bad: Callable[[int], bool]) -> dict[str, Any] | None:
    fwd = to_forward(node)
    slot = flow.labels[j].rsplit(".", 1)[-1]
    out_label = f"{fwd}.output.{slot}"
    k = flow.index.get(out_label)
    if k is None or not flow.present[k]:
        return None
    consumers = flow.consumers(k)
    # a captured consumer whose gradient w.r.t. this input is bad explains it: no gap
    for c in consumers:
        g = flow.grad_of_input(c)
        if g is not None and is_bad(g):
            return None
    end, module_node = _region_end(flow, int(flow.seq[k]), fwd)
    if module_node is None:  # no re-entry found: the innermost module whose backward turns clean into bad
        module_node = _module_making_it(flow, fwd, is_bad)
    inputs = _orphan_outputs_before(flow, int(flow.seq[end]) if end is not None else int(flow.seq.max()) + 1,
                                    module_node) if module_node else [k]
    if k not in inputs:
        inputs = [*inputs, k]
    last_clean: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    to_frame = None
    if end is not None:
        outputs.append(flow.describe(end))
        g = flow.grad_of_input(end)
        if g is not None and not is_bad(g):
            last_clean.append(flow.describe(g))
        to_frame = flow.frame(str(flow.nodes[end]))
    info = _module_info(flow, module_node)
    where = info["module"] or "the model"
    consumed = ("is consumed by no captured op" if not consumers else
                f"is also read by captured op(s) {', '.join(sorted({str(flow.nodes[c]) for c in consumers})[:3])} "
                "whose gradients are clean")
    missing = (f"the producer of the gradient of {out_label} (shape {flow.shapes[k]}): in the forward this output "
               f"{consumed}; what runs after "
               + ", ".join(sorted({str(flow.nodes[i]) for i in inputs})[:4])
               + (f" and before {flow.nodes[end]}" if end is not None else "")
               + f" inside {where} (forward and backward) is not in the dump")
    return {"direction": "backward", "gradient_of": out_label, "missing": missing, "last_clean": last_clean,
            "region_inputs": [flow.describe(i) for i in sorted(inputs, key=lambda i: flow.seq[i])],
            "region_outputs": outputs, **info,
            "_from_frame": flow.frame(str(flow.nodes[max(inputs, key=lambda i: flow.seq[i])])),
            "_to_frame": to_frame}


def _forward_gap(flow: StepFlow, j: int, node: str, is_bad: Callable[[int], bool]) -> dict[str, Any] | None:
    if not flow.is_new_input(j):
        return None
    before = _orphan_outputs_before(flow, int(flow.seq[j]), None)
    # the nearest orphan outputs sharing a module with the bad input
    module_node = None
    chosen: list[int] = []
    for k in reversed(before):
        m = flow.common_module([node, str(flow.nodes[k])])
        if m is None:
            continue
        if module_node is None:
            module_node = m
        if m == module_node:
            chosen.append(k)
    if module_node is None:
        return None
    clean = [k for k in chosen if not is_bad(k)]
    info = _module_info(flow, module_node)
    missing = (f"the producer of {flow.labels[j]} (shape {flow.shapes[j]}): no captured output has its "
               f"statistics; what runs after "
               + ", ".join(sorted({str(flow.nodes[k]) for k in chosen})[:4])
               + f" and before {node} inside {info['module'] or 'the model'} are not in the dump")
    last = max(chosen, key=lambda k: flow.seq[k]) if chosen else None
    return {"direction": "forward", "gradient_of": None, "missing": missing,
            "last_clean": [flow.describe(k) for k in sorted(clean, key=lambda k: flow.seq[k])],
            "region_inputs": [flow.describe(k) for k in sorted(chosen, key=lambda k: flow.seq[k])],
            "region_outputs": [flow.describe(j)], **info,
            "_from_frame": flow.frame(str(flow.nodes[last])) if last is not None else None,
            "_to_frame": flow.frame(node)}


def gap_hint(gap: dict[str, Any]) -> str:
    """One line for a finding's hints (the gap itself carries the detail)."""
    cap = gap["capture"]
    how = f"dump level mix with list {cap['list']} in tensor mode"
    if cap.get("register_custom_api"):
        how += (" (it also records low-risk APIs such as Tensor.to / view) and, if the op is a custom op or "
                "kernel, register it with PrecisionDebugger.register_custom_api")
    where = f" (gradient of {gap['gradient_of']})" if gap.get("gradient_of") else ""
    return (f"coverage gap in {gap.get('module') or 'the model'}: {gap['what']} first shows in "
            f"{gap['first_bad']['tensor']}{where}, produced by an op msprobe did not capture; to capture it, "
            f"{how} (see `precnb plan`)")
