"""``precnb.open_runs``: several runs in one dataset, two runs whose names differ aligned first."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import xarray as xr

__all__ = ["open_runs"]


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
    from precnb.combine import combine_runs
    from precnb.io.api import open_run

    opened = {name: (p if isinstance(p, xr.Dataset) else open_run(p, **kwargs)) for name, p in paths.items()}
    if len(opened) == 2:
        from precnb.analysis.align import Alignment, align

        (bn, b), (tn, t) = opened.items()
        a = align(b, t, mapping=mapping)
        if not a.identical:
            both = combine_runs({bn: a.apply(b), tn: a.target_view(t)})
            both.attrs[Alignment.ATTR] = json.dumps(a.to_dict())
            return both
    elif mapping is not None:
        raise ValueError("mapping aligns two runs; give exactly two")
    return combine_runs(opened)
