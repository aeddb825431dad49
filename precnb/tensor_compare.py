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
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.tensor.metrics import FLOAT_METRICS, pair_metrics
from precnb.errors import PrecnbError
from precnb.io._expect import Expected
from precnb.io.tensors import TensorFolder, load_array, rank_folders

__all__ = ["ENTRY_VARS", "select_tensors", "tensor_metrics", "to_frame"]

ENTRY_VARS = (*FLOAT_METRICS, "bitwise_equal", "status", "message", "target_dtype", "baseline_dtype")
_COPIED_COORDS = ("node", "module", "api", "kind", "direction", "role", "dtype", "shape")
_OBJECT_VARS = ("status", "message", "target_dtype", "baseline_dtype")


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


def select_tensors(ds: xr.Dataset, tensors: Any = None) -> list[str]:
    r"""Tensor labels of *ds* picked by *tensors*, in dataset order.

    Parameters
    ----------
    ds : xarray.Dataset
    tensors : None, str or iterable of str
        None: every tensor. A list: exactly these labels. A string: the tensors of that module
        (``blocks.1.attn`` and below) or node (``Functional.linear.0.forward``), else a regular
        expression searched in the labels.

    Returns
    -------
    list of str

    Raises
    ------
    KeyError
        Naming listed labels that are not in *ds*.
    ValueError
        When a string matches nothing.

    Examples
    --------
    >>> ds = xr.Dataset(coords={"tensor": ["a.0.forward.output.0", "b.0.forward.output.0"],
    ...                          "module": ("tensor", ["blocks.1", "blocks.10"]),
    ...                          "node": ("tensor", ["a.0.forward", "b.0.forward"])})
    >>> select_tensors(ds, "blocks.1")
    ['a.0.forward.output.0']
    >>> select_tensors(ds, r"^b\.")
    ['b.0.forward.output.0']
    """
    labels = [str(x) for x in ds["tensor"].values]
    if tensors is None:
        return labels
    if isinstance(tensors, str):
        modules = [str(x) for x in ds["module"].values] if "module" in ds.coords else [""] * len(labels)
        nodes = [str(x) for x in ds["node"].values] if "node" in ds.coords else [""] * len(labels)
        picked = [lbl for lbl, mod, node in zip(labels, modules, nodes, strict=True)
                  if tensors in (lbl, node, mod) or mod.startswith(tensors + ".")]
        if picked:
            return picked
        try:
            rx = re.compile(tensors)
        except re.error as exc:
            raise ValueError(f"tensors={tensors!r} is neither a module, a node nor a valid regular "
                             f"expression ({exc})") from None
        picked = [lbl for lbl in labels if rx.search(lbl)]
        if not picked:
            raise ValueError(f"tensors={tensors!r} matches no module, node or tensor label")
        return picked
    wanted = [str(x) for x in tensors]
    known = set(labels)
    missing = [x for x in wanted if x not in known]
    if missing:
        raise KeyError(f"not in the target run: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    return wanted


def _pairing(alignment: Any) -> Callable[[str], str]:
    """Map target label → baseline label: any mapping (missing labels pair by name) or an Alignment."""
    if alignment is None:
        return lambda label: label
    tensor_map = getattr(alignment, "tensor_map", None)  # a precnb.Alignment
    if callable(tensor_map):
        alignment = tensor_map()
    for name in ("baseline_tensor", "baseline_label"):
        fn = getattr(alignment, name, None)
        if callable(fn):
            return lambda label: str(fn(label) or label)
    if isinstance(alignment, Mapping):
        return lambda label: str(alignment.get(label, label))
    raise TypeError(f"alignment: expected a mapping target label -> baseline label, got {type(alignment).__name__}")


def _entries(ds: xr.Dataset, labels: list[str], steps: list[int], ranks: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(data_name, expected)`` over (step, rank, label); "" / None where the label is absent or not saved.

    *expected* is what each file's dump record says (:class:`precnb.io._expect.Expected`: its
    element count and dtype), checked before the file is materialised.
    """
    out = np.full((len(steps), len(ranks), len(labels)), "", dtype=object)
    exp = np.full(out.shape, None, dtype=object)
    known = ds.indexes["tensor"]
    have = [i for i, lbl in enumerate(labels) if lbl in known]
    if have:
        names = [labels[i] for i in have]
        sub = ds["data_name"].sel(step=steps, rank=ranks, tensor=names).values
        pres = ds["present"].sel(step=steps, rank=ranks, tensor=names).values
        out[:, :, have] = np.where(pres, sub, "")
        numel = ds["numel"].sel(step=steps, rank=ranks, tensor=names).values if "numel" in ds else None
        dtypes = ds["dtype"].sel(tensor=names).values if "dtype" in ds.coords else [None] * len(names)
        for s, r, k in zip(*np.nonzero(pres), strict=True):
            exp[s, r, have[k]] = Expected.of(None if numel is None else numel[s, r, k], dtypes[k])
    return out, exp


def _load(folder: TensorFolder | None, name: str, expected: Expected | None) -> tuple[np.ndarray, str]:
    if folder is None:
        raise PrecnbError("no dump folder known for this step and rank")
    path = folder.path(name)
    try:
        return load_array(path, expected)
    except MemoryError:  # one tensor too large for this machine: that tensor is unreadable, not the command
        raise PrecnbError(f"{path}: not enough memory to load it") from None


def _compute_block(tnames: list[str], bnames: list[str], tdir: Path | None, bdir: Path | None,
                   texp: list[Any] | None = None, bexp: list[Any] | None = None) -> dict[str, np.ndarray]:
    """Metrics of one block of pairs (one pair in memory at a time)."""
    tfolder = TensorFolder(tdir / "dump_tensor_data") if tdir is not None else None
    bfolder = TensorFolder(bdir / "dump_tensor_data") if bdir is not None else None
    k = len(tnames)
    out: dict[str, np.ndarray] = {m: np.full(k, np.nan) for m in FLOAT_METRICS}
    out["bitwise_equal"] = np.zeros(k, bool)
    for name in _OBJECT_VARS:
        out[name] = np.full(k, "", dtype=object)
    for j, (tn, bn) in enumerate(zip(tnames, bnames, strict=True)):
        if not tn or not bn:
            out["status"][j] = "no_data"
            out["message"][j] = "no tensor file in the " + ("target" if not tn else "baseline")
            continue
        try:
            tarr, tdt = _load(tfolder, tn, texp[j] if texp else None)
            barr, bdt = _load(bfolder, bn, bexp[j] if bexp else None)
        except PrecnbError as exc:  # one unreadable file does not stop the others
            out["status"][j] = "unreadable"
            out["message"][j] = " ".join(str(exc).split())[:300]
            continue
        res = pair_metrics(tarr, barr, target_dtype=tdt, baseline_dtype=bdt)
        del tarr, barr
        for m in FLOAT_METRICS:
            out[m][j] = res.values[m]
        out["bitwise_equal"][j] = res.bitwise_equal
        out["status"][j], out["message"][j] = res.status, res.message
        out["target_dtype"][j], out["baseline_dtype"][j] = tdt, bdt
    return out


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
        Return dask-backed variables; nothing is read until computed.
    chunk : int
        Tensors per task.
    scheduler : str or dask client
        ``"auto"`` / ``"threads"`` (a thread pool; numpy and file reads release the GIL),
        ``"sync"`` (this thread), or anything :func:`dask.compute` accepts (``"processes"``, a
        distributed client).
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


def _var_dtype(v: str) -> Any:
    return object if v in _OBJECT_VARS else (bool if v == "bitwise_equal" else np.float64)


def _empty_vars(shape: tuple[int, int, int]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for v in ENTRY_VARS:
        dt = _var_dtype(v)
        out[v] = (np.full(shape, "", dtype=object) if dt is object else
                  np.zeros(shape, bool) if dt is bool else np.full(shape, np.nan))
    return out


def _workers(workers: int | None) -> int:
    if workers:
        return max(1, int(workers))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(8, cpus)


def _dask_vars(specs: list[tuple[int, int, int, int]], args: Callable[[Any], tuple[Any, ...]],
               shape: tuple[int, int, int]) -> dict[str, Any]:
    """Dask-backed variables: one delayed task per block (a selection computes only its blocks)."""
    import dask
    import dask.array as da

    nested: dict[str, list[list[list[Any]]]] = {
        v: [[[] for _ in range(shape[1])] for _ in range(shape[0])] for v in ENTRY_VARS}
    for spec in specs:
        s, r, k0, k1 = spec
        res = dask.delayed(_compute_block, pure=True)(*args(spec))
        for v in ENTRY_VARS:
            nested[v][s][r].append(da.from_delayed(res[v], shape=(k1 - k0,), dtype=_var_dtype(v))[None, None, :])
    out = {}
    for v in ENTRY_VARS:
        if shape[2] == 0:
            out[v] = (("step", "rank", "tensor"), da.zeros(shape, dtype=_var_dtype(v)))
        else:
            out[v] = (("step", "rank", "tensor"), da.block(nested[v]))
    return out


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
