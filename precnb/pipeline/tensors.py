"""The pipeline's use of tensor data (issue #17): whole-tensor metrics for the divergence search.

When both runs of a pair were dumped with ``task: tensor`` (and no shard merging is asked),
:func:`pair_tensor_metrics` computes :func:`precnb.tensor_metrics` once, and the first-divergence
diagnosis judges the entries it covers on them before statistics. ``Options.tensor_metrics``
turns it on (True), off (False) or leaves it to the inputs (None).

Examples
--------
>>> has_tensor_files("/nonexistent")
False
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import xarray as xr

__all__ = ["has_tensor_files", "pair_tensor_metrics", "pairing", "unreadable_entries", "wants_tensor_metrics"]

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
    import numpy as np

    status = metrics["status"].values
    out = []
    for s, r, k in zip(*np.nonzero(status == "unreadable"), strict=True):
        where = (f"{metrics['tensor'].values[k]} at step {int(metrics['step'].values[s])} "
                 f"rank {int(metrics['rank'].values[r])}")
        out.append((where, str(metrics["message"].values[s, r, k])))
    return out
