"""Exact comparison of two :class:`~precnb.io.records.FileRecords` (values bit for bit, NaN and ±inf included)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np


def _array_same(a: Any, b: Any, what: str) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    if a.dtype.kind == "f":  # bit for bit: NaN payloads, -0.0 and ±inf included
        at = np.flatnonzero(a.view(np.uint64) != b.view(np.uint64))[:3]
        assert a.tobytes() == b.tobytes(), f"{what}: first differences at {at}"
    else:
        assert a.tolist() == b.tolist(), f"{what}: differs"


def records_differences(a: Any, b: Any) -> None:
    """Raise AssertionError naming the first field in which *a* and *b* differ."""
    assert (a.step, a.rank) == (b.step, b.rank)
    assert a.labels == b.labels, "labels differ"
    assert a.coords.keys() == b.coords.keys(), "coordinate names differ"
    for k in a.coords:
        _array_same(a.coords[k], b.coords[k], f"coord {k}")
    assert a.values.keys() == b.values.keys()
    for k in a.values:
        _array_same(a.values[k], b.values[k], f"values {k}")
    _array_same(a.null_stats, b.null_stats, "null_stats")
    _array_same(a.seq, b.seq, "seq")
    _array_same(a.numel, b.numel, "numel")
    assert a.strings == b.strings, "strings differ"
    # meta compared as JSON text, key order included (the facts become JSON attributes)
    assert json.dumps(a.meta, default=repr) == json.dumps(b.meta, default=repr), "meta differs"
    assert a.unique_labels == b.unique_labels
