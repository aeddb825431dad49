"""What the user hands the pipeline: paths, datasets, mappings of run names → runs, combined runs, a Triage.

:func:`normalize` is the one input model (issue #27): it turns every accepted form of
``(run_or_runs, baseline=..., layouts=..., mapping=...)`` into :class:`RunInputs` (the runs by name,
which is the target and which the baseline, by one rule, :func:`pick_roles`; the parallel layout of
each run, by name; the name mapping files). The pipeline takes its two :class:`Source`
(:func:`split_inputs`), the explorer its one dataset (``precnb.widgets._inputs.normalize_runs``);
:func:`~precnb.pipeline.sources.open_source` opens a source (a path through the readers, a dataset
as is) and records what could not be read (:mod:`precnb.pipeline.sources`, re-exported here).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import xarray as xr

from precnb.pipeline.sources import Loaded, ReadRun, Source, in_memory, open_source

__all__ = ["NOT_A_RUN_NAME", "Loaded", "ReadRun", "RunInputs", "Source", "in_memory", "normalize", "open_source",
           "pick_roles", "split_inputs"]



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
    layouts : dict of str to layout
        The parallel layout given for a run, by run name (``"tp=2,pp=2"``, a mapping or a
        :class:`precnb.Layout`); a run without one has its layout read from the dumps.
    mapping : path, mapping, Alignment or a sequence of them, optional
        Name mapping files or a ready alignment, for the pair's name alignment.
    """

    runs: dict[str, Any]
    target: str
    baseline: str | None = None
    names: tuple[str, ...] = ()
    combined: xr.Dataset | None = None
    triage: Any = None
    layouts: Mapping[str, Any] = field(default_factory=dict)
    mapping: Any = None

    @property
    def target_layout(self) -> Any:
        """The layout given for the target (None: none given)."""
        return self.layouts.get(self.target)

    @property
    def baseline_layout(self) -> Any:
        """The layout given for the baseline (None: none given, or one run)."""
        return self.layouts.get(self.baseline) if self.baseline is not None else None

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
            return Source(value, name, layout=self.layouts.get(name))

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


def normalize(run_or_runs: Any, baseline: Any = None, *, layouts: Mapping[str, Any] | None = None,
              target_layout: Any = None, baseline_layout: Any = None, mapping: Any = None) -> RunInputs:
    """The one input model: every accepted form of ``(run_or_runs, baseline=..., layouts=...)`` as :class:`RunInputs`.

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
    layouts : mapping of run name to layout, optional
        The parallel layout of runs, by their names (``{"tp8": "tp=8"}``).
    target_layout, baseline_layout : layout, optional
        The same, by role (the options ``target_layout`` / ``baseline_layout``, the command line's
        ``--target-layout`` / ``--baseline-layout``).
    mapping : path, mapping, Alignment or a sequence of them, optional
        Name mapping files (kept as given: the alignment reads them).

    Returns
    -------
    RunInputs

    Raises
    ------
    ValueError
        For inputs that do not say which run is which; a layout for a run that is not one of them,
        or given twice (by name and by role) with two values; a baseline layout without a baseline.
    TypeError
        For a run that is neither a path nor a dataset.

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> inp = normalize({"gpu": empty_dataset(), "npu": empty_dataset()})
    >>> inp.target, inp.baseline, inp.names
    ('npu', 'gpu', ('gpu', 'npu'))
    >>> inp = normalize({"tp1": empty_dataset(), "tp2": empty_dataset()}, layouts={"tp2": "tp=2"})
    >>> inp.target_layout, inp.baseline_layout
    ('tp=2', None)
    """
    from precnb.pipeline.result import Triage

    x = run_or_runs
    extra = layouts or target_layout is not None or baseline_layout is not None or mapping is not None
    if isinstance(x, RunInputs):
        if baseline is not None:
            raise ValueError("these inputs already say which run is the baseline; do not pass baseline")
        if not extra:
            return x
        if mapping is not None and x.mapping is not None and mapping is not x.mapping:
            raise ValueError("these inputs already hold a mapping; do not pass mapping")
        return replace(x, layouts=_layouts_by_name(x, {**x.layouts, **(layouts or {})}, target_layout,
                                                   baseline_layout),
                       mapping=mapping if mapping is not None else x.mapping)
    if isinstance(x, Triage):
        if extra:
            raise ValueError("a Triage already holds its runs and options; pass neither baseline nor options")
        return _of_triage(x, baseline)
    if isinstance(x, xr.Dataset) and "run" in x.dims:
        inp = _of_combined(x, baseline)
    elif isinstance(x, Mapping) and not isinstance(x, xr.Dataset):
        inp = _of_mapping({str(k): _checked(v) for k, v in x.items()}, baseline)
    elif isinstance(x, Sequence) and not isinstance(x, (str, bytes, xr.Dataset)):
        inp = _of_mapping({f"run{i}": _checked(v) for i, v in enumerate(x)}, baseline)
    else:
        inp = _of_pair(_checked(x), baseline)
    if not extra:
        return inp
    return replace(inp, layouts=_layouts_by_name(inp, layouts, target_layout, baseline_layout), mapping=mapping)


def _layouts_by_name(inp: RunInputs, layouts: Mapping[str, Any] | None, target_layout: Any,
                     baseline_layout: Any) -> dict[str, Any]:
    """The layouts given, by run name: those given by name, and those given by role (the same value if both).

    Examples
    --------
    >>> inp = RunInputs({}, "t", "b", ("b", "t"))
    >>> _layouts_by_name(inp, {"b": "tp=1"}, "tp=2", None)
    {'b': 'tp=1', 't': 'tp=2'}
    """
    out: dict[str, Any] = {}
    for key, given in (layouts or {}).items():
        if str(key) not in inp.names:
            raise ValueError(f"layouts: {str(key)!r} is not one of the runs {list(inp.names)}")
        if given is not None:
            out[str(key)] = given
    if baseline_layout is not None and inp.baseline is None:
        raise ValueError("baseline_layout needs a baseline")
    by_role: tuple[tuple[str, str | None, Any], ...] = (("target_layout", inp.target, target_layout),
                                                        ("baseline_layout", inp.baseline, baseline_layout))
    for role, name, spec in by_role:
        if spec is None or name is None:
            continue
        if name in out and out[name] != spec:
            raise ValueError(f"the layout of run {name!r} is given twice: layouts[{name!r}]={out[name]!r} and "
                             f"{role}={spec!r}; give one")
        out[name] = spec
    return out


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



