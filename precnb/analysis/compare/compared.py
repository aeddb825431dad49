"""How much of two runs a comparison covered: "nothing compared" as its own answer, "compared N of M" otherwise.

A first-divergence search that compared no record (the runs share no step, no rank or no
tensor, or everything was left out) has not found the runs equal: :func:`nothing_compared`
says so, naming what each side holds. When only part of the runs was comparable,
:func:`compared_part` says how much ("compared 120 of 300 target records").

Examples
--------
>>> import numpy as np, xarray as xr
>>> def run(steps, ranks, labels):
...     shape = (len(steps), len(ranks), len(labels))
...     return xr.Dataset({"present": (("step", "rank", "tensor"), np.ones(shape, bool))},
...                       coords={"step": steps, "rank": ranks, "tensor": labels})
>>> f = nothing_compared(run([0, 1], [0], ["a"]), run([5], [0], ["a"]), ("baseline", "target"))
>>> f.kind, f.title, f.stats["nothing_compared"]
('none', 'Nothing compared', True)
>>> for part in f.reason.split("; "): print(part)
nothing was compared: the runs share no step (baseline holds steps 0-1, target step 5)
baseline: steps 0-1, rank 0, 1 tensor(s), 2 record(s)
target: step 5, rank 0, 1 tensor(s), 1 record(s)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.findings import Finding
from precnb.analysis.summary import format_ranges

__all__ = ["compared_part", "holdings", "nothing_compared"]


def holdings(ds: xr.Dataset) -> dict[str, Any]:
    """What one run holds: its steps, ranks, tensors and records (entries present)."""
    present = np.asarray(ds["present"].values, bool) if "present" in ds else np.zeros((0, 0, 0), bool)
    recorded = present.any(axis=(0, 1)) if present.ndim == 3 and present.size else np.zeros(0, bool)
    return {"steps": [int(s) for s in ds["step"].values], "ranks": [int(r) for r in ds["rank"].values],
            "tensors": int(recorded.sum()), "records": int(present.sum())}


def _plural(word: str, vals: Sequence[int]) -> str:
    return f"{word}{'s' if len(vals) != 1 else ''} {format_ranges(vals)}"


def _side(name: str, h: dict[str, Any]) -> str:
    return (f"{name}: {_plural('step', h['steps'])}, {_plural('rank', h['ranks'])}, {h['tensors']} tensor(s), "
            f"{h['records']} record(s)")


def nothing_compared(baseline: xr.Dataset, target: xr.Dataset, names: tuple[str, str], *, step_offset: int = 0,
                     steps: Sequence[int] | None = None, ranks: Sequence[int] | None = None,
                     shared_tensors: int | None = None) -> Finding:
    """The finding of a pair that had no record in common: kind ``none``, ``stats["nothing_compared"]``.

    Parameters
    ----------
    baseline, target : xarray.Dataset
        The runs as compared (the baseline in the target's names when they were aligned).
    names : (str, str)
    step_offset : int
        Target step = baseline step + offset.
    steps, ranks : sequence of int, optional
        The selection the comparison was restricted to (baseline step numbers).
    shared_tensors : int, optional
        Tensor labels both runs hold (computed from the runs when None).

    Returns
    -------
    Finding
        Its reason starts ``"nothing was compared: "`` and names the steps, ranks, tensors and
        records each side holds; ``stats`` holds the same per side (``baseline`` / ``target``
        keys under the run names) and ``compared_records = 0``.
    """
    hb, ht = holdings(baseline), holdings(target)
    bsteps, tsteps = set(hb["steps"]), {s - step_offset for s in ht["steps"]}
    common_steps = sorted(bsteps & tsteps)
    common_ranks = sorted(set(hb["ranks"]) & set(ht["ranks"]))
    if shared_tensors is None:
        shared_tensors = len(baseline.indexes["tensor"].intersection(target.indexes["tensor"]))
    off = f" (target step = baseline step {step_offset:+d})" if step_offset else ""
    b, t = names
    if not hb["records"] and not ht["records"]:
        why = "neither run holds a tensor record"
    elif not hb["records"] or not ht["records"]:
        why = f"the {b if not hb['records'] else t} run holds no tensor record"
    elif not common_steps:
        why = (f"the runs share no step{off} ({b} holds {_plural('step', hb['steps'])}, "
               f"{t} {_plural('step', ht['steps'])})")
    elif not common_ranks:
        why = (f"the runs share no rank ({b} holds {_plural('rank', hb['ranks'])}, "
               f"{t} {_plural('rank', ht['ranks'])})")
    elif steps is not None and not set(steps) & set(common_steps):
        why = f"no selected step ({format_ranges(steps)}) is in both runs (shared: {format_ranges(common_steps)})"
    elif ranks is not None and not set(ranks) & set(common_ranks):
        why = f"no selected rank ({format_ranges(ranks)}) is in both runs (shared: {format_ranges(common_ranks)})"
    elif not shared_tensors:
        why = "the runs share no tensor name (nor could their names be aligned)"
    else:
        why = "no tensor is recorded in both runs at a step and rank they share"
    reason = f"nothing was compared: {why}; {_side(b, hb)}; {_side(t, ht)}"
    stats: dict[str, Any] = {"compared_records": 0, "differing_records": 0, "nothing_compared": True,
                             "steps": common_steps, "ranks": common_ranks, "step_offset": int(step_offset),
                             "shared_tensors": int(shared_tensors), b: hb, t: ht}
    return Finding(kind="none", reason=reason, stats=stats)


def compared_part(compared: int, baseline: xr.Dataset, target: xr.Dataset, names: tuple[str, str],
                  stats: dict[str, Any] | None = None) -> str | None:
    """``"compared 120 of 300 target records"`` when only part of either run was compared, else None.

    *stats*, when given, receives ``records_baseline`` / ``records_target`` (the runs' record counts).
    """
    nb, nt = holdings(baseline)["records"], holdings(target)["records"]
    if stats is not None:
        stats[f"records_{names[0]}"], stats[f"records_{names[1]}"] = nb, nt
    parts = [f"{compared} of {n} {name} records" for name, n in ((names[0], nb), (names[1], nt)) if compared < n]
    return "compared " + ", ".join(parts) if parts else None
