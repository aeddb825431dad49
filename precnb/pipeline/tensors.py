"""What the pipeline reads beside the statistics (tensor files, monitor output, loss log), and what a triage flags.

**Tensor data** (issue #17): whole-tensor metrics for the divergence search.

When both runs of a pair were dumped with ``task: tensor`` (and no shard merging is asked),
:func:`pair_tensor_metrics` computes :func:`precnb.tensor_metrics` once, and the first-divergence
diagnosis judges the entries it covers on them before statistics. ``Options.tensor_metrics``
turns it on (True), off (False) or leaves it to the inputs (None).

**Inputs read beside the run** (:func:`side_inputs`, the loss-spike diagnosis's ``inputs`` hook: the ``monitor``
and ``loss`` options). The loss-spike diagnosis (:mod:`precnb.analysis.spike`) judges the loss of every step,
which a dump of the steps around an incident does not hold: the pipeline opens the job's monitor output and its
loss log here (the analysis never reads files) and hands them over as ``params["monitor"]`` (a dataset),
``params["loss_log"]`` (a DataFrame ``step, rank, loss``) and ``params["loss_source"]`` (where it was read).

**What a triage flags, record by record** (:func:`flagged`, :class:`Flagged`), and how early each flagged record
comes. The explorer's default colour ("first bad") and its rank × step view need, for every (step, rank, tensor),
whether a diagnosis of the triage flags it and its place in causal order; this composes the analysis for a
:class:`~precnb.pipeline.Triage`:

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
>>> has_tensor_files("/nonexistent")
False
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

__all__ = ["Flagged", "flagged", "flagged_ranks", "has_tensor_files", "pair_tensor_metrics", "pairing", "params_of",
           "side_inputs", "unreadable_entries", "wants_tensor_metrics"]

_PATTERNS = ("dump_tensor_data", "*/dump_tensor_data", "*/*/dump_tensor_data", "*/*/*/dump_tensor_data")


def has_tensor_files(run: Any) -> bool:
    """Whether *run* (a path or an opened dataset) holds msprobe tensor files.

    A path is looked at without parsing: a ``dump_tensor_data/`` folder in it, its rank folders
    or its step folders (a dump.json path looks at its folder). Below a dump root, the rank
    folders looked at are those of the first step and the first one of every other step (the
    steps' folders are listed, not every rank folder of a 100-step run).
    """
    if isinstance(run, xr.Dataset):
        return "data_name" in run and bool(run.attrs.get("rank_dirs"))
    if not isinstance(run, str | os.PathLike):
        return False
    p = Path(run)
    if p.is_file():
        p = p.parent
    try:
        if not p.is_dir():
            return False
        if any(next(p.glob(pat), None) is not None for pat in _PATTERNS[:2]):
            return True
        probe = _rank_folders(p)
        if probe is not None:
            return any((d / "dump_tensor_data").is_dir() for d in probe)
        return any(next(p.glob(pat), None) is not None for pat in _PATTERNS[2:])
    except OSError:
        return False


def _rank_folders(p: Path) -> list[Path] | None:
    """Rank folders of the msprobe dump *p* to look in: all of its first step, the first of the others."""
    from precnb.errors import NotADumpError
    from precnb.io.msprobe.discover import discover

    try:
        firsts = discover(p, first=True)
        if not firsts:
            return None
        return [d.path for d in discover(p, steps=[firsts[0].step])] + [d.path for d in firsts[1:]]
    except NotADumpError:
        return None  # not an msprobe tree: the patterns decide


def wants_tensor_metrics(opts: Any, target: Any, baseline: Any) -> bool:
    """``Options.tensor_metrics`` resolved for this pair (None: both hold tensor files, no layout)."""
    choice = getattr(opts, "tensor_metrics", None)
    if choice is False or baseline is None:
        return False
    if getattr(opts, "target_layout", None) or getattr(opts, "baseline_layout", None):
        return False  # merged shards have no files of their own
    return bool(choice) or (has_tensor_files(target) and has_tensor_files(baseline))


def pairing(alignment: Any) -> Any:
    """The alignment to pair labels with, when :func:`precnb.tensor_metrics` can use it.

    A :class:`precnb.Alignment` (its ``tensor_map()``), a mapping, or an object with
    ``baseline_tensor`` / ``baseline_label``; else None (labels pair by name).
    """
    from collections.abc import Mapping

    if getattr(alignment, "identical", False):
        return None  # every name pairs with itself
    if isinstance(alignment, Mapping) or any(callable(getattr(alignment, n, None))
                                             for n in ("tensor_map", "baseline_tensor", "baseline_label")):
        return alignment
    return None


def pair_tensor_metrics(opts: Any, raw_baseline: xr.Dataset | None, raw_target: xr.Dataset, *,
                        step_offset: int | None, alignment: Any = None, notes: list[str] | None = None,
                        failures: list[tuple[str, str]] | None = None) -> xr.Dataset | None:
    """:func:`precnb.tensor_metrics` of the pair when wanted (else None); what was done goes to *notes*.

    Tensor files that could not be read (or were refused: larger than their record, unsafe) go
    to *failures* as ``(tensor at step/rank, reason naming the file)``: the command exits 1.
    """
    if raw_baseline is None or not wants_tensor_metrics(opts, raw_target, raw_baseline):
        return None
    if not (has_tensor_files(raw_baseline) and has_tensor_files(raw_target)):
        if getattr(opts, "tensor_metrics", None):
            raise ValueError("tensor_metrics=True needs two runs dumped with task=tensor")
        return None
    from collections.abc import Mapping

    from precnb.tensor_compare import tensor_metrics

    pairing = alignment if isinstance(alignment, Mapping) or any(
        callable(getattr(alignment, n, None)) for n in ("baseline_tensor", "baseline_label")) else None
    metrics = tensor_metrics(raw_baseline, raw_target, steps=getattr(opts, "steps", None),
                             ranks=getattr(opts, "ranks", None), alignment=pairing,
                             step_offset=int(step_offset or 0))
    if failures is not None:
        failures.extend(unreadable_entries(metrics))
    if notes is not None:
        pairs = int((metrics["status"] != "no_data").sum())
        notes.append(f"tensor metrics (msprobe compare's formulas) computed for {pairs} tensor pair(s): "
                     "the divergence search judges them on whole tensors first")
    return metrics


def unreadable_entries(metrics: xr.Dataset) -> list[tuple[str, str]]:
    """``(tensor at step S rank R, message)`` of every entry whose files could not be read or were refused."""
    status = metrics["status"].values
    out = []
    for s, r, k in zip(*np.nonzero(status == "unreadable"), strict=True):
        where = (f"{metrics['tensor'].values[k]} at step {int(metrics['step'].values[s])} "
                 f"rank {int(metrics['rank'].values[r])}")
        out.append((where, str(metrics["message"].values[s, r, k])))
    return out


def _loss_table(value: Any) -> tuple[Any, str]:
    import pandas as pd

    if isinstance(value, (str, os.PathLike)):
        from precnb.io.losslog import read_loss_log

        df = read_loss_log(value)
        tag = df.attrs.get("tag")
        return df, f"loss log {os.fspath(value)}" + (f" (TensorBoard tag {tag!r})" if tag else "")
    if isinstance(value, pd.DataFrame):
        missing = {"step", "loss"} - set(value.columns)
        if missing:
            raise ValueError(f"the loss table needs columns step and loss (missing {sorted(missing)})")
        if list(value.columns) == ["step", "rank", "loss"]:
            return value, "loss table"  # already in shape (the analysis only reads it: the caller's is not touched)
        if "rank" in value:
            return value[["step", "rank", "loss"]], "loss table"
        return value[["step", "loss"]].assign(rank=float("nan"))[["step", "rank", "loss"]], "loss table"
    raise TypeError(f"loss: expected a path or a pandas.DataFrame, got {type(value).__name__}")


def side_inputs(source: Any, opts: Any, raw_target: Any, *, loaded: Any, common: dict[str, Any],
                cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """``params`` entries for the ``monitor`` and ``loss`` options (empty when neither is given).

    The loss-spike diagnosis's ``inputs`` hook (``reads=InputHooks("precnb.pipeline.tensors:side_inputs")``):
    read once per triage (kept in *cache*, the plan's, when given). Files of the monitor output that cannot
    be read are appended to ``loaded.failures``.

    Raises
    ------
    precnb.errors.PrecnbError
        When the loss log cannot be read (one line naming the file).
    """
    if cache is not None and "side_inputs" in cache:
        return dict(cache["side_inputs"])
    from precnb.pipeline.sources import Source, open_source

    out: dict[str, Any] = {}
    if opts.monitor is not None:
        out["monitor"] = open_source(Source(opts.monitor, "monitor"), loaded=loaded, **common)
    if opts.loss is not None:
        out["loss_log"], out["loss_source"] = _loss_table(opts.loss)
    if cache is not None:
        cache["side_inputs"] = out
    return dict(out)


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
    """``d.explorer.flags(ds, finding, triage=t)``; a hook of the old form, ``flags(ds, finding)``, without *triage*."""
    import inspect

    hook = d.explorer.flags
    try:
        params = list(inspect.signature(hook).parameters.values())
    except (TypeError, ValueError):
        params = []
    takes = any(p.name == "triage" or p.kind is p.VAR_KEYWORD for p in params)
    return hook(ds, finding, triage=t) if takes else hook(ds, finding)


def _own_flags(t: Any, grid: xr.Dataset) -> tuple[np.ndarray, list[str]]:
    """Records the found findings' diagnoses flag themselves (:attr:`ExplorerHooks.flags`), and what they are."""
    from precnb.analysis import registry

    bad = np.zeros(tuple(grid.sizes[d] for d in ("step", "rank", "tensor")), bool)
    titles: list[str] = []
    for f in t.found:
        d = registry.lookup(f.kind)
        if d is not None and d.explorer.flags is not None:
            bad |= _rows_mask(grid, _call_flags(d, grid, f, t))
            titles.append(d.explorer.flag_text or d.title.lower())
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
            if not d.explorer.unmerged or d.explorer.flags is None:  # only the replica check flags ranks as dumped
                continue
            pin = next((f for f in t.found if f.kind == d.kind), None)
            rows = _call_flags(d, raw, pin, t)
            if len(rows):
                pos = causal_positions_of(raw, _rows_mask(raw, rows), first=pin)
                what = f"{d.explorer.flag_text or d.title.lower()} across the target's shards (ranks as dumped)"
                out = Flagged(raw, pos, what, unmerged=True)
                break
    t.cache["flagged_ranks"] = out
    return out


def params_of(wanted: Sequence[Any], opts: Any, tsrc: Any, raw_t: xr.Dataset, loaded: Any, common: dict[str, Any],
              cache: dict[str, Any], *, baseline: Any = None) -> dict[str, Any]:
    """The diagnoses' parameters: the options they read, what is read beside the run, each one's own inputs.

    An ``inputs`` hook that takes ``baseline`` gets the triage's baseline source (None for one run); one that takes
    ``cache`` gets the plan's cache, to read what it reads once per triage (the monitor output and the loss log).
    """
    params: dict[str, Any] = {"limit": int(opts.limit)}
    for d in wanted:  # what a diagnosis reads beside the run (its ``inputs`` hook)
        if d.reads.inputs is not None:
            hook = _resolve(d.reads.inputs)
            kw = {k: v for k, v in (("baseline", baseline), ("cache", cache)) if _takes(hook, k)}
            params.update(hook(tsrc, opts, raw_t, loaded=loaded, common=common, **kw))
    return params


def _resolve(ref: Any) -> Any:
    """A hook given as a callable or as ``"module:function"``."""
    if callable(ref):
        return ref
    import importlib

    mod, _, name = str(ref).partition(":")
    return getattr(importlib.import_module(mod), name)


def _takes(hook: Any, name: str) -> bool:
    """Whether *hook* takes the keyword *name* (a hook of the first form does not)."""
    import inspect

    try:
        params = list(inspect.signature(hook).parameters.values())
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)
