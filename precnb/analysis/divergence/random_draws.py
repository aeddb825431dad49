"""Random draws another layout changes by design: where two runs stop being comparable, not a divergence.

A random op (dropout, ``torch.normal`` …) draws from a generator. Two healthy runs of the same seed draw the
same values only when each draw reads the same generator stream for the same whole tensor. A parallel layout
changes that by design:

* **pipeline stages** — Megatron seeds each stage's generator apart (``seed + 100 * pipeline rank``) and a stage
  draws for its micro-batches in the schedule's order: a run of another pipeline size draws other masks from the
  first random op of stage 1 on (and from the second micro-batch on, on any stage);
* **a sharded draw** — a random op whose output is split across a group (TP with sequence parallelism, the
  model-parallel generator of attention dropout under TP, CP, a data-parallel half of the batch): each rank
  draws its own part, never the unsharded run's whole draw.

So when the two runs' layouts differ that way, a random op's **forward output** that differs while **its inputs
agree** (and whose copies agree where it is replicated: an unsynchronised seed makes them differ and stays a
finding) is set aside as *different by design*: it is the runs' **horizon**. What follows from it (the rest of
that rank's step, every later step) is carried from it and cannot be judged on statistics, so it is not
searched; differences before it still are. The finding says so (``stats["horizon"]``, a hint, and an assumption
``random_by_design``): comparisons past it need the random ops off (dropout 0) or the same layout.

Examples
--------
>>> layout_pp("world 4 = tp2 × cp1 × pp2 × dp1 (ep1, vpp1), order tp-cp-ep-dp-pp"), layout_pp(""), layout_pp(None)
(2, 1, 1)
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from precnb.analysis.random_ops import is_random_op

__all__ = ["HORIZON_KIND", "horizon_assumption", "layout_pp", "set_aside_random_draws"]

HORIZON_KIND = "random_by_design"
_SPLIT_DIMS = ("tp", "cp", "dp")


def layout_pp(described: Any) -> int:
    """The pipeline size in a merged run's ``merged_layout`` attribute (1 when absent: a run not merged)."""
    m = re.search(r"\bpp(\d+)\b", str(described or ""))
    return int(m.group(1)) if m else 1


def _split_across(ds: Any, tensor: str) -> str | None:
    """The group (``tp``, ``cp``, ``dp``) across which a merged run's *tensor* is split (None: not split)."""
    if tensor not in ds.indexes["tensor"]:
        return None
    for dim in _SPLIT_DIMS:
        name = f"shard_kind_{dim}"
        if name in ds.coords and str(ds[name].sel(tensor=tensor).values) == "sharded":
            return dim
    return None


def _why(cmp: Any, tensor: str) -> str | None:
    """Why the two runs' layouts draw *tensor* (a random op's output) differently by design (None: they do not)."""
    lb, lt = cmp.base.attrs.get("merged_layout"), cmp.targ.attrs.get("merged_layout")
    if (lb or "") == (lt or ""):
        return None  # the same layout (or two runs compared rank by rank): the same draws are expected
    pb, pt = layout_pp(lb), layout_pp(lt)
    if pb != pt:
        return (f"the pipeline layouts differ (pp={pb} vs pp={pt}): each stage seeds its generator apart "
                "(Megatron: seed + 100 x pipeline rank) and draws in its schedule's micro-batch order")
    for side, ds in (("target", cmp.targ), ("baseline", cmp.base)):
        dim = _split_across(ds, tensor)
        if dim is not None:
            return (f"the {side}'s draw is split across its {dim.upper()} group (each rank draws its own part: "
                    "sequence parallelism, the model-parallel generator, a batch part): not one whole draw")
    return None


def _candidates(j: Any) -> list[tuple[int, int, int, int, str]]:
    """(step index, rank index, seq, tensor column, why) of the random-op outputs that differ by design."""
    cmp = j.cmp
    b = j.b
    roles, nodes, kinds = b["role"].values, b["node"].values, b["kind"].values
    dirs = b["direction"].values if "direction" in b.coords else np.full(roles.shape, "")
    cols = [c for c in np.flatnonzero(roles == "output").tolist()
            if str(kinds[c]) == "api" and str(dirs[c]) != "backward" and ".backward" not in str(nodes[c])
            and is_random_op(str(nodes[c]))]
    if not cols:
        return []
    diff = np.asarray(j.diff.values, bool)
    both = np.asarray(cmp.both.values, bool)
    rel = np.asarray(cmp.rel.values, np.float64)
    rtol = np.asarray(cmp.rtol.values, np.float64)
    rd = np.asarray(cmp.replicas_differ.values, bool) if cmp.replicas_differ is not None else None
    seq = np.asarray(j.seq.values)
    labels = [str(x) for x in b["tensor"].values]
    inputs = {c: np.flatnonzero((roles == "input") & (nodes == nodes[c])) for c in cols}
    why_of: dict[int, str | None] = {}
    out = []
    for c in cols:
        for si, ri in np.argwhere(diff[:, :, c]).tolist():
            if rd is not None and rd[si, ri, c]:
                continue  # copies that must be replicated differ: an unsynchronised seed, a finding
            ins = [i for i in inputs[c].tolist() if both[si, ri, i]]
            if not ins or (rel[si, ri, ins] > rtol[ins]).any() or diff[si, ri, ins].any():
                continue  # its inputs differ: not (only) the draw
            if c not in why_of:
                why_of[c] = _why(cmp, labels[c])
            if why_of[c]:
                out.append((si, ri, int(seq[si, ri, c]), c, str(why_of[c])))
    return sorted(out)


def set_aside_random_draws(j: Any) -> None:
    """Set aside, in the judged pair *j*, the first random draw the layouts change by design and what follows.

    The horizon is the earliest step holding such a draw; on each rank where one differs at that step, from its
    first such draw on; at every later step, everything. Differences before it stay in ``j.diff``. Adds
    ``j.stats["horizon"]`` (the first draw, why, how many differences were set aside) and a hint.
    """
    cands = _candidates(j)
    if not cands:
        return
    s0 = cands[0][0]
    diff = np.asarray(j.diff.values, bool).copy()
    seq = np.asarray(j.seq.values)
    before = int(diff.sum())
    first_on: dict[int, tuple[int, int, str]] = {}
    for si, ri, sq, c, why in cands:
        if si == s0 and ri not in first_on:
            first_on[ri] = (sq, c, why)
    for ri, (sq, _, _) in first_on.items():
        diff[s0, ri] &= ~(seq[s0, ri] >= sq)
    diff[s0 + 1:] = False
    ds = j.cmp.ds
    ri0 = min(first_on, key=lambda r: first_on[r][0])
    _, c0, why0 = first_on[ri0]
    tensor = str(ds["tensor"].values[c0])
    node = str(j.b["node"].values[c0])
    step = int(ds["step"].values[s0])
    rank = int(ds["rank"].values[ri0])
    later = [int(s) for s in ds["step"].values[s0 + 1:]]
    j.diff = j.diff.copy(data=diff)
    j.stats["horizon"] = {"kind": HORIZON_KIND, "step": step, "rank": rank, "node": node, "tensor": tensor,
                          "why": why0, "set_aside": before - int(diff.sum()), "later_steps": later,
                          "ranks": sorted(int(ds["rank"].values[r]) for r in first_on)}
    j.hints.append(horizon_text(j.stats["horizon"]))


def horizon_text(h: dict[str, Any]) -> str:
    """The hint of a horizon (``stats["horizon"]``)."""
    later = f" and steps {h['later_steps'][0]}-{h['later_steps'][-1]}" if len(h.get("later_steps") or []) > 1 else \
        (f" and step {h['later_steps'][0]}" if h.get("later_steps") else "")
    return (f"different by design, not compared past it: {h['node']} (step {h['step']}, rank {h['rank']}) is a random "
            f"op whose inputs agree and whose output differs because {h['why']}; {h['set_aside']} difference(s) from "
            f"it on (the rest of that step{later}) follow from it and were not searched. Compare with the random "
            "ops off (dropout 0) or the same layout to search past it")


def horizon_assumption(h: dict[str, Any]) -> dict[str, Any]:
    """The ``random_by_design`` assumption of a finding's horizon (``stats["horizon"]``)."""
    return {"kind": HORIZON_KIND, "step": h["step"], "rank": h["rank"], "node": h["node"], "why": h["why"],
            "text": f"{h['node']} at step {h['step']} differs by design (a random op whose draw the layout "
                    f"changes: {h['why']}); not compared past it: needs dropout off or the same layout"}
