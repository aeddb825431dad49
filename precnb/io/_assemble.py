"""Columnar per-file records and their assembly into the canonical dataset.

Every reader turns one (step, rank) source file into a :class:`FileRecords` (plain
numpy columns, cheap to pickle between dask workers) and then calls :func:`assemble`,
which aligns them on the union of tensor labels.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from precnb.schema import DIMS, SCHEMA_VERSION, STATS, TENSOR_COORDS, validate

__all__ = ["FileRecords", "LoadReport", "RecordBuilder", "assemble"]

_INT_COORDS = {k for k, v in TENSOR_COORDS.items() if v is not str}


@dataclass
class LoadReport:
    """What a load read, skipped and why.

    Attributes
    ----------
    read : list of str
        Files read successfully.
    skipped : list of (str, str)
        ``(path, reason)`` for every file or folder that was not loaded.
    warnings : list of str
        Things that loaded but deserve attention.
    """

    read: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[tuple[str, str]]:
        """Skipped entries that failed to load (not those ignored on purpose)."""
        return [(p, r) for p, r in self.skipped if not r.startswith("ignored")]

    @property
    def ok(self) -> bool:
        """True when no file failed to load."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict."""
        return {
            "read": list(self.read),
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
            "warnings": list(self.warnings),
        }

    def merge(self, other: LoadReport) -> None:
        """Add *other*'s entries to this report."""
        self.read.extend(other.read)
        self.skipped.extend(other.skipped)
        self.warnings.extend(other.warnings)

    def summary(self) -> str:
        """One paragraph, for the CLI."""
        lines = [f"read {len(self.read)} file(s), skipped {len(self.skipped)}"]
        lines += [f"  skipped {p}: {r}" for p, r in self.skipped]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


@dataclass
class FileRecords:
    """The tensors of one (step, rank) source, as columns.

    Attributes
    ----------
    step, rank : int
    labels : list of str
        Tensor labels, in execution order.
    coords : dict of str to list
        One list per tensor coordinate of the schema, aligned with *labels*.
    values : dict of str to ndarray
        float64 statistics aligned with *labels* (at least max/min/mean/norm).
    null_stats, seq, numel : ndarray
    strings : dict of str to list of str
        Optional string variables aligned with *labels* (``crc``, ``data_name``).
    construct, stacks : dict
        Side tables for this file (node → parent, node → frames).
    meta : dict
        Task, level, framework, source path.
    """

    step: int
    rank: int
    labels: list[str]
    coords: dict[str, list[Any]]
    values: dict[str, np.ndarray]
    null_stats: np.ndarray
    seq: np.ndarray
    numel: np.ndarray
    strings: dict[str, list[str]] = field(default_factory=dict)
    construct: dict[str, str] = field(default_factory=dict)
    stacks: dict[str, list[str]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


class RecordBuilder:
    """Accumulate tensors one at a time and produce a :class:`FileRecords`.

    Examples
    --------
    >>> b = RecordBuilder(step=0, rank=0)
    >>> b.add("x.output.0", {"max": 1.0, "min": 0.0, "mean": 0.5, "norm": None},
    ...       node="x", kind="api", role="output", shape=[2])
    >>> r = b.build()
    >>> r.labels, int(r.null_stats[0]), int(r.numel[0])
    (['x.output.0'], 8, 2)
    """

    def __init__(self, step: int, rank: int, extra_stats: Sequence[str] = ()) -> None:
        self.step, self.rank = step, rank
        self.stat_names = (*STATS, *[s for s in extra_stats if s not in STATS])
        self.labels: list[str] = []
        self.coords: dict[str, list[Any]] = {k: [] for k in TENSOR_COORDS}
        self.values: dict[str, list[float]] = {s: [] for s in self.stat_names}
        self.null: list[int] = []
        self.numel: list[int] = []
        self.crc: list[str] = []
        self.has_crc = False
        self._seen: dict[str, int] = {}

    def add(
        self,
        label: str,
        stats: dict[str, Any],
        *,
        shape: Sequence[int] | None = None,
        crc: str | None = None,
        **coords: Any,
    ) -> None:
        """Add one tensor; ``None`` statistics are recorded in ``null_stats``."""
        if label in self._seen:  # duplicate keys: keep the last record, like json does
            label = f"{label}#dup{sum(lbl.startswith(label) for lbl in self.labels)}"
        self._seen[label] = len(self.labels)
        self.labels.append(label)
        null = 0
        for bit, name in enumerate(self.stat_names):
            v = stats.get(name)
            f = _to_float(v)
            if f is None:
                f = np.nan
                if bit < len(STATS):  # null bits exist for max/min/mean/norm only
                    null |= 1 << bit
            self.values[name].append(f)
        self.null.append(null & 0xFF)
        self.numel.append(_numel(shape))
        if crc is not None:
            self.has_crc = True
        self.crc.append(crc or "")
        if shape is not None and "shape" not in coords:
            coords["shape"] = _shape_text(shape)
        for k in TENSOR_COORDS:
            self.coords[k].append(coords.get(k, -1 if k in _INT_COORDS else ""))

    def build(self, **kw: Any) -> FileRecords:
        """Return the accumulated columns as a :class:`FileRecords`."""
        n = len(self.labels)
        return FileRecords(
            step=self.step,
            rank=self.rank,
            labels=self.labels,
            coords=self.coords,
            values={k: np.asarray(v, dtype=np.float64) for k, v in self.values.items()},
            null_stats=np.asarray(self.null, dtype=np.uint8),
            seq=np.arange(n, dtype=np.int32),
            numel=np.asarray(self.numel, dtype=np.int64),
            strings={"crc": self.crc} if self.has_crc else {},
            **kw,
        )


def _to_float(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:  # ints beyond float range
            return float("inf") if v > 0 else float("-inf")
    if isinstance(v, str):
        s = v.strip()
        if s.lower() in ("", "null", "none", "n/a"):
            return None
        try:
            return float(s)
        except ValueError:
            return None
    return None


def _numel(shape: Sequence[int] | None) -> int:
    if shape is None:
        return -1
    n = 1
    try:
        for d in shape:
            n *= int(d)
    except (TypeError, ValueError):
        return -1
    return n


def _shape_text(shape: Sequence[int] | str) -> str:
    if isinstance(shape, str):
        return shape
    try:
        return json.dumps([int(d) for d in shape])
    except (TypeError, ValueError):
        return str(shape)


def _union_labels(records: Iterable[FileRecords]) -> tuple[list[str], dict[str, int], list[FileRecords]]:
    index: dict[str, int] = {}
    order: list[str] = []
    recs = sorted(records, key=lambda r: (r.step, r.rank))
    for r in recs:
        for lbl in r.labels:
            if lbl not in index:
                index[lbl] = len(order)
                order.append(lbl)
    return order, index, recs


def assemble(
    records: Sequence[FileRecords],
    *,
    source_format: str,
    attrs: dict[str, Any] | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
) -> xr.Dataset:
    """Align per-file records on the union of tensor labels.

    Parameters
    ----------
    records : sequence of FileRecords
    source_format : str
        Recorded in ``attrs["source_format"]``.
    attrs : dict, optional
        Extra attributes.
    steps, ranks : sequence of int, optional
        Force these coordinates (e.g. to keep a rank whose file was unreadable).

    Returns
    -------
    xarray.Dataset
        A dataset that passes :func:`precnb.schema.validate`.
    """
    labels, index, recs = _union_labels(records)
    step_vals = sorted(set(steps) if steps is not None else {r.step for r in recs})
    rank_vals = sorted(set(ranks) if ranks is not None else {r.rank for r in recs})
    si = {s: i for i, s in enumerate(step_vals)}
    ri = {r: i for i, r in enumerate(rank_vals)}
    shape = (len(step_vals), len(rank_vals), len(labels))
    stat_names: list[str] = list(STATS)
    for r in recs:
        stat_names += [k for k in r.values if k not in stat_names]
    arrays = {k: np.full(shape, np.nan) for k in stat_names}
    present = np.zeros(shape, bool)
    null = np.zeros(shape, np.uint8)
    seq = np.full(shape, -1, np.int32)
    numel = np.full(shape, -1, np.int64)
    string_names = sorted({k for r in recs for k in r.strings})
    strings = {k: np.full(shape, "", dtype=object) for k in string_names}
    coords: dict[str, list[Any]] = {k: [None] * len(labels) for k in TENSOR_COORDS}
    construct: dict[str, str] = {}
    stacks: dict[str, list[str]] = {}
    for r in recs:
        if r.step not in si or r.rank not in ri:
            continue
        cols = np.fromiter((index[lbl] for lbl in r.labels), dtype=np.int64, count=len(r.labels))
        s, k = si[r.step], ri[r.rank]
        for name, vals in r.values.items():
            arrays[name][s, k, cols] = vals
        present[s, k, cols] = True
        null[s, k, cols] = r.null_stats
        seq[s, k, cols] = r.seq
        numel[s, k, cols] = r.numel
        for name, col in r.strings.items():
            strings[name][s, k, cols] = col
        for name, col in r.coords.items():
            target = coords[name]
            for j, v in zip(cols.tolist(), col, strict=True):
                if target[j] is None:
                    target[j] = v
        for node, parent in r.construct.items():
            construct.setdefault(node, parent)
        for node, frames in r.stacks.items():
            stacks.setdefault(node, frames)
    data: dict[str, Any] = {name: (DIMS, arr) for name, arr in arrays.items()}
    data["present"] = (DIMS, present)
    data["null_stats"] = (DIMS, null)
    data["seq"] = (DIMS, seq)
    data["numel"] = (DIMS, numel)
    for name, arr in strings.items():
        data[name] = (DIMS, arr)
    coord_arrays: dict[str, Any] = {
        "step": np.asarray(step_vals, np.int64),
        "rank": np.asarray(rank_vals, np.int64),
        "tensor": np.asarray(labels, dtype=object),
    }
    for name, vals in coords.items():
        if name in _INT_COORDS:
            coord_arrays[name] = ("tensor", np.asarray([-1 if v is None else v for v in vals], np.int64))
        else:
            coord_arrays[name] = ("tensor", np.asarray(["" if v is None else str(v) for v in vals], object))
    meta: dict[str, Any] = {
        "precnb_schema": SCHEMA_VERSION,
        "source_format": source_format,
        "construct": json.dumps(construct),
        "stacks": json.dumps(stacks),
    }
    for key in ("task", "level", "framework"):
        vals = sorted({str(r.meta[key]) for r in recs if r.meta.get(key)})
        meta[key] = ",".join(vals)
    meta.update(attrs or {})
    ds = xr.Dataset(data, coords=coord_arrays, attrs=meta)
    return validate(ds)
