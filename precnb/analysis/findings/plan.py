"""Dump planner: the smallest msprobe ``config.json`` that confirms a finding (or closes its gap).

A statistics dump says *where*; a tensor dump of only that place, at only that step and rank,
says *what*, and lets the op be replayed alone. :func:`plan_dump` turns a finding into such a
config, valid for msprobe 26.x ``PrecisionDebugger(config_path=...)``::

    {"task": "tensor", "dump_path": "./precnb_confirm", "rank": [1], "step": [1], "level": "mix",
     "async_dump": false, "tensor": {"scope": [], "list": ["Custom.fused_attention.1."], "data_mode": ["all"]}}

``list`` entries follow msprobe's matching (a substring of the node name; at level ``mix`` a
module whose name contains an entry has every API inside it dumped): ``"Torch.sqrt.0."`` picks
that call's forward and backward records, ``"Module.blocks.1.attn."`` the module and everything it
runs. ``scope`` stays empty (msprobe defines it as a start/end pair of full node names). The size
estimate is Σ numel × dtype size of the selected tensors in the statistics dump.

Examples
--------
>>> node_selector("Functional.linear.7.backward")
'Functional.linear.7.'
>>> node_selector("Module.blocks.1.attn.Attention.forward.0")
'Module.blocks.1.attn.'
>>> dtype_size("torch.bfloat16"), dtype_size("Float32")
(2, 4)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from precnb.dtypes import dtype_size as _dtype_size
from precnb.naming import parse_node

__all__ = ["DEFAULT_DUMP_PATH", "attach_plans", "dtype_size", "generic_plan", "node_selector", "plan_dump"]

DEFAULT_DUMP_PATH = "./precnb_confirm"


def dtype_size(dtype: str) -> int:
    """Bytes per element of a dtype name (4 when unknown): :func:`precnb.dtypes.dtype_size`."""
    return _dtype_size(str(dtype))


def node_selector(node: str) -> str:
    """The msprobe ``list`` entry that selects *node* (API call: forward and backward; module: all of it)."""
    p = parse_node(node)
    if p.kind in ("module", "param_grad"):
        return f"{node.split('.', 1)[0]}.{p.module}."
    if p.call >= 0:
        return f"{p.api}.{p.call}."
    return node


def _module_selector(path: str, ds: xr.Dataset | None = None) -> str:
    prefix = "Module"
    if ds is not None and str(ds.attrs.get("framework", "")).lower() in ("mindspore", "mindtorch"):
        prefix = "Cell"
    return f"{prefix}.{path}."


def _selected(ds: xr.Dataset, entries: list[str], modules: list[str]) -> np.ndarray:
    nodes = np.asarray([str(n) for n in ds["node"].values], dtype=str)
    mods = np.asarray([str(m) for m in ds["module"].values])
    kinds = np.asarray([str(k) for k in ds["kind"].values])
    mask = np.zeros(len(nodes), bool)
    for e in entries:  # a substring anywhere in the node name (one ufunc per entry, not a loop over the nodes)
        mask |= np.char.find(nodes, e) >= 0
    for m in modules:
        mask |= (mods == m) | np.char.startswith(mods.astype(str), m + ".")
    return mask & (kinds != "monitor") if (kinds != "monitor").any() else mask


def _estimate(ds: xr.Dataset, mask: np.ndarray, steps: Sequence[int], ranks: Sequence[int]) -> int:
    if not mask.any() or "numel" not in ds:
        return 0
    have_s = {int(s): i for i, s in enumerate(ds["step"].values.tolist())}
    have_r = {int(r): i for i, r in enumerate(ds["rank"].values.tolist())}
    si = [have_s[int(s)] for s in steps if int(s) in have_s]
    ri = [have_r[int(r)] for r in ranks if int(r) in have_r]
    if not si or not ri:
        return 0
    ti = np.flatnonzero(mask)
    sizes = np.asarray([dtype_size(str(d)) for d in ds["dtype"].values[ti]])
    dims = ("step", "rank", "tensor")
    numel_v, present_v = ds["numel"].variable, ds["present"].variable
    if numel_v.dims == dims and present_v.dims == dims and isinstance(numel_v.data, np.ndarray) and isinstance(
            present_v.data, np.ndarray):  # in memory: index the arrays, not the dataset
        at = np.ix_(np.asarray(si, dtype=np.int64), np.asarray(ri, dtype=np.int64), ti)
        numel = np.where(present_v.data[at], np.maximum(numel_v.data[at], 0), 0)
    else:  # a lazily opened store: read only the cells selected
        sub = ds[["present", "numel"]].isel(step=si, rank=ri, tensor=ti)
        numel = np.where(sub["present"].values, np.maximum(sub["numel"].values, 0), 0)
    return int((numel * sizes).sum())


def _human(n: int) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} B"


def plan_dump(
    finding: Any,
    ds: xr.Dataset,
    *,
    dump_path: str = DEFAULT_DUMP_PATH,
    task: str | None = None,
) -> dict[str, Any] | None:
    """The msprobe config (and what it selects) that confirms *finding* on the next run of *ds*'s job.

    Parameters
    ----------
    finding : Finding
    ds : xarray.Dataset
        The run that shows the finding (its statistics give the size estimate).
    dump_path : str
        ``dump_path`` written into the config.
    task : {"tensor", "statistics"}, optional
        ``tensor`` saves the selected tensors (to confirm and replay); ``statistics`` re-dumps them
        only. Default: ``tensor``, except for a classified replica departure, whose cheapest confirmation
        is an md5-mode statistics dump of its group (:mod:`precnb.analysis.replicas.departure_plan`).

    Returns
    -------
    dict or None
        ``config`` (the msprobe config.json as a dict), ``selects`` (what it records: list
        entries, modules, node names), ``estimated_bytes`` and ``estimate`` (text), ``steps``,
        ``ranks``, ``register_custom_api`` (a line of Python to add, for a coverage gap),
        ``summary`` (one line) and ``notes``. None for a finding of kind ``none``.
    """
    if not getattr(finding, "found", False) or finding.step is None:
        return None
    from precnb.analysis import registry

    d = registry.lookup(finding.kind)
    own = d.finding.plan if d is not None else None
    if own is not None:  # a diagnosis that plans its own confirmation (e.g. a loss spike's cause)
        return own(finding, ds, dump_path=dump_path, **({"task": task} if task is not None else {}))
    return generic_plan(finding, ds, dump_path=dump_path, task=task or "tensor")


def generic_plan(finding: Any, ds: xr.Dataset, *, dump_path: str = DEFAULT_DUMP_PATH, task: str = "tensor",
                 steps: Sequence[int] | None = None, ranks: Sequence[int] | None = None, module: str | None = None,
                 node_notes: Sequence[str] = ()) -> dict[str, Any] | None:
    """The plan :func:`plan_dump` makes for a finding whose diagnosis has no plan of its own.

    A diagnosis's own ``plan`` may call it with what it knows better: the *steps* and *ranks* to dump
    (default: the finding's), a *module* to select instead of its node (a coverage gap's module comes
    first), and *node_notes* added when the plan selects the finding's node.
    """
    if not getattr(finding, "found", False) or finding.step is None:
        return None
    steps = list(steps) if steps is not None else [int(finding.step)]
    ranks = list(ranks) if ranks is not None else ([int(finding.rank)] if finding.rank is not None else [])
    entries: list[str] = []
    modules: list[str] = []
    notes: list[str] = []
    register = None
    gap = finding.gap
    if gap and gap.get("module"):
        modules.append(str(gap["module"]))
        entries.append(_module_selector(str(gap["module"]), ds))
        register = gap["capture"].get("register_custom_api")
        if register:
            notes.append("the op is not one msprobe hooks: add the register_custom_api line to the training "
                         "script (it cannot be set in config.json); the module entry in list also records the "
                         "low-risk APIs (view, transpose, ...) that risk_level filters out otherwise")
    elif module:
        modules.append(str(module))
        entries.append(_module_selector(modules[-1], ds))
    elif finding.node:
        kind = str(ds["kind"].values[list(ds["tensor"].values).index(finding.tensor)]) \
            if finding.tensor in ds.indexes["tensor"] else ""
        if kind == "monitor" and finding.module:
            modules.append(str(finding.module))
            entries.append(_module_selector(str(finding.module), ds))
            notes.append("planned from monitor output: run PrecisionDebugger with this config (the module's APIs "
                         "are dumped with it)")
        else:
            entries.append(node_selector(finding.node))
            notes.extend(node_notes)
    if not entries:
        return None
    mask = _selected(ds, entries, modules)
    fvd = finding.evidence.get("first_value_difference") if isinstance(finding.evidence, dict) else None
    if not mask.any() and fvd and fvd.get("node"):  # a node of the other run only: confirm where values differ
        notes.insert(0, f"{finding.node} is not recorded in this run; the plan dumps the first value difference "
                        f"({fvd['node']}) instead")
        entries = [node_selector(str(fvd["node"]))]
        mask = _selected(ds, entries, modules)
    est = _estimate(ds, mask, steps, ranks)
    if gap:  # the missing op's own tensors, once registered: its forward operands and their gradients
        est += 2 * sum(int(np.prod(_shape(t["shape"]))) * dtype_size(t["dtype"])
                       for t in [*gap.get("region_inputs", []), *gap.get("region_outputs", [])])
    selected_nodes = sorted({str(n) for n in ds["node"].values[mask]})
    config: dict[str, Any] = {
        "task": task, "dump_path": dump_path, "rank": ranks, "step": steps, "level": "mix", "async_dump": False,
        task: {"scope": [], "list": entries, "data_mode": ["all"]},
    }
    if task == "statistics":
        config[task]["summary_mode"] = "statistics"
    where = f"step {', '.join(map(str, steps))}, rank {', '.join(map(str, ranks))}"
    size = f"about {_human(est)}" if est > 0 else (  # never "about 0 B": a size the statistics cannot tell
        "size unknown (the statistics record no element count for them)" if mask.any() else
        "size unknown (none of them is recorded at that step and rank)")
    summary = (f"task {task}, level mix, {where}, list {entries}: {len(selected_nodes)} recorded node(s)"
               + (" + the uncaptured op once registered" if gap else "") + f", {size}")
    return {"config": config, "selects": {"list": entries, "modules": modules, "nodes": selected_nodes[:200],
                                          "node_count": len(selected_nodes)},
            "estimated_bytes": est, "estimate": _human(est) if est > 0 else "unknown", "steps": steps, "ranks": ranks,
            "register_custom_api": register, "summary": summary, "notes": notes}


def _shape(text: str) -> list[int]:
    try:
        return [int(x) for x in str(text).strip("[]").split(",") if x.strip()] or [1]
    except ValueError:
        return [0]


def attach_plans(findings: Sequence[Any], ds: xr.Dataset | None, **kw: Any) -> None:
    """Set ``dump_plan`` on every found finding that has none (the pipeline's last step)."""
    if ds is None:
        return
    for f in findings:
        if getattr(f, "found", False) and f.dump_plan is None:
            try:
                f.dump_plan = plan_dump(f, ds, **kw)
            except (KeyError, ValueError, IndexError):  # a finding on names this run lacks: no plan
                f.dump_plan = None
