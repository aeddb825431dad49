"""The culprit module of a divergence: the innermost module call around it whose inputs agree and output differs."""

from __future__ import annotations

from typing import Any

import numpy as np

from precnb.analysis.compare import Comparison
from precnb.naming import parse_node
from precnb.schema import side_table

__all__ = ["culprit_module"]


def culprit_module(cmp: Comparison, diff: np.ndarray, si: int, ri: int, node: str) -> dict[str, Any] | None:
    """The innermost module call around *node* whose inputs agree and whose output differs."""
    ds = cmp.ds
    nodes = ds["node"].values
    roles = ds["role"].values
    both = cmp.both.values[si, ri]
    by_node: dict[str, list[int]] = {}
    for j, n in enumerate(nodes.tolist()):
        by_node.setdefault(str(n), []).append(j)
    tree = side_table(cmp.targ, "construct")
    module_calls: dict[str, list[str]] = {}
    for n in by_node:
        p = parse_node(n)
        if p.kind == "module" and p.direction == "forward":
            module_calls.setdefault(p.module, []).append(n)
    chain: list[str] = []
    cur, seen = node, {node}
    while True:
        parent = tree.get(cur)
        if not parent or parent in seen:
            p = parse_node(cur)  # no parent recorded: the call of the nearest enclosing module path
            path = p.module if p.kind in ("module", "param_grad") else str(ds["module"].values[by_node[cur][0]]) \
                if cur in by_node else ""
            if p.kind == "module" and "." in path:
                path = path.rsplit(".", 1)[0]
            elif p.kind == "module":
                path = ""
            parent = None
            while path:
                if path in module_calls:
                    parent = sorted(module_calls[path])[0]
                    break
                path = path.rsplit(".", 1)[0] if "." in path else ""
            if parent is None or parent in seen:
                break
        chain.append(parent)
        seen.add(parent)
        cur = parent
    for cand in ([node, *chain]):
        p = parse_node(cand)
        if p.kind != "module" or cand not in by_node:
            continue
        idx = by_node[cand]
        ins = [j for j in idx if roles[j] == "input" and both[j]]
        outs = [j for j in idx if roles[j] == "output" and both[j]]
        if outs and any(diff[j] for j in outs) and not any(diff[j] for j in ins):
            return {"module": p.module, "node": cand, "api": node if parse_node(node).kind == "api" else None,
                    "why": "its inputs agree and its output differs"}
    return None
