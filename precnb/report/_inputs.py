"""What a report is about: one run, or a target and its baseline (plus layouts and step offset).

:func:`prepare` accepts what :func:`precnb.report.to_html` accepts — a dataset, a path, a
mapping of run names to datasets/paths, or a dataset with a ``run`` dim — and returns a
:class:`ReportData` holding single-run datasets, display names and the comparison settings.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xarray as xr

__all__ = ["ReportData", "prepare"]


@dataclass
class ReportData:
    """The runs of one report.

    Attributes
    ----------
    target : xarray.Dataset
        The run the report is about (single run; shards merged when a layout asked for it).
    baseline : xarray.Dataset or None
        The run it is compared with.
    names : (str, str)
        Display names (baseline, target); ``("", name)`` without a baseline.
    raw_target, raw_baseline : xarray.Dataset
        The runs before shard merging (the replica check and the header look at these).
    layout, baseline_layout : Layout or None
    step_offset : int or "auto"
        Target step = baseline step + offset.
    notes : list of str
        What was done to the inputs (merges), for the header.
    """

    target: xr.Dataset
    baseline: xr.Dataset | None = None
    names: tuple[str, str] = ("", "run")
    raw_target: xr.Dataset | None = None
    raw_baseline: xr.Dataset | None = None
    layout: Any = None
    baseline_layout: Any = None
    step_offset: int | str = 0
    notes: list[str] = field(default_factory=list)

    @property
    def compared(self) -> bool:
        """True with a baseline."""
        return self.baseline is not None


def _open(x: Any) -> xr.Dataset:
    if isinstance(x, xr.Dataset):
        return x
    if isinstance(x, (str, os.PathLike)):
        import precnb  # the top-level API (as the explorer does), not precnb.io directly

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return precnb.open_run(x, progress=False)
    raise TypeError(f"expected an xarray.Dataset or a path, got {type(x).__name__}")


def _name(x: Any, default: str) -> str:
    if isinstance(x, (str, os.PathLike)):
        p = Path(x)
        return p.name or str(p)
    if isinstance(x, xr.Dataset):
        src = str(x.attrs.get("source", "") or "")
        if src:
            return Path(src).name or src
    return default


def _in_memory(ds: xr.Dataset) -> xr.Dataset:
    lazy = any(v.chunks is not None for v in ds.data_vars.values())
    return ds.compute() if lazy else ds


def _split(ds: xr.Dataset, baseline: str | None) -> tuple[xr.Dataset, xr.Dataset | None, tuple[str, str]]:
    names = [str(r) for r in ds["run"].values]
    if len(names) == 1:
        return ds.isel(run=0).drop_vars("run"), None, ("", names[0])
    if baseline is not None and baseline not in names:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {names}")
    base = baseline or names[0]
    target = next(n for n in reversed(names) if n != base)
    return (ds.sel(run=target).drop_vars("run"), ds.sel(run=base).drop_vars("run"), (base, target))


def _layout(spec: Any, ds: xr.Dataset) -> Any:
    if spec is None or spec == "":
        return None
    from precnb.analysis import Layout

    if isinstance(spec, Layout):
        return spec
    if isinstance(spec, Mapping):
        return Layout(int(ds.sizes["rank"]), **dict(spec))
    return Layout.parse(str(spec), world_size=int(ds.sizes["rank"]))


def prepare(
    ds_or_runs: Any,
    *,
    baseline: Any = None,
    layout: Any = None,
    baseline_layout: Any = None,
    step_offset: int | str = 0,
    names: Sequence[str] | None = None,
) -> ReportData:
    """Normalise the report inputs.

    Parameters
    ----------
    ds_or_runs : xarray.Dataset, path, mapping or dataset with a ``run`` dim
        One run; ``{"gpu": a, "npu": b}`` (first = baseline, last = target); or a dataset
        holding several runs (``baseline`` may name one of them).
    baseline : xarray.Dataset, path or str, optional
        The baseline run, or the name of one of the runs.
    layout : Layout, str or mapping, optional
        Parallel layout of the target (``"tp=2,pp=2"``): replica check; with a baseline the
        target's shards are merged before comparing.
    baseline_layout : Layout, str or mapping, optional
        Layout of the baseline (its shards are merged before comparing).
    step_offset : int or "auto"
        Target step = baseline step + offset (a resumed run).
    names : (str, str), optional
        Display names (baseline, target).

    Returns
    -------
    ReportData
    """
    base_ds: xr.Dataset | None = None
    if isinstance(ds_or_runs, Mapping) and not isinstance(ds_or_runs, xr.Dataset):
        items = list(ds_or_runs.items())
        if not items or len(items) > 2:
            raise ValueError("pass one run, or a mapping of two runs {baseline_name: run, target_name: run}")
        if len(items) == 1:
            shown = (("", str(items[0][0])))
            target = _open(items[0][1])
        else:
            shown = (str(items[0][0]), str(items[1][0]))
            base_ds, target = _open(items[0][1]), _open(items[1][1])
    elif isinstance(ds_or_runs, xr.Dataset) and "run" in ds_or_runs.dims:
        target, base_ds, shown = _split(ds_or_runs, baseline if isinstance(baseline, str) else None)
        if baseline is not None and not isinstance(baseline, str):
            raise ValueError("pass baseline as a run name when the runs are already combined")
    else:
        target = _open(ds_or_runs)
        shown = ("", _name(ds_or_runs, "run"))
    if baseline is not None and base_ds is None and not (isinstance(ds_or_runs, xr.Dataset)
                                                          and "run" in ds_or_runs.dims):
        base_ds = _open(baseline)
        shown = (_name(baseline, "baseline"), shown[1])
    if base_ds is not None and shown[0] == shown[1]:
        shown = ("baseline", "target") if not shown[0] else (f"{shown[0]} (baseline)", f"{shown[1]} (target)")
    if names is not None:
        shown = (str(names[0]), str(names[1]))
    target = _in_memory(target)
    base_ds = _in_memory(base_ds) if base_ds is not None else None
    data = ReportData(target=target, baseline=base_ds, names=shown, raw_target=target, raw_baseline=base_ds,
                      step_offset=step_offset)
    data.layout = _layout(layout, target)
    if base_ds is not None:
        data.baseline_layout = _layout(baseline_layout, base_ds)
        _merge(data)
    elif baseline_layout:
        raise ValueError("baseline_layout needs a baseline")
    return data


def _sharded(layout: Any) -> bool:
    return layout is not None and any(getattr(layout, d) > 1 for d in ("tp", "pp", "vpp", "cp", "ep"))


def _merge(data: ReportData) -> None:
    """Merge shards before comparing (as ``precnb diff --baseline-layout/--target-layout``)."""
    from precnb.analysis import merge_shards

    b_lay = data.baseline_layout if _sharded(data.baseline_layout) else None
    t_lay = data.layout if _sharded(data.layout) else None
    assert data.baseline is not None
    base, target = data.baseline, data.target
    if b_lay is not None:
        merged = merge_shards(base, b_lay, reference=None if t_lay else target)
        data.notes.append(f"baseline shards merged ({b_lay.describe()})")
    else:
        merged = base
    if t_lay is not None:
        data.target = merge_shards(target, t_lay, reference=None if b_lay else base)
        data.notes.append(f"target shards merged ({t_lay.describe()})")
    data.baseline = merged
