"""What to run next for a replica departure: the cheapest dump that confirms it, and a replay of the op.

A departure is confirmed by bitwise equality, which md5 mode gives at almost no cost: a statistics dump
with ``summary_mode: md5`` records each tensor's CRC-32 and no tensor. :func:`departure_plan` plans it on
the replicated tensors the departure touched (its origin op, whose record holds the inputs, and the
replicated tensors that departed after it), on every rank of that TP/DP group, at the next steps of the
job. Where the run saved tensors (``task: tensor``), the plan's notes give the ``precnb repro`` command
that re-runs the departing op on its dumped inputs, to run on another device: with ``--replicas`` (the
group's other ranks) the script says whether the recomputation agrees with the departing rank's dumped
output or with its replicas', which confirms a device fault.

Examples
--------
>>> from precnb.analysis.findings import Finding
>>> f = Finding(kind="replica_mismatch", reason="r", step=1, rank=1, node="Torch.rsqrt.0.forward",
...             evidence={"departure": {"group": [0, 1], "dim": "tp", "node": "Torch.rsqrt.0.forward", "step": 1}})
>>> next_steps(f, [1, 2, 3])
[4, 5, 6]
"""

from __future__ import annotations

from typing import Any

import xarray as xr

__all__ = ["departure_plan", "next_steps"]

_STEPS_AHEAD = 3
_BYTES_PER_RECORD = 160  # an md5-mode leaf in dump.json: dtype, shape, four statistics and the CRC


def next_steps(finding: Any, steps: list[int], ahead: int = _STEPS_AHEAD) -> list[int]:
    """The *ahead* steps after the last one the run dumped (the job's next steps)."""
    last = max([int(s) for s in steps] + [int(finding.step)])
    return list(range(last + 1, last + 1 + ahead))


def departure_plan(finding: Any, ds: xr.Dataset, *, dump_path: str, source: str | None = None
                   ) -> dict[str, Any] | None:
    """The md5-mode dump of the replicated tensors of the departing group at the next steps (a plan dict).

    Parameters
    ----------
    finding : Finding
        A ``replica_mismatch`` finding carrying ``evidence["departure"]``
        (:func:`precnb.analysis.replicas.departures.check_departures`).
    ds : xarray.Dataset
        The run (ranks as dumped).
    dump_path : str
        ``dump_path`` written into the config.
    source : str, optional
        The run's path, for the ``precnb repro`` command of the notes.

    Returns
    -------
    dict or None
        The shape of :func:`precnb.analysis.findings.plan.plan_dump`'s result.
    """
    from precnb.analysis.findings.plan import _human, _selected, node_selector
    from precnb.naming import is_communication

    ev = finding.evidence.get("departure") if isinstance(finding.evidence, dict) else None
    if not ev:
        return None
    group, step = [int(r) for r in ev["group"]], int(ev["step"])
    nodes = [str(ev["node"])]
    for s in finding.suspects:  # the replicated tensors that departed after it, in that step and group
        n = str(s.get("node") or "")
        if s.get("step") == step and list(s.get("group") or []) == group and n and n not in nodes \
                and not n.startswith("Module.") and not is_communication(n):
            nodes.append(n)
    entries = list(dict.fromkeys(node_selector(n) for n in nodes))
    steps = next_steps(finding, [int(s) for s in ds["step"].values])
    mask = _selected(ds, entries, [])
    est = int(mask.sum()) * len(group) * len(steps) * _BYTES_PER_RECORD
    selected = sorted({str(n) for n in ds["node"].values[mask]})
    config: dict[str, Any] = {
        "task": "statistics", "dump_path": dump_path, "rank": group, "step": steps, "level": "mix",
        "async_dump": False, "statistics": {"scope": [], "list": entries, "data_mode": ["all"],
                                            "summary_mode": "md5"},
    }
    dim = str(ev.get("dim", "tp")).upper()
    notes = [f"md5 mode records each tensor's CRC-32 (bitwise) and no tensor: run it on the same job at the next "
             f"steps; the {dim} group {group} must agree on every CRC of these ops' inputs and outputs: a replica "
             "whose output CRC differs while its input CRCs agree is the faulty device again (compare the CRCs with "
             "`precnb replicas` on the new dump, or follow the device across jobs with `precnb devices`)",
             "widen step (or rerun after rescheduling the job onto other devices) to catch an intermittent fault"]
    tensor_run = str(ds.attrs.get("task", "")) == "tensor"
    source = source or (str(ds.attrs["source"]) if ds.attrs.get("source") else None)
    rank = int(finding.rank) if finding.rank is not None else group[-1]
    others = ",".join(str(r) for r in group if r != rank)
    repro = (f"precnb repro {source or 'RUN'} {ev['node']} --step {step} --rank {rank} --replicas {others} "
             "-o repro.py; then on another device: python repro.py --device npu:0 (or cuda:0, cpu): it re-runs the op "
             f"on rank {rank}'s dumped inputs, checks rank(s) {others} had the same inputs, and says whose dumped "
             "output it agrees with (the other side computed it wrongly)")
    if tensor_run:
        notes.append("the run saved tensors: re-run the departing op on its dumped inputs on another device: "
                     + repro)
    else:
        notes.append(f"to replay {ev['node']} on another device, dump its tensors once (`precnb plan --task tensor`), "
                     "then: " + repro.replace(source or "RUN", "TENSOR_DUMP", 1))
    where = f"step {', '.join(map(str, steps))}, rank {', '.join(map(str, group))}"
    summary = (f"task statistics (summary_mode md5), level mix, {where}, list {entries}: {len(selected)} recorded "
               f"node(s), about {_human(est)}")
    return {"config": config, "selects": {"list": entries, "modules": [], "nodes": selected[:200],
                                          "node_count": len(selected)},
            "estimated_bytes": est, "estimate": _human(est), "steps": steps, "ranks": group,
            "register_custom_api": None, "summary": summary, "notes": notes,
            "repro": repro if tensor_run else None}
