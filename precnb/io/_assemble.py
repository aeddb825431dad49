"""Columnar per-file records and their assembly into the canonical dataset.

Every reader turns one (step, rank) source file into a :class:`FileRecords` (plain
numpy columns, cheap to pickle between dask workers) and then calls :func:`assemble`,
which aligns them on the union of tensor labels.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from precnb.io._runfacts import FactsAccumulator
from precnb.schema import DIMS, SCHEMA_VERSION, STATS, TENSOR_COORDS, validate

__all__ = ["Assembler", "FileRecords", "LoadReport", "RecordBuilder", "assemble", "select_items"]

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


def select_items(items: Sequence[Any], steps: Sequence[int] | None, ranks: Sequence[int] | None) -> list[Any]:
    """The parse items (with ``step`` and ``rank``) in *steps* and *ranks* (None: all).

    Examples
    --------
    >>> from types import SimpleNamespace as N
    >>> [(i.step, i.rank) for i in select_items([N(step=0, rank=1), N(step=2, rank=1)], [2], None)]
    [(2, 1)]
    """
    want_s = None if steps is None else {int(s) for s in steps}
    want_r = None if ranks is None else {int(r) for r in ranks}
    return [i for i in items if (want_s is None or i.step in want_s) and (want_r is None or i.rank in want_r)]


def stat_value(v: Any) -> float | None:
    """A JSON statistic as the schema stores it (None for null).

    Numbers (ints beyond the float range become ±inf), booleans (1.0 / 0.0) and numeric strings
    (``"nan"``, ``"-Infinity"``, ``"1e400"``) are read; ``None``, ``"null"``, ``""`` are null.
    Anything else (lists, objects, other strings) raises TypeError.

    Examples
    --------
    >>> stat_value("-Infinity"), stat_value("null"), stat_value(10**400)
    (-inf, None, inf)
    """
    if v is None:
        return None
    if isinstance(v, float):
        return v
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, int):
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
            pass
    raise TypeError(v)


def _to_float(v: Any) -> float | None:
    """:func:`stat_value`, with unreadable values as null."""
    try:
        return stat_value(v)
    except TypeError:
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


_NO_OWNER = np.iinfo(np.int64).max


class _Rec:
    """The part of a :class:`FileRecords` kept until its step is materialised (no Python lists of labels)."""

    __slots__ = ("construct", "dtypes", "gids", "key", "null", "numel", "order", "rank", "seq", "skipped",
                 "stacks", "step", "strings", "values")

    def __init__(self, rec: FileRecords, gids: np.ndarray, order: int, skipped: bool,
                 construct: tuple[Any, dict[str, str]], stacks: tuple[Any, dict[str, list[str]]],
                 dtypes: np.ndarray | None = None) -> None:
        self.step, self.rank, self.order = rec.step, rec.rank, order
        self.key = (rec.step, rec.rank, order)
        self.skipped = skipped
        self.gids = gids
        self.values = rec.values
        self.null, self.seq, self.numel = rec.null_stats, rec.seq, rec.numel
        self.strings = rec.strings
        self.construct, self.stacks = construct, stacks
        self.dtypes = dtypes  # dtype codes per label (Assembler._dtype_code), to find changed entries


MAX_DTYPE_CHANGES = 200_000


class Assembler:
    """Collect :class:`FileRecords` one at a time and align them on the union of tensor labels.

    What :func:`assemble` does, but records are folded in as they arrive (from a dask cluster,
    say): labels become integer ids at once, side tables that are byte-identical are parsed
    and merged once, and a step can be materialised and dropped before the next is read
    (:meth:`take_steps`, used to stream a run into zarr). The result does not depend on the
    arrival order: records are ordered by ``(step, rank, order)`` as :func:`assemble` does.

    Parameters
    ----------
    steps, ranks : sequence of int, optional
        Force these coordinates; records outside them add tensor labels but no values.

    Examples
    --------
    >>> b = RecordBuilder(step=0, rank=0)
    >>> b.add("x.output.0", {"max": 1.0, "min": 0.0, "mean": 0.5, "norm": 2.0}, node="x", kind="api")
    >>> acc = Assembler()
    >>> acc.add(b.build())
    >>> acc.build(source_format="synthetic").sizes["tensor"]
    1
    """

    def __init__(self, *, steps: Sequence[int] | None = None, ranks: Sequence[int] | None = None) -> None:
        self.forced_steps = sorted(set(steps)) if steps is not None else None
        self.forced_ranks = sorted(set(ranks)) if ranks is not None else None
        self._steps_set = set(self.forced_steps) if self.forced_steps is not None else None
        self._ranks_set = set(self.forced_ranks) if self.forced_ranks is not None else None
        self._gid: dict[str, int] = {}
        self._labels: list[str] = []
        self._coords: dict[str, list[Any]] = {k: [] for k in TENSOR_COORDS}
        self._owner = np.zeros((0, 3), np.int64)  # (step, rank, order) of the record that set the coords
        self._holes: dict[str, dict[int, tuple[int, ...]]] = {}  # coords still None: key of their value
        self._pending: list[_Rec] = []
        self._n = 0
        self._meta: dict[str, set[str]] = {"task": set(), "level": set(), "framework": set()}
        self._side_cache: dict[Any, Any] = {}
        # state of what has been materialised (label order, variables, side tables)
        self._pos = np.zeros(0, np.int64)  # gid -> column, -1 before the label is placed
        self._order: list[int] = []  # gids in column order
        self.stat_names: list[str] = list(STATS)
        self.string_names: set[str] = set()
        self.construct: dict[str, str] = {}
        self.stacks: dict[str, list[str]] = {}
        self._merged: set[Any] = set()
        # entries whose dtype differs from their tensor's dtype coordinate (attrs["dtype_changes"])
        self._dtype_code: dict[Any, int] = {None: 0, "": 0}
        self._dtype_names: list[str] = [""]
        self._codes_cache: dict[tuple[Any, ...], np.ndarray] = {}
        self.dtype_changes: dict[str, dict[str, list[list[int]]]] = {}
        self.n_dtype_changes = 0
        self.facts = FactsAccumulator()  # requires_grad / optimizer scalar arguments (attrs)

    # ----------------------------------------------------------------------------- adding
    def _side(self, rec: FileRecords) -> tuple[tuple[Any, dict[str, str]], tuple[Any, dict[str, list[str]]]]:
        from precnb.io._fastparse import SIDE_KEY, parse_construct, parse_stack

        side = rec.meta.get(SIDE_KEY)
        if not side:
            return (None, rec.construct), (None, rec.stacks)
        out: list[Any] = []
        for name, parse in (("construct", parse_construct), ("stack", parse_stack)):
            item = side.get(name)
            if item is None:
                out.append((None, {}))
                continue
            key = (name, item[0])
            if key not in self._side_cache:
                self._side_cache[key] = parse(item[1])
            out.append((key, self._side_cache[key]))
        return out[0], out[1]

    def add(self, rec: FileRecords, order: int | None = None) -> None:
        """Fold in one record; *order* breaks ties between records of the same (step, rank)."""
        order = self._n if order is None else int(order)
        self._n += 1
        for key in ("task", "level", "framework"):
            v = rec.meta.get(key)
            if v:
                self._meta[key].add(str(v))
        gid = self._gid
        n_before = len(self._labels)
        for lbl in rec.labels:
            if lbl not in gid:
                gid[lbl] = len(self._labels)
                self._labels.append(lbl)
        gids = np.fromiter((gid[lbl] for lbl in rec.labels), dtype=np.int64, count=len(rec.labels))
        n_new = len(self._labels) - n_before
        if n_new:
            self._owner = np.concatenate([self._owner, np.full((n_new, 3), _NO_OWNER, np.int64)])
            for vals in self._coords.values():
                vals.extend([None] * n_new)
        skipped = (self._steps_set is not None and rec.step not in self._steps_set) or (
            self._ranks_set is not None and rec.rank not in self._ranks_set)
        if not skipped:
            self._set_coords(rec, gids, order)
            self.facts.add(rec.meta.get("facts"), step=rec.step)
        construct, stacks = self._side(rec)
        dt = rec.coords.get("dtype")
        codes = self._codes(dt) if dt is not None and len(dt) == len(rec.labels) else None
        self._pending.append(_Rec(rec, gids, order, skipped, construct, stacks, codes))

    def _codes(self, names: Sequence[Any]) -> np.ndarray:
        key = tuple(names)  # the ranks of a run repeat the same dtype column: encode it once
        hit = self._codes_cache.get(key)
        if hit is not None:
            return hit
        code = self._dtype_code
        out = np.empty(len(names), np.int32)
        for i, d in enumerate(names):
            c = code.get(d)
            if c is None:
                c = code[d] = len(self._dtype_names)
                self._dtype_names.append(str(d))
            out[i] = c
        if len(self._codes_cache) > 256:
            self._codes_cache.clear()
        self._codes_cache[key] = out
        return out

    def _note_dtype_changes(self, recs: list[_Rec]) -> None:
        """Record entries of *recs* whose dtype is not their tensor's coordinate (both known)."""
        coord: np.ndarray | None = None
        for r in recs:
            if r.skipped or r.dtypes is None:
                continue
            if coord is None:
                coord = self._codes(self._coords["dtype"])
            own = coord[r.gids]
            bad = np.flatnonzero((r.dtypes != own) & (r.dtypes != 0) & (own != 0))
            for j in bad.tolist():
                if self.n_dtype_changes >= MAX_DTYPE_CHANGES:
                    return
                label = self._labels[int(r.gids[j])]
                name = self._dtype_names[int(r.dtypes[j])]
                self.dtype_changes.setdefault(label, {}).setdefault(name, []).append([r.step, r.rank])
                self.n_dtype_changes += 1

    def _set_coords(self, rec: FileRecords, gids: np.ndarray, order: int) -> None:
        """Coordinates come from the first record (in (step, rank, order) order) holding the label."""
        own = self._owner[gids]
        s, r = rec.step, rec.rank
        earlier = (s < own[:, 0]) | ((s == own[:, 0]) & ((r < own[:, 1]) | ((r == own[:, 1]) & (order < own[:, 2]))))
        if earlier.any():
            self._take_coords(rec, gids, np.flatnonzero(earlier), (s, r, order))
        if self._holes:
            self._fill_holes(rec, gids, (s, r, order))

    def _take_coords(self, rec: FileRecords, gids: np.ndarray, js: np.ndarray, key: tuple[int, int, int]) -> None:
        if len(js) > 1:  # a label repeated within one record: its first occurrence wins
            _, first = np.unique(gids[js], return_index=True)
            js = js[np.sort(first)]
        targets = gids[js]
        prev = [tuple(k) for k in self._owner[targets].tolist()]
        self._owner[targets] = key
        jl, tl = js.tolist(), targets.tolist()
        for name, vals in self._coords.items():
            col = rec.coords.get(name)
            holes = self._holes.get(name)
            for j, t, old in zip(jl, tl, prev, strict=True):
                v = None if col is None else col[j]
                if v is not None:
                    vals[t] = v
                    if holes:
                        holes.pop(t, None)
                else:  # a None value never wins (assemble() took the first value that is not None)
                    self._holes.setdefault(name, {}).setdefault(t, old)

    def _fill_holes(self, rec: FileRecords, gids: np.ndarray, key: tuple[int, int, int]) -> None:
        """Coordinates whose earliest record had None: the earliest record with a value wins."""
        where: dict[int, int] = {}
        for j, g in enumerate(gids.tolist()):
            where.setdefault(g, j)
        for name, holes in self._holes.items():
            col = rec.coords.get(name)
            if col is None:
                continue
            for t, best in list(holes.items()):
                j = where.get(t)
                if j is not None and col[j] is not None and key < best:
                    self._coords[name][t] = col[j]
                    holes[t] = key

    # ------------------------------------------------------------------------ materialising
    @property
    def n_pending(self) -> int:
        """Records added and not yet materialised."""
        return len(self._pending)

    def pending_steps(self) -> list[int]:
        """Steps of the records not yet materialised, sorted."""
        return sorted({r.step for r in self._pending})

    def _place(self, recs: list[_Rec]) -> None:
        """Give columns to labels first seen in *recs* (sorted), and register their variables."""
        n = len(self._labels)
        if len(self._pos) < n:
            self._pos = np.concatenate([self._pos, np.full(n - len(self._pos), -1, np.int64)])
        for r in recs:
            new = r.gids[self._pos[r.gids] < 0]
            if len(new):
                _, first = np.unique(new, return_index=True)
                new = new[np.sort(first)]
                self._pos[new] = np.arange(len(self._order), len(self._order) + len(new))
                self._order.extend(new.tolist())
            self.stat_names += [k for k in r.values if k not in self.stat_names]
            self.string_names.update(r.strings)

    def _merge_sides(self, r: _Rec) -> None:
        for (key, table), target in ((r.construct, self.construct), (r.stacks, self.stacks)):
            if key is not None:
                if key in self._merged:
                    continue
                self._merged.add(key)
            for node, val in table.items():
                target.setdefault(node, val)

    def _fill(self, recs: list[_Rec], step_vals: Sequence[int], rank_vals: Sequence[int]) -> dict[str, np.ndarray]:
        si = {s: i for i, s in enumerate(step_vals)}
        ri = {r: i for i, r in enumerate(rank_vals)}
        shape = (len(step_vals), len(rank_vals), len(self._order))
        arrays: dict[str, np.ndarray] = {k: np.full(shape, np.nan) for k in self.stat_names}
        arrays["present"] = np.zeros(shape, bool)
        arrays["null_stats"] = np.zeros(shape, np.uint8)
        arrays["seq"] = np.full(shape, -1, np.int32)
        arrays["numel"] = np.full(shape, -1, np.int64)
        for name in sorted(self.string_names):
            arrays[name] = np.full(shape, "", dtype=object)
        self._note_dtype_changes([r for r in recs if r.step in si and r.rank in ri])
        for r in recs:
            if r.skipped or r.step not in si or r.rank not in ri:
                continue
            cols = self._pos[r.gids]
            s, k = si[r.step], ri[r.rank]
            for name, vals in r.values.items():
                arrays[name][s, k, cols] = vals
            arrays["present"][s, k, cols] = True
            arrays["null_stats"][s, k, cols] = r.null
            arrays["seq"][s, k, cols] = r.seq
            arrays["numel"][s, k, cols] = r.numel
            for name, col in r.strings.items():
                arrays[name][s, k, cols] = col
            self._merge_sides(r)
        return arrays

    def take_steps(self, steps: Sequence[int], ranks: Sequence[int]) -> dict[str, np.ndarray]:
        """Materialise (and drop) the pending records of *steps*: arrays (step, rank, tensor).

        Columns are every label placed so far, in :func:`assemble` order; call in increasing
        step order so that labels first seen later are appended after the earlier ones.
        """
        want = set(steps)
        take = sorted((r for r in self._pending if r.step in want), key=lambda r: r.key)
        self._pending = [r for r in self._pending if r.step not in want]
        self._place(take)
        return self._fill(take, list(steps), list(ranks))

    def tensor_coords(self) -> dict[str, Any]:
        """The ``tensor`` coordinate and the per-tensor coordinates of the columns placed so far."""
        order = self._order
        out: dict[str, Any] = {"tensor": np.asarray([self._labels[g] for g in order], dtype=object)}
        for name, vals in self._coords.items():
            col = [vals[g] for g in order]
            if name in _INT_COORDS:
                out[name] = ("tensor", np.asarray([-1 if v is None else v for v in col], np.int64))
            else:
                out[name] = ("tensor", np.asarray(["" if v is None else str(v) for v in col], object))
        return out

    def attrs(self, source_format: str, attrs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Dataset attributes: schema version, format, side tables, task/level/framework."""
        meta: dict[str, Any] = {
            "precnb_schema": SCHEMA_VERSION,
            "source_format": source_format,
            "construct": json.dumps(self.construct),
            "stacks": json.dumps(self.stacks),
        }
        for key in ("task", "level", "framework"):
            meta[key] = ",".join(sorted(self._meta[key]))
        if self.dtype_changes:
            meta["dtype_changes"] = json.dumps(self.dtype_changes)
        meta.update(self.facts.attrs())
        meta.update(attrs or {})
        return meta

    def build(self, *, source_format: str, attrs: dict[str, Any] | None = None) -> xr.Dataset:
        """Materialise everything added into the canonical dataset (see :func:`assemble`)."""
        recs = sorted(self._pending, key=lambda r: r.key)
        self._pending = []
        step_vals = self.forced_steps if self.forced_steps is not None else sorted({r.step for r in recs})
        rank_vals = self.forced_ranks if self.forced_ranks is not None else sorted({r.rank for r in recs})
        self._place(recs)
        arrays = self._fill(recs, step_vals, rank_vals)
        coords = self.tensor_coords()
        coords["step"] = np.asarray(step_vals, np.int64)
        coords["rank"] = np.asarray(rank_vals, np.int64)
        data = {name: (DIMS, arr) for name, arr in arrays.items()}
        ds = xr.Dataset(data, coords=coords, attrs=self.attrs(source_format, attrs))
        return validate(ds)


def assemble(
    records: Sequence[FileRecords],
    *,
    source_format: str,
    attrs: dict[str, Any] | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
) -> xr.Dataset:
    """Align per-file records on the union of tensor labels.

    Records are ordered by (step, rank) (ties keep their order); tensor labels in order of
    first appearance; coordinates of a tensor come from the first record holding it.

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
    acc = Assembler(steps=steps, ranks=ranks)
    for r in records:
        acc.add(r)
    return acc.build(source_format=source_format, attrs=attrs)
