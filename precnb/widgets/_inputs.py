"""What the user passes to :func:`precnb.widgets.explore` as one dataset and run names.

The input model is the pipeline's (:func:`precnb.pipeline.inputs.normalize`): the explorer takes its
dataset, the pipeline its sources, both the same roles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xarray as xr

from precnb.pipeline.inputs import normalize  # one input model (issue #27)
from precnb.pipeline.sources import in_memory as _in_memory  # one function (issue #27)

__all__ = ["Runs", "normalize_runs", "parse_ranks", "runs_for", "runs_of"]


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


def runs_of(triage: Any) -> Runs:
    """The explorer's runs of a diagnosed *triage*: its runs as diagnosed, named as it names them."""
    return normalize_runs(triage)


def normalize_runs(run_or_runs: Any, baseline: Any = None) -> Runs:
    """The explorer's :class:`Runs` of any accepted input: :func:`precnb.pipeline.inputs.normalize`'s dataset and roles.

    Parameters
    ----------
    run_or_runs : xarray.Dataset, path, mapping, sequence, Triage or RunInputs
        See :func:`precnb.pipeline.inputs.normalize` (a mapping may hold more than two runs).
    baseline : xarray.Dataset, path or str, optional
        A baseline run (dataset / path), or the name of one of the runs.

    Returns
    -------
    Runs
    """
    inp = normalize(run_or_runs, baseline)
    ds = _in_memory(inp.dataset())
    if inp.baseline is None or "run" not in ds.dims:
        return Runs(ds)
    return Runs(ds, inp.target, inp.baseline)


def runs_for(run_or_runs: Any, baseline: Any = None, *, auto: bool = True,
             options: dict[str, Any] | None = None) -> tuple[Runs, Any]:
    """The explorer's runs and the pipeline's :class:`~precnb.Triage` for them.

    Two runs (or one) go through :func:`precnb.diagnose` with *options*: the explorer shows
    the runs it prepared (shards merged, the baseline in the target's names) and opens on its
    first finding. With more than two runs the explorer shows all of them and the triage
    compares the baseline with the last other run. A Triage is shown as it is.
    """
    from precnb.pipeline import diagnose

    inp = normalize(run_or_runs, baseline)  # the one input model: the pipeline reads the same roles
    if inp.triage is not None:  # already diagnosed: show it as it is
        if options:
            raise ValueError("a Triage already holds its runs and options; pass neither baseline nor options")
        return runs_of(inp.triage), inp.triage
    kw = dict(options or {})
    if not auto:
        kw["kinds"] = []
    if len(inp.names) > 2:
        runs = normalize_runs(inp)
        triage = diagnose(runs.run(runs.target), baseline=runs.run(runs.baseline), **kw)
        return runs, triage
    triage = diagnose(inp, **kw)
    return runs_of(triage), triage


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
