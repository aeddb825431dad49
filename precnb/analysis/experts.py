"""Tokens per MoE expert, per step and rank, read from the experts' own records; experts that got none.

An MoE expert (``….experts.local_experts.<i>``, Megatron's SequentialMLP; ``….experts.<i>`` elsewhere) is called on
the tokens routed to it: its forward input is ``[tokens, hidden]``, so the tokens it received are the input's
element count over its last dimension (summed over the micro-batch calls of a step). An expert that received no
token still runs, on empty tensors whose statistics msprobe leaves null — and a division by its token count
there is 0/0 = NaN (a common cause of a NaN gradient in MoE training).

Expert ``i`` on expert-parallel rank ``r`` is global expert ``r · experts_per_rank + i`` (Megatron's numbering);
the EP rank comes from the layout (:meth:`precnb.analysis.layout.Layout.expert_coords`).

Examples
--------
>>> from precnb.schema import empty_dataset
>>> expert_tokens(empty_dataset())
[]
>>> describe_starved({"step": 1, "rank": 1, "layer": "decoder.layers.1", "expert": 2, "local": 0, "tokens": 0})
'expert 2 of decoder.layers.1 (local_experts.0 on rank 1) received 0 tokens at step 1'
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import xarray as xr

__all__ = ["describe_starved", "expert_of", "expert_tokens", "starved_experts", "tokens_table"]

_EXPERT_INPUT = re.compile(
    r"^Module\.(?:\d+\.)?(?P<layer>.*?)\.(?:mlp\.)?experts\.(?:local_experts\.)?(?P<local>\d+)\.[A-Za-z0-9_]+"
    r"\.forward\.(?P<call>\d+)\.input\.0$")
_IN_EXPERT = re.compile(r"^(?:\d+\.)?(?P<layer>.*?)\.(?:mlp\.)?experts\.(?:local_experts\.)?(?P<local>\d+)(?:\.|$)")


def _last_dim(shape: Any) -> int | None:
    try:
        dims = json.loads(str(shape))
    except (TypeError, ValueError):
        return None
    return int(dims[-1]) if isinstance(dims, list) and dims and isinstance(dims[-1], int) else None


def _ep_rank(layout: Any, rank: int) -> int:
    if layout is None or getattr(layout, "ep", 1) <= 1 or rank >= layout.world_size:
        return 0
    return int(layout.expert_coords(rank)["ep"])


def expert_tokens(ds: xr.Dataset, layout: Any = None) -> list[dict[str, Any]]:
    """One row per (step, rank, expert): ``step, rank, layer, local, expert, tokens`` (see the module).

    *layout*: the run's :class:`~precnb.analysis.layout.Layout` (global expert indices need its EP ranks; without
    one, ``expert`` is the local index).
    """
    if ds.sizes.get("tensor", 0) == 0 or "numel" not in ds.data_vars:
        return []
    labels = [str(t) for t in ds["tensor"].values]
    cols: list[tuple[int, str, int, int]] = []  # (column, layer, local, hidden)
    for j, lbl in enumerate(labels):
        m = _EXPERT_INPUT.match(lbl)
        if m is None:
            continue
        hidden = _last_dim(ds["shape"].values[j])
        if hidden:
            cols.append((j, m.group("layer"), int(m.group("local")), hidden))
    if not cols:
        return []
    numel = ds["numel"].values
    present = ds["present"].values
    steps = [int(s) for s in ds["step"].values]
    ranks = [int(r) for r in ds["rank"].values]
    per_rank_locals: dict[tuple[int, str], set[int]] = defaultdict(set)
    tokens: dict[tuple[int, int, str, int], int] = defaultdict(int)
    for j, layer, local, hidden in cols:
        for si, step in enumerate(steps):
            for ri, rank in enumerate(ranks):
                if not present[si, ri, j] or numel[si, ri, j] < 0:
                    continue
                per_rank_locals[(rank, layer)].add(local)
                tokens[(step, rank, layer, local)] += int(numel[si, ri, j]) // hidden
    rows = []
    for (step, rank, layer, local), n in sorted(tokens.items()):
        per_rank = len(per_rank_locals[(rank, layer)])
        rows.append({"step": step, "rank": rank, "layer": layer, "local": local,
                     "expert": _ep_rank(layout, rank) * per_rank + local, "tokens": n})
    return rows


def starved_experts(ds: xr.Dataset, layout: Any = None, *, steps: Sequence[int] | None = None
                    ) -> list[dict[str, Any]]:
    """The rows of :func:`expert_tokens` with no token (at *steps* only, when given)."""
    want = None if steps is None else {int(s) for s in steps}
    return [r for r in expert_tokens(ds, layout) if r["tokens"] == 0 and (want is None or r["step"] in want)]


def expert_of(module: str) -> tuple[str, int] | None:
    """``(layer, local expert)`` of a module path inside an expert, else None.

    >>> expert_of("0.decoder.layers.1.mlp.experts.local_experts.0.linear_fc2")
    ('decoder.layers.1', 0)
    """
    m = _IN_EXPERT.match(str(module))
    return (m.group("layer"), int(m.group("local"))) if m else None


def describe_starved(row: dict[str, Any]) -> str:
    """One line for a starved expert (a row of :func:`starved_experts`)."""
    return (f"expert {row['expert']} of {row['layer']} (local_experts.{row['local']} on rank {row['rank']}) "
            f"received {row['tokens']} tokens at step {row['step']}")


def tokens_table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``{layer: {expert: {step: tokens}}}`` summed over the ranks holding each expert (a JSON-ready table)."""
    out: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        cell = out[r["layer"]][str(r["expert"])]
        cell[str(r["step"])] = cell.get(str(r["step"]), 0) + int(r["tokens"])
    return {k: dict(v) for k, v in out.items()}
