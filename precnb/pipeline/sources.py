"""The runs the pipeline opens: :class:`Source` (a path or a dataset, its name and layout), and opening it.

:func:`open_source` opens a source (a path through the readers, a dataset as is) and records in a
:class:`Loaded` what could not be read; a :class:`ReadRun` is a run already read, with the path it
was read from. :mod:`precnb.pipeline.inputs` (the input model) builds the sources.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xarray as xr

__all__ = ["Loaded", "ReadRun", "Source", "in_memory", "open_source"]


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
    #: the parallel layout given for this run (``"tp=2"``, a mapping or a Layout; None: read from the dumps)
    layout: Any = None

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
