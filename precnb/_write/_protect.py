"""What an output must stay out of: the inputs, each protected with the dump it belongs to."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from precnb.errors import OutputRefusedError

#: the key under which a dataset opened from a zarr store records that store (an input as well), in
#: ``ds.encoding`` (kept by selections; never written); a combined dataset keeps it per run in ``run_attrs``
STORE_ATTR = "precnb_store"

PathLike = str | os.PathLike[str]
# folder names that are part of a dump's structure: an input inside one protects the dump root
_DUMP_PART = re.compile(r"^(step[0-9]+|rank[0-9]*|rank_[0-9]+|proc[0-9]+|.*-rank[0-9]+-[0-9A-Za-z]+)$")
_SIDE_FILES = ("dump.json", "debug.json", "construct.json", "stack.json", "statistic.csv")
_PARTIAL = ".precnb-partial"
_SENTINEL = ".precnb-writing"
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # the output's file system cannot take it


def _write_failed(shown: str, exc: OSError) -> OutputRefusedError:
    """An OSError while writing an output, as one line naming the output (nothing was published)."""
    why = exc.strerror or type(exc).__name__
    if exc.errno in _FULL:
        why += ": the file system holding it is full (free some space, or write elsewhere)"
    return OutputRefusedError(shown, f"cannot write it: {why}; nothing was written")


def _real(p: Path) -> Path:
    return Path(os.path.realpath(p))


def protected_roots(inputs: Iterable[PathLike | None]) -> list[Path]:
    """The folders and files an output must stay out of, for the given inputs (resolved paths).

    Examples
    --------
    >>> [p.name for p in protected_roots(["/data/RUN/step0/rank0/dump.json"])]
    ['RUN']
    >>> [p.name for p in protected_roots(["/data/results/compare_result.csv"])]
    ['compare_result.csv']
    """
    out: list[Path] = []
    for given in inputs:
        if given is None or str(given) == "":
            continue
        p = _real(Path(given).expanduser())
        try:
            is_file = not stat.S_ISDIR(os.stat(p).st_mode)
        except OSError:
            is_file = p.suffix != ""
        here = p.parent if is_file else p
        inside_dump = is_file and p.name in _SIDE_FILES
        if is_file and p.name == "statistic.csv" and here.name.isdigit() and here.parent.name.isdigit():
            here = here.parent.parent.parent  # a kernel dump: rank_<id>/<net>/<graph>/<iteration>/
        while here.parent != here and _DUMP_PART.match(here.name):
            inside_dump = True
            here = here.parent
        root = here if inside_dump else p
        if root not in out:
            out.append(root)
    return out


def dataset_inputs(ds: Any) -> list[str]:
    """The source paths recorded in a dataset's attributes (``source``, per-run sources, zarr stores).

    A dataset reopened from a zarr store names the dump it was converted from as its ``source``;
    the store it was read from (:data:`STORE_ATTR`) is an input too. A :class:`precnb.Triage`
    gives those of the runs it holds.
    """
    import json

    if ds is None:
        return []
    if not hasattr(ds, "attrs"):  # a precnb.Triage (or alike): the runs it holds
        return [p for name in ("raw_target", "raw_baseline", "target", "baseline")
                for p in dataset_inputs(getattr(ds, name, None))]
    attrs = getattr(ds, "attrs", {}) or {}
    out = [str(attrs[k]) for k in ("source", STORE_ATTR) if attrs.get(k)]
    store = (getattr(ds, "encoding", None) or {}).get(STORE_ATTR)
    if store:
        out.append(str(store))
    raw = attrs.get("run_attrs")
    try:
        runs = json.loads(raw) if isinstance(raw, str) else (raw or {})
    except ValueError:
        runs = {}
    for own in runs.values() if isinstance(runs, dict) else ():
        if isinstance(own, dict):
            out += [str(own[k]) for k in ("source", STORE_ATTR) if own.get(k)]
    return [s for s in out if not s.startswith("(")]


def _ids(p: Path) -> list[tuple[int, int]]:
    """(device, inode) of *p* (when it exists) and of every ancestor."""
    out = []
    cur = p
    while True:
        with contextlib.suppress(OSError):
            st = os.stat(cur)
            out.append((st.st_dev, st.st_ino))
        if cur.parent == cur:
            return out
        cur = cur.parent


def _ident(p: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(p)
    except OSError:
        return None
    return st.st_dev, st.st_ino
