"""Parse files in local worker processes when no dask cluster is given.

The per-file parse is pure Python (the JSON walk holds the GIL), so threads do not help;
a small process pool does. One pool is kept per process and reused by later loads (a
command that loads step by step pays the start-up once); it is shut down at exit.

Workers are forked when this process runs no other thread (the usual command-line case:
nothing to import again, ~10 ms per worker); otherwise (a Jupyter kernel runs threads) they
start from a fork server, which is safe with threads. A pool that breaks (a worker killed,
e.g. by the out-of-memory killer) is dropped and the remaining files are parsed in-process:
a load never fails because of the pool.
"""

from __future__ import annotations

import atexit
import collections
import multiprocessing as mp
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

__all__ = ["MIN_PARALLEL_BYTES", "available_cpus", "outcomes_in_processes", "resolve_workers", "shutdown",
           "worth_processes"]

MAX_AUTO_WORKERS = 8
MIN_PARALLEL_BYTES = 4 << 20
"""Below this many bytes of input, parsing in this process is faster than starting workers."""
_POOL: tuple[int, ProcessPoolExecutor] | None = None
_LOCK = threading.Lock()


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, else the CPU count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def resolve_workers(workers: int | str | None) -> int:
    """The number of worker processes to parse with (1: in this process).

    Parameters
    ----------
    workers : int, "auto" or None
        ``None`` (the default everywhere: Python API, command line, notebooks) reads
        ``PRECNB_WORKERS`` (an integer or ``auto``), else ``"auto"``; ``"auto"`` (or 0) is the
        available CPUs, at most 8. Whether processes are actually started also depends on the
        amount of work (see :func:`worth_processes`).

    Returns
    -------
    int

    Examples
    --------
    >>> resolve_workers(3)
    3
    >>> resolve_workers("auto") >= 1
    True
    """
    if workers is None:
        workers = os.environ.get("PRECNB_WORKERS", "auto").strip() or "auto"
    if isinstance(workers, str):
        if workers.lower() == "auto":
            return min(available_cpus(), MAX_AUTO_WORKERS)
        try:
            workers = int(workers)
        except ValueError:
            raise ValueError(f"workers: expected an integer or 'auto', got {workers!r}") from None
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    return min(available_cpus(), MAX_AUTO_WORKERS) if workers == 0 else int(workers)


def worth_processes(n_items: int, n_workers: int, total_bytes: int | None) -> bool:
    """Whether parsing *n_items* files in *n_workers* processes pays for starting them.

    At least two files per worker, and (when the input size is known) at least
    :data:`MIN_PARALLEL_BYTES` in all: a small run parses faster than a pool starts.

    Examples
    --------
    >>> worth_processes(64, 2, 64 << 20)
    True
    >>> worth_processes(6, 2, 1 << 20)
    False
    """
    if n_workers <= 1 or n_items < 2 * n_workers:
        return False
    return total_bytes is None or total_bytes >= MIN_PARALLEL_BYTES


def _context() -> Any:
    methods = mp.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return mp.get_context("fork")
    return mp.get_context("forkserver" if "forkserver" in methods else "spawn")


def _executor(workers: int) -> ProcessPoolExecutor:
    global _POOL
    with _LOCK:
        if _POOL is not None and _POOL[0] == workers:
            return _POOL[1]
        _drop()
        ex = ProcessPoolExecutor(workers, mp_context=_context())
        _POOL = (workers, ex)
        return ex


def _drop() -> None:
    global _POOL
    if _POOL is not None:
        _POOL[1].shutdown(wait=False, cancel_futures=True)
        _POOL = None


def shutdown() -> None:
    """Stop the worker processes (they are started again by the next load that needs them)."""
    with _LOCK:
        _drop()


atexit.register(shutdown)


def _run_chunk(task: Callable[[Any], Any], chunk: Sequence[Any]) -> list[Any]:
    return [task(x) for x in chunk]


def outcomes_in_processes(items: Sequence[Any], task: Callable[[Any], Any], workers: int
                          ) -> Iterator[tuple[int, Any]]:
    """``(index, task(item))`` in item order, computed by *workers* local processes.

    Items go out in chunks; at most ``2 × workers`` chunks are in flight, so finished
    results wait in this process only as long as the consumer lags. *task* must be
    picklable and must not raise (wrap it to return errors as values).

    Parameters
    ----------
    items : sequence
    task : callable
    workers : int

    Returns
    -------
    iterator of (int, object)
    """
    return _ordered(items, task, workers, _executor(workers))  # the pool starts now, not at first next()


def _ordered(items: Sequence[Any], task: Callable[[Any], Any], workers: int,
             ex: ProcessPoolExecutor | None) -> Iterator[tuple[int, Any]]:
    n = len(items)
    size = max(1, min(16, n // (4 * workers) or 1))
    starts = list(range(0, n, size))
    pending: collections.deque[tuple[int, Future[list[Any]] | None]] = collections.deque()

    def submit(k: int) -> None:
        if k >= len(starts):
            return
        a = starts[k]
        fut = None
        if ex is not None:
            try:
                fut = ex.submit(_run_chunk, task, list(items[a:a + size]))
            except (BrokenProcessPool, RuntimeError):
                fut = None
        pending.append((a, fut))

    for k in range(min(len(starts), 2 * workers)):
        submit(k)
    k = len(pending)
    try:
        while pending:
            a, fut = pending.popleft()
            outs: list[Any] | None = None
            if fut is not None:
                try:
                    outs = fut.result()
                except BrokenProcessPool:  # a worker died: parse the rest here
                    shutdown()
                    ex = None
            if outs is None:
                outs = _run_chunk(task, items[a:a + size])
            submit(k)
            k += 1
            yield from enumerate(outs, start=a)
    finally:
        for _, fut in pending:
            if fut is not None:
                fut.cancel()
