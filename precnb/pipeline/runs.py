"""``precnb.open_runs``: several runs in one dataset, two runs whose names differ aligned first.

This is THE public ``open_runs`` (``precnb.open_runs``). :func:`precnb.io.open_runs` is the readers'
layer underneath it (open and combine, names as they are, no alignment: ``io`` sits below ``analysis``);
this one calls it for what needs no alignment.

``precnb.align`` is here too: :func:`precnb.analysis.align.align` on opened runs or on paths,
as :func:`precnb.diagnose` and :func:`precnb.tensor_metrics` accept them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import xarray as xr

__all__ = ["align", "open_runs"]


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
