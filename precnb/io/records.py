"""What every reader produces per source file: :class:`FileRecords` (plain numpy columns) and its helpers.

A reader turns one (step, rank) source into a :class:`FileRecords`, cheap to pickle between
worker processes, and hands the records to :class:`precnb.io._assemble.Assembler`, which aligns
them on the union of tensor labels. :class:`RecordBuilder` builds one tensor at a time (small
formats); a fast reader may fill the columns itself (numpy arrays instead of lists). Side tables
shared by many files (construct.json, stack.json) travel as :class:`SharedTable` and are parsed
once per distinct content.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from precnb.schema import STATS, TENSOR_COORDS

__all__ = ["FileRecords", "LoadReport", "RecordBuilder", "SharedTable", "dedup_labels", "stat_value"]

_INT_COORDS = {k for k, v in TENSOR_COORDS.items() if v is not str}


class SharedTable:
    """A side table many files share (node → value), sent as raw bytes and parsed once per distinct content.

    Parameters
    ----------
    key : hashable
        Identifies the content (e.g. ``("stack", digest)``): equal keys are parsed once.
    raw : bytes or None
        None when *value* is given and the bytes need not be kept (pickling then sends *value*'s
        JSON text, which *parse* must read as the same table).
    parse : callable
        A module-level function ``bytes -> dict`` (it is pickled to worker processes).
    value : dict, optional
        Already parsed (kept in this process, never pickled).

    Examples
    --------
    >>> t = SharedTable(("t", 1), b'{"a": 1}', json.loads)
    >>> t.get()
    {'a': 1}
    """

    __slots__ = ("key", "parse", "raw", "value")

    def __init__(self, key: Hashable, raw: bytes | None, parse: Callable[[bytes], dict[str, Any]],
                 value: dict[str, Any] | None = None) -> None:
        self.key, self.raw, self.parse, self.value = key, raw, parse, value

    def get(self) -> dict[str, Any]:
        """The parsed table."""
        if self.value is None:
            if self.raw is None:  # its bytes are freed only once it is parsed
                raise RuntimeError(f"the table {self.key!r} holds neither its bytes nor its value")
            self.value = self.parse(self.raw)
        return self.value

    def __reduce__(self) -> tuple[Any, ...]:
        raw = self.raw
        if raw is None:  # kept parsed only (its bytes let go): the table's own JSON text, which parses the same
            from precnb.schema import side_text
            raw = side_text(self.get()).encode("utf-8", "surrogatepass")
        return (SharedTable, (self.key, raw, self.parse))


def distinct(labels: Sequence[str], hashes: np.ndarray | None = None) -> bool:
    """Whether *labels* are all different, without building a table of them.

    Their hashes are sorted and compared (a C-level pass, several times cheaper than a set or a
    dict of millions of fresh strings); the strings themselves are compared only when two hashes
    agree. *hashes*: the labels' ``hash()`` values when the caller has them (taken while the
    strings were fresh in the processor's caches); they are sorted in place.

    Examples
    --------
    >>> distinct(["a", "b", "c"]), distinct(["a", "b", "a"]), distinct([])
    (True, False, True)
    """
    n = len(labels)
    if n < 2:
        return True
    if hashes is None or len(hashes) != n:
        hashes = np.fromiter(map(hash, labels), np.int64, n)
    if not hashes_repeat(hashes):
        return True
    return len(set(labels)) == n


def hashes_repeat(hashes: np.ndarray) -> bool:
    """Whether two of *hashes* (int64, sorted here in place) are equal: the cheap half of a distinctness test.

    Examples
    --------
    >>> hashes_repeat(np.array([3, 1, 2])), hashes_repeat(np.array([3, 1, 3]))
    (False, True)
    """
    hashes.sort()
    return bool((hashes[1:] == hashes[:-1]).any())


def dedup_labels(labels: Sequence[str]) -> list[str]:
    """Rename repeated labels as ``label#dupN`` (N: the labels so far that start with it), keeping the first.

    Examples
    --------
    >>> dedup_labels(["a", "b", "a", "a"])
    ['a', 'b', 'a#dup1', 'a#dup2']
    """
    out: list[str] = []
    seen: set[str] = set()
    for label in labels:
        if label in seen:
            label = f"{label}#dup{sum(lbl.startswith(label) for lbl in out)}"
        seen.add(label)
        out.append(label)
    return out


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
    unread : list of (str, str, str, str)
        ``(file, record, where, why)`` for every section or tensor leaf of a readable file that
        could not be read (a section that is not a list or an object, an object with tensor fields
        but no ``type``/``dtype``/``shape``); *where* is the record key or the tensor's label
        inside the record (``input.0``), ``""`` for the whole record. At most a thousand per file.
    unread_count : int
        How many there were (all of them).
    """

    read: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unread: list[tuple[str, str, str, str]] = field(default_factory=list)
    unread_count: int = 0

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
            "unread": [{"file": f, "record": r, "where": w, "why": y} for f, r, w, y in self.unread],
            "unread_count": self.unread_count,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoadReport:
        """The report :meth:`to_dict` wrote (older dicts without ``unread`` too)."""
        rep = cls(read=list(d.get("read", [])), skipped=[(s["path"], s["reason"]) for s in d.get("skipped", [])],
                  warnings=list(d.get("warnings", [])))
        rep.unread = [(u["file"], u["record"], u["where"], u["why"]) for u in d.get("unread", [])]
        rep.unread_count = int(d.get("unread_count", len(rep.unread)))
        return rep

    def merge(self, other: LoadReport) -> None:
        """Add *other*'s entries to this report."""
        self.read.extend(other.read)
        self.skipped.extend(other.skipped)
        self.warnings.extend(other.warnings)
        self.unread.extend(other.unread)
        self.unread_count += other.unread_count

    def summary(self) -> str:
        """One paragraph, for the CLI."""
        lines = [f"read {len(self.read)} file(s), skipped {len(self.skipped)}"]
        lines += [f"  skipped {p}: {r}" for p, r in self.skipped]
        lines += [f"  warning: {w}" for w in self.warnings]
        if self.unread_count:
            lines.append(f"  not read: {self.unread_count} section(s) or leaf(s)")
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
        A coordinate may also be a 1-d ndarray (object for strings, int64 for integers); it
        then holds the final values (a list is converted: ``None`` → ``-1`` / ``""``).
    null_stats, seq, numel : ndarray
    strings : dict of str to list of str
        Optional string variables aligned with *labels* (``crc``, ``data_name``).
    construct, stacks : dict or SharedTable
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
    construct: dict[str, str] | SharedTable = field(default_factory=dict)
    stacks: dict[str, list[str]] | SharedTable = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    #: the reader checked that the labels are all different (:func:`distinct`): the assembler of a
    #: single record then never builds a label table
    unique_labels: bool = field(default=False, repr=False, compare=False)


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
