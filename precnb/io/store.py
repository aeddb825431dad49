"""Materialise a canonical dataset into a zarr store and reopen it.

The store reopens to a dataset identical to the one written (values, NaN/±inf, masks,
string coordinates and attributes), so ``precnb convert`` is lossless.

A dump can also be streamed into a store without ever holding the whole run in memory
(:func:`to_zarr` given a path): the files of one step are parsed (in-process or on a dask
cluster), aligned, and appended along ``step`` before the next step is read. Tensors first
seen at a later step are appended to the ``tensor`` dimension (the store is resized and the
earlier steps marked absent there), so the store reopens identical to
``precnb.open_run(path)``. Each variable is chunked one step at a time, which is also how
``open_run(store, lazy=True)`` hands it to dask (string coordinates: :data:`precnb.io._zarr_steps.STRING_CHUNK`
tensors a chunk, written a chunk at a time).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np
import xarray as xr

from precnb._write import STORE_ATTR
from precnb.errors import DumpFormatError, NotADumpError
from precnb.io._store_audit import COMPLETE_ATTR
from precnb.io.readers import Reader
from precnb.schema import DIMS, SchemaError, validate

__all__ = ["READER", "is_store", "open_store", "to_zarr"]

_MARKER_KEY = "precnb_output"  # precnb._marks.MARKER_KEY: the store attribute marking precnb's own stores


def _strings_to_object(ds: xr.Dataset) -> xr.Dataset:
    """Turn numpy StringDType / fixed-width unicode arrays back into object arrays (lazily for dask)."""
    out = ds.copy()
    for name, var in list(out.variables.items()):
        kind = var.dtype.kind
        if kind in ("U", "T"):
            if var.chunks is not None:
                out[name] = var.copy(data=var.data.astype(object))
            else:
                out[name] = var.copy(data=np.asarray(var.values, dtype=object))
    return out


RANK_CHUNK = 256
"""Ranks per chunk in a store: a step slice (first divergence, NaN origin) and a block of ranks
over all steps (spike history) both read only their chunks."""


def _chunks(n_rank: int, n_tensor: int) -> tuple[int, int, int]:
    return (1, max(1, min(n_rank, RANK_CHUNK)), max(1, n_tensor))


def _mark(p: Path) -> None:
    """Mark the store as precnb's own output (``--overwrite`` replaces only such a store), every chunk written."""
    import zarr

    from precnb._marks import MARKER_KEY, marker

    attrs = zarr.open_group(p, mode="r+", zarr_format=3).attrs
    attrs.update({MARKER_KEY: marker("zarr-store"), COMPLETE_ATTR: "all"})


@contextmanager
def _every_chunk() -> Iterator[None]:
    """Zarr writes fill-valued chunks too: a chunk absent from the store is then damage, never a fill (#49)."""
    import zarr

    with zarr.config.set({"array.write_empty_chunks": True}):
        yield


def _write_dataset(ds: xr.Dataset, p: Path) -> Path:
    """Write *ds* into the (empty, locked) folder *p*."""
    out = ds.drop_encoding()
    out.attrs.pop(_MARKER_KEY, None)
    enc = {name: {"chunks": _chunks(out.sizes["rank"], out.sizes["tensor"])} for name, var in out.data_vars.items()
           if var.dims == DIMS and var.chunks is None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        warnings.simplefilter("ignore", category=FutureWarning)
        out.to_zarr(p, mode="a", zarr_format=3, consolidated=False, encoding=enc)  # p: empty
    return p


def to_zarr(
    source: xr.Dataset | str | Path,
    path: str | Path,
    *,
    mode: str = "w-",
    format: str | None = None,
    client: Any = None,
    progress: bool | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    errors: Literal["report", "raise"] = "report",
    workers: int | str | None = None,
    inputs: Iterable[str | Path] = (),
) -> Path:
    """Write a dataset, or stream a dump, to a zarr (format 3) store, safely.

    The store is built in a locked temporary sibling and renamed into place when complete
    (:mod:`precnb._write`): never inside an input (the source path, the dataset's recorded
    sources, *inputs*), never over anything but a store precnb wrote, and a second writer of
    the same store at the same time fails at once.

    Parameters
    ----------
    source : xarray.Dataset or path-like
        A canonical dataset (possibly dask-backed: written chunk by chunk), or a path that
        :func:`precnb.open_run` reads. An msprobe dump is streamed one step at a time with
        bounded memory (parse the step's files, align, append along ``step``); other inputs
        are opened, then written.
    path : str or Path
        Store folder to create (its parent folder must exist).
    mode : {"w-", "w"}
        ``"w-"`` (default) refuses an existing path; ``"w"`` replaces an existing store that
        precnb wrote (and nothing else).
    format : str, optional
        Force a reader for a path source (see :func:`precnb.open_run`).
    client : distributed.Client, optional
        Parse on this cluster (see :func:`precnb.open_run`).
    progress : bool, optional
    steps, ranks : sequence of int, optional
        Convert only these.
    errors : {"report", "raise"}
        As in :func:`precnb.open_run`; skipped files are listed in the store's load report.
    workers : int, "auto" or None
        Local worker processes when there is no client (see :func:`precnb.open_run`).
    inputs : iterable of path-like
        Further paths the store must stay out of (e.g. the runs a merged dataset came from).

    Returns
    -------
    Path

    Raises
    ------
    precnb.errors.OutputRefusedError
        See :func:`precnb._write.check_output`.

    Examples
    --------
    >>> import precnb
    >>> precnb.to_zarr("dump/", "run.zarr")  # doctest: +SKIP
    >>> lazy = precnb.open_run("run.zarr", lazy=True)  # doctest: +SKIP
    """
    from precnb._write import dataset_inputs, writing_folder

    if mode not in ("w-", "w"):
        raise ValueError(f"mode must be 'w-' (refuse an existing path) or 'w' (replace a precnb store), "
                         f"got {mode!r}")
    overwrite = mode == "w"
    if isinstance(source, xr.Dataset):
        with writing_folder(path, inputs=[*dataset_inputs(source), *inputs], overwrite=overwrite) as tmp, \
                _every_chunk():
            _write_dataset(source, tmp)
            _mark(tmp)
        return Path(path)
    from precnb.io.api import open_run
    from precnb.io.detect import resolve
    from precnb.io.readers import get_reader

    src, fmt = resolve(Path(source), format)
    reader = get_reader(fmt)
    with writing_folder(path, inputs=[source, src, *inputs], overwrite=overwrite) as tmp, _every_chunk():
        if reader.stream is None:
            ds = open_run(src, format=fmt, client=client, progress=progress, steps=steps, ranks=ranks,
                          errors=errors, workers=workers)
            _write_dataset(ds, tmp)
        else:
            _stream(reader.stream(src, client=client, progress=progress, steps=steps, ranks=ranks, errors=errors,
                                  workers=workers), tmp)
        _mark(tmp)
    return Path(path)


def _stream(parts: Any, p: Path) -> Path:
    """Write what a reader's ``stream`` yields (ranks, then one step at a time, then attrs) into *p*.

    *p* is the empty locked folder of :func:`precnb._write.writing_folder` (removed by it on failure).
    """
    from precnb.io._zarr_steps import StepWriter

    writer: StepWriter | None = None
    for part in parts:
        if part[0] == "ranks":
            writer = StepWriter(p, part[1], _chunks)
        elif part[0] == "step":
            assert writer is not None
            writer.append(part[1], part[2], part[3])
        elif part[0] == "attrs":
            assert writer is not None
            writer.finish(part[1])
        part = None  # the step's arrays are written: let them go before the next part is built
    return p


def open_store(path: str | Path, *, lazy: bool = False, gaps: Literal["raise", "report"] = "raise") -> xr.Dataset:
    """Open a store written by :func:`to_zarr`.

    The store is checked first (:func:`precnb.io._store_audit.audit_store`): every file a regular one
    (a FIFO is never opened), every chunk there. A chunk missing from a store precnb wrote whole is damage:
    its values are unknown, zarr would read them as fill values and an analysis would answer from them.

    Parameters
    ----------
    path : str or Path
    lazy : bool
        Keep variables dask-backed (one chunk per step) instead of loading them.
    gaps : {"raise", "report"}
        A missing chunk raises (default: no answer from what it hides), or (``"report"``, ``precnb
        info``) is read as fill values and listed in the load report as a skipped chunk file, with the
        fill-valued regions of a store that does not say every chunk was written.

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    precnb.errors.DumpFormatError
        A damaged store (missing chunks named), a file that is not a regular file, attributes that are
        not a precnb dataset's.
    """
    from precnb.io._store_attrs import check_coords, check_store_attrs
    from precnb.io._store_audit import audit_store

    p = Path(path)
    try:
        is_dir = p.is_dir()
    except OSError as exc:
        raise NotADumpError(f"{p}: cannot access: {exc.strerror or exc}") from None
    if not is_dir:
        raise NotADumpError(f"{p}: not a zarr store")
    audit = audit_store(p)
    if audit.missing and gaps == "raise":
        raise DumpFormatError(p, audit.missing_message())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = xr.open_zarr(p, consolidated=False)
        if not lazy:
            ds = ds.load()
    except OSError as exc:
        raise DumpFormatError(p, f"cannot read the zarr store: {exc.strerror or exc}") from None
    except Exception as exc:  # zarr raises its own types (GroupNotFoundError, metadata errors)
        raise DumpFormatError(p, f"not a readable precnb zarr store: {type(exc).__name__}: {exc}") from None
    ds = _strings_to_object(ds)
    ds = ds.drop_encoding()
    ds.attrs.pop(_MARKER_KEY, None)
    ds.attrs.pop(COMPLETE_ATTR, None)
    check_coords(ds, p)
    dropped = check_store_attrs(ds, p, report=gaps == "report")
    if audit.missing or audit.unwritten or dropped:
        ds.attrs["load_report"] = _with_gaps(ds.attrs.get("load_report"), audit.lines(), p, dropped)
    # the store itself is an input too (its ``source`` names the dump it was converted from): a write
    # from this dataset (a report, a mapping file, a second store) must stay out of it. In the encoding,
    # not the attributes: the dataset stays identical to the one written, and the path is never written
    ds.encoding[STORE_ATTR] = os.path.abspath(p)
    try:
        return validate(ds)
    except SchemaError as exc:
        raise DumpFormatError(p, f"zarr store is not a precnb dataset: {exc}") from None


def _with_gaps(raw: Any, entries: list[tuple[str, str]], p: Path, dropped: Sequence[tuple[str, str]] = ()) -> str:
    """The store's load report (JSON text) with the audit's entries added as skipped files.

    *dropped*: the attributes :func:`~precnb.io._store_attrs.check_store_attrs` could not read, added as
    unread (``zarr.json``, ``attribute NAME``, why).
    """
    import json

    from precnb.io.records import LoadReport

    try:
        rep = LoadReport.from_dict(json.loads(raw) if isinstance(raw, str) else raw) if raw else LoadReport()
    except (ValueError, TypeError, KeyError, AttributeError):
        raise DumpFormatError(p, "the store's load_report attribute is not a precnb load report") from None
    rep.skipped.extend(entries)
    for name, why in dropped:
        rep.unread.append((str(p / "zarr.json"), "attribute", name, why.removeprefix("attribute ")))
        rep.unread_count += 1
    return json.dumps(rep.to_dict())


def store_outline(path: str | Path) -> tuple[dict[str, int], dict[str, Any]]:
    """The dimension sizes and attributes of a store, read from its metadata alone.

    ``precnb convert`` reports what it wrote without loading the store's coordinates again
    (they would add their strings to the peak memory of the conversion).

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    sizes : dict of str to int
        ``step``, ``rank`` and ``tensor`` lengths.
    attrs : dict
        The dataset attributes (without precnb's output marker).
    """
    import zarr

    group = zarr.open_group(Path(path), mode="r", zarr_format=3)
    sizes = {}
    for dim in DIMS:
        coord = group[dim]
        if not isinstance(coord, zarr.Array):
            raise NotADumpError(f"{path}: {dim!r} in the store is a group, not a coordinate array")
        sizes[dim] = int(coord.shape[0])
    attrs = dict(group.attrs)
    attrs.pop(_MARKER_KEY, None)
    attrs.pop(COMPLETE_ATTR, None)
    return sizes, attrs


def is_store(path: str | Path) -> bool:
    """Whether *path* is a zarr store folder (format 3 or 2).

    Examples
    --------
    >>> is_store("/nonexistent")
    False
    """
    p = Path(path)
    try:
        # exists(), not is_file(): a FIFO named zarr.json is the store's to refuse (named), not another format's
        return p.is_dir() and ((p / "zarr.json").exists() or (p / ".zgroup").exists())
    except OSError:
        return False


def _open(path: Path, *, lazy: bool = False, steps: Sequence[int] | None = None,
          ranks: Sequence[int] | None = None, gaps: Literal["raise", "report"] = "raise", **_: Any) -> xr.Dataset:
    ds = open_store(path, lazy=lazy, gaps=gaps)
    if steps is not None:
        ds = ds.sel(step=[s for s in ds["step"].values if s in set(steps)])
    if ranks is not None:
        ds = ds.sel(rank=[r for r in ds["rank"].values if r in set(ranks)])
    return ds


def _steps(path: Path, ranks: Sequence[int] | None = None) -> list[int]:
    return [int(s) for s in open_store(path, lazy=True)["step"].values]


READER = Reader(name="zarr", can_open=is_store, open=_open, description="precnb zarr store",
                available_steps=_steps, detect_priority=0, lazy=True)
