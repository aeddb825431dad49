"""The runs the pipeline opens: :class:`Source` (a path or a dataset, its name and layout), and opening it.

:func:`open_source` opens a source (a path through the readers, a dataset as is) and records in a
:class:`Loaded` what could not be read; a :class:`ReadRun` is a run already read, with the path it
was read from. :mod:`precnb.pipeline.inputs` (the input model) builds the sources.

``precnb.open_runs`` (:func:`open_runs`) is here too: several runs in one dataset, two runs whose names differ
aligned first. :func:`precnb.io.open_runs` is the readers' layer underneath it (open and combine, names as they
are, no alignment: ``io`` sits below ``analysis``); this one calls it for what needs no alignment. And
``precnb.align`` (:func:`align`): :func:`precnb.analysis.align.align` on opened runs or on paths, as
:func:`precnb.diagnose` and :func:`precnb.tensor_metrics` accept them.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xarray as xr

__all__ = ["Loaded", "ReadRun", "Source", "align", "in_memory", "open_runs", "open_source"]


@dataclass(frozen=True)
class ReadRun:
    """A run already read into *ds* from *path*: diagnosed from the dataset, its node records read from the path.

    What a rerun hands :func:`precnb.diagnose` (the explorer's Match, Unmatch and Rerun): the
    dataset saves reading the dumps again, the path keeps what only the files hold (the scalar
    arguments of a node's record, :func:`precnb.pipeline.result.attach_scalar_arguments`), so a rerun gives the first
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
    #: what :meth:`resolved` found, by forced format: the readers are asked once per path
    _resolved: dict[str | None, tuple[str, str]] = field(default_factory=dict, init=False, repr=False, compare=False)

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

    def resolved(self, format: str | None = None) -> tuple[str, str]:
        """(the path to read, its reader's name) for :attr:`records_path`, detected once (*format*: forced).

        Every read of the run in a triage (each step batch, the steps it holds, node records) goes through it, so
        the readers are asked which one reads the path once (:func:`precnb.io.detect.resolve`: a sample folder that
        wraps the dump is read through the dump).

        Raises
        ------
        NotADumpError
            When nothing reads the path (asked again next time).
        """
        got = self._resolved.get(format)
        if got is None:
            from pathlib import Path

            from precnb.io.detect import resolve

            if self.records_path is None:
                raise TypeError(f"{self.name}: no path to read")
            where, fmt = resolve(Path(self.records_path), format)
            got = self._resolved[format] = (os.fspath(where), fmt)
        return got


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

        where, fmt = src.resolved(format)  # the reader asked once per path, not once per step batch
        with warnings.catch_warnings():  # skipped files are reported through `loaded`
            warnings.simplefilter("ignore")
            ds = open_run(where, format=fmt, steps=steps, ranks=ranks, workers=workers,
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


def open_runs(paths: Mapping[str, Any], *, mapping: Any = None, **kwargs: Any) -> xr.Dataset:
    """Open several runs into one dataset with a leading ``run`` dimension.

    Two runs whose names differ (a framework port, renamed modules, restructured code) are aligned
    first (:func:`precnb.align`): the first is renamed into the second's names, framework glue is
    left out, and the alignment is recorded in ``attrs["precnb_alignment"]`` (so
    :func:`precnb.first_divergence` of the combined dataset names both sides).

    Parameters
    ----------
    paths : mapping of str to path-like or xarray.Dataset
        Run name → path (or an opened dataset), e.g. ``{"gpu": "gpu_dump", "npu": "npu_dump"}``;
        with two runs the first is the baseline.
    mapping : path, mapping document or Alignment, optional
        Name-mapping file(s) for the alignment of two runs.
    **kwargs
        Passed to :func:`precnb.open_run`.

    Returns
    -------
    xarray.Dataset
        Dims ``(run, step, rank, tensor)``.

    Examples
    --------
    >>> import precnb
    >>> both = precnb.open_runs({"pt": "pt_dump/", "ms": "ms_dump/"})  # doctest: +SKIP
    >>> precnb.first_divergence(both).baseline["node"]  # doctest: +SKIP
    """
    from precnb.io import api

    if len(paths) != 2 and mapping is not None:
        raise ValueError("mapping aligns two runs; give exactly two")
    opened = {name: (p if isinstance(p, xr.Dataset) else api.open_run(p, **kwargs)) for name, p in paths.items()}
    if len(opened) == 2:
        from precnb.analysis.align import Alignment, align
        from precnb.combine import combine_runs

        (bn, b), (tn, t) = opened.items()
        a = align(b, t, mapping=mapping)
        if not a.identical:
            both = combine_runs({bn: a.apply(b), tn: a.target_view(t)})
            both.attrs[Alignment.ATTR] = json.dumps(a.to_dict())
            return both
    return api.open_runs(opened)  # the readers' combination, names as they are


def align(baseline: Any, target: Any, *, mapping: Any = None, **kwargs: Any) -> Any:
    """Pair the modules, nodes and tensors of two runs (paths or opened datasets).

    Parameters
    ----------
    baseline, target : path-like or xarray.Dataset
        Two single runs: a dump path (opened with :func:`precnb.open_run`) or a dataset.
    mapping : path, mapping document, Alignment or a sequence of them, optional
        See :func:`precnb.analysis.align.align`.
    **kwargs
        Passed to :func:`precnb.open_run` for a path.

    Returns
    -------
    precnb.Alignment

    Raises
    ------
    TypeError
        An input that is neither a path nor a dataset.

    Examples
    --------
    >>> import precnb
    >>> precnb.align("data_samples/renamed/baseline", "data_samples/renamed/target").identical  # doctest: +SKIP
    False
    """
    import os

    from precnb.analysis.align import align as align_datasets
    from precnb.io.api import open_run

    def opened(x: Any, which: str) -> xr.Dataset:
        if isinstance(x, xr.Dataset):
            return x
        if isinstance(x, str | os.PathLike):
            return open_run(x, **{"progress": False, **kwargs})
        raise TypeError(f"{which}: expected a run path or an xarray.Dataset, got {type(x).__name__}")

    return align_datasets(opened(baseline, "baseline"), opened(target, "target"), mapping=mapping)
