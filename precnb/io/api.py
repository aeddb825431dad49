"""Public entry points: :func:`open_run`, :func:`open_runs`, :func:`detect_format`, :func:`available_steps`.

Every format is a :class:`~precnb.io.readers.Reader` of the registry (:mod:`precnb.io.readers`);
nothing here knows a format.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import xarray as xr

from precnb._extras import DASK_ARRAYS, require
from precnb.combine import combine_runs
from precnb.io._assemble import LoadReport
from precnb.io.detect import detect_format, resolve
from precnb.io.readers import get_reader, reader_names

__all__ = ["available_steps", "detect_format", "load_report", "node_records", "open_run", "open_runs"]


def __getattr__(name: str) -> Any:
    if name == "FORMATS":  # the registry's names (plug-ins included), when asked
        return reader_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_run(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    errors: Literal["report", "raise"] = "report",
    client: Any = None,
    lazy: bool = False,
    progress: bool | None = None,
    workers: int | str | None = None,
    rank_table: Any = None,
    gaps: Literal["raise", "report"] = "raise",
) -> xr.Dataset:
    """Open one run as a canonical dataset (dims step, rank, tensor).

    Parameters
    ----------
    path : path-like
        An msprobe dump root, ``stepN`` folder, rank folder or dump.json; a monitor output
        folder; a MindSpore kernel dump; a compare result CSV; or a precnb zarr store.
    format : str, optional
        Force a reader (a name of :func:`precnb.io.readers.reader_names`, e.g. ``"msprobe"``);
        detected when omitted.
    steps, ranks : sequence of int, optional
        Load only these.
    errors : {"report", "raise"}
        ``"report"`` (default) skips unreadable rank files and records them in the load
        report (``precnb.load_report(ds)``); ``"raise"`` stops at the first one.
    client : dask.distributed.Client, optional
        Parse on this cluster (one task per file). The ambient client is used when present
        (unless ``PRECNB_NO_DASK_CLIENT`` is set).
    lazy : bool
        Return dask-backed variables, one chunk per step. A zarr store is then read lazily
        (nothing but the coordinates is loaded: open a run larger than memory this way, after
        :func:`precnb.to_zarr`); other sources are parsed, then chunked. Needs the ``dask`` extra
        (``pip install 'precnb[dask]'``).
    progress : bool, optional
        Force the progress bar on or off (default: on for 16 files or more).
    workers : int, "auto" or None
        Without a dask client, parse in this many local processes (``"auto"``: one per
        available CPU, at most 8, when the input is large enough to pay for them). Default
        (everywhere, the command line included): ``PRECNB_WORKERS``, else ``"auto"``.
    rank_table : path or mapping, optional
        Which host and device served each rank (HCCL ``rank_table_file`` JSON, ``rank,host,device``
        CSV or ``{rank: (host, device)}``, :mod:`precnb.io.rank_table`). Kept as
        ``ds.attrs["rank_table"]``, so every diagnosis of the run names hosts and devices beside ranks.
    gaps : {"raise", "report"}
        A zarr store with missing chunk files: raise (default; their values are unknown), or read them
        as fill values and list them in the load report (``precnb info``).

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    NotADumpError
        When the path holds nothing readable.
    precnb._extras.MissingExtraError
        *lazy* without dask installed (the message names the extra).

    Examples
    --------
    >>> import precnb
    >>> ds = precnb.open_run(precnb.sample_path("healthy"))  # doctest: +SKIP
    >>> ds.sizes  # doctest: +SKIP
    """
    if lazy:  # dask-backed variables: the dask extra (one line naming it, not an xarray ImportError later)
        require("open_run(lazy=True)", DASK_ARRAYS, extra="dask")
    p, fmt = resolve(Path(path), format)
    reader = get_reader(fmt)
    extra = {"gaps": gaps} if gaps != "raise" else {}
    ds = reader.open(p, errors=errors, client=client, progress=progress, steps=steps, ranks=ranks,
                     workers=workers, lazy=lazy, **extra)
    rep = load_report(ds)
    if rep.failures:
        warnings.warn(
            f"{p}: {len(rep.failures)} file(s) could not be read and were skipped; "
            "see precnb.load_report(ds)", stacklevel=2)
    if lazy and not reader.lazy:
        ds = ds.chunk({"step": 1})
    if rank_table is not None:
        ds = with_rank_table(ds, rank_table)
    return ds


def with_rank_table(ds: xr.Dataset, rank_table: Any) -> xr.Dataset:
    """*ds* with its rank table kept in ``attrs["rank_table"]`` (JSON ``{rank: {"host", "device"}}``).

    The table must place every rank of *ds*.

    Raises
    ------
    precnb.io.rank_table.RankTableError
        A table that cannot be read or that does not place a rank of the run.
    """
    from precnb.io.rank_table import check_covers, normalise_table, within_run

    name = str(rank_table) if isinstance(rank_table, (str, os.PathLike)) else "rank table"
    table = normalise_table(rank_table, name=name)
    notes: list[str] = []
    if "rank" in ds.dims:
        check_covers(table, (int(r) for r in ds["rank"].values), name=name)
        table = within_run(table, (int(r) for r in ds["rank"].values), notes=notes, name=name)
    for note in notes:  # rows for ranks the run does not have: said, never dropped silently (#49)
        warnings.warn(note, stacklevel=3)
    ds = ds.copy()
    ds.attrs["rank_table"] = json.dumps({str(r): d for r, d in table.items()})
    ds.attrs["rank_table_source"] = name
    return ds


def available_steps(path: str | os.PathLike[str], *, format: str | None = None,
                    ranks: Sequence[int] | None = None) -> list[int] | None:
    """The steps *path* holds, found without parsing any dump file; None when that needs a full read.

    msprobe dumps are listed from their ``step*/rank*`` folders and zarr stores from their
    coordinates; monitor CSVs, kernel dumps and compare CSVs return None (their steps are
    inside the files).

    Parameters
    ----------
    path : path-like
    format : str, optional
        Force a reader (see :func:`open_run`).
    ranks : sequence of int, optional
        Only steps where one of these ranks has a folder.

    Returns
    -------
    list of int or None

    Raises
    ------
    NotADumpError
        When the path holds nothing readable.

    Examples
    --------
    >>> import precnb
    >>> available_steps(precnb.sample_path("dp_nan"))  # doctest: +SKIP
    [0, 1, 2]
    """
    p, fmt = resolve(Path(path), format)
    reader = get_reader(fmt)
    if reader.available_steps is None:
        return None
    return reader.available_steps(p, ranks)


def node_records(path: str | os.PathLike[str], step: int, rank: int, nodes: Sequence[str], *,
                 format: str | None = None) -> dict[str, Any]:
    """The raw records of *nodes* at (*step*, *rank*), read from the dump on demand.

    What the canonical dataset leaves out of a node (its scalar arguments: an ``eps``, a
    ``dim``, a scale) is in its record. Only the named records are decoded, so this is cheap
    on a large file. Formats without node records (monitor CSVs, compare CSVs, stores) give
    ``{}``; so do a (step, rank) the run does not hold and nodes it does not record.

    Parameters
    ----------
    path : path-like
        The run, as given to :func:`open_run`.
    step, rank : int
        The dump folder's step and rank numbers.
    nodes : sequence of str
        Node names as msprobe writes them (``"Tensor.__add__.6.forward"``).
    format : str, optional
        Force a reader.

    Returns
    -------
    dict
        Node → its record (the JSON object of ``dump.json``'s ``data``).

    Examples
    --------
    >>> import precnb
    >>> rec = node_records(precnb.sample_path("xfw/pt"), 0, 0, ["Tensor.__add__.6.forward"])
    >>> rec["Tensor.__add__.6.forward"]["input_args"][1]
    {'type': 'float', 'value': 1e-06}
    """
    p, fmt = resolve(Path(path), format)
    reader = get_reader(fmt)
    if reader.node_records is None or not nodes:
        return {}
    return reader.node_records(p, int(step), int(rank), list(nodes))


def open_runs(paths: Mapping[str, Any], **kwargs: Any) -> xr.Dataset:
    """Open several runs into one dataset with a leading ``run`` dimension, names as they are.

    The readers' layer: use :func:`precnb.open_runs` (the public one), which aligns two runs whose
    names differ first and calls this for the rest.

    Parameters
    ----------
    paths : mapping of str to path-like or xarray.Dataset
        Run name → path (or an already opened dataset), e.g.
        ``{"baseline": "gpu_dump", "target": "npu_dump"}``.
    **kwargs
        Passed to :func:`open_run`.

    Returns
    -------
    xarray.Dataset
        Dims ``(run, step, rank, tensor)``, names as they are (:func:`precnb.open_runs` aligns
        two runs whose names differ first).
    """
    opened = {name: (p if isinstance(p, xr.Dataset) else open_run(p, **kwargs))
              for name, p in paths.items()}
    return combine_runs(opened)


def load_report(ds: xr.Dataset) -> LoadReport:
    """Return what loading *ds* read and skipped.

    Parameters
    ----------
    ds : xarray.Dataset

    Returns
    -------
    LoadReport
    """
    raw = ds.attrs.get("load_report")
    if not raw:
        return LoadReport()
    return LoadReport.from_dict(json.loads(raw) if isinstance(raw, str) else raw)
