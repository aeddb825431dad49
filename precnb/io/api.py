"""Public entry points: :func:`open_run`, :func:`open_runs`, :func:`detect_format`."""

from __future__ import annotations

import collections
import functools
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import xarray as xr

from precnb.combine import combine_runs
from precnb.errors import NotADumpError, PrecnbError
from precnb.io._assemble import Assembler, LoadReport

__all__ = ["FORMATS", "available_steps", "detect_format", "load_report", "open_run", "open_runs"]

Format = Literal["msprobe", "monitor", "kernel", "kernel_tensors", "compare", "zarr", "config_check"]
FORMATS: tuple[str, ...] = ("msprobe", "monitor", "kernel", "kernel_tensors", "compare", "zarr", "config_check")
PROGRESS_MIN_FILES = 16


class _LazyDaskArrayMeta(type):
    """``isinstance(x, <dask array type>)`` without importing dask.array before anyone else does."""

    def __instancecheck__(cls, obj: Any) -> bool:
        mod = sys.modules.get("dask.array")
        return mod is not None and isinstance(obj, mod.Array)

    def __subclasscheck__(cls, sub: type) -> bool:
        mod = sys.modules.get("dask.array")
        return mod is not None and issubclass(sub, mod.Array)


class _LazyDaskArray(metaclass=_LazyDaskArrayMeta):
    """Stands for ``dask.array.Array`` in xarray's duck-array type checks until dask.array is imported."""


def _defer_dask_array_import() -> None:
    """Keep xarray from importing dask.array (~0.6 s) just to learn that a numpy array is not one.

    xarray asks for the dask array type the first time it wraps any array (``isinstance(data,
    array_type("dask"))``) and imports dask.array to answer. No dask array can exist before
    dask.array is imported, so until then the answer is "no" without the import; afterwards the
    check is the real one. Installed only when xarray has the cache this relies on and has not
    filled it yet; anything else leaves xarray untouched. Saves most of a second per CLI call.
    """
    if "dask.array" in sys.modules:
        return
    try:
        from xarray.namedarray import pycompat
    except ImportError:  # pragma: no cover - other xarray layouts
        return
    cache = getattr(pycompat, "_cached_duck_array_modules", None)
    base = getattr(pycompat, "DuckArrayModule", None)
    if not isinstance(cache, dict) or base is None or "dask" in cache:
        return

    class _LazyDaskModule(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:  # no import here
            self.type = (_LazyDaskArray,)
            self._real: Any = None

        def _resolve(self) -> Any:
            if self._real is None:
                self._real = base("dask")
            return self._real

        module = property(lambda self: self._resolve().module)  # type: ignore[assignment]
        version = property(lambda self: self._resolve().version)  # type: ignore[assignment]
        available = property(lambda self: self._resolve().available)  # type: ignore[assignment]

    cache["dask"] = _LazyDaskModule()
    # the same question asked through ``is_dask_collection`` imports dask itself (~0.15 s)
    try:
        from xarray.namedarray import utils as nutils
    except ImportError:  # pragma: no cover
        return
    real = getattr(nutils, "is_dask_collection", None)
    if callable(real) and "dask" not in sys.modules and not getattr(real, "_precnb_lazy", False):
        def is_dask_collection(x: object) -> bool:
            return "dask" in sys.modules and real(x)

        is_dask_collection._precnb_lazy = True  # type: ignore[attr-defined]
        is_dask_collection.__doc__ = real.__doc__
        nutils.is_dask_collection = is_dask_collection


_defer_dask_array_import()


def detect_format(path: str | Path) -> str:
    """Guess which reader handles *path*.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    str
        One of :data:`FORMATS`.

    Raises
    ------
    NotADumpError
        When no reader recognises the path.

    Examples
    --------
    >>> detect_format("/nonexistent")
    Traceback (most recent call last):
    ...
    precnb.errors.NotADumpError: /nonexistent: no such file or directory
    """
    from precnb.io import _why, compare_csv, kernel, monitor, ms_kernel_tensors, msprobe_dump

    p = Path(path)
    try:
        if not p.exists():
            raise NotADumpError(f"{p}: {_why.missing_reason(p)}")
        if p.is_dir() and ((p / "zarr.json").is_file() or (p / ".zgroup").is_file()):
            return "zarr"
    except OSError as exc:
        raise NotADumpError(f"{p}: cannot access: {exc.strerror or exc}") from None
    kind = _why.kind_of(p)
    if kind is not None and kind != "a folder":  # a FIFO, a device: never opened
        raise NotADumpError(f"{p}: {_why.not_a_file_reason(p, 'it')}; precnb reads dump folders and files")
    if msprobe_dump.is_msprobe_dump(p):
        return "msprobe"
    from precnb.io.config_check import is_config_check

    if is_config_check(p):
        return "config_check"
    if monitor.is_monitor_output(p):
        return "monitor"
    if kernel.is_kernel_dump(p):
        return "kernel"
    if ms_kernel_tensors.is_ms_kernel_tensors(p):
        return "kernel_tensors"
    if compare_csv.is_compare_csv(p):
        return "compare"
    if kind is None and p.suffix.lower() in (".csv", ".json"):
        bad = _why.utf8_reason(p)
        if bad:  # e.g. a GBK-encoded compare result: say so rather than "not recognised"
            raise NotADumpError(f"{p}: {bad}")
    raise NotADumpError(
        f"{p}: not a recognised input (expected an msprobe dump, monitor output, "
        "MindSpore kernel dump (statistic.csv or .npy tensors), compare result CSV, msprobe config_check pack "
        "or precnb zarr store)"
    )


def _interactive() -> bool:
    """Whether a progress bar has somewhere to go: a terminal on stderr, or a notebook (a widget)."""
    try:
        if sys.stderr is not None and sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):  # a closed or replaced stream
        pass
    return "ipykernel" in sys.modules


def _progress(total: int, progress: bool | None, desc: str) -> Any:
    """A tqdm bar, or None.

    ``progress=None`` shows one for long loads, and only on a terminal or in a notebook
    (``precnb ... | cat`` or a log file gets no carriage returns).
    """
    if progress is False or (progress is None and (total < PROGRESS_MIN_FILES or not _interactive())):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="file", leave=False)


def parse_files(
    items: Sequence[Any],
    parse: Callable[[Any], Any],
    *,
    describe: Callable[[Any], str],
    report: LoadReport,
    errors: Literal["report", "raise"] = "report",
    client: Any = None,
    progress: bool | None = None,
    consume: Callable[[int, Any], None] | None = None,
    workers: int | str | None = None,
) -> list[Any]:
    """Run *parse* on every item, in-process, in local worker processes or on a dask cluster.

    One task per (step, rank) file. A file that fails is recorded in *report* (or re-raised
    when ``errors="raise"``); the others still load. On a cluster, tasks are submitted in
    bounded batches and results are taken (and released on the workers) in item order, so
    neither the workers nor this process hold more than a few batches of parsed files.

    Parameters
    ----------
    items : sequence
        What *parse* takes (e.g. :class:`~precnb.io.msprobe_dump.RankDir`).
    parse : callable
        A module-level function (it is pickled to the workers).
    describe : callable
        Item → text for the load report.
    report : LoadReport
    errors : {"report", "raise"}
    client : distributed.Client, optional
        Run on this cluster; when None, the ambient client (``distributed.get_client()``)
        if any, unless ``PRECNB_NO_DASK_CLIENT`` is set.
    progress : bool, optional
    consume : callable, optional
        ``consume(index, result)`` is called for every parsed item in item order and the
        result is not kept (bounded memory); the returned list is then empty.
    workers : int, "auto" or None
        Without a dask client: parse in this many local processes (see
        :func:`precnb.io._pool.resolve_workers`; default ``PRECNB_WORKERS``, else "auto"). Used
        when it pays (:func:`precnb.io._pool.worth_processes`).

    Returns
    -------
    list
        The results of the items that parsed, in item order (empty with *consume*).
    """
    from precnb.io._pool import outcomes_in_processes, resolve_workers, worth_processes

    results: list[Any] = []
    if client is None and len(items) > 1:
        client = _ambient_client()
    n_proc = resolve_workers(workers) if client is None else 1
    if client is not None:
        outcomes = _outcomes_on(client, items, parse)
    elif worth_processes(len(items), n_proc, _total_bytes(items) if n_proc > 1 else None):
        # the pool starts before the bar's thread
        outcomes = outcomes_in_processes(items, functools.partial(_safe_parse, parse), n_proc)
    else:
        outcomes = ((i, _safe_parse(parse, item)) for i, item in enumerate(items))
    bar = _progress(len(items), progress, "reading dumps")
    try:
        for i, (rec, err) in outcomes:
            if bar is not None:
                bar.update(1)
            item = items[i]
            if err is not None:
                err = _restore(err)
                if errors == "raise":
                    raise err
                report.skipped.append((describe(item), str(err)))
                continue
            report.read.append(describe(item))
            if consume is not None:
                consume(i, rec)
            else:
                results.append(rec)
    finally:
        if bar is not None:
            bar.close()
    return results


def _total_bytes(items: Sequence[Any]) -> int | None:
    """Total size of the items' files (``dump_file`` or ``path``), None when unknown."""
    total = 0
    for item in items:
        f = getattr(item, "dump_file", None) or getattr(item, "path", None)
        if f is None:
            return None
        try:
            total += os.stat(f).st_size
        except OSError:
            continue
    return total


def _batch_size(client: Any) -> int:
    try:
        threads = sum(client.nthreads().values())
    except Exception:  # any scheduler problem: fall back to a fixed size
        threads = 2
    return max(32, 16 * max(threads, 1))


def _outcomes_on(client: Any, items: Sequence[Any], parse: Callable[[Any], Any]
                 ) -> Iterator[tuple[int, tuple[Any, PrecnbError | None]]]:
    """(index, outcome) in item order from a dask client; at most two batches in flight.

    Results are gathered a batch at a time (one round trip, not one per file) and their
    futures dropped at once, so the workers can release them while the next batch runs.
    """
    size = _batch_size(client)
    task = functools.partial(_safe_parse, parse)
    starts = list(range(0, len(items), size))
    pending: collections.deque[tuple[int, list[Any]]] = collections.deque()

    def submit(k: int) -> None:
        if k < len(starts):
            a = starts[k]
            pending.append((a, client.map(task, list(items[a:a + size]), pure=False)))

    submit(0)
    submit(1)
    k = 2
    try:
        while pending:
            a, futs = pending.popleft()
            outs = client.gather(futs)
            del futs
            submit(k)
            k += 1
            yield from enumerate(outs, start=a)
    finally:
        for _, futs in pending:  # errors="raise" or an interrupt: cancel the rest
            client.cancel(futs)


def _safe_parse(parse: Callable[[Any], Any], item: Any) -> tuple[Any, PrecnbError | None]:
    try:
        return parse(item), None
    except PrecnbError as exc:
        return None, _portable(exc)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
        from precnb.errors import DumpFormatError

        where = describe_item(item)
        return None, _portable(DumpFormatError(where, f"unexpected content: {type(exc).__name__}: {exc}"))


class _PortableError(PrecnbError):
    """An error that crosses process boundaries (dask workers) and is rebuilt as the original."""

    def __init__(self, cls: type[PrecnbError], kwargs: dict[str, Any], text: str) -> None:
        super().__init__(text)
        self.cls, self.kwargs, self.text = cls, kwargs, text

    def __reduce__(self) -> tuple[Any, ...]:
        return (_PortableError, (self.cls, self.kwargs, self.text))

    def rebuild(self) -> PrecnbError:
        """The original exception."""
        from precnb.errors import DumpFormatError

        if issubclass(self.cls, DumpFormatError):
            return self.cls(self.kwargs["path"], self.kwargs["message"])
        return self.cls(self.text)


def _portable(exc: PrecnbError) -> PrecnbError:
    """*exc*, or a picklable stand-in when its constructor takes other arguments than the message.

    (``DumpFormatError(path, message)`` cannot be unpickled as is: a worker's error would
    break the transfer of the result.)
    """
    from precnb.errors import DumpFormatError

    if isinstance(exc, DumpFormatError):
        return _PortableError(type(exc), {"path": exc.path, "message": exc.message}, str(exc))
    return exc


def _restore(err: PrecnbError) -> PrecnbError:
    return err.rebuild() if isinstance(err, _PortableError) else err


def describe_item(item: Any) -> str:
    """A printable name for a parse item (a path or an object with ``dump_file``/``path``)."""
    for attr in ("dump_file", "path"):
        if hasattr(item, attr):
            return str(getattr(item, attr))
    return str(item)


def _ambient_client() -> Any:
    if os.environ.get("PRECNB_NO_DASK_CLIENT"):
        return None
    if "distributed" not in sys.modules:  # no client can exist; importing it costs ~0.5 s
        return None
    try:
        from distributed import get_client
    except ImportError:  # pragma: no cover
        return None
    try:
        return get_client()
    except ValueError:
        return None


def msprobe_parser() -> Callable[[Any], Any]:
    """The per-file task for msprobe rank folders.

    :func:`precnb.io._fastparse.parse_rank_dir` (identical records, faster), or the reference
    :func:`precnb.io.msprobe_dump.read_rank_dir` when ``PRECNB_REFERENCE_PARSER`` is set.
    """
    if os.environ.get("PRECNB_REFERENCE_PARSER"):
        from precnb.io.msprobe_dump import read_rank_dir

        return read_rank_dir
    from precnb.io._fastparse import parse_rank_dir

    return parse_rank_dir


def select_rank_dirs(path: Path, report: LoadReport, steps: Sequence[int] | None,
                     ranks: Sequence[int] | None) -> list[Any]:
    """The (step, rank) folders below *path*, restricted to *steps* and *ranks*."""
    from precnb.io import msprobe_dump as md

    dirs = md.discover(path, report)
    if steps is not None:
        dirs = [d for d in dirs if d.step in set(steps)]
    if ranks is not None:
        dirs = [d for d in dirs if d.rank in set(ranks)]
    if not dirs:
        raise NotADumpError(f"{path}: no (step, rank) folder matches the selection")
    return dirs


class MsprobeLoad:
    """Parse msprobe rank folders into an :class:`Assembler`, in item order (shared by the streaming writer)."""

    def __init__(self, path: Path, dirs: Sequence[Any], report: LoadReport) -> None:
        self.path, self.dirs, self.report = path, list(dirs), report
        self.acc = Assembler(steps=[d.step for d in dirs], ranks=[d.rank for d in dirs])
        self.comm_groups: dict[str, str] = {}
        self.n_read = 0

    def read(self, dirs: Sequence[Any], *, offset: int = 0, errors: Any = "report", client: Any = None,
             progress: bool | None = None, workers: int | str | None = None) -> None:
        """Parse *dirs* (item numbers start at *offset*) and fold them in."""
        def consume(i: int, rec: Any) -> None:
            for g, node in rec.meta.get("comm_groups", {}).items():
                self.comm_groups.setdefault(g, node)
            self.report.warnings.extend(rec.meta.get("warnings", ()))
            self.acc.add(rec, order=offset + i)
            self.n_read += 1

        parse_files(dirs, msprobe_parser(), describe=lambda d: str(d.dump_file), report=self.report,
                    errors=errors, client=client, progress=progress, consume=consume, workers=workers)

    def check_any(self) -> None:
        """Raise :class:`NotADumpError` when no file could be read."""
        if not self.n_read:
            reasons = "; ".join(f"{p}: {r}" for p, r in self.report.skipped[:3])
            raise NotADumpError(f"{self.path}: no dump file could be read ({reasons})")

    def attrs(self) -> dict[str, Any]:
        """Reader attributes: source, rank folders, communication groups, load report."""
        rank_dirs = {d.key: str(d.path) for d in self.dirs}
        return {"source": str(self.path), "rank_dirs": json.dumps(rank_dirs),
                "comm_groups": json.dumps([{"ranks": json.loads(g), "node": n} for g, n in self.comm_groups.items()]),
                "load_report": json.dumps(self.report.to_dict())}


def _open_msprobe(path: Path, *, errors: Any, client: Any, progress: bool | None,
                  steps: Sequence[int] | None, ranks: Sequence[int] | None,
                  workers: int | str | None = None) -> xr.Dataset:
    report = LoadReport()
    dirs = select_rank_dirs(path, report, steps, ranks)
    load = MsprobeLoad(path, dirs, report)
    load.read(dirs, errors=errors, client=client, progress=progress, workers=workers)
    load.check_any()
    return load.acc.build(source_format="msprobe", attrs=load.attrs())


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
) -> xr.Dataset:
    """Open one run as a canonical dataset (dims step, rank, tensor).

    Parameters
    ----------
    path : path-like
        An msprobe dump root, ``stepN`` folder, rank folder or dump.json; a monitor output
        folder; a MindSpore kernel dump (statistic.csv or tensor .npy files); a compare result
        CSV; an msprobe ``config_check`` pack (zip); or a precnb zarr store.
    format : str, optional
        Force a reader (see :data:`FORMATS`); detected when omitted.
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
        :func:`precnb.to_zarr`); other sources are parsed, then chunked.
    progress : bool, optional
        Force the progress bar on or off (default: on for 16 files or more).
    workers : int, "auto" or None
        Without a dask client, parse in this many local processes (``"auto"``: one per
        available CPU, at most 8, when the input is large enough to pay for them). Default
        (everywhere, the command line included): ``PRECNB_WORKERS``, else ``"auto"``.

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    NotADumpError
        When the path holds nothing readable.

    Examples
    --------
    >>> import precnb
    >>> ds = precnb.open_run(precnb.sample_path("healthy"))  # doctest: +SKIP
    >>> ds.sizes  # doctest: +SKIP
    """
    from precnb.io._resolve import resolve

    p, fmt = resolve(Path(path), format)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    common = {"errors": errors, "client": client, "progress": progress, "steps": steps, "ranks": ranks,
              "workers": workers}
    if fmt == "msprobe":
        ds = _open_msprobe(p, **common)
    elif fmt == "monitor":
        from precnb.io import monitor

        ds = monitor.open_monitor(p, **common)
    elif fmt == "kernel":
        from precnb.io import kernel

        ds = kernel.open_kernel_dump(p, **common)
    elif fmt == "kernel_tensors":
        from precnb.io import ms_kernel_tensors

        ds = ms_kernel_tensors.open_ms_kernel_tensors(p, **common)
    elif fmt == "compare":
        from precnb.io import compare_csv

        ds = compare_csv.open_compare_csv(p)
    elif fmt == "config_check":
        from precnb.io import config_check

        ds = config_check.open_config_check(p, steps=steps, ranks=ranks)
    else:
        from precnb.io import store

        ds = store.open_store(p, lazy=lazy)
        if steps is not None:
            ds = ds.sel(step=[s for s in ds["step"].values if s in set(steps)])
        if ranks is not None:
            ds = ds.sel(rank=[r for r in ds["rank"].values if r in set(ranks)])
    rep = load_report(ds)
    if rep.failures:
        warnings.warn(
            f"{p}: {len(rep.failures)} file(s) could not be read and were skipped; "
            "see precnb.load_report(ds)", stacklevel=2)
    if lazy and fmt != "zarr":
        ds = ds.chunk({"step": 1})
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
        Force a reader (see :data:`FORMATS`).
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
    from precnb.io._resolve import resolve

    p, fmt = resolve(Path(path), format)
    if fmt == "msprobe":
        from precnb.io import msprobe_dump as md

        dirs = md.discover(p, LoadReport())
        if ranks is not None:
            dirs = [d for d in dirs if d.rank in set(ranks)]
        return sorted({d.step for d in dirs})
    if fmt == "zarr":
        from precnb.io import store

        return [int(s) for s in store.open_store(p, lazy=True)["step"].values]
    return None


def open_runs(paths: Mapping[str, Any], **kwargs: Any) -> xr.Dataset:
    """Open several runs into one dataset with a leading ``run`` dimension.

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
    rep = LoadReport()
    if not raw:
        return rep
    d = json.loads(raw) if isinstance(raw, str) else raw
    rep.read = list(d.get("read", []))
    rep.skipped = [(s["path"], s["reason"]) for s in d.get("skipped", [])]
    rep.warnings = list(d.get("warnings", []))
    return rep
