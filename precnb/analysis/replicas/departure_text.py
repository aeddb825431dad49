"""The words of a replica departure: its reason and what was set aside (:func:`check_departures`' text)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["aside_text", "departure_reason"]


def aside_text(a: Mapping[str, Any]) -> str:
    """One line for a record set aside by the departure check (what, where, why)."""
    where = a.get("node") or ((a.get("examples") or [{}])[0].get("tensor")) or "?"
    return f"set aside: {where}" + (f" at step {a['step']}" if "step" in a else "") + f": {a.get('why', '')}"


def departure_reason(ev: dict[str, Any], later: int, later_steps: list[int]) -> str:
    """The finding's reason for a classified departure *ev* and the *later* mismatches that follow from it."""
    g = ev["group"]
    dim = ev["dim"].upper()
    judge = {"baseline": "the clean run", "own_records": "a check of each rank's own records"}.get(ev["decided_by"],
                                                                                     "the majority")
    who = (f"rank {ev['wrong_side'][0]} is wrong: the other copies are, bit for bit, a value identical on every "
           "rank of the group at this step" if ev["wrong_side"] and ev["decided_by"] == "replicated_copy" else
           f"rank {ev['wrong_side'][0]} is wrong ({judge} decides)" if ev["wrong_side"] else
           f"ranks {g[0]} and {g[1]} disagree; a pair cannot say which side is wrong (both are candidates)"
           if len(g) == 2 else f"ranks {ev['departing_ranks']} depart")
    if ev["inputs_identical"]:
        if ev["scalar_args_identical"]:
            ins = ("its inputs (tensors and scalar arguments) are identical" if ev["tensor_inputs_identical"] else
                   "it has no tensor input and its scalar arguments are identical")
        elif ev["tensor_inputs_identical"]:
            ins = "its tensor inputs are identical (scalar arguments not read)"
        else:
            ins = "it has no tensor input (scalar arguments not read)"
        what = {"unsynchronised_seed": "a random op outside any model-parallel RNG region: an unsynchronised seed",
                "compute_fault": "a compute fault on that device, or a non-deterministic kernel"}[ev["cause"]]
        head = f"{ev['tensor']} departs across {dim} replicas {g} at step {ev['step']} while {ins}: {what}"
    elif ev["decided_by"] == "replicated_copy" and not ev.get("inherited_from"):
        head = (f"{ev['tensor']} departs across {dim} replicas {g} at step {ev['step']}: on the other ranks it is a "
                "value the whole group holds identically (a collective's result, copied), on this one it is not: "
                "changed after the collective made the copies")
        who = f"rank {ev['wrong_side'][0]} departs"
    elif ev.get("own_records"):  # created where it is recorded: the rank's own records disagree
        head = (f"{ev['tensor']} departs across {dim} replicas {g} at step {ev['step']}: {ev['own_records']} "
                "(the gradient was changed after the backward pass computed it)")
    else:
        src = ev.get("inherited_from")
        role = {"grad": "a parameter gradient", "input": "an input"}.get(ev["role"], f"a {ev['role']}")
        what = "its inputs already differ" if ev["role"] == "output" else f"it is {role}, not an op's output"
        head = (f"{ev['tensor']} departs across {dim} replicas {g} at step {ev['step']}; {what}: "
                + (f"inherited from the departure at step {src['step']} ({src['node']})" if src else
                   "inherited from an earlier difference no checked tensor shows"))
    tail = (f"; {later} later mismatch(es) follow from it (steps {', '.join(map(str, later_steps))})" if later else "")
    return f"{head}; {who}{tail}"
