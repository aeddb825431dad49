"""A zarr store checked before anything reads it: every file regular, every chunk there or its gap named.

zarr reads a missing chunk file as the array's fill value: a store whose chunk files of step 1 were
deleted reopened as a run where step 1 holds nothing but NaN, and ``precnb nan`` answered "first NaN at
step 2" with exit 0 (issue #49). And zarr opens a chunk file named by its key whatever it is: a FIFO
there blocked ``info``, ``nan``, ``diff`` and ``open_run`` forever.

:func:`audit_store` reads every ``zarr.json`` through the input-safety layer (:mod:`precnb._files`:
regular file, size bound, UTF-8, nesting bound), walks every array's chunk folder without opening a
chunk (a FIFO, a device or a folder where a chunk is expected is refused, naming it), and lists the
chunk keys the grid expects but the folder lacks. precnb writes every chunk of a store, fill-valued or
not (``array.write_empty_chunks``), and says so in the root attribute :data:`COMPLETE_ATTR`: a chunk
missing from such a store is damage (:attr:`StoreAudit.missing`); a store written without the attribute
(older precnb, or another writer) may leave fill-valued chunks unwritten, so its absent chunks are
reported as fill-valued regions (:attr:`StoreAudit.unwritten`) and not refused.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precnb.errors import DumpFormatError
from precnb.io._fs import read_json_input

__all__ = ["COMPLETE_ATTR", "MAX_ATTRS_BYTES", "StoreAudit", "audit_store"]

#: root attribute of a store whose every chunk was written (``"all"``): an absent chunk is damage there
COMPLETE_ATTR = "precnb_chunks"
#: bytes a zarr.json may hold (the root one carries construct, stacks and the load report as JSON text)
MAX_ATTRS_BYTES = 1 << 30
_MAX_ARRAY_META = 16 << 20
#: chunk keys listed per message
_SHOWN = 5


@dataclass
class StoreAudit:
    """What :func:`audit_store` found.

    ``missing`` and ``unwritten`` are ``(chunk path relative to the store, what it holds)``; ``complete`` says
    whether the store declares every chunk written (then absent chunks are ``missing``, else ``unwritten``).
    """

    path: str
    complete: bool = False
    arrays: dict[str, dict[str, Any]] = field(default_factory=dict)
    missing: list[tuple[str, str]] = field(default_factory=list)
    unwritten: list[tuple[str, str]] = field(default_factory=list)
    root_attrs: dict[str, Any] = field(default_factory=dict)

    def missing_message(self) -> str:
        """One line naming the missing chunks (the first few) and what they hide."""
        shown = "; ".join(f"{k} ({what})" for k, what in self.missing[:_SHOWN])
        more = f" and {len(self.missing) - _SHOWN} more" if len(self.missing) > _SHOWN else ""
        return (f"damaged zarr store: {len(self.missing)} chunk file(s) missing: {shown}{more}; the values there are "
                "unknown (zarr would read them as fill values): re-convert the dump (`precnb info` lists the gaps)")

    def lines(self) -> list[tuple[str, str]]:
        """``(path, reason)`` entries for the load report: every missing chunk, and the fill-valued regions."""
        out = [(os.path.join(self.path, k), f"chunk file missing ({what}): read as fill values, its values unknown")
               for k, what in self.missing]
        if self.unwritten:
            by_array: dict[str, int] = {}
            for k, _ in self.unwritten:
                by_array[k.split("/", 1)[0]] = by_array.get(k.split("/", 1)[0], 0) + 1
            regions = ", ".join(f"{a} ({n})" for a, n in sorted(by_array.items()))
            out.append((self.path, f"ignored: {len(self.unwritten)} chunk(s) not written, read as fill values "
                                   f"(fill-valued regions of a store that does not say every chunk was written): "
                                   f"{regions}"))
        return out


def _meta(path: Path, limit: int) -> dict[str, Any]:
    doc = read_json_input(path, limit, what="zarr metadata file")
    if not isinstance(doc, dict):
        raise DumpFormatError(path, f"zarr metadata is a JSON {type(doc).__name__}, not an object")
    return doc


def _grid(meta: dict[str, Any], where: Path) -> tuple[list[int], list[int], str, str]:
    """(shape, chunk shape, separator, prefix) of an array's metadata, checked."""
    shape = meta.get("shape")
    try:
        chunk = meta["chunk_grid"]["configuration"]["chunk_shape"]
        enc = meta.get("chunk_key_encoding") or {"name": "default"}
        sep = (enc.get("configuration") or {}).get("separator", "/" if enc.get("name") == "default" else ".")
        prefix = "c" if enc.get("name") == "default" else ""
    except (KeyError, TypeError, AttributeError):
        raise DumpFormatError(where, "not a regular-grid zarr array (no chunk_grid.configuration.chunk_shape)"
                              ) from None
    ok = (isinstance(shape, list) and isinstance(chunk, list) and len(shape) == len(chunk)
          and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 62 for x in shape)
          and all(isinstance(x, int) and not isinstance(x, bool) and 0 < x < 1 << 62 for x in chunk)
          and sep in ("/", "."))
    if not ok:
        raise DumpFormatError(where, f"zarr array metadata with an unusable shape {str(shape)[:80]} or chunk shape "
                                     f"{str(chunk)[:80]}")
    return list(shape or []), list(chunk), str(sep), prefix


def _found_chunks(folder: Path, store: Path) -> set[str]:
    """Relative keys (``"1/0/0"``) of every file under *folder*; anything but a regular file is refused."""
    found: set[str] = set()
    if not folder.exists():
        return found
    stack = [folder]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError as exc:
            raise DumpFormatError(d, f"cannot list the chunk folder: {exc.strerror or exc}") from None
        for e in entries:
            try:
                if e.is_dir():  # links followed
                    stack.append(Path(e.path))
                    continue
                regular = e.is_file()
            except OSError:
                regular = False
            if not regular:
                from precnb._files import not_a_file_reason

                why = not_a_file_reason(e.path, "it") or "it cannot be read"
                raise DumpFormatError(e.path, f"zarr chunk: {why} (never opened)")
            found.add(os.path.relpath(e.path, folder).replace(os.sep, "/"))
    return found


def _describe(name: str, dims: list[str], index: tuple[int, ...], chunk: list[int], shape: list[int],
              steps: list[int] | None) -> str:
    parts = []
    for dim, i, c, n in zip(dims, index, chunk, shape, strict=False):
        lo, hi = i * c, min(n, (i + 1) * c) - 1
        if dim == "step" and steps is not None and hi < len(steps):
            vals = steps[lo:hi + 1]
            parts.append(f"step {vals[0]}" if len(vals) == 1 else f"steps {vals[0]}-{vals[-1]}")
        else:
            parts.append(f"{dim} {lo}" if lo == hi else f"{dim}s {lo}-{hi}")
    return f"{name}: " + ", ".join(parts)


def audit_store(path: str | os.PathLike[str]) -> StoreAudit:
    """Check a zarr (format 3) store folder without reading a chunk; see the module docstring.

    A format 2 store (``.zgroup``) gets the regular-file check of every file only.

    Raises
    ------
    precnb.errors.DumpFormatError
        A metadata file or a chunk that is not a regular file, metadata that is not JSON or too large or
        deep, an array without a usable grid (the message names the file).
    """
    p = Path(path)
    audit = StoreAudit(str(p))
    if not (p / "zarr.json").exists():
        _found_chunks(p, p)  # format 2: every file regular
        return audit
    root = _meta(p / "zarr.json", MAX_ATTRS_BYTES)
    attrs = root.get("attributes")
    audit.root_attrs = attrs if isinstance(attrs, dict) else {}
    audit.complete = audit.root_attrs.get(COMPLETE_ATTR) == "all"
    try:
        children = sorted(c for c in os.listdir(p) if (p / c).is_dir())
    except OSError as exc:
        raise DumpFormatError(p, f"cannot list the store: {exc.strerror or exc}") from None
    metas: dict[str, dict[str, Any]] = {}
    for name in children:
        if not (p / name / "zarr.json").exists():
            continue
        meta = _meta(p / name / "zarr.json", _MAX_ARRAY_META)
        if meta.get("node_type") != "array":
            continue
        metas[name] = meta
    audit.arrays = metas
    steps: list[int] | None = None
    expected: dict[str, list[tuple[int, ...]]] = {}
    for name, meta in metas.items():
        shape, chunk, sep, prefix = _grid(meta, p / name / "zarr.json")
        found = _found_chunks(p / name / prefix if prefix else p / name, p)
        if not prefix:
            found.discard("zarr.json")
        grid = [math.ceil(n / c) for n, c in zip(shape, chunk, strict=True)]
        total = math.prod(grid)
        if len(found) >= total:
            continue
        absent = []
        for index in itertools.product(*(range(g) for g in grid)):
            key = sep.join(map(str, index)) if index else "0"
            if key not in found:
                absent.append(index)
        expected[name] = absent
    if not expected:
        return audit
    if "step" in metas and "step" not in expected:
        steps = _read_steps(p)
    for name, absent in expected.items():
        meta = metas[name]
        shape, chunk, sep, prefix = _grid(meta, p / name / "zarr.json")
        dims = [str(d) for d in (meta.get("dimension_names") or [f"dim_{i}" for i in range(len(shape))])]
        for index in absent:
            key = f"{name}/{prefix + '/' if prefix else ''}{sep.join(map(str, index)) if index else '0'}"
            entry = (key, _describe(name, dims, index, chunk, shape, steps))
            (audit.missing if audit.complete else audit.unwritten).append(entry)
    return audit


def _read_steps(p: Path) -> list[int] | None:
    """The step coordinate (its chunks are all there), or None when it cannot be read."""
    try:
        import numpy as np
        import zarr

        arr = zarr.open_array(p / "step", mode="r", zarr_format=3)
        return [int(v) for v in np.asarray(arr[:]).ravel()]
    except Exception:  # an unreadable coordinate: the chunks are then described by index
        return None
