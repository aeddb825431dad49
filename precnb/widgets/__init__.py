"""Notebook explorer: ipywidgets panels wired to precnb.viz charts and analysis findings.

Needs the ``notebook`` extra (ipywidgets, altair, anywidget, vl-convert-python); without
it, :func:`explore` raises an ImportError that says what to install.

Examples
--------
>>> import precnb
>>> ex = precnb.explore(precnb.open_run("dump/"))  # doctest: +SKIP
>>> ex.step, ex.rank, ex.tensor  # starts at the NaN origin when there is one  # doctest: +SKIP
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

from precnb._args import baseline_keyword

__all__ = ["explore"]

_NEEDED = ("ipywidgets", "altair", "anywidget", "vl_convert")


def _missing() -> list[str]:
    return [m for m in _NEEDED if find_spec(m) is None]


@baseline_keyword(call="run_or_runs")
def explore(run_or_runs: Any, *, baseline: Any = None, auto: bool = True, max_lines: int = 12,
            panels: Any = None, **options: Any) -> Any:
    """Open the linked explorer on one run or several, through the triage pipeline.

    Parameters
    ----------
    run_or_runs : xarray.Dataset, path, mapping or sequence
        One run; a dataset with a ``run`` dim; ``{"gpu": a, "npu": b}``; or paths.
    baseline : xarray.Dataset, path or str, optional
        The run to compare against (a dataset / path, or the name of one of the runs).
        Keyword-only: ``explore(target, baseline=...)`` (a second positional run is a ``TypeError``).
    auto : bool
        Open on the pipeline's first finding (``Explorer.finding``): the first divergence of two
        runs, the NaN origin of one, ... (False: run no diagnosis, just show the runs).
    max_lines : int
        Most rank lines in the line chart (the selected rank and the most deviating ones).
    panels : sequence of callables, optional
        The tabs: panel factories (``factory(explorer) -> Panel | None``), default
        :func:`precnb.widgets.tabs.default_panels` (see :mod:`precnb.widgets.panel`).
    **options
        Pipeline options, as for :func:`precnb.diagnose` (``target_layout="tp=2"``,
        ``baseline_layout``, ``step_offset``, ``tolerance``, ``mapping``, ``steps``, ``ranks``, ...).

    Returns
    -------
    precnb.widgets.explorer.Explorer
        An ipywidgets ``VBox``; display it (last expression of a cell).

    Raises
    ------
    ImportError
        When ipywidgets / altair / anywidget / vl-convert-python are not installed.
    """
    missing = _missing()
    if missing:
        raise ImportError(f"precnb.explore needs {', '.join(missing)}: "
                          "pip install 'precnb[notebook]'")
    from precnb.analysis._memo import scope
    from precnb.widgets._inputs import runs_for
    from precnb.widgets.explorer import Explorer

    with scope():  # the triage and the first screen: each dataset checksummed once for the memos
        runs, triage = runs_for(run_or_runs, baseline, auto=auto, options=options)
        return Explorer(runs, auto=auto, max_lines=max_lines, triage=triage, panels=panels)


def __getattr__(name: str) -> Any:
    panels = {"Explorer": "explorer", "FilterPanel": "filters", "HeatmapPanel": "charts",
              "SeriesPanel": "charts", "WherePanel": "charts", "DetailPanel": "detail", "FindingBar": "findings",
              "FindingPanel": "findings", "TriagePanel": "options", "AlignmentPanel": "alignment",
              "ShardPanel": "shards", "HierarchyPanel": "hierarchy", "ExportPanel": "export", "Panel": "panel",
              "default_panels": "tabs"}
    if name in panels:
        import importlib

        return getattr(importlib.import_module(f"precnb.widgets.{panels[name]}"), name)
    raise AttributeError(f"module 'precnb.widgets' has no attribute {name!r}")
