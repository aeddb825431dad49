"""Run a reader's per-file parse task: in this process, in local worker processes or on a dask cluster.

Every reader that reads one file (or one (step, rank) folder) at a time hands its items and
its module-level parse function to :func:`parse_files`, which picks where they run:

- a dask cluster (the *client* given, else the ambient ``distributed`` client), in bounded
  batches so that neither the workers nor this process hold more than a few parsed files;
- local worker processes (:mod:`precnb.io._pool`) when no cluster is used and the input is
  large enough to pay for them (``workers``, default ``PRECNB_WORKERS`` else ``"auto"``);
- this process otherwise.

A file that fails is recorded in the load report (or re-raised with ``errors="raise"``); the
others still load. Results come back in item order whatever ran them.

Examples
--------
>>> from precnb.io._assemble import LoadReport
>>> rep = LoadReport()
>>> parse_files([1, 2, 3], abs, describe=str, report=rep, workers=1)
[1, 2, 3]
>>> rep.read
['1', '2', '3']
"""

from __future__ import annotations

import collections
import functools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

from precnb.errors import DumpFormatError, PrecnbError
from precnb.io._assemble import LoadReport

__all__ = ["PROGRESS_MIN_FILES", "describe_item", "parse_files"]

PROGRESS_MIN_FILES = 16


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
        What *parse* takes (e.g. :class:`~precnb.io.msprobe.RankDir`).
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
        if issubclass(self.cls, DumpFormatError):
            return self.cls(self.kwargs["path"], self.kwargs["message"])
        return self.cls(self.text)


def _portable(exc: PrecnbError) -> PrecnbError:
    """*exc*, or a picklable stand-in when its constructor takes other arguments than the message.

    (``DumpFormatError(path, message)`` cannot be unpickled as is: a worker's error would
    break the transfer of the result.)
    """
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
