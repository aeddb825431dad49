"""The msprobe dump that confirms a loss spike's cause at its step (:meth:`Finding.plan`).

A tensor dump (level ``mix``) of only what the cause names, at the origin step and the spike
step: the batch inputs and the loss op of the rank that spiked (data); the parameter's module —
its forward, backward and ``parameters_grad`` — and the collective that reduces its gradient
(before and after), on the departing rank and one healthy replica (hardware); the optimizer op
that made the jump (optimizer); the op that overflowed and its module (numerics).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.findings.plan import DEFAULT_DUMP_PATH, node_selector
from precnb.analysis.spike._records import View

__all__ = ["spike_plan"]


def _module_entry(module: str, view: View | None) -> str:
    framework = str(view.ds.attrs.get("framework", "")).lower() if view is not None else ""
    return f"{'Cell' if framework in ('mindspore', 'mindtorch') else 'Module'}.{module}."


def _entries(cause: dict[str, Any], dump: View | None) -> tuple[list[str], list[str], list[str]]:
    """(list entries, modules, notes) of msprobe's ``tensor.list`` for one cause."""
    entries: list[str] = []
    modules: list[str] = []
    notes: list[str] = []
    node, module = cause.get("node"), cause.get("module")
    from_dump = dump is not None and cause.get("tensor") in dump.index
    kind = cause["cause"]
    if node and from_dump:
        entries.append(node_selector(str(node)))
    if module and module != "optimizer" and (kind in ("hardware", "numerics") or not from_dump):
        modules.append(str(module))
        entries.append(_module_entry(str(module), dump))
    if kind == "data" and dump is not None:
        from precnb.analysis.spike._series import dump_loss_label

        loss = dump_loss_label(dump.ds)
        if loss is not None:
            entries.append(node_selector(str(dump.node[dump.index[loss]])))
        notes.append("the tensors of the batch (token ids, labels) say which sample is out of distribution; the "
                     "statistics hold the whole batch as one tensor")
    if kind == "hardware" and dump is not None:
        post = next((p.post for p in dump.params() if p.name == cause.get("parameter") and p.post is not None), None)
        if post is not None:
            entries.append(node_selector(str(dump.node[post])))
        notes.append("compare the gradient before the reduce on the departing rank with the healthy replica's; rerun "
                     "the step on another device (or `precnb repro` the backward on the dumped inputs) to tell a "
                     "faulty device from a kernel bug")
    if kind == "optimizer" and dump is not None:
        wanted = set(cause.get("parameters") or [])
        for p in dump.params():
            if p.name in wanted and p.after is not None and len(entries) < 9:
                entries.append(node_selector(str(dump.node[p.after])))
    if kind == "optimizer":
        notes.append("the optimizer's scalar arguments (lr, alpha, value) are recorded with its ops: compare them "
                     "with the schedule's")
    return list(dict.fromkeys(entries)), modules, notes


def spike_plan(finding: Any, ds: xr.Dataset | None, *, dump_path: str = DEFAULT_DUMP_PATH, task: str = "tensor"
               ) -> dict[str, Any] | None:
    """The plan (the shape :func:`precnb.analysis.findings.plan.plan_dump` returns) for a loss-spike finding.

    *ds* is the run diagnosed (its statistics give the size estimate and the collective that
    reduces the parameter's gradient); the cause is the finding's first.
    """
    from precnb.analysis.findings.plan import _estimate, _human, _selected

    if not getattr(finding, "found", False) or finding.step is None:
        return None
    view = View(ds, "run") if ds is not None else None
    dump = view if view is not None and not view.monitor else None
    sp = int(finding.step)
    cause = None
    if finding.causes:
        cause = {**finding.causes[0], **{k: v for k, v in (finding.values.get("origin") or {}).items()
                                          if k not in finding.causes[0]}}
    all_ranks = view.ranks if view is not None else []
    entries: list[str]
    modules: list[str]
    if cause is None:
        entries, modules, notes = [], [], ["no cause found: dump every op at the spike step"]
        steps, ranks = sorted({sp - 1, sp} - {-1}), list(finding.values.get("spike", {}).get("ranks") or [])
    else:
        entries, modules, notes = _entries(cause, dump)
        steps = sorted({int(cause["step"]), sp})
        r = cause.get("rank")
        if r is None:
            ranks = all_ranks[:1]
        elif cause["cause"] == "hardware":
            ranks = [int(r), *[x for x in all_ranks if x != r][:1]]
        else:
            ranks = [int(r)]
    if view is not None and view.monitor:
        notes.insert(0, "planned from monitor output: run PrecisionDebugger with this config (the module's APIs "
                        "are dumped with it)")
    config: dict[str, Any] = {"task": task, "dump_path": dump_path, "rank": sorted(ranks), "step": steps,
                              "level": "mix", "async_dump": False,
                              task: {"scope": [], "list": entries, "data_mode": ["all"]}}
    if task == "statistics":
        config[task]["summary_mode"] = "statistics"
    nodes: list[str] = []
    est = 0
    where = f"step {', '.join(map(str, steps))}, rank {', '.join(map(str, sorted(ranks))) or 'all'}"
    head = f"task {task}, level mix, {where}, list {entries or '(everything)'}"
    if dump is None:  # monitor output (or no run): nothing recorded to count the nodes or the size from
        source = "monitor output" if view is not None else "no run"
        summary = f"{head}: nodes and size not known (planned from {source}: no msprobe dump was read to count them)"
    else:
        kinds = dump.ds["kind"].values
        mask = _selected(dump.ds, entries, modules) if entries else np.asarray(
            [str(k) != "monitor" for k in kinds], bool)  # (everything): every node the dump records
        nodes = sorted({str(n) for n in dump.ds["node"].values[mask]})
        est = _estimate(dump.ds, mask, steps, ranks)
        size = f"about {_human(est)}" if est > 0 else (  # never "about 0 B": a size the statistics cannot tell
            "size unknown (the statistics record no element count for them)" if mask.any() else
            "size unknown (none of them is recorded in the dump read)")
        what = f"every recorded node ({len(nodes)})" if not entries else f"{len(nodes)} recorded node(s)"
        summary = f"{head}: {what}, {size}"
    return {"config": config, "selects": {"list": entries, "modules": modules, "nodes": nodes[:200],
                                          "node_count": len(nodes)},
            "estimated_bytes": est, "estimate": _human(est) if est > 0 else "unknown", "steps": steps,
            "ranks": sorted(ranks), "register_custom_api": None, "summary": summary, "notes": notes}
