"""What a triage flags, record by record, and how early each flagged record comes.

The explorer's default colour ("first bad") and its rank × step view need, for every
(step, rank, tensor), whether a diagnosis of the triage flags it and its place in causal
order. This module composes the analysis for a :class:`~precnb.pipeline.Triage`:

* two runs: the differences the first-divergence search counted (its tolerance; for two
  frameworks its calibrated tolerance, without the isolated recording differences it set aside)
  on the comparison's grid (the one it walked), and records present in one run only — those only
  when the search found a divergence: with none, a record in one run only is what the two runs
  record differently (the finding lists them), not a fault;
* one run: NaN and unexpected ±inf, plus the records of the other findings the triage made
  (replica mismatches when a layout was given, anomalies);
* the order is :func:`precnb.analysis.causal.earliness.causal_positions`, with the triage's first
  finding put first when the grid holds it (the diagnosis decides what comes first).

Examples
--------
>>> import precnb
>>> t = precnb.diagnose(precnb.sample_path("dp_nan"))  # doctest: +SKIP
>>> f = flagged(t)  # doctest: +SKIP
>>> f.first()  # doctest: +SKIP
(1, 1, 'Torch.sqrt.0.forward.output.0')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

__all__ = ["Flagged", "flagged", "flagged_ranks"]


@dataclass
class Flagged:
    """Flagged records of one grid and their causal positions.

    Attributes
    ----------
    ds : xarray.Dataset
        The grid (one run; for a pair, the comparison's target side).
    positions : ndarray of float, (step, rank, tensor)
        0 for the first flagged record, 1 for the next, ...; NaN where nothing is flagged.
    what : str
        What is flagged, in words.
    unmerged : bool
        The grid is the target before its shards were merged (its ranks are the dump's).
    """

    ds: xr.Dataset
    positions: np.ndarray
    what: str
    unmerged: bool = False

    @property
    def count(self) -> int:
        """How many records are flagged."""
        return int(np.isfinite(self.positions).sum())

    def first(self) -> tuple[int, int, str] | None:
        """(step, rank, tensor) of the first flagged record (None when none is)."""
        if not self.count:
            return None
        i = np.unravel_index(int(np.nanargmin(self.positions)), self.positions.shape)
        return (int(self.ds["step"].values[i[0]]), int(self.ds["rank"].values[i[1]]),
                str(self.ds["tensor"].values[i[2]]))


def _rows_mask(ds: xr.Dataset, rows: Any) -> np.ndarray:
    """(step, rank, tensor) mask of records listed as rows (dicts or a DataFrame with step/rank/tensor)."""
    out = np.zeros(tuple(ds.sizes[d] for d in ("step", "rank", "tensor")), bool)
    if rows is None or not len(rows):
        return out
    if hasattr(rows, "to_dict"):
        rows = rows[["step", "rank", "tensor"]].to_dict("records")
    steps = ds.indexes["step"].get_indexer(pd.Index([int(r["step"]) for r in rows]))
    ranks = ds.indexes["rank"].get_indexer(pd.Index([int(r["rank"]) for r in rows]))
    tensors = ds.indexes["tensor"].get_indexer(pd.Index([str(r["tensor"]) for r in rows]))
    ok = (steps >= 0) & (ranks >= 0) & (tensors >= 0)
    out[steps[ok], ranks[ok], tensors[ok]] = True
    return out


def _pin(t: Any, ds: xr.Dataset | None = None) -> Any:
    """The record of the triage's first finding that names one (put first): its origin when it has one."""
    from precnb.analysis.findings import shown_record

    ranks = [int(r) for r in ds["rank"].values] if ds is not None else []
    return next((rec for f in t.findings if (rec := shown_record(f, ranks)) is not None), None)


def _call_flags(d: Any, ds: xr.Dataset, finding: Any, t: Any) -> Any:
    """``d.flags(ds, finding, triage=t)``; a hook of the first form, ``flags(ds, finding)``, without *triage*."""
    import inspect

    try:
        params = list(inspect.signature(d.flags).parameters.values())
    except (TypeError, ValueError):
        params = []
    takes = any(p.name == "triage" or p.kind is p.VAR_KEYWORD for p in params)
    return d.flags(ds, finding, triage=t) if takes else d.flags(ds, finding)


def _own_flags(t: Any, grid: xr.Dataset) -> tuple[np.ndarray, list[str]]:
    """Records the found findings' diagnoses flag themselves (:attr:`Diagnosis.flags`), and what they are."""
    from precnb.analysis import registry

    bad = np.zeros(tuple(grid.sizes[d] for d in ("step", "rank", "tensor")), bool)
    titles: list[str] = []
    for f in t.found:
        d = registry.lookup(f.kind)
        if d is not None and d.flags is not None:
            bad |= _rows_mask(grid, _call_flags(d, grid, f, t))
            titles.append(d.flag_text or d.title.lower())
    return bad, list(dict.fromkeys(titles))


def flagged(t: Any) -> Flagged:
    """Flagged records of the triage's target (see the module docstring); computed once per triage."""
    from precnb.analysis import registry
    from precnb.analysis.causal.earliness import bad_records, causal_positions_of

    if "flagged" in t.cache:
        return t.cache["flagged"]
    if t.paired:
        from precnb.analysis.divergence import searched_differences

        cmp = t.comparison()
        grid = cmp.ds.isel(run=1).assign_coords(run=str(t.names[1]))
        diverged = any(getattr(registry.lookup(f.kind), "mode", None) == "pair" for f in t.found)  # the runs differ
        differs = searched_differences(cmp, alignment=t.alignment, crc=t.options.crc).values
        bad, seq = bad_records(grid, cmp, crc=t.options.crc, differs=differs, structural=diverged)
        what = "differences beyond tolerance" + (", and records in one run only" if diverged else "")
    else:
        grid = t.target
        bad, seq = bad_records(grid)
        what = "NaN and unexpected ±inf"
        own, titles = _own_flags(t, grid)
        bad = bad | own
        what += "".join(f", {x}" for x in titles)
    out = Flagged(grid, causal_positions_of(grid, bad, seq=seq, first=_pin(t, grid)), what)
    t.cache["flagged"] = out
    return out


def flagged_ranks(t: Any) -> Flagged:
    """Flagged records for a rank × step view: the dump's own ranks where that says more.

    When the target's shards were merged for the comparison (a target layout) and its replicas
    disagree, the view shows the target as dumped, flagged by the replica check (the merged grid
    has lost the rank that departs); otherwise it is :func:`flagged`.
    """
    from precnb.analysis import registry
    from precnb.analysis.causal.earliness import causal_positions_of

    if "flagged_ranks" in t.cache:
        return t.cache["flagged_ranks"]
    out = flagged(t)
    raw = t.raw_target
    if t.paired and raw is not None and t.target_layout is not None and raw.sizes["rank"] > out.ds.sizes["rank"]:
        for d in registry.diagnoses():
            if not d.unmerged or d.flags is None:  # only the replica check flags ranks as dumped
                continue
            pin = next((f for f in t.found if f.kind == d.kind), None)
            rows = _call_flags(d, raw, pin, t)
            if len(rows):
                pos = causal_positions_of(raw, _rows_mask(raw, rows), first=pin)
                what = f"{d.flag_text or d.title.lower()} across the target's shards (ranks as dumped)"
                out = Flagged(raw, pos, what, unmerged=True)
                break
    t.cache["flagged_ranks"] = out
    return out
