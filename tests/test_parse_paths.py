"""The two parse paths give identical records: the C reader (``precnb/io/_craw.c``) against the pure Python reference.

``PRECNB_PURE_PARSER=1`` parses every batch with the standard library's ``json`` and reads every record with
:class:`precnb.io.msprobe.walk.Walk` and :class:`precnb.io.msprobe.nodes.NodeParts` in Python; without it the
C extension reads the records it fully understands straight from the batch's bytes and hands the others back.
Both must give identical FileRecords — labels, coordinates, values bit for bit (NaN, ±inf, -0.0), null masks,
strings, meta (warnings, unread, facts, scalar signatures, release facts) in the same order — with and without
scalar signatures, on every bundled dump, on generated and mutated dumps (hypothesis, the generators of
``tests/test_fuzz_readers.py``) and on hand-written edge records, through both parse paths (batch by batch, and
whole with ``PRECNB_JSON_WHOLE=1``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from precnb.errors import DumpFormatError
from precnb.io import _cext
from precnb.io.msprobe.discover import discover
from precnb.io.msprobe.parse import read_rank_dir
from tests._records_equal import records_differences
from tests.conftest import SAMPLES, SHARED
from tests.test_fuzz_readers import fuzz_settings, msprobe_dump, mutate_obj, write_msprobe

ROOT = Path(__file__).resolve().parents[1]
built = pytest.mark.skipif(_cext.CRAW is None, reason="precnb.io._craw is not built (no compiler at install)")
pytestmark = built


@contextlib.contextmanager
def env(**values: str | None):
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _read(folder: Path, pure: bool, whole: bool) -> Any:
    with env(PRECNB_PURE_PARSER="1" if pure else None, PRECNB_JSON_WHOLE="1" if whole else None):
        out = []
        for rd in discover(folder):
            for sigs in (True, False):
                try:
                    out.append(read_rank_dir(rd, signatures=sigs))
                except DumpFormatError as exc:
                    out.append(str(exc))
        return out


def assert_same(folder: Path) -> int:
    """Both walks on every rank folder below *folder*, both parse paths; the number of tensors compared."""
    n = 0
    for whole in (False, True):
        pure, fast = _read(folder, True, whole), _read(folder, False, whole)
        assert len(pure) == len(fast)
        for a, b in zip(pure, fast, strict=True):
            if isinstance(a, str) or isinstance(b, str):
                assert a == b
                continue
            records_differences(a, b)
            n += len(a.labels)
    return n


def _bundled() -> list[Path]:
    roots = [SAMPLES, ROOT / "tests" / "fixtures" / "msprobe_releases"]
    shared = SHARED / "data_samples" / "msprobe"  # (../shared: absent on some machines, then left out)
    if shared.is_dir():
        roots += [p for p in sorted(shared.iterdir()) if p.name.split("_")[0] in ("S1", "S5", "S6", "S13")]
    return sorted({p.parent for r in roots for p in r.rglob("dump.json")})


@pytest.mark.parametrize("folder", _bundled(), ids=lambda p: str(p.relative_to(p.parents[3])))
def test_bundled_dumps_same_records(folder):
    # a rank folder byte-identical to one compared before in this worker (same name, same files: many samples and
    # releases share rank files) is the same walk on the same bytes: its count is reused
    h = hashlib.sha256(folder.name.encode())
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode() + b"\0")
            h.update(p.read_bytes())
    key = h.hexdigest()
    if key not in _COMPARED:
        _COMPARED[key] = assert_same(folder)
    assert _COMPARED[key] > 0 or not json.loads(folder.joinpath("dump.json").read_text()).get("data")


#: digest of a rank folder (its name and files) -> the number of tensors both walks gave alike
_COMPARED: dict[str, int] = {}


def test_the_c_reader_is_taken(monkeypatch):
    """Without PRECNB_PURE_PARSER each C function reads (not a silent fallback), with signatures or without; with
    it none does."""
    calls: dict[str, int] = {}
    real = _cext.CRAW

    class Spy:
        def __getattr__(self, name):
            def counted(*args):
                calls[name] = calls.get(name, 0) + 1
                return getattr(real, name)(*args)
            return counted

    folder = SAMPLES / "dp_nan" / "step2" / "rank1"
    monkeypatch.setattr(_cext, "CRAW", Spy())
    for sigs in (True, False):
        calls.clear()
        with env(PRECNB_PURE_PARSER=None):
            read_rank_dir(discover(folder)[0], signatures=sigs)
        assert {"read_records", "parts_add"} <= set(calls), calls
    calls.clear()
    with env(PRECNB_PURE_PARSER="1"):
        read_rank_dir(discover(folder)[0])
    assert not calls


LEAF = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": 1.5, "Min": -0.0, "Mean": None,
        "Norm": float("nan")}
INF_LEAF = {"type": "torch.Tensor", "dtype": "torch.bfloat16", "shape": [], "Max": float("inf"),
            "Min": float("-inf"), "Mean": 1, "Norm": True}
SCALAR = {"type": "int", "value": 3}

#: records at the edges of what the C walk reads (or hands back): each must read as the reference reads it
EDGE_RECORDS: dict[str, Any] = {
    "Functional.linear.0.forward": {"input_args": [LEAF, SCALAR, None, 3, "s", [LEAF, [LEAF]]],
                                    "input_kwargs": {"w": LEAF, "t": [LEAF, None], "n": None}, "output": [LEAF]},
    "Functional.nested.0.forward": {"input_args": [[[LEAF]]], "output": [{"a": {"b": LEAF}}]},
    "Functional.section_leaf.0.forward": {"input_args": LEAF, "output": {"type": None, "x": LEAF}},
    "Functional.typed_section.0.forward": {"input_args": {"type": "int", "value": 1}, "output": {"shape": [1]}},
    "Functional.tensor_like.0.forward": {"input_args": [{"type": "torch.Tensor", "shape": [1]}], "output": [LEAF]},
    "Functional.unknown.0.forward": {"input_args": [LEAF], "extra": [LEAF], "is_recompute": False},
    "Functional.flags.0.forward": {"input_args": [LEAF], "is_nan": True, "empty": {}, "also": []},
    "Functional.bad_section.0.forward": {"input_args": 3, "output": [LEAF]},
    "Functional.none_section.0.forward": {"input_args": None, "output": [INF_LEAF]},
    "Functional.long.0.forward": {"input_args": [LEAF] * 300},
    "Functional.non_tensor.0.forward": {"input_args": [{"type": "torch.Size", "dtype": "x", "shape": []}, LEAF]},
    "Functional.scalar_like.0.forward": {"input_args": [{"value": 1, "x": 2}, {"type": [1], "value": 2}]},
    "Tensor.ünïcode.0.forward": {"input_args": [LEAF]},
    "Tensor.new\nline.0.forward": {"input_args": [LEAF]},
    "Tensor.huge.12345678901234567890.forward": {"input_args": [LEAF]},
    "Module.a.b.Linear.forward.0": {"input_args": [LEAF], "parameters": {"weight": dict(LEAF, requires_grad=True)}},
    "Cell.x.Dense.backward.3": {"input": [INF_LEAF], "output": [LEAF]},
    "Module.Linear.forward.1": {"output": [LEAF]},
    "Module..forward.1": {"output": [LEAF]},
    "Module.a.b.Linear.parameters_grad": {"weight": [LEAF], "bias": LEAF, "none": None},
    "Module.a.b.Linear.parameters_grad.2": {"weight": [LEAF, LEAF]},
    "Module.c.Linear.parameters_grad.3": {"weight": 3},
    "Cell.Dense.parameters_grad.007": {"weight": [LEAF]},
    "Module.parameters_grad": {"weight": [LEAF]},
    "Module.a.parameters_grad.x.parameters_grad.3": {"weight": [LEAF]},
    "Module.b.Linear.parameters_grad.12345678901234567890": {"weight": [LEAF]},
    "Functional.parameters_grad.0.forward": {"input_args": [LEAF]},
    "Distributed.all_reduce.0.forward": {"input_args": [LEAF, {"type": "torch.ProcessGroup", "group_ranks": [0, 1]}]},
    "Torch._fused_adamw_.0.forward": {"input_args": [[LEAF]], "input_kwargs": {"lr": {"type": "float", "value": 0.1}}},
    "Tensor.addcdiv_.0.forward": {"input_args": [LEAF], "input_kwargs": {"value": {"type": "float", "value": -0.1}}},
    "Functional.relu.0.backward": {"grad_input": [LEAF], "grad_output": [LEAF]},
    "Functional.null.0.forward": None,
    "Functional.list.0.forward": [LEAF],
    "debug_tensor": LEAF,
    "Functional.md5.0.forward": {"input_args": [dict(LEAF, md5="abc", data_name="x.pt")]},
    "Functional.null_md5.0.forward": {"input_args": [dict(LEAF, md5=None, data_name="y.pt"), dict(LEAF, md5=None)]},
    "Functional.bad_md5.0.forward": {"input_args": [dict(LEAF, md5=3), dict(LEAF, data_name="../x")]},
    "Functional.odd_stats.0.forward": {"output": [dict(LEAF, Max="-Infinity", Min="null", Mean=[1], Norm=10**400)]},
    "Functional.odd_shape.0.forward": {"output": [dict(LEAF, shape=[True, -1]), dict(LEAF, dtype=3)]},
}


#: construct.json parents of every spelling (their module paths are read in C or, for the others, in Python)
PARENTS = ["Module.a.b.Linear.forward.0", "Cell.x.Dense.backward.3", "Module.Linear.forward.1",
           "Functional.relu.0.forward", "Module.a.b.Linear.parameters_grad", "Module.ü.Linear.forward.0", "optimizer",
           "clip_grad", "", "Cell.Dense.parameters_grad.007", "Module.parameters_grad", "Module.a.parameters_grad.x",
           "Module..forward.1", "Module.a.Linear.forward.x", "Tensor.add.99999999999999999999.forward", "Module"]


def _write(root: Path, data: dict[str, Any], indent: int | None, construct: dict[str, Any] | None) -> Path:
    d = root / "step0" / "rank0"
    d.mkdir(parents=True)
    doc = {"task": "statistics", "level": "mix", "framework": "pytorch", "data": data}
    (d / "dump.json").write_text(json.dumps(doc, indent=indent))
    if construct is not None:
        (d / "construct.json").write_text(json.dumps(construct))
    return root


@pytest.mark.parametrize("indent", [None, 1])
@pytest.mark.parametrize("construct", [False, True])
def test_edge_records_same_records(tmp_path, indent, construct):
    parents = {n: ("optimizer" if "adamw" in n else PARENTS[i % len(PARENTS)]) for i, n in enumerate(EDGE_RECORDS)}
    root = _write(tmp_path, EDGE_RECORDS, indent, parents if construct else None)
    assert assert_same(root) > 300


@pytest.mark.parametrize("name", sorted(EDGE_RECORDS))
def test_each_edge_record_alone(tmp_path, name):
    """One record after a plain one (the C walk's hand-back and resume at that position)."""
    data = {"Functional.plain.0.forward": {"input_args": [LEAF], "output": [LEAF]}, name: EDGE_RECORDS[name],
            "Functional.plain.1.forward": {"output": [LEAF]}}
    assert assert_same(_write(tmp_path, data, 1, None)) >= 4  # the plain records' tensors at least


@fuzz_settings(40)
@given(spec=msprobe_dump(max_nodes=6))
def test_generated_dumps_same_records(spec):
    with tempfile.TemporaryDirectory(prefix="precnb-paths-") as tmp:
        write_msprobe(Path(tmp), spec)
        assert_same(Path(tmp))


@fuzz_settings(40)
@given(spec=msprobe_dump(max_nodes=5), data=st.data())
def test_mutated_dumps_same_records(spec, data):
    key = next(iter(spec["files"]))
    spec["files"] = {key: mutate_obj(spec["files"][key], data)}
    if not isinstance(spec["files"][key], dict) or not isinstance(spec["files"][key].get("data"), dict):
        return  # not a dump the walk reads (the parse refuses it the same way on both paths)
    with tempfile.TemporaryDirectory(prefix="precnb-paths-") as tmp:
        write_msprobe(Path(tmp), spec)
        assert_same(Path(tmp))
