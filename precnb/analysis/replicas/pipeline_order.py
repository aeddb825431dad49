"""Which of one step's replica departures on different pipeline stages comes first (issue #47 item 3).

A departure event is one replica group's first differing record at a step (:func:`departure_events`), placed
by its execution position ``seq``. That position counts the records of one rank: the ranks of two pipeline
stages number theirs apart, so ``seq`` cannot tell which stage's departure came first. The pipeline can: a
stage receives its activations from the stage before it and its gradients from the stage after it. Among one
step's events on different stages:

1. an event whose first differing record an op of its own ranks produced (an output, a parameter) comes before
   one whose first differing record is an input the ranks received (from a peer stage, as the P2P receive
   carries it);
2. then forward before backward, and in the forward the earlier stage first, in the backward the later one;
3. then execution position.

Events of one stage keep their order.

Examples
--------
>>> ev = [{"step": 4, "group": [2, 3], "role": "input", "node": "Module.0.norm.RMSNorm.forward.0", "seq": 3},
...       {"step": 4, "group": [0, 1], "role": "output", "node": "Module.0.fc2.RowParallelLinear.forward.0",
...        "seq": 162}]
>>> [e["group"] for e in pipeline_order(ev, lambda rank: rank // 2)]
[[0, 1], [2, 3]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from precnb.naming import parse_node

__all__ = ["pipeline_order"]


def _key(e: dict[str, Any], stage: int) -> tuple[int, int, int, int]:
    backward = parse_node(str(e["node"])).direction == "backward"
    return (int(e.get("role") == "input"), int(backward), -stage if backward else stage, int(e["seq"]))


def pipeline_order(events: Sequence[dict[str, Any]], stage_of: Callable[[int], int]) -> list[dict[str, Any]]:
    """*events* (in step order) with each step's events on several pipeline stages put in causal order.

    *stage_of* gives a dump rank's pipeline stage. See the module docstring for the rules.
    """
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(events):
        j = i
        while j < len(events) and events[j]["step"] == events[i]["step"]:
            j += 1
        one = list(events[i:j])
        stages = [stage_of(int(e["group"][0])) for e in one]
        if len(set(stages)) > 1:
            order = sorted(range(len(one)), key=lambda k: _key(one[k], stages[k]))
            one = [one[k] for k in order]
        out += one
        i = j
    return out
