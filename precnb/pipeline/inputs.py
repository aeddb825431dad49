"""What the user hands the pipeline: paths, datasets, mappings of run names → runs, combined runs, a Triage.

:func:`normalize` is the one input model (issue #27): it turns every accepted form of
``(run_or_runs, baseline=...)`` into :class:`RunInputs` (the runs by name, which is the target and
which the baseline, by one rule, :func:`pick_roles`). The pipeline takes its two :class:`Source`
(:func:`split_inputs`), the explorer its one dataset (``precnb.widgets._inputs.normalize_runs``);
:func:`open_source` opens a source (a path through the readers, a dataset as is) and records
what could not be read.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xarray as xr

__all__ = ["NOT_A_RUN_NAME", "Loaded", "ReadRun", "RunInputs", "Source", "in_memory", "normalize", "open_source",
           "pick_roles", "split_inputs"]


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


#: the one message for a baseline given as a run when the target already holds the runs
NOT_A_RUN_NAME = "pass baseline as a run name when the runs are already combined"


def pick_roles(names: Sequence[str], baseline: Any = None) -> tuple[str, str]:
    """(target, baseline) names among combined runs: *baseline* if named, else the first; the target the last other.

    The one rule for a dataset with a ``run`` dim, used by :func:`split_inputs` (every front end) and by the
    explorer for more than two runs.

    Raises
    ------
    ValueError
        When *baseline* is not a run name, or not one of *names*.
    """
    if baseline is not None and not isinstance(baseline, str):
        raise ValueError(NOT_A_RUN_NAME)
    if baseline is not None and baseline not in names:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {list(names)}")
    base = baseline or names[0]
    return next(n for n in reversed(names) if n != base), base


#: the one message for a mapping that is empty or, where two runs are diagnosed, holds more than two
_ONE_OR_TWO = "pass one run, or a mapping of two runs {baseline_name: run, target_name: run}"


def _checked(x: Any) -> Any:
    """*x* if it is a run the readers can take (a path, a dataset, a :class:`ReadRun`), else the one TypeError."""
    if isinstance(x, (str, os.PathLike, xr.Dataset, ReadRun)):
        return x
    raise TypeError(f"expected a path or an xarray.Dataset, got {type(x).__name__}")


@dataclass(frozen=True)
class RunInputs:
    """Whatever the user passed, in one form: the runs by name and which is the target, which the baseline.

    Built by :func:`normalize` (the one function that knows every accepted input). The pipeline takes
    its :meth:`sources`, the explorer its :meth:`dataset`; both read the same :attr:`target` and
    :attr:`baseline`.

    Attributes
    ----------
    runs : dict of str to run
        Run name → what to open (a path, a dataset or a :class:`ReadRun`), in the order given (a
        baseline first); empty for a combined dataset or a triage (their runs are in them).
    target, baseline : str, str or None
        The names of the run diagnosed and of the run it is compared with (None: one run).
    names : tuple of str
        Every run's name, in order (more than two for the explorer's many runs).
    combined : xarray.Dataset, optional
        The dataset with a ``run`` dim that was passed.
    triage : precnb.Triage, optional
        The triage that was passed (already diagnosed: its runs, names and options).
    """

    runs: dict[str, Any]
    target: str
    baseline: str | None = None
    names: tuple[str, ...] = ()
    combined: xr.Dataset | None = None
    triage: Any = None

    def sources(self) -> tuple[Source, Source | None]:
        """The pipeline's (target, baseline) sources.

        Raises
        ------
        ValueError
            For a mapping of more than two runs (the explorer shows them; a triage compares two).
        TypeError
            For a triage (already diagnosed: rerun it from its runs).
        """
        if self.triage is not None:
            raise TypeError(f"expected a path or an xarray.Dataset, got {type(self.triage).__name__}")
        if self.combined is None and len(self.runs) > 2:
            raise ValueError(_ONE_OR_TWO)

        def source(name: str) -> Source:
            value = _select(self.combined, name) if self.combined is not None else self.runs[name]
            return Source(value, name)

        return source(self.target), (source(self.baseline) if self.baseline is not None else None)

    def dataset(self) -> xr.Dataset:
        """The explorer's one dataset: the runs with a ``run`` dim when comparing, else the one run.

        Paths are opened with :func:`precnb.io.open_run` (its defaults); a triage gives its runs as
        diagnosed (:meth:`precnb.Triage.combined`).

        Raises
        ------
        ValueError
            For a triage built from findings only (no dataset).
        """
        if self.triage is not None:
            if self.baseline is not None:
                return self.triage.combined()
            if self.triage.target is None:
                raise ValueError("this Triage holds no dataset (built from findings only): diagnose the run again")
            return self.triage.target
        if self.combined is not None:
            return self.combined if len(self.names) > 1 else _select(self.combined, self.target)
        if len(self.runs) == 1:
            return _opened(self.runs[self.target])
        from precnb.combine import combine_runs

        return combine_runs({n: _opened(v) for n, v in self.runs.items()})


def _opened(x: Any) -> xr.Dataset:
    if isinstance(x, ReadRun):
        return x.ds
    if isinstance(x, xr.Dataset):
        return x
    from precnb.io.api import open_run

    return open_run(x)


def normalize(run_or_runs: Any, baseline: Any = None) -> RunInputs:
    """The one input model: every accepted form of ``(run_or_runs, baseline=...)`` as :class:`RunInputs`.

    Parameters
    ----------
    run_or_runs : path, xarray.Dataset, ReadRun, mapping, sequence, Triage or RunInputs
        One run (a path, a dataset, a :class:`ReadRun`); a dataset with a ``run`` dim (the first run
        is the baseline unless *baseline* names one, the target the last other); a mapping
        ``{name: run}`` (first = baseline, last = target; with more than two, as for a combined
        dataset); a sequence of runs (named ``run0``, ``run1``, ...); a :class:`~precnb.Triage`
        (its runs as diagnosed); or :class:`RunInputs` (returned as is).
    baseline : path, xarray.Dataset, ReadRun or str, optional
        The run compared with, or (combined runs) the name of one of them.

    Returns
    -------
    RunInputs

    Raises
    ------
    ValueError
        For inputs that do not say which run is which.
    TypeError
        For a run that is neither a path nor a dataset.

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> inp = normalize({"gpu": empty_dataset(), "npu": empty_dataset()})
    >>> inp.target, inp.baseline, inp.names
    ('npu', 'gpu', ('gpu', 'npu'))
    """
    from precnb.pipeline.result import Triage

    x = run_or_runs
    if isinstance(x, RunInputs):
        if baseline is not None:
            raise ValueError("these inputs already say which run is the baseline; do not pass baseline")
        return x
    if isinstance(x, Triage):
        return _of_triage(x, baseline)
    if isinstance(x, xr.Dataset) and "run" in x.dims:
        return _of_combined(x, baseline)
    if isinstance(x, Mapping) and not isinstance(x, xr.Dataset):
        return _of_mapping({str(k): _checked(v) for k, v in x.items()}, baseline)
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes, xr.Dataset)):
        return _of_mapping({f"run{i}": _checked(v) for i, v in enumerate(x)}, baseline)
    return _of_pair(_checked(x), baseline)


def _of_triage(triage: Any, baseline: Any) -> RunInputs:
    if baseline is not None:
        raise ValueError("a Triage already holds its runs and options; pass neither baseline nor options")
    b, t = (str(n) for n in triage.names)
    if triage.baseline is None:
        return RunInputs({}, t, None, (t,), triage=triage)
    return RunInputs({}, t, b, (b, t), triage=triage)


def _of_combined(ds: xr.Dataset, baseline: Any) -> RunInputs:
    names = tuple(str(r) for r in ds["run"].values)
    if baseline is not None and not isinstance(baseline, str):
        raise ValueError(NOT_A_RUN_NAME)
    if len(names) == 1:  # one run: a baseline name has nothing to pick
        return RunInputs({}, names[0], None, names, combined=ds)
    target, base = pick_roles(names, baseline)
    return RunInputs({}, target, base, names, combined=ds)


def _of_mapping(runs: dict[str, Any], baseline: Any) -> RunInputs:
    names = tuple(runs)
    if not names:
        raise ValueError(_ONE_OR_TWO)
    if len(names) <= 2:
        if baseline is not None:
            raise ValueError("a mapping of runs already says which is the baseline; do not pass baseline")
        return RunInputs(runs, names[-1], names[0] if len(names) == 2 else None, names)
    target, base = pick_roles(names, baseline)  # many runs (the explorer): the combined dataset's rule
    return RunInputs(runs, target, base, names)


def _of_pair(target: Any, baseline: Any) -> RunInputs:
    tname = _name_of(target, "target")
    if baseline is None:
        return RunInputs({tname: target}, tname, None, (tname,))
    if isinstance(baseline, str) and not os.path.exists(baseline) and isinstance(target, xr.Dataset):
        raise ValueError(f"baseline {baseline!r}: no such path (a run name needs a combined dataset)")
    bname = _name_of(_checked(baseline), "baseline")
    if bname == tname:
        bname, tname = f"{bname} (baseline)", f"{tname} (target)"
    return RunInputs({bname: baseline, tname: target}, tname, bname, (bname, tname))


def split_inputs(target: Any, baseline: Any = None) -> tuple[Source, Source | None]:
    """The (target, baseline) sources of ``diagnose(target, baseline=...)``: :func:`normalize`, then its sources.

    *target* may be a path, a single-run dataset, a dataset with a ``run`` dim (two runs:
    the first is the baseline unless *baseline* names one), a mapping ``{name: run}`` of
    one or two runs (first = baseline, last = target), a sequence of runs, or :class:`RunInputs`.
    *baseline* may be a path, a dataset or, with a combined dataset, the name of one of its runs.

    Raises
    ------
    ValueError
        For inputs that do not say which run is which.
    """
    return normalize(target, baseline).sources()


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
