"""What the user hands the pipeline: paths, datasets, mappings of run names → runs.

:func:`split_inputs` turns ``diagnose(target, baseline=...)``'s arguments into at most two run
sources with display names; :func:`open_source` opens one (a path through the readers, a
dataset as is) and records what could not be read.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xarray as xr

__all__ = ["Loaded", "ReadRun", "Source", "open_source", "split_inputs"]


@dataclass(frozen=True)
class ReadRun:
    """A run already read into *ds* from *path*: diagnosed from the dataset, its node records read from the path.

    What a rerun hands :func:`precnb.diagnose` (the explorer's Match, Unmatch and Rerun): the
    dataset saves reading the dumps again, the path keeps what only the files hold (the scalar
    arguments of a node's record, :mod:`precnb.pipeline.scalars`), so a rerun gives the first
    run's answer.
    """

    ds: xr.Dataset
    path: str


@dataclass
class Source:
    """One run to open: a path or a dataset, and its display name (*path*: where a dataset was read from)."""

    value: Any
    name: str
    path: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.value, ReadRun):
            self.value, self.path = self.value.ds, self.value.path

    @property
    def is_path(self) -> bool:
        """True for a path (not yet opened)."""
        return isinstance(self.value, (str, os.PathLike))

    @property
    def records_path(self) -> str | None:
        """The path to read node records from: the path given, or the one the dataset was read from."""
        return os.fspath(self.value) if self.is_path else self.path


@dataclass
class Loaded:
    """Files that could not be read while opening the runs (path, reason)."""

    failures: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _name_of(x: Any, default: str) -> str:
    if isinstance(x, ReadRun):
        x = x.path
    if isinstance(x, (str, os.PathLike)):
        p = Path(x)
        return p.name or str(p)
    if isinstance(x, xr.Dataset):
        src = str(x.attrs.get("source", "") or "")
        if src:
            return Path(src).name or src
    return default


def _select(ds: xr.Dataset, name: str) -> xr.Dataset:
    from precnb.combine import select_run

    return select_run(ds, name)


def split_inputs(target: Any, baseline: Any = None) -> tuple[Source, Source | None]:
    """The (target, baseline) sources of ``diagnose(target, baseline=...)``.

    *target* may be a path, a single-run dataset, a dataset with a ``run`` dim (two runs:
    the first is the baseline unless *baseline* names one), or a mapping ``{name: run}`` of
    one or two runs (first = baseline, last = target). *baseline* may be a path, a dataset or,
    with a combined dataset, the name of one of its runs.

    Raises
    ------
    ValueError
        For inputs that do not say which run is which.
    """
    if isinstance(target, Mapping) and not isinstance(target, xr.Dataset):
        items = list(target.items())
        if not items or len(items) > 2:
            raise ValueError("pass one run, or a mapping of two runs {baseline_name: run, target_name: run}")
        if baseline is not None:
            raise ValueError("a mapping of runs already says which is the baseline; do not pass baseline")
        if len(items) == 1:
            return Source(items[0][1], str(items[0][0])), None
        return Source(items[1][1], str(items[1][0])), Source(items[0][1], str(items[0][0]))
    if isinstance(target, xr.Dataset) and "run" in target.dims:
        names = [str(r) for r in target["run"].values]
        if baseline is not None and not isinstance(baseline, str):
            raise ValueError("pass baseline as a run name when the runs are already combined")
        if len(names) == 1:
            return Source(_select(target, names[0]), names[0]), None
        if baseline is not None and baseline not in names:
            raise ValueError(f"baseline {baseline!r} is not one of the runs {names}")
        base = baseline or names[0]
        tname = next(n for n in reversed(names) if n != base)
        return Source(_select(target, tname), tname), Source(_select(target, base), base)
    tsrc = Source(target, _name_of(target, "target"))
    if baseline is None:
        return tsrc, None
    if isinstance(baseline, str) and not os.path.exists(baseline) and isinstance(target, xr.Dataset):
        raise ValueError(f"baseline {baseline!r}: no such path (a run name needs a combined dataset)")
    bsrc = Source(baseline, _name_of(baseline, "baseline"))
    if bsrc.name == tsrc.name:
        bsrc.name, tsrc.name = f"{bsrc.name} (baseline)", f"{tsrc.name} (target)"
    return tsrc, bsrc


def open_source(src: Source, *, loaded: Loaded, steps: Sequence[int] | None = None,
                ranks: Sequence[int] | None = None, format: str | None = None,
                workers: int | str | None = None, client: Any = None,
                progress: bool | None = None) -> xr.Dataset:
    """Open *src* (a dataset is taken as is, restricted to *steps*/*ranks*).

    Files that could not be read are appended to ``loaded.failures``.
    """
    if isinstance(src.value, xr.Dataset):
        ds = src.value
        if steps is not None:
            ds = ds.sel(step=[s for s in ds["step"].values if int(s) in set(steps)])
        if ranks is not None:
            ds = ds.sel(rank=[r for r in ds["rank"].values if int(r) in set(ranks)])
    elif src.is_path:
        from precnb.io.api import open_run

        with warnings.catch_warnings():  # skipped files are reported through `loaded`
            warnings.simplefilter("ignore")
            ds = open_run(src.value, format=format, steps=steps, ranks=ranks, workers=workers,
                          client=client, progress=progress)
    else:
        raise TypeError(f"expected a path or an xarray.Dataset, got {type(src.value).__name__}")
    from precnb.io.api import load_report

    rep = load_report(ds)
    loaded.failures.extend(f for f in rep.failures if f not in loaded.failures)
    return ds


def in_memory(ds: xr.Dataset) -> xr.Dataset:
    """*ds* loaded when it is dask-backed and small enough to be worth it (the report, the explorer)."""
    lazy = any(v.chunks is not None for v in ds.data_vars.values())
    return ds.compute() if lazy else ds
