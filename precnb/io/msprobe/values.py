"""The value rules of msprobe tensor leaves, applied a column at a time.

A leaf is one JSON object (``type``, ``dtype``, ``shape``, ``Max``, ``Min``, ``Mean``, ``Norm``
and optionally ``md5``, ``data_name``). :class:`Columns` turns a batch of leaves into numpy
columns with one C-level pass per field for the common case (statistics that numpy converts as
the rules below do — numbers, booleans, nulls, numeric strings —, shapes of ints seen before,
strings where strings belong) and applies the exact rules element by element only where that
pass refuses:

- a statistic that is a number, a boolean, null or a numeric string (``"nan"``, ``"1e400"``,
  the quoted ``"-Infinity"`` of a bare token) is read by :func:`precnb.io._assemble.stat_value`;
  anything else is null and reported (kind ``stat``);
- a shape that is not a list of non-negative integers with fewer than 2**62 elements gives
  ``numel == -1`` and ``shape == ""`` (reported, ``shape``);
- a dtype, md5 or data_name that is not a string is ignored (reported, ``field``); a
  ``data_name`` that would leave ``dump_tensor_data/`` is kept but reported (``data_name``).

Problems are counted per kind and reported with the first example in file order
(:class:`Issues`).

Examples
--------
>>> cols = Columns()
>>> leaf = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3],
...         "Max": 1.0, "Min": "-Infinity", "Mean": None, "Norm": 2.0}
>>> cols.add_batch([leaf], ["x.output.0"], Issues())
>>> out = cols.finish()
>>> out["min"].tolist(), out["null"].tolist(), out["shape"].tolist(), out["numel"].tolist()
([-inf], [4], ['[2, 3]'], [6])
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np

from precnb.io.msprobe._textcol import TextColumn, _join
from precnb.io.records import _shape_text, stat_value

__all__ = ["MAX_COUNTER", "Columns", "Issues", "TextColumn", "short", "unsafe_data_name", "valid_shape"]


MAX_COUNTER = 2**62  # call counters, micro steps, numel
_STAT_KEYS = (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "Norm"))
_FIELDS = operator.itemgetter("Max", "Min", "Mean", "Norm", "shape", "dtype")
_NAN = float("nan")
_STR_OR_NONE = frozenset({str, type(None)})
_INT_ONLY = frozenset({int})
_LIST_ONLY = frozenset({list})
_SHAPES: dict[tuple[int, ...], tuple[str, int]] = {}  # per process: valid shape -> (text, numel)
_BAD_SHAPES: set[tuple[int, ...]] = set()  # per process: shapes of ints that are not valid
_SAFE_NAMES: set[str] = set()
_TEXT, _NUMEL = operator.itemgetter(0), operator.itemgetter(1)

_MESSAGES = {
    "stat": "statistic(s) neither a number nor null; loaded as null",
    "shape": "tensor(s) whose shape is not a list of non-negative integers; numel unknown",
    "field": "dtype/md5/data_name value(s) that are not strings; ignored",
    "record": "node record(s) that are not JSON objects; skipped",
    "data_name": "data_name(s) pointing outside dump_tensor_data; precnb.load_tensor refuses them",
    "top": "top-level task/level/framework value(s) that are not strings; ignored",
}


def short(v: Any, n: int = 40) -> str:
    """``repr(v)`` cut to *n* characters, for messages.

    Examples
    --------
    >>> short("x" * 50, 10)
    "'xxxxxx..."
    """
    text = repr(v)
    return text if len(text) <= n else text[: n - 3] + "..."


class Issues:
    """Problems met in one file, counted per kind and reported with the first example in file order.

    Each problem carries its position (leaf number, field number) so that problems found a
    column at a time are reported as if the file had been read leaf by leaf.
    """

    def __init__(self) -> None:
        self._found: list[tuple[tuple[int, int], str, str]] = []

    def add(self, where: tuple[int, int], kind: str, example: str) -> None:
        """Record one problem at *where* (``(leaf index, field order)``)."""
        self._found.append((where, kind, example))

    def messages(self, path: str | Path) -> list[str]:
        """One line per kind: ``"{path}: {count} {what} (first: {example})"``."""
        counts: dict[str, int] = {}
        first: dict[str, str] = {}
        for _, kind, example in sorted(self._found, key=lambda f: f[0]):
            counts[kind] = counts.get(kind, 0) + 1
            first.setdefault(kind, example)
        return [f"{path}: {n} {_MESSAGES[k]} (first: {first[k]})" for k, n in counts.items()]


def valid_shape(shape: Any) -> list[int] | None:
    """*shape* when it is a list of non-negative ints with fewer than 2**62 elements, else None.

    Examples
    --------
    >>> valid_shape([2, 3]), valid_shape([2, -1]), valid_shape([True]), valid_shape("2")
    ([2, 3], None, None, None)
    """
    if not isinstance(shape, list):
        return None
    n = 1
    for d in shape:
        if d.__class__ is not int or d < 0 or d > MAX_COUNTER:
            return None
        n *= d
    return shape if n < MAX_COUNTER else None


def unsafe_data_name(name: str) -> bool:
    """Whether a data_name would resolve outside ``dump_tensor_data/``.

    Examples
    --------
    >>> unsafe_data_name("Functional.linear.0.forward.output.0.pt"), unsafe_data_name("../../etc/passwd")
    (False, True)
    """
    if "\x00" in name or not name.strip():
        return True
    posix = PurePosixPath(name.replace("\\", "/"))
    return posix.is_absolute() or ".." in posix.parts or bool(PureWindowsPath(name).drive)


def _shape_info(key: tuple[int, ...]) -> tuple[str, int] | None:
    hit = _SHAPES.get(key)
    if hit is not None or key in _BAD_SHAPES:
        return hit
    valid = valid_shape(list(key))
    if valid is None:
        if len(_BAD_SHAPES) > 100_000:
            _BAD_SHAPES.clear()
        _BAD_SHAPES.add(key)
        return None
    if len(_SHAPES) > 100_000:
        _SHAPES.clear()
    hit = _SHAPES[key] = (_shape_text(valid), int(np.prod(valid, dtype=object)))
    return hit


class Columns:
    """Accumulate the columns of a file's tensor leaves, batch by batch."""

    def __init__(self) -> None:
        self.n = 0
        self._stats: dict[str, list[np.ndarray]] = {k: [] for k, _ in _STAT_KEYS}
        self._null: list[np.ndarray] = []
        self._numel: list[np.ndarray] = []
        self.shape = TextColumn()
        self.dtype = TextColumn()
        self.crc: list[str | None] = []
        self.data_name: list[str] = []
        self.any_crc = False  # crc holds one entry per leaf only then
        self.any_data_name = False
        self._names_from: int | None = None  # data_name holds one entry per leaf once a leaf had the key
        self.leaf_type = ""
        self._interned: dict[str, str] = {}

    def add_batch(self, leaves: Sequence[dict[str, Any]], labels: Sequence[str], issues: Issues) -> None:
        """Read the fields of *leaves* (labels aligned, numbered from ``self.n`` on)."""
        n = len(leaves)
        if not n:
            return
        try:  # one pass over the leaves for the six fields every leaf has
            cols: list[Sequence[Any]] = list(zip(*map(_FIELDS, leaves), strict=True))
        except KeyError:
            get = dict.get
            keys = (*(k for _, k in _STAT_KEYS), "shape", "dtype")
            cols = [list(map(get, leaves, itertools.repeat(k))) for k in keys]
        null = np.zeros(n, np.uint8)
        for bit, (name, key) in enumerate(_STAT_KEYS):
            self._stats[name].append(self._stat_column(cols[bit], bit, key, null, labels, issues))
        self._null.append(null)
        self._shapes(cols[4], labels, issues)
        self._strings(leaves, cols[5], labels, issues)
        self._leaf_type(leaves)
        self.n += n

    def add_raw(self, got: tuple[Any, ...], shapes: list[str], dtypes: list[str]) -> None:
        """The columns of leaves :mod:`precnb.io._craw` read (*got*: its result).

        *shapes*, *dtypes*: the distinct texts its codes ``got[10]``, ``got[11]`` index.
        """
        n = len(got[4]) // 8  # (numel: an int64 per leaf)
        if not n:
            return
        table = np.frombuffer(got[2], np.float64).reshape(4, n)
        for bit, (name, _) in enumerate(_STAT_KEYS):
            self._stats[name].append(table[bit])
        self._null.append(np.frombuffer(got[3], np.uint8))
        self._numel.append(np.frombuffer(got[4], np.int64))
        self.shape.extend_coded(got[10], shapes)
        self.dtype.extend_coded(got[11], dtypes)
        if self.any_crc:  # what _strings pads for leaves without these keys
            self.crc += itertools.repeat(None, n)
        if self._names_from is not None:
            self.data_name += itertools.repeat("", n)
        if not self.leaf_type and got[7] is not None:
            self.leaf_type = got[7]
        self.n += n

    def _leaf_type(self, leaves: Sequence[dict[str, Any]]) -> None:
        if not self.leaf_type:
            for v in leaves:
                t = v["type"]
                if t.startswith(("torch", "mindspore", "mindtorch")):
                    self.leaf_type = t
                    break

    def _stat_column(self, col: Sequence[Any], bit: int, key: str, null: np.ndarray, labels: Sequence[str],
                     issues: Issues) -> np.ndarray:
        """float64 statistics: one numpy conversion, or the exact rules value by value when it refuses.

        numpy converts numbers, booleans and numeric strings as :func:`stat_value` does (it calls
        ``float()``: ``"-Infinity"``, ``"1e400"``, ``"nan"``) and nulls to NaN; only the NaN
        results are looked at again, to mark the nulls among them. Anything ``stat_value`` reads as
        null or refuses (``"null"``, ``""``, lists, objects) and ints beyond the float range make
        numpy raise: the column then goes through ``stat_value`` element by element.
        """
        try:
            out = np.array(col, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            out = None
        if out is not None and out.ndim == 1:
            nan = np.flatnonzero(out != out)
            if len(nan):
                mark = 1 << bit
                for i in nan.tolist():
                    if col[i] is None:
                        null[i] |= mark
            return out
        odd = np.flatnonzero(~np.fromiter(map(isinstance, col, itertools.repeat(float)), bool, len(col)))
        fixed = list(col)
        for i in odd.tolist():
            v = col[i]
            try:
                f = stat_value(v)
            except TypeError:
                f = None
                issues.add((self.n + i, bit), "stat", f"{labels[i]} {key}={short(v)}")
            if f is None:
                fixed[i] = _NAN
                null[i] |= 1 << bit
            else:
                fixed[i] = f
        return np.array(fixed, dtype=np.float64)

    def _shapes(self, col: Sequence[Any], labels: Sequence[str], issues: Issues) -> None:
        n = len(col)
        infos: list[Any]
        if set(map(type, col)) <= _LIST_ONLY and set(map(type, itertools.chain.from_iterable(col))) <= _INT_ONLY:
            keys = list(map(tuple, col))  # every element an int (bools excluded): the tuple is the shape
            try:  # shapes seen before (the usual case once a file is under way): no scan for misses
                infos = list(map(_SHAPES.__getitem__, keys))
            except KeyError:
                infos = list(map(_shape_info, keys))
            else:
                self.shape.extend(list(map(_TEXT, infos)))
                self._numel.append(np.fromiter(map(_NUMEL, infos), np.int64, n))
                return
            if None not in infos:
                self.shape.extend(list(map(_TEXT, infos)))
                self._numel.append(np.fromiter(map(_NUMEL, infos), np.int64, n))
                return
        else:
            infos = []
            for shape in col:
                valid = valid_shape(shape)
                infos.append(None if valid is None else _shape_info(tuple(valid)))
        numel = np.empty(n, np.int64)
        base = self.n
        texts: list[str] = []
        for i, info in enumerate(infos):
            if info is None:
                issues.add((base + i, 4), "shape", f"{labels[i]} shape={short(col[i])}")
                texts.append("")
                numel[i] = -1
            else:
                texts.append(info[0])
                numel[i] = info[1]
        self.shape.extend(texts)
        self._numel.append(numel)

    def _strings(self, leaves: Sequence[dict[str, Any]], dtype_col: Sequence[Any], labels: Sequence[str],  # noqa: C901
                 issues: Issues) -> None:
        get = dict.get
        base = self.n
        intern = self._interned
        known = len(intern)
        try:  # one pass: the strings are checked as they enter the (small) table of distinct dtypes
            got: list[str] | None = list(map(intern.setdefault, dtype_col, dtype_col))
        except TypeError:  # an unhashable value (a list, an object)
            got = None
        if got is not None and len(intern) > known and any(
                k.__class__ is not str for k in itertools.islice(intern, known, None)):
            got = None
        if got is None:
            for k in [k for k in intern if k.__class__ is not str]:
                del intern[k]
            dtypes = list(dtype_col)
            for i, d in enumerate(dtypes):
                if d.__class__ is not str:
                    if d is not None:
                        issues.add((base + i, 5), "field", f"{labels[i]} dtype={short(d)}")
                    dtypes[i] = ""
            got = list(map(intern.setdefault, dtypes, dtypes))
        self.dtype.extend(got)
        n = len(leaves)
        # md5 and data_name: kept only once a leaf has one (earlier leaves then padded), none otherwise
        crcs = list(map(get, leaves, itertools.repeat("md5")))
        if crcs.count(None) != n:
            if not self.any_crc:
                self.crc = [None] * base
            self.any_crc = True
            if not set(map(type, crcs)) <= _STR_OR_NONE:
                for i, c in enumerate(crcs):
                    if c is not None and c.__class__ is not str:
                        issues.add((base + i, 6), "field", f"{labels[i]} md5={short(c)}")
                        crcs[i] = ""
        if self.any_crc:
            self.crc += crcs
        names: list[Any] = list(map(get, leaves, itertools.repeat("data_name")))
        if names.count(None) == n:
            if self._names_from is not None:
                self.data_name += itertools.repeat("", n)
            return
        if self._names_from is None:
            self._names_from = base
            self.data_name = [""] * base
        for i, dn in enumerate(names):
            if dn is None:
                names[i] = ""
            elif dn.__class__ is not str:
                issues.add((base + i, 7), "field", f"{labels[i]} data_name={short(dn)}")
                names[i] = ""
            elif dn:
                self.any_data_name = True
                if dn not in _SAFE_NAMES:
                    if unsafe_data_name(dn):
                        issues.add((base + i, 8), "data_name", f"{labels[i]} data_name={short(dn, 80)}")
                        continue
                    if len(_SAFE_NAMES) > 100_000:
                        _SAFE_NAMES.clear()
                    _SAFE_NAMES.add(dn)
        self.data_name += names

    def finish(self) -> dict[str, Any]:
        """The columns: ``max``/``min``/``mean``/``norm`` (float64), ``null``, ``numel``, ``shape`` and ``dtype`` (str).

        Each batch's arrays are let go as their column is joined (one column's parts at a time are
        held twice, not the file's). Called once.
        """
        out: dict[str, Any] = {}
        for name, parts in self._stats.items():
            out[name] = _join(parts, np.float64)
        out["null"] = _join(self._null, np.uint8)
        out["numel"] = _join(self._numel, np.int64)
        out["shape"], out["dtype"] = self.shape.array(), self.dtype.array()
        self.shape, self.dtype = TextColumn(), TextColumn()
        return out
