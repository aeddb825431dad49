"""Turn what the user passes to :func:`precnb.widgets.explore` into one dataset and run names."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xarray as xr

from precnb.pipeline.inputs import in_memory as _in_memory  # one function (issue #27)


def _diagnosed(triage: Any) -> xr.Dataset:
    """The run a one-run *triage* diagnosed (a Triage built without its dataset is an error, not ``None``)."""
    if triage.target is None:
        raise ValueError("this Triage holds no dataset (built from findings only): diagnose the run again")
    return triage.target


__all__ = ["Runs", "normalize_runs", "parse_ranks", "runs_for"]


@dataclass
class Runs:
    """The explorer's data: one dataset (with a ``run`` dim when comparing) and run roles."""

    ds: xr.Dataset
    target: str | None = None
    baseline: str | None = None
    _views: dict[str, xr.Dataset] = field(default_factory=dict, repr=False, compare=False)

    @property
    def names(self) -> list[str]:
        """Run names (empty for a single run)."""
        return [str(r) for r in self.ds["run"].values] if "run" in self.ds.dims else []

    def run(self, name: str | None = None) -> xr.Dataset:
        """One run as a single-run dataset (the target by default)."""
        if "run" not in self.ds.dims:
            return self.ds
        name = name or self.target or self.names[-1]
        if name not in self._views:  # one object per run: caches keyed on it stay valid
            from precnb.combine import select_run

            self._views[name] = select_run(self.ds, name)  # with its own attributes (per-entry metadata, stacks)
        return self._views[name]


def _open(x: Any) -> xr.Dataset:
    if isinstance(x, xr.Dataset):
        return x
    if isinstance(x, (str, os.PathLike)):
        from precnb.io.api import open_run

        return open_run(x)
    raise TypeError(f"expected an xarray.Dataset or a path, got {type(x).__name__}")


def normalize_runs(run_or_runs: Any, baseline: Any = None) -> Runs:
    """Accept a dataset, a path, a mapping/sequence of them, or a dataset with a ``run`` dim.

    Parameters
    ----------
    run_or_runs : xarray.Dataset, path, mapping or sequence
    baseline : xarray.Dataset, path or str, optional
        A baseline run (dataset / path), or the name of one of the runs.

    Returns
    -------
    Runs
    """
    from precnb.combine import combine_runs

    if isinstance(run_or_runs, xr.Dataset):
        ds = run_or_runs
    elif isinstance(run_or_runs, Mapping):
        ds = combine_runs({str(k): _open(v) for k, v in run_or_runs.items()})
    elif isinstance(run_or_runs, Sequence) and not isinstance(run_or_runs, (str, bytes)):
        ds = combine_runs({f"run{i}": _open(v) for i, v in enumerate(run_or_runs)})
    else:
        ds = _open(run_or_runs)
    if baseline is not None and not (isinstance(baseline, str) and "run" in ds.dims):
        if "run" in ds.dims:
            raise ValueError("pass baseline as a run name when the runs are already combined")
        ds = combine_runs({"baseline": _open(baseline), "target": ds})
        baseline = "baseline"
    ds = _in_memory(ds)
    if "run" not in ds.dims:
        return Runs(ds)
    names = [str(r) for r in ds["run"].values]
    if len(names) == 1:
        return Runs(ds.isel(run=0).drop_vars("run"), None, None)
    if baseline is not None and baseline not in names:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {names}")
    base = baseline or names[0]
    target = next(n for n in reversed(names) if n != base)
    return Runs(ds, target, base)


def runs_for(run_or_runs: Any, baseline: Any = None, *, auto: bool = True,
             options: dict[str, Any] | None = None) -> tuple[Runs, Any]:
    """The explorer's runs and the pipeline's :class:`~precnb.Triage` for them.

    Two runs (or one) go through :func:`precnb.diagnose` with *options*: the explorer shows
    the runs it prepared (shards merged, the baseline in the target's names) and opens on its
    first finding. With more than two runs the explorer shows all of them and the triage
    compares the baseline with the last other run.
    """
    from precnb.pipeline import Triage, diagnose

    if isinstance(run_or_runs, Triage):  # already diagnosed: show it as it is
        if baseline is not None or options:
            raise ValueError("a Triage already holds its runs and options; pass neither baseline nor options")
        triage = run_or_runs
        if triage.baseline is None:
            return Runs(_in_memory(_diagnosed(triage))), triage
        return Runs(_in_memory(triage.combined()), triage.names[1], triage.names[0]), triage
    kw = dict(options or {})
    if not auto:
        kw["kinds"] = []
    if isinstance(run_or_runs, Sequence) and not isinstance(run_or_runs, (str, bytes, os.PathLike)):
        run_or_runs = {f"run{i}": v for i, v in enumerate(run_or_runs)}
    many = (isinstance(run_or_runs, xr.Dataset) and "run" in run_or_runs.dims and run_or_runs.sizes["run"] > 2) or \
        (isinstance(run_or_runs, Mapping) and not isinstance(run_or_runs, xr.Dataset) and len(run_or_runs) > 2)
    if many:
        runs = normalize_runs(run_or_runs, baseline)
        triage = diagnose(runs.run(runs.target), baseline=runs.run(runs.baseline), **kw)
        return runs, triage
    triage = diagnose(run_or_runs, baseline=baseline, **kw)
    if triage.baseline is None:
        return Runs(_in_memory(_diagnosed(triage))), triage
    names = list(triage.names)
    return Runs(_in_memory(triage.combined()), names[1], names[0]), triage


def parse_ranks(text: str, available: Sequence[int]) -> list[int] | None:
    """Parse ``"0-7, 12"`` into ranks present in *available*; empty text → None (all).

    Examples
    --------
    >>> parse_ranks("0-2, 5", range(8))
    [0, 1, 2, 5]
    >>> parse_ranks(" ", range(8)) is None
    True
    """
    text = text.strip()
    if not text:
        return None
    have = set(int(r) for r in available)
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.replace(";", ",").split(","))):
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise ValueError(f"rank item {part!r} is not N or N-M") from None
        out.update(r for r in range(min(a, b), max(a, b) + 1) if r in have)
    return sorted(out)
