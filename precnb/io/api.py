"""Public entry points: :func:`open_run`, :func:`open_runs`, :func:`detect_format`."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import xarray as xr

from precnb.combine import combine_runs
from precnb.errors import NotADumpError, PrecnbError
from precnb.io._assemble import FileRecords, LoadReport, assemble

__all__ = ["FORMATS", "detect_format", "load_report", "open_run", "open_runs"]

Format = Literal["msprobe", "monitor", "kernel", "compare", "zarr"]
FORMATS: tuple[str, ...] = ("msprobe", "monitor", "kernel", "compare", "zarr")
PROGRESS_MIN_FILES = 16


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
    from precnb.io import compare_csv, kernel, monitor, msprobe_dump

    p = Path(path)
    if not p.exists():
        raise NotADumpError(f"{p}: no such file or directory")
    if p.is_dir() and ((p / "zarr.json").is_file() or (p / ".zgroup").is_file()):
        return "zarr"
    if msprobe_dump.is_msprobe_dump(p):
        return "msprobe"
    if monitor.is_monitor_output(p):
        return "monitor"
    if kernel.is_kernel_dump(p):
        return "kernel"
    if compare_csv.is_compare_csv(p):
        return "compare"
    raise NotADumpError(
        f"{p}: not a recognised input (expected an msprobe dump, monitor output, "
        "MindSpore statistic.csv dump, compare result CSV or precnb zarr store)"
    )


def _progress(total: int, progress: bool | None, desc: str) -> Any:
    if progress is False or (progress is None and total < PROGRESS_MIN_FILES):
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
) -> list[Any]:
    """Run *parse* on every item, in-process or on a dask cluster, with a progress bar.

    One task per (step, rank) file. A file that fails is recorded in *report* (or re-raised
    when ``errors="raise"``); the others still load.
    """
    results: list[FileRecords] = []
    bar = _progress(len(items), progress, "reading dumps")
    if client is None and len(items) > 1:
        client = _ambient_client()
    if client is not None:
        futures = client.map(_safe_parse, [parse] * len(items), items, pure=False)
        outcomes = []
        for fut in futures:
            outcomes.append(fut.result())
            if bar is not None:
                bar.update(1)
    else:
        outcomes = []
        for item in items:
            outcomes.append(_safe_parse(parse, item))
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    for item, (rec, err) in zip(items, outcomes, strict=True):
        if err is not None:
            if errors == "raise":
                raise err
            report.skipped.append((describe(item), str(err)))
        else:
            results.append(rec)
            report.read.append(describe(item))
    return results


def _safe_parse(parse: Callable[[Any], Any], item: Any) -> tuple[Any, PrecnbError | None]:
    try:
        return parse(item), None
    except PrecnbError as exc:
        return None, exc
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
        from precnb.errors import DumpFormatError

        where = describe_item(item)
        return None, DumpFormatError(where, f"unexpected content: {type(exc).__name__}: {exc}")


def describe_item(item: Any) -> str:
    """A printable name for a parse item (a path or an object with ``dump_file``/``path``)."""
    for attr in ("dump_file", "path"):
        if hasattr(item, attr):
            return str(getattr(item, attr))
    return str(item)


def _ambient_client() -> Any:
    if os.environ.get("PRECNB_NO_DASK_CLIENT"):
        return None
    try:
        from distributed import get_client
    except ImportError:  # pragma: no cover
        return None
    try:
        return get_client()
    except ValueError:
        return None


def _open_msprobe(path: Path, *, errors: Any, client: Any, progress: bool | None,
                  steps: Sequence[int] | None, ranks: Sequence[int] | None) -> xr.Dataset:
    from precnb.io import msprobe_dump as md

    report = LoadReport()
    dirs = md.discover(path, report)
    if steps is not None:
        dirs = [d for d in dirs if d.step in set(steps)]
    if ranks is not None:
        dirs = [d for d in dirs if d.rank in set(ranks)]
    if not dirs:
        raise NotADumpError(f"{path}: no (step, rank) folder matches the selection")
    recs = parse_files(dirs, md.read_rank_dir, describe=lambda d: str(d.dump_file), report=report,
                       errors=errors, client=client, progress=progress)
    if not recs:
        reasons = "; ".join(f"{p}: {r}" for p, r in report.skipped[:3])
        raise NotADumpError(f"{path}: no dump file could be read ({reasons})")
    rank_dirs = {d.key: str(d.path) for d in dirs}
    comm_groups: dict[str, str] = {}
    for rec in recs:
        for g, node in rec.meta.get("comm_groups", {}).items():
            comm_groups.setdefault(g, node)
    ds = assemble(
        recs,
        source_format="msprobe",
        steps=[d.step for d in dirs],
        ranks=[d.rank for d in dirs],
        attrs={"source": str(path), "rank_dirs": json.dumps(rank_dirs),
               "comm_groups": json.dumps([{"ranks": json.loads(g), "node": n} for g, n in comm_groups.items()]),
               "load_report": json.dumps(report.to_dict())},
    )
    return ds


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
) -> xr.Dataset:
    """Open one run as a canonical dataset (dims step, rank, tensor).

    Parameters
    ----------
    path : path-like
        An msprobe dump root, ``stepN`` folder, rank folder or dump.json; a monitor output
        folder; a MindSpore kernel dump; a compare result CSV; or a precnb zarr store.
    format : str, optional
        Force a reader (see :data:`FORMATS`); detected when omitted.
    steps, ranks : sequence of int, optional
        Load only these.
    errors : {"report", "raise"}
        ``"report"`` (default) skips unreadable rank files and records them in the load
        report (``precnb.load_report(ds)``); ``"raise"`` stops at the first one.
    client : dask.distributed.Client, optional
        Parse on this cluster (one task per file). The ambient client is used when present.
    lazy : bool
        Return dask-backed variables (chunked one step at a time).
    progress : bool, optional
        Force the progress bar on or off (default: on for 16 files or more).

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
    from precnb.io._resolve import resolve_input

    p = Path(path) if format else resolve_input(Path(path))
    fmt = format or detect_format(p)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    common = {"errors": errors, "client": client, "progress": progress, "steps": steps, "ranks": ranks}
    if fmt == "msprobe":
        ds = _open_msprobe(p, **common)
    elif fmt == "monitor":
        from precnb.io import monitor

        ds = monitor.open_monitor(p, **common)
    elif fmt == "kernel":
        from precnb.io import kernel

        ds = kernel.open_kernel_dump(p, **common)
    elif fmt == "compare":
        from precnb.io import compare_csv

        ds = compare_csv.open_compare_csv(p)
    else:
        from precnb.io import store

        ds = store.open_store(p)
    rep = load_report(ds)
    if rep.failures:
        warnings.warn(
            f"{p}: {len(rep.failures)} file(s) could not be read and were skipped; "
            "see precnb.load_report(ds)", stacklevel=2)
    if lazy:
        ds = ds.chunk({"step": 1})
    return ds


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
        Dims ``(run, step, rank, tensor)``.
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
