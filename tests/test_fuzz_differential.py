"""Differential fuzzing (issue #49): the C parser (the fast path) and the pure Python reference give the same dataset or
the same error on every mutated dump.

The mutations are :mod:`tests.test_fuzz_readers`' (truncation, byte flips, invalid UTF-8, deleted keys, swapped
types, deep nesting, duplicate keys, huge numbers, a BOM; construct.json / stack.json too). Each mutated dump is
opened twice in this process, with the C extension (the ``_craw`` fast path) and with
``PRECNB_PURE_PARSER=1``; both must raise the same :class:`~precnb.errors.PrecnbError` text, or both load, with
identical datasets (values, coordinates, attributes, load report). ``make test`` runs a short fixed-seed slice;
``make fuzz`` a long one with random seeds (``PRECNB_FUZZ_SCALE`` / ``PRECNB_FUZZ_RANDOM``).
``tools/fuzz_sanitized.sh`` (the same against an AddressSanitizer/UBSan build) runs in ``make fuzz``.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import precnb
from precnb.errors import PrecnbError
from precnb.io import _cext
from tests.test_fuzz_readers import (
    Workdir,
    fuzz_settings,
    msprobe_dump,
    mutate_rank_files,
    rank_folder,
    write_msprobe,
)

pytestmark = pytest.mark.skipif(_cext.CRAW is None,
                                reason="the C extension is not built (pip install -e . with a compiler)")


def _open(root, pure: bool) -> tuple[str, Any]:
    old = {k: os.environ.pop(k, None) for k in ("PRECNB_PURE_PARSER", "PRECNB_JSON_WHOLE")}
    if pure:
        os.environ["PRECNB_PURE_PARSER"] = "1"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "ok", precnb.open_run(root, format="msprobe", workers=1, progress=False)
    except PrecnbError as exc:
        return "error", f"{type(exc).__name__}: {exc}"
    finally:
        os.environ.pop("PRECNB_PURE_PARSER", None)
        os.environ.update({k: v for k, v in old.items() if v is not None})


def _same_dataset(a, b) -> None:
    assert a.sizes == b.sizes
    for name in sorted(set(a.variables) | set(b.variables)):
        x, y = a[name].values, b[name].values
        assert x.dtype == y.dtype, (name, x.dtype, y.dtype)
        if x.dtype.kind == "f":
            assert np.array_equal(x, y, equal_nan=True) and np.array_equal(np.signbit(x), np.signbit(y)), name
        else:
            assert np.array_equal(x, y), name
    attrs_a, attrs_b = dict(a.attrs), dict(b.attrs)
    assert attrs_a.keys() == attrs_b.keys()
    for k in attrs_a:
        va, vb = attrs_a[k], attrs_b[k]
        if isinstance(va, str) and isinstance(vb, str) and va != vb:
            va, vb = json.loads(va), json.loads(vb)  # the same JSON, written in another key order or spacing
        assert va == vb, k


@given(msprobe_dump(max_nodes=2), st.data())
@fuzz_settings(60)
def test_c_and_pure_paths_agree_on_mutated_dumps(spec, data):
    with Workdir() as tmp:
        root = tmp / "dump"
        write_msprobe(root, spec)
        for s, r in data.draw(st.permutations(sorted(spec["files"])))[:data.draw(st.integers(1, 2))]:
            mutate_rank_files(rank_folder(root, spec, s, r), spec["files"][s, r], spec["indent"], data)
        c_kind, c_out = _open(root, pure=False)
        p_kind, p_out = _open(root, pure=True)
        assert c_kind == p_kind, (c_out if c_kind == "error" else p_out)
        if c_kind == "error":
            assert c_out == p_out
        else:
            _same_dataset(c_out, p_out)
