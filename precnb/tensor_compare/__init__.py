"""Tensor metrics of two tensor-mode runs over (step, rank, tensor): :func:`tensor_metrics`.

The one place where tensor files are read for comparison. It pairs the target's tensors with the
baseline's (same label, or through an alignment), loads each pair only when its block is computed
(:func:`precnb.io.tensors.load_array`: ``.pt`` without torch, never unpickling), and computes
msprobe compare's metrics with :func:`precnb.analysis.tensor.metrics.pair_metrics`. Work is split
into blocks of tensors per (step, rank), run on dask (threads by default, or any scheduler /
distributed client), so memory holds one pair per worker; ``lazy=True`` returns the dask-backed
dataset unevaluated, and a selection of it computes only the blocks it touches.

Examples
--------
>>> import precnb
>>> m = precnb.tensor_metrics("data_samples/tensor_bug/baseline",
...                           "data_samples/tensor_bug/target")  # doctest: +SKIP
>>> m["cosine"].sel(tensor="Tensor.__add__.5.forward.output.0").item()  # doctest: +SKIP
0.97918197981
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import xarray as xr

from precnb._extras import DASK_ARRAYS, require
from precnb.errors import PrecnbError
from precnb.io.tensors import rank_folders
from precnb.tensor_compare.blocks import (
    _COPIED_COORDS,
    ENTRY_VARS,
    _compute_block,
    _dask_vars,
    _empty_vars,
    _workers,
)
from precnb.tensor_compare.select import _entries, _pairing, select_tensors

__all__ = ["ENTRY_VARS", "select_tensors", "tensor_metrics", "to_frame"]

def _open(run: Any, which: str, steps: list[int] | None = None, ranks: list[int] | None = None) -> xr.Dataset:
    if isinstance(run, xr.Dataset):
        ds = run
    elif isinstance(run, str | os.PathLike):
        from precnb.io.api import open_run

        ds = open_run(run, steps=steps, ranks=ranks, progress=None)
    else:
        raise TypeError(f"{which}: expected a dataset or a path, got {type(run).__name__}")
    if "run" in ds.dims:
        raise ValueError(f"{which} has a 'run' dimension; pass one run (precnb.combine.select_run)")
    if "data_name" not in ds or not rank_folders(ds):
        src = ds.attrs.get("source", "the dataset")
        raise PrecnbError(f"{which} ({src}) holds no tensor files: dump it with task=tensor")
    return ds


def tensor_metrics(
    baseline: Any,
    target: Any,
    *,
    tensors: Any = None,
    steps: Iterable[int] | None = None,
    ranks: Iterable[int] | None = None,
    alignment: Any = None,
    step_offset: int | str | None = None,
    lazy: bool = False,
    chunk: int = 64,
    scheduler: Any = "auto",
    workers: int | None = None,
) -> xr.Dataset:
    """Compute msprobe compare's tensor metrics for every (step, rank, tensor) of two tensor-mode runs.

    Parameters
    ----------
    baseline, target : xarray.Dataset or path
        Runs opened from ``task: tensor`` msprobe dumps (or their paths); msprobe's Bench and
        NPU sides.
    tensors : None, str or list of str, optional
        Which target tensors: a list of labels, a module path / node (e.g. ``"blocks.1"``) or a
        regular expression (see :func:`select_tensors`). Default: every tensor saved as a file.
    steps, ranks : iterable of int, optional
        Restrict to these (default: the steps and ranks both runs have).
    alignment : mapping or Alignment, optional
        Target label → baseline label (labels it does not name pair with the same label); a
        :class:`precnb.Alignment` pairs through its ``tensor_map()``.
    step_offset : int, "auto" or None
        Target step = baseline step + offset; None (the default everywhere): 0 when both runs hold the
        same steps, else detected ("auto", :func:`precnb.analysis.compare.align_steps`); the result's ``step`` is the
        baseline's, with a ``target_step`` coordinate.
    lazy : bool
        Return dask-backed variables; nothing is read until computed (the ``dask`` extra).
    chunk : int
        Tensors per task.
    scheduler : str or dask client
        ``"auto"`` / ``"threads"`` (a thread pool; numpy and file reads release the GIL),
        ``"sync"`` (this thread), or anything :func:`dask.compute` accepts (``"processes"``, a
        distributed client; these need the ``dask`` extra: ``pip install 'precnb[dask]'``).
    workers : int, optional
        Threads or processes for the local schedulers (default: the CPUs available, at most 8).

    Returns
    -------
    xarray.Dataset
        Dims (step, rank, tensor); ``tensor`` = target labels with coordinates
        ``baseline_tensor``, ``node``, ``module``, ``api``, ``kind``, ``direction``, ``role``,
        ``dtype``, ``shape`` (the target's). Variables: ``cosine``, ``euc_dist``,
        ``max_abs_err``, ``max_rel_err``, ``one_thousandth_err_ratio``,
        ``five_thousandths_err_ratio``, ``ulp_err`` (float64, NaN where msprobe writes
        unsupported / N/A / Nan), ``bitwise_equal`` (bool), ``status`` (see
        :data:`precnb.analysis.tensor.metrics.STATUSES`), ``message``, ``target_dtype`` and
        ``baseline_dtype`` (as saved).

    Raises
    ------
    PrecnbError
        When a run holds no tensor files.
    ValueError
        When the runs share no step or rank, or *tensors* selects nothing.
    """
    want_steps = None if steps is None else [int(x) for x in steps]
    want_ranks = None if ranks is None else [int(x) for x in ranks]
    if isinstance(step_offset, int) and not isinstance(step_offset, bool):
        off = int(step_offset)
        b = _open(baseline, "baseline", want_steps, want_ranks)
        t = _open(target, "target", None if want_steps is None else [x + off for x in want_steps], want_ranks)
    else:  # the one default: resolved on the runs themselves
        from precnb.analysis.compare import align_steps

        b = _open(baseline, "baseline", None, want_ranks)
        t = _open(target, "target", None, want_ranks)
        off = align_steps(b, t, step_offset)
    common_steps = sorted(set(b["step"].values.tolist()) & {s - off for s in t["step"].values.tolist()})
    common_ranks = sorted(set(b["rank"].values.tolist()) & set(t["rank"].values.tolist()))
    if want_steps is not None:
        common_steps = [s for s in common_steps if s in set(want_steps)]
    if want_ranks is not None:
        common_ranks = [r for r in common_ranks if r in set(want_ranks)]
    if not common_steps or not common_ranks:
        raise ValueError(f"the runs share no step/rank to compare (baseline steps {b['step'].values.tolist()}, "
                         f"ranks {b['rank'].values.tolist()}; target steps {t['step'].values.tolist()}, "
                         f"ranks {t['rank'].values.tolist()})")
    pair = _pairing(alignment)
    labels = select_tensors(t, tensors)
    blabels = [pair(lbl) for lbl in labels]
    tnames, texp = _entries(t, labels, [s + off for s in common_steps], common_ranks)
    bnames, bexp = _entries(b, blabels, common_steps, common_ranks)
    keep = np.flatnonzero(((tnames != "") | (bnames != "")).any(axis=(0, 1)))
    labels = [labels[i] for i in keep]
    blabels = [blabels[i] for i in keep]
    tnames, bnames = tnames[:, :, keep], bnames[:, :, keep]
    texp, bexp = texp[:, :, keep], bexp[:, :, keep]
    tdirs, bdirs = rank_folders(t), rank_folders(b)
    chunk = max(1, int(chunk))
    n = len(labels)
    shape = (len(common_steps), len(common_ranks), n)
    specs = [(s, r, k0, min(n, k0 + chunk)) for s in range(shape[0]) for r in range(shape[1])
             for k0 in range(0, n, chunk)]

    def args(spec: tuple[int, int, int, int]) -> tuple[Any, ...]:
        s, r, k0, k1 = spec
        step, rank = common_steps[s], common_ranks[r]
        return (list(tnames[s, r, k0:k1]), list(bnames[s, r, k0:k1]), tdirs.get((step + off, rank)),
                bdirs.get((step, rank)), list(texp[s, r, k0:k1]), list(bexp[s, r, k0:k1]))

    coords: dict[str, Any] = {"step": np.asarray(common_steps, np.int64), "rank": np.asarray(common_ranks, np.int64),
                              "target_step": ("step", np.asarray([s + off for s in common_steps], np.int64)),
                              "tensor": np.asarray(labels, dtype=object),
                              "baseline_tensor": ("tensor", np.asarray(blabels, dtype=object))}
    for c in _COPIED_COORDS:
        if c in t.coords:
            coords[c] = ("tensor", t[c].sel(tensor=labels).values if labels else np.asarray([], object))
    attrs = {"precnb_tensor_metrics": "msprobe compare 26.2.0 tensor-mode metrics (precnb.analysis.tensor.metrics)",
             "baseline_source": str(b.attrs.get("source", "")), "target_source": str(t.attrs.get("source", ""))}
    if lazy or (scheduler not in (None, "auto", "threads", "sync")):
        require(f"tensor_metrics({'lazy=True' if lazy else f'scheduler={scheduler!r}'})", DASK_ARRAYS, extra="dask")
        out = xr.Dataset(_dask_vars(specs, args, shape), coords=coords, attrs=attrs)
        if lazy:
            return out
        import dask

        (computed,) = dask.compute(out, scheduler=scheduler, num_workers=workers)
        return computed
    arrays = _empty_vars(shape)
    nworkers = _workers(workers)
    if scheduler in ("auto", "threads") and nworkers > 1 and len(specs) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=nworkers) as pool:
            results = list(pool.map(lambda sp: _compute_block(*args(sp)), specs))
    else:
        results = [_compute_block(*args(sp)) for sp in specs]
    for (s, r, k0, k1), res in zip(specs, results, strict=True):
        for v in ENTRY_VARS:
            arrays[v][s, r, k0:k1] = res[v]
    return xr.Dataset({v: (("step", "rank", "tensor"), a) for v, a in arrays.items()}, coords=coords, attrs=attrs)


def to_frame(metrics: xr.Dataset, *, with_data_only: bool = True) -> Any:
    """One row per (step, rank, tensor) of a :func:`tensor_metrics` result (pandas DataFrame).

    Parameters
    ----------
    metrics : xarray.Dataset
    with_data_only : bool
        Drop entries whose status is ``no_data``.

    Returns
    -------
    pandas.DataFrame
        Columns ``step, rank, tensor, baseline_tensor, node, module``, the metrics, ``status``,
        ``message``, ``target_dtype``, ``baseline_dtype``.
    """
    ds = metrics.compute()
    cols = [v for v in ENTRY_VARS if v in ds]
    extra = [c for c in ("baseline_tensor", "node", "module") if c in ds.coords]
    frame = ds[cols].reset_coords([c for c in ds.coords if c not in (*extra, "step", "rank", "tensor")],
                                  drop=True).to_dataframe().reset_index()
    if with_data_only:
        frame = frame[frame["status"] != "no_data"]
    return frame[["step", "rank", "tensor", *extra, *cols]].reset_index(drop=True)
