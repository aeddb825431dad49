"""Property-based fuzzing of the readers with generated and mutated inputs (hypothesis).

Valid inputs: msprobe dump.json trees (1-3 ranks x 1-2 steps; API / module / backward /
parameters_grad nodes; tensor leaves with finite, NaN, ±inf, null, bool, int and out-of-float
-range statistics; non-tensor leaves), monitor v1 CSVs and MindSpore statistic.csv files. Every
value loaded must equal the generated one exactly (sign of zero, NaN and ±inf included) and
``present`` must be True exactly where a tensor was written.

Mutated inputs (truncation at a random byte, byte flips, invalid UTF-8, deleted keys, swapped
types, deep nesting, duplicate keys, garbage cells): ``open_run`` either returns a dataset that
passes :func:`precnb.schema.validate` in which every rank folder written is loaded or listed
among the load report's failures (no silently dropped rank), or raises a
:class:`~precnb.errors.PrecnbError`. Any other exception is a crash.

The numbers of inputs tried, crashes and dropped ranks are printed at the end of the module and
written to ``test-output/fuzz_summary.json``. Settings are derandomized (CI-stable) and write
nothing outside temporary folders (no example database). ``make test`` runs the CI budget;
``make fuzz`` multiplies it (``PRECNB_FUZZ_SCALE``, default 25 there) with random seeds
(``PRECNB_FUZZ_RANDOM=1``; a failure prints its reproduction blob).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import json
import math
import os
import shutil
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import precnb
from precnb.errors import DumpFormatError, PrecnbError
from precnb.io._csvutil import parse_float, parse_shape
from precnb.io._jsonio import loads_json
from precnb.io.api import load_report
from precnb.schema import validate

ROOT = Path(__file__).resolve().parents[1]
SUMMARY_FILE = ROOT / "test-output" / "fuzz_summary.json"

NAN, INF = math.nan, math.inf
ABSENT = object()  # a statistic key left out of the leaf


#: ``make test`` runs the CI budget (scale 1); ``make fuzz`` a long one (PRECNB_FUZZ_SCALE=25, random seeds)
FUZZ_SCALE = float(os.environ.get("PRECNB_FUZZ_SCALE", "1") or 1)
FUZZ_RANDOM = os.environ.get("PRECNB_FUZZ_RANDOM", "") not in ("", "0")


def fuzz_settings(n: int) -> settings:
    return settings(max_examples=max(1, int(n * FUZZ_SCALE)), deadline=None, derandomize=not FUZZ_RANDOM,
                    database=None, print_blob=FUZZ_RANDOM,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much, HealthCheck.large_base_example])


# --------------------------------------------------------------------------- tally / summary

TALLY: dict[str, dict[str, int]] = defaultdict(lambda: {"tried": 0, "loaded": 0, "refused": 0,
                                                        "crashes": 0, "dropped": 0})
_T0 = time.perf_counter()


@pytest.fixture(scope="module", autouse=True)
def _fuzz_summary(request):
    yield
    total = {k: sum(t[k] for t in TALLY.values()) for k in ("tried", "loaded", "refused", "crashes", "dropped")}
    summary = {**total, "seconds": round(time.perf_counter() - _T0, 1),
               "by_test": {k: dict(v) for k, v in sorted(TALLY.items())}}
    SUMMARY_FILE.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY_FILE.write_text(json.dumps(summary, indent=2) + "\n")
    line = (f"fuzz: {total['tried']} inputs tried, {total['crashes']} crashes, {total['dropped']} dropped ranks "
            f"({total['loaded']} loaded, {total['refused']} refused with PrecnbError) -> {SUMMARY_FILE}")
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        with capman.global_and_fixture_disabled():
            print(f"\n{line}")
    else:
        print(line)


class Workdir:
    """A fresh temporary folder per example (hypothesis runs many examples per test)."""

    def __enter__(self) -> Path:
        self.path = Path(tempfile.mkdtemp(prefix="precnb-fuzz-"))
        return self.path

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


@contextlib.contextmanager
def msprobe_parser(reference: bool):
    """Parse dump.json files whole (else batch by batch, the default) for this example."""
    old = os.environ.pop("PRECNB_JSON_WHOLE", None)
    if reference:
        os.environ["PRECNB_JSON_WHOLE"] = "1"
    try:
        yield
    finally:
        os.environ.pop("PRECNB_JSON_WHOLE", None)
        if old is not None:
            os.environ["PRECNB_JSON_WHOLE"] = old


def _quiet_open(path: Path, **kw: Any):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return precnb.open_run(path, **kw)


def check_open(key: str, root: Path, rank_dirs: dict[Path, int], *, fmt: str,
               per_file_has_data: Any = None):
    """Open *root*; count a crash on any non-PrecnbError and a drop for any rank folder not accounted for.

    *rank_dirs* maps every rank folder written to its rank. *per_file_has_data(folder)* says
    whether a folder holds at least one tensor (used when a rank has no present record and no
    failure: then it must really be empty).
    """
    t = TALLY[key]
    t["tried"] += 1
    try:
        ds = _quiet_open(root, format=fmt)
    except PrecnbError:
        t["refused"] += 1
        return None
    except BaseException:
        t["crashes"] += 1
        raise
    t["loaded"] += 1
    validate(ds)
    rep = load_report(ds)
    ranks = [int(r) for r in ds["rank"].values]
    present_by_rank = ds["present"].values.any(axis=(0, 2)) if ds.sizes["tensor"] else np.zeros(len(ranks), bool)
    failed = {rank for p, _ in rep.failures for folder, rank in rank_dirs.items()
              if Path(p.split(";")[0].split(" (step")[0]).is_relative_to(folder)}
    dropped = []
    for folder, rank in rank_dirs.items():
        if rank in failed:
            continue
        if rank not in ranks:
            dropped.append(folder)
        elif not present_by_rank[ranks.index(rank)] and per_file_has_data is not None and per_file_has_data(folder):
            dropped.append(folder)  # in the coordinate, but silently empty
    if dropped:
        t["dropped"] += len(dropped)
    assert not dropped, (dropped, rep.to_dict())
    return ds


def same(got: float, want: float) -> bool:
    """Exact equality: NaN matches NaN, and the sign of zero counts."""
    if math.isnan(want):
        return math.isnan(got)
    return got == want and math.copysign(1.0, got) == math.copysign(1.0, want)


def expected_float(v: Any) -> tuple[float, bool]:
    """(value, is_null) that the schema promises for a JSON statistic."""
    if v is None or v is ABSENT:
        return NAN, True
    if isinstance(v, bool):
        return float(v), False
    if isinstance(v, int):
        try:
            return float(v), False
        except OverflowError:
            return (INF if v > 0 else -INF), False
    return float(v), False


# --------------------------------------------------------------------------- msprobe generator

NON_TENSOR = {"slice", "ellipsis", "torch.Size", "torch.dtype", "torch.device", "mindspore.dtype"}
STATS = (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "Norm"))
NULL_BIT = {"max": 1, "min": 2, "mean": 4, "norm": 8}

stat_value = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([NAN, INF, -INF, 0.0, -0.0, 5e-324, 1.7976931348623157e308]),
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([10**400, -(10**400), 2**1024]),
    st.just(ABSENT),
)
DTYPES = ["torch.float32", "torch.bfloat16", "torch.float16", "torch.int64", "torch.bool", "Float32"]


@st.composite
def tensor_leaf(draw, md5: bool, data_name: bool) -> dict[str, Any]:
    leaf: dict[str, Any] = {
        "type": draw(st.sampled_from(["torch.Tensor", "mindspore.Tensor", "numpy.ndarray"])),
        "dtype": draw(st.sampled_from(DTYPES)),
        "shape": draw(st.lists(st.integers(0, 7), max_size=4)),
    }
    for _, key in STATS:
        v = draw(stat_value)
        if v is not ABSENT:
            leaf[key] = v
    leaf["requires_grad"] = draw(st.booleans())
    if md5:
        leaf["md5"] = f"{draw(st.integers(0, 2**32 - 1)):08x}"
    if data_name:
        leaf["data_name"] = "PLACEHOLDER"  # filled with the label once known
    return leaf


other_leaf = st.one_of(
    st.none(),
    st.builds(lambda v: {"type": "int", "value": v}, st.integers(-3, 3)),
    st.builds(lambda v: {"type": "bool", "value": v}, st.booleans()),
    st.just({"type": "torch.Size", "value": [2, 3]}),
    st.just({"type": "slice", "value": [0, None, 1]}),
    st.just({"type": "torch.dtype", "value": "torch.float32"}),
    st.just({"type": "torch.ProcessGroup", "group_ranks": [0, 1], "group_id": "1234"}),
)


def arg(md5: bool, dn: bool):
    leaf = tensor_leaf(md5, dn)
    return st.one_of(leaf, leaf, other_leaf, st.lists(st.one_of(leaf, other_leaf), max_size=3))


NODE_KINDS = ["api_fwd", "api_bwd", "module_fwd", "param_grad"]


def node_name(kind: str, i: int) -> str:
    if kind == "api_fwd":
        prefix = ["Functional", "Tensor", "Torch", "Distributed"][i % 4]
        return f"{prefix}.{['linear', 'add', 'all_reduce'][i % 3]}.{i}.forward"
    if kind == "api_bwd":
        return f"Functional.relu.{i}.backward"
    if kind == "module_fwd":
        return f"Module.blocks.{i}.mlp.Linear.forward.0"
    return f"Module.blocks.{i}.mlp.Linear.parameters_grad.{i}"


@st.composite
def node_record(draw, kind: str, md5: bool, dn: bool) -> dict[str, Any]:
    a = arg(md5, dn)
    if kind in ("api_fwd", "module_fwd"):
        rec: dict[str, Any] = {
            "input_args": draw(st.lists(a, max_size=3)),
            "input_kwargs": draw(st.dictionaries(st.sampled_from(["weight", "bias", "other", "dim"]), a, max_size=2)),
            "output": draw(st.lists(a, min_size=1, max_size=2)),
        }
        if kind == "module_fwd":
            rec["parameters"] = draw(st.dictionaries(st.sampled_from(["weight", "bias"]), tensor_leaf(md5, dn),
                                                     max_size=2))
        if draw(st.booleans()):
            rec["is_recompute"] = False
        return rec
    if kind == "api_bwd":
        return {"input": draw(st.lists(a, max_size=2)), "output": draw(st.lists(a, max_size=2))}
    return {p: [draw(tensor_leaf(md5, dn))] if draw(st.booleans()) else draw(tensor_leaf(md5, dn))
            for p in draw(st.lists(st.sampled_from(["weight", "bias"]), min_size=1, max_size=2, unique=True))}


def flatten(node: str, rec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Independent msprobe compare naming of the tensor leaves of one generated record."""
    out: dict[str, dict[str, Any]] = {}

    def visit(v: Any, prefix: str) -> None:
        if isinstance(v, dict):
            if isinstance(v.get("type"), str) and v["type"] not in NON_TENSOR and "dtype" in v and "shape" in v:
                out[prefix] = v
                return
            for k, x in v.items():
                visit(x, f"{prefix}.{k}")
        elif isinstance(v, list):
            for i, x in enumerate(v):
                visit(x, f"{prefix}.{i}")

    if ".parameters_grad" in node:
        for p, v in rec.items():
            visit(v[0] if isinstance(v, list) and len(v) == 1 else v, f"{node}.{p}")
        return out
    for key, section in (("input_args", "input"), ("input_kwargs", "input"), ("input", "input"),
                         ("parameters", "parameters"), ("output", "output")):
        if key in rec:
            visit(rec[key], f"{node}.{section}")
    return out


@st.composite
def msprobe_dump(draw, max_nodes: int = 4) -> dict[str, Any]:
    """{"files": {(step, rank): doc}, "steps": n, "ranks": n, ...}: 1-2 steps x 1-3 ranks."""
    n_steps = draw(st.integers(1, 2))
    n_ranks = draw(st.integers(1, 3))
    md5 = draw(st.booleans())
    dn = draw(st.booleans())
    kinds = draw(st.lists(st.sampled_from(NODE_KINDS), min_size=1, max_size=max_nodes))
    nodes = [(node_name(k, i), k) for i, k in enumerate(kinds)]
    proc = n_ranks == 1 and draw(st.booleans())
    files: dict[tuple[int, int], Any] = {}
    for s in range(n_steps):
        for r in range(n_ranks):
            data = {}
            for name, kind in nodes:
                if draw(st.integers(0, 4)) == 0:
                    continue  # this node is absent on this (step, rank)
                rec = draw(node_record(kind, md5, dn))
                for label, leaf in flatten(name, rec).items():
                    if "data_name" in leaf:
                        leaf["data_name"] = f"{label}.pt"
                data[name] = rec
            doc: dict[str, Any] = {"task": "tensor" if dn else "statistics", "level": "mix"}
            if draw(st.booleans()):
                doc["framework"] = "pytorch"
            doc["dump_data_dir"] = None
            doc["data"] = data
            files[s, r] = doc
    return {"files": files, "steps": n_steps, "ranks": n_ranks, "proc": proc, "md5": md5, "dn": dn,
            "nodes": nodes, "indent": draw(st.sampled_from([None, 1, 4])),
            "side": draw(st.sampled_from(["none", "construct", "both_old", "both_new"]))}


def rank_folder(root: Path, spec: dict[str, Any], s: int, r: int) -> Path:
    return root / f"step{s}" / (f"proc{4242}" if spec["proc"] else f"rank{r}")


def write_msprobe(root: Path, spec: dict[str, Any]) -> dict[Path, int]:
    folders: dict[Path, int] = {}
    for (s, r), doc in spec["files"].items():
        d = rank_folder(root, spec, s, r)
        d.mkdir(parents=True, exist_ok=True)
        (d / "dump.json").write_text(json.dumps(doc, indent=spec["indent"]))
        names = list(doc["data"])
        if spec["side"] != "none":
            (d / "construct.json").write_text(json.dumps({n: None for n in names}))
        if spec["side"] == "both_old":
            (d / "stack.json").write_text(json.dumps({n: ["File a.py, line 1, in f, \n x"] for n in names}))
        elif spec["side"] == "both_new":
            (d / "stack.json").write_text(json.dumps({"0": [names, ["File a.py, line 1, in f, \n x"]]}))
        folders[d] = r
    return folders


def check_msprobe_values(ds, spec: dict[str, Any]) -> int:
    """Every generated value equals the loaded one; present exactly where written. Returns #values."""
    tindex = {str(t): i for i, t in enumerate(ds["tensor"].values)}
    steps = [int(s) for s in ds["step"].values]
    ranks = [int(r) for r in ds["rank"].values]
    assert steps == list(range(spec["steps"]))
    assert ranks == list(range(spec["ranks"]))
    arrays = {name: ds[name].values for name, _ in STATS}
    present = ds["present"].values
    null = ds["null_stats"].values
    numel = ds["numel"].values
    expected_present = np.zeros(present.shape, bool)
    checked = 0
    for (s, r), doc in spec["files"].items():
        for node, rec in doc["data"].items():
            for label, leaf in flatten(node, rec).items():
                assert label in tindex, (label, sorted(tindex)[:20])
                t = tindex[label]
                expected_present[s, r, t] = True
                for stat, key in STATS:
                    want, is_null = expected_float(leaf.get(key, ABSENT))
                    got = float(arrays[stat][s, r, t])
                    assert same(got, want), (label, s, r, stat, got, leaf.get(key, "<absent>"))
                    assert bool(null[s, r, t] & NULL_BIT[stat]) == is_null, (label, stat)
                    checked += 1
                assert int(numel[s, r, t]) == math.prod(leaf["shape"]), (label, leaf["shape"])
                if spec["md5"]:
                    assert str(ds["crc"].values[s, r, t]) == leaf["md5"]
                if spec["dn"]:
                    assert str(ds["data_name"].values[s, r, t]) == leaf["data_name"]
                assert str(ds["node"].values[t]) == node
    assert (present == expected_present).all(), np.argwhere(present != expected_present)[:5]
    assert len(tindex) == int(expected_present.any(axis=(0, 1)).sum())
    return checked


@pytest.mark.slow
@given(msprobe_dump(), st.booleans())
@fuzz_settings(200)
def test_msprobe_valid_dumps_load_exactly(spec, reference):
    with Workdir() as tmp, msprobe_parser(reference):
        root = tmp / "dump"
        folders = write_msprobe(root, spec)
        if not any(flatten(n, rec) for doc in spec["files"].values() for n, rec in doc["data"].items()):
            # no tensor at all: still a readable dump (nodes without tensors, or empty data)
            ds = check_open("msprobe_valid", root, folders, fmt="msprobe")
            assert ds is not None and ds.sizes["tensor"] == 0
            return
        ds = check_open("msprobe_valid", root, folders, fmt="msprobe")
        assert ds is not None
        assert load_report(ds).ok, load_report(ds).to_dict()
        check_msprobe_values(ds, spec)


# --------------------------------------------------------------------------- mutations

GARBAGE: list[Any] = [
    "nan", "NaN", "inf", "abc", "", "1e400", "\u0000", [], {}, [1, "x", None], {"a": {"b": [None, {}]}},
    10**400, -(10**400), 2**64, -1e308, True, False, None, 0, -1,
    [[[[[]]]]], {"type": "torch.Tensor"},
    {"type": "torch.Tensor", "dtype": "torch.float32", "shape": "2x3", "Max": "nan", "Min": [1], "Mean": {}},
    {"type": "torch.Tensor", "dtype": None, "shape": [10**30, 10**30], "Max": 1},
    {"type": "torch.Tensor", "dtype": "f", "shape": [-1, 2.5, "a", None, True], "Max": "1e400"},
    {"type": "torch.Tensor", "dtype": "f", "shape": [1e400], "Max": 1},
    {"type": "torch.Tensor", "dtype": {"x": 1}, "shape": [2**70], "Max": 1, "md5": [1], "data_name": 7},
    {"type": "torch.Tensor", "dtype": "f", "shape": [], "data_name": "../../../etc/passwd"},
    {"type": ["torch.Tensor"], "dtype": "f", "shape": []},
    {"group_ranks": [0, 1, "x", 10**30]},
    {"group_ranks": "0,1"},
]


def _paths(obj: Any, path: tuple = (), out: list | None = None, depth: int = 0) -> list[tuple]:
    out = [] if out is None else out
    if depth > 12:
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((*path, k))
            _paths(v, (*path, k), out, depth + 1)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.append((*path, i))
            _paths(v, (*path, i), out, depth + 1)
    return out


def _get_parent(obj: Any, path: tuple) -> Any:
    for p in path[:-1]:
        obj = obj[p]
    return obj


def _deep(depth: int) -> Any:
    v: Any = 1
    for i in range(depth):
        v = [v] if i % 2 else {"k": v}
    return v


def mutate_obj(doc: Any, data: st.DataObject) -> Any:
    doc = copy.deepcopy(doc)
    op = data.draw(st.sampled_from(["delete", "swap", "swap", "swap", "data_list", "deep", "wrap"]))
    if op == "data_list":
        doc["data"] = data.draw(st.sampled_from([list(doc["data"].values()), [], "data", None, 3]))
        return doc
    paths = _paths(doc)
    if not paths:
        return data.draw(st.sampled_from([[], "x", None, {"data": {}}]))
    path = paths[data.draw(st.integers(0, len(paths) - 1))]
    parent = _get_parent(doc, path)
    key = path[-1]
    if op == "delete":
        del parent[key]
    elif op == "swap":
        parent[key] = copy.deepcopy(data.draw(st.sampled_from(GARBAGE)))
    elif op == "deep":
        parent[key] = _deep(data.draw(st.sampled_from([40, 200, 900, 3000])))
    else:  # wrap: a dict where a list belongs and vice versa
        v = parent[key]
        parent[key] = {"0": v} if isinstance(v, list) else [v]
    return doc


def dumps(obj: Any, indent: int | None = None) -> str:
    try:
        return json.dumps(obj, indent=indent)
    except RecursionError:  # too deep for the encoder: write the nesting by hand
        return '{"data": ' + "[" * 5000 + "]" * 5000 + "}"


def mutate_rank_files(d: Path, doc: Any, indent: Any, data: st.DataObject, *, side_objects: bool = False) -> None:
    """Mutate one rank folder's files in place: its dump.json as an object or as bytes, or a side file.

    *doc*: the folder's dump.json document as written; *side_objects*: a side file (construct.json /
    stack.json) may also be mutated as a JSON object, not only as bytes.
    """
    kind = data.draw(st.sampled_from(["obj", "bytes", "bytes", "side"]))
    if kind == "obj":
        (d / "dump.json").write_text(dumps(mutate_obj(doc, data), indent))
    elif kind == "bytes":
        f = d / "dump.json"
        f.write_bytes(mutate_bytes(f.read_bytes(), data))
    else:
        name = data.draw(st.sampled_from(["construct.json", "stack.json"]))
        raw = (d / name).read_bytes() if (d / name).exists() else b'{"0": [["x"], ["y"]]}'
        if not side_objects or data.draw(st.booleans()):
            raw = mutate_bytes(raw, data)
        else:
            m = mutate_obj({"data": json.loads(raw)}, data)
            raw = dumps(m.get("data") if isinstance(m, dict) else m).encode()
        (d / name).write_bytes(raw)


def mutate_bytes(raw: bytes, data: st.DataObject) -> bytes:
    op = data.draw(st.sampled_from(["truncate", "truncate", "flip", "utf8", "dupkey", "bom", "empty", "insert",
                                    "number"]))
    n = len(raw)
    if op == "truncate":
        return raw[: data.draw(st.integers(0, max(n - 1, 0)))]
    if op == "flip":
        b = bytearray(raw)
        for _ in range(data.draw(st.integers(1, 4))):
            if b:
                b[data.draw(st.integers(0, len(b) - 1))] = data.draw(st.integers(0, 255))
        return bytes(b)
    if op == "utf8":
        i = data.draw(st.integers(0, n))
        return raw[:i] + data.draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\xfe\xff"])) + raw[i:]
    if op == "dupkey":
        i = raw.find(b'"data"')
        j = raw.find(b"{", i) if i >= 0 else -1
        if j < 0:
            return raw
        return raw[: j + 1] + b'"Functional.linear.0.forward": {"output": [1]}, ' \
            b'"Functional.linear.0.forward": {"output": []},' + raw[j + 1:]
    if op == "bom":
        return b"\xef\xbb\xbf" + raw
    if op == "empty":
        return data.draw(st.sampled_from([b"", b" \n", b"null", b"[]", b"{}", b'{"data": {}}', b"\x00" * 8]))
    if op == "insert":
        i = data.draw(st.integers(0, n))
        return raw[:i] + data.draw(st.sampled_from([b"}", b"]", b",", b'"', b"\\", b"NaN", b"-", b"1e999"])) + raw[i:]
    # number: replace the first number after "Max": with a huge literal
    i = raw.find(b'"Max":')
    if i < 0:
        return raw
    j = i + 6
    while j < n and raw[j:j + 1] in b" \n":
        j += 1
    k = j
    while k < n and raw[k:k + 1] not in b",}\n":
        k += 1
    return raw[:j] + data.draw(st.sampled_from([b"1e400", b"-1e400", b"9" * 400, b"-" + b"9" * 5000, b"1e-400",
                                                 b'"nan"', b"[1, 2]", b"true"])) + raw[k:]


@pytest.mark.slow
@given(msprobe_dump(max_nodes=2), st.data())
@fuzz_settings(400)
def test_msprobe_mutated_dumps_never_crash(spec, data):
    with Workdir() as tmp, msprobe_parser(data.draw(st.booleans())):
        root = tmp / "dump"
        folders = write_msprobe(root, spec)
        targets = sorted(spec["files"])
        k = data.draw(st.integers(1, len(targets)))
        chosen = data.draw(st.permutations(targets))[:k]
        for s, r in chosen:
            mutate_rank_files(rank_folder(root, spec, s, r), spec["files"][s, r], spec["indent"], data,
                              side_objects=True)

        def has_data(folder: Path) -> bool:
            from precnb.io import msprobe as md

            try:
                rd = md.discover(folder)[0]
                return len(md.read_rank_dir(rd).labels) > 0
            except PrecnbError:
                return False

        check_open("msprobe_mutated", root, folders, fmt="msprobe", per_file_has_data=has_data)


# --------------------------------------------------------------------------- monitor (v1 CSV)

MON_FAMILIES = {"actv": True, "actv_grad": True, "grad_reduced": False, "grad_unreduced": False,
                "param_origin": False, "exp_avg": False}  # family -> has micro_step column
OPS = ["min", "max", "norm", "mean", "zeros", "nans"]
cell_value = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                       st.sampled_from([NAN, INF, -INF, -0.0, None]))


def _cell(v: float | None) -> str:
    return "" if v is None else repr(float(v))


@st.composite
def monitor_output(draw) -> dict[str, Any]:
    n_steps, n_ranks = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    fams = draw(st.lists(st.sampled_from(sorted(MON_FAMILIES)), min_size=1, max_size=3, unique=True))
    ops = draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=6, unique=True))
    vpp_on = draw(st.integers(0, 4)) == 0
    micro_multi = {f: MON_FAMILIES[f] and draw(st.booleans()) for f in fams}
    files: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in range(n_ranks):
        for f in fams:
            rows = []
            for s in range(n_steps):
                for i in range(draw(st.integers(0, 3))):
                    name = f"blocks.{i}.attn.output" if MON_FAMILIES[f] else f"blocks.{i}.attn.weight"
                    micros = [0, 1] if micro_multi[f] else [0]
                    for m in micros:
                        rows.append({"vpp_stage": 1 if vpp_on else 0, "name": name, "step": s, "micro_step": m,
                                     "stats": {op: draw(cell_value) for op in ops}})
            files[r, f] = rows
    return {"steps": n_steps, "ranks": n_ranks, "fams": fams, "ops": ops, "files": files, "vpp": vpp_on,
            "multi": micro_multi}


def mon_folder(root: Path, r: int) -> Path:
    return root / f"Dec03_21-34-40-rank{r}-1a2b3c4d"


def write_monitor(root: Path, spec: dict[str, Any]) -> dict[Path, int]:
    folders = {}
    for (r, f), rows in spec["files"].items():
        d = mon_folder(root, r)
        d.mkdir(parents=True, exist_ok=True)
        folders[d] = r
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        micro = MON_FAMILIES[f]
        w.writerow(["vpp_stage", "name", "step", *(["micro_step"] if micro else []), *spec["ops"]])
        for row in rows:
            w.writerow([row["vpp_stage"], row["name"], row["step"], *([row["micro_step"]] if micro else []),
                        *(_cell(row["stats"][op]) for op in spec["ops"])])
        (d / f"{f}_0-{spec['steps'] - 1}.csv").write_text(buf.getvalue())
    return folders


def mon_label(spec: dict[str, Any], f: str, row: dict[str, Any]) -> str:
    name = f"{row['vpp_stage']}:{row['name']}" if spec["vpp"] else row["name"]
    label = f"{f}/{name}"
    return f"{label}/micro{row['micro_step']}" if spec["multi"][f] else label


@given(monitor_output())
@fuzz_settings(120)
def test_monitor_valid_csvs_load_exactly(spec):
    with Workdir() as tmp:
        folders = write_monitor(tmp / "mon", spec)
        n_rows = sum(len(rows) for rows in spec["files"].values())
        ds = check_open("monitor_valid", tmp / "mon", folders, fmt="monitor")
        if n_rows == 0:
            assert ds is None  # nothing to load is refused with a PrecnbError
            return
        assert ds is not None and load_report(ds).ok
        tindex = {str(t): i for i, t in enumerate(ds["tensor"].values)}
        sidx = {int(s): i for i, s in enumerate(ds["step"].values)}
        assert [int(r) for r in ds["rank"].values] == list(range(spec["ranks"]))
        expected_present = np.zeros(ds["present"].shape, bool)
        for (r, f), rows in spec["files"].items():
            for row in rows:
                label = mon_label(spec, f, row)
                t, s = tindex[label], sidx[row["step"]]
                expected_present[s, r, t] = True
                for op in spec["ops"]:
                    v = row["stats"][op]
                    got = float(ds[op].values[s, r, t])
                    assert same(got, NAN if v is None else v), (label, op, got, v)
                    if op in NULL_BIT:
                        assert bool(ds["null_stats"].values[s, r, t] & NULL_BIT[op]) == (v is None)
        assert (ds["present"].values == expected_present).all()


def mutate_csv(text: str, data: st.DataObject) -> bytes:
    op = data.draw(st.sampled_from(["bytes", "cell", "cell", "fields", "header"]))
    if op == "bytes":
        return mutate_bytes(text.encode(), data)
    lines = text.splitlines()
    i = data.draw(st.integers(0, len(lines) - 1))
    cells = next(csv.reader([lines[i]])) if lines[i] else [""]
    if op == "cell":
        j = data.draw(st.integers(0, len(cells) - 1))
        cells[j] = data.draw(st.sampled_from(["abc", "1e400", "-1e400", "9" * 400, "9" * 5000, "nan", "", "True",
                                               "[[[[[[", "(1," + "2," * 50 + ")", "[" * 3000, '"', "2.5", "-7",
                                               "\x00", "é", "1,2", "x" * 200_000]))
    elif op == "fields":
        cells = cells[:-1] if data.draw(st.booleans()) and len(cells) > 1 else [*cells, "extra"]
    else:
        lines[0] = data.draw(st.sampled_from(["", "a,b,c", "vpp_stage,name,step,max,max", "name,step,present",
                                              "vpp_stage,name,step,micro_step,norm", "Op Name,IO,Slot",
                                              "Op Type,Op Name,IO,Slot,Max Value,Max Value"]))
        return "\n".join(lines).encode()
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(cells)
    lines[i] = buf.getvalue()
    return "\n".join(lines).encode()


@pytest.mark.slow  # make test runs it; make test-fast stays under 5 minutes (RESULTS_tests.md)
@given(monitor_output(), st.data())
@fuzz_settings(250)
def test_monitor_mutated_csvs_never_crash(spec, data):
    with Workdir() as tmp:
        root = tmp / "mon"
        folders = write_monitor(root, spec)
        csvs = sorted(p for d in folders for p in d.glob("*.csv"))
        for p in data.draw(st.permutations(csvs))[: data.draw(st.integers(1, len(csvs)))]:
            p.write_bytes(mutate_csv(p.read_text(), data))
        check_open("monitor_mutated", root, folders, fmt="monitor")


# --------------------------------------------------------------------------- kernel (statistic.csv)

KCOLS = {"Max Value": "max", "Min Value": "min", "Avg Value": "mean", "L2Norm Value": "norm", "Count": "count",
         "NaN Count": "nan_count", "Positive Inf Count": "pos_inf_count", "Zero Count": "zero_count"}
FIXED = ["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Size", "Data Type", "Shape"]
kcell = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                  st.sampled_from([NAN, INF, -INF, -0.0, None, True, False]))


def _kcell(v: Any) -> tuple[str, float, bool]:
    """(text, expected value, is_null)."""
    if v is None:
        return "null", NAN, True
    if isinstance(v, bool):
        return str(v), float(v), False
    return repr(float(v)), float(v), False


@st.composite
def kernel_dump(draw) -> dict[str, Any]:
    n_steps, n_ranks = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    cols = draw(st.lists(st.sampled_from(sorted(KCOLS)), min_size=1, max_size=len(KCOLS), unique=True))
    md5 = draw(st.booleans())
    files = {}
    for s in range(n_steps):
        for r in range(n_ranks):
            rows = []
            for i in range(draw(st.integers(0, 4))):
                for io_, slot in draw(st.lists(st.sampled_from([("input", 0), ("input", 1), ("output", 0)]),
                                               min_size=1, max_size=3, unique=True)):
                    rows.append({"op": f"Default/network-Net/MatMul-op{i}" if i % 2 else f"Default_Add-op{i}",
                                 "type": "MatMul", "io": io_, "slot": slot, "shape": [2, i + 1],
                                 "stats": {c: draw(kcell) for c in cols},
                                 "md5": f"{draw(st.integers(0, 2**32)):032x}" if md5 else None})
            files[s, r] = rows
    return {"steps": n_steps, "ranks": n_ranks, "cols": cols, "md5": md5, "files": files,
            "trailing": draw(st.booleans())}


def kernel_folder(root: Path, s: int, r: int) -> Path:
    return root / f"rank_{r}" / "Net" / "0" / str(s)


def write_kernel(root: Path, spec: dict[str, Any]) -> dict[Path, int]:
    folders = {}
    for (s, r), rows in spec["files"].items():
        d = kernel_folder(root, s, r)
        d.mkdir(parents=True, exist_ok=True)
        folders[root / f"rank_{r}"] = r
        header = [*FIXED, *spec["cols"], *(["MD5"] if spec["md5"] else [])]
        lines = [",".join(header)]
        for row in rows:
            cells = [row["type"], row["op"], "0", "0", "1733905446819790", row["io"], str(row["slot"]), "8",
                     "float32", '"(' + ",".join(map(str, row["shape"])) + ')"',
                     *(_kcell(row["stats"][c])[0] for c in spec["cols"]), *([row["md5"]] if spec["md5"] else [])]
            lines.append(",".join(cells) + ("," if spec["trailing"] else ""))
        (d / "statistic.csv").write_text("\n".join(lines) + "\n")
    return folders


@given(kernel_dump())
@fuzz_settings(120)
def test_kernel_valid_csvs_load_exactly(spec):
    with Workdir() as tmp:
        folders = write_kernel(tmp / "k", spec)
        ds = check_open("kernel_valid", tmp / "k", folders, fmt="kernel")
        assert ds is not None and load_report(ds).ok
        tindex = {str(t): i for i, t in enumerate(ds["tensor"].values)}
        expected_present = np.zeros(ds["present"].shape, bool)
        assert [int(r) for r in ds["rank"].values] == list(range(spec["ranks"]))
        assert [int(s) for s in ds["step"].values] == list(range(spec["steps"]))
        for (s, r), rows in spec["files"].items():
            for row in rows:
                t = tindex[f"{row['op']}.{row['io']}.{row['slot']}"]
                expected_present[s, r, t] = True
                for col in spec["cols"]:
                    _, want, is_null = _kcell(row["stats"][col])
                    var = KCOLS[col]
                    assert same(float(ds[var].values[s, r, t]), want), (col, row)
                    if var in NULL_BIT:
                        assert bool(ds["null_stats"].values[s, r, t] & NULL_BIT[var]) == is_null
                assert int(ds["numel"].values[s, r, t]) == math.prod(row["shape"])
                if spec["md5"]:
                    assert str(ds["crc"].values[s, r, t]) == row["md5"]
        assert (ds["present"].values == expected_present).all()


@pytest.mark.slow
@given(kernel_dump(), st.data())
@fuzz_settings(250)
def test_kernel_mutated_csvs_never_crash(spec, data):
    with Workdir() as tmp:
        root = tmp / "k"
        folders = write_kernel(root, spec)
        csvs = sorted(root.glob("rank_*/*/*/*/statistic.csv"))
        for p in data.draw(st.permutations(csvs))[: data.draw(st.integers(1, len(csvs)))]:
            p.write_bytes(mutate_csv(p.read_text(), data))
        check_open("kernel_mutated", root, folders, fmt="kernel")


# --------------------------------------------------------------------------- compare CSV

COMPARE_HEADER = ("NPU Name,Bench Name,NPU Dtype,Bench Dtype,NPU Tensor Shape,Bench Tensor Shape,Max diff,"
                  "Min diff,Mean diff,L2norm diff,MaxRelativeErr,MinRelativeErr,MeanRelativeErr,NormRelativeErr,"
                  "NPU max,NPU min,NPU mean,NPU l2norm,Bench max,Bench min,Bench mean,Bench l2norm,Result,"
                  "Err_message,NPU_Stack_Info,Data_name")


@st.composite
def compare_csv(draw) -> str:
    lines = [COMPARE_HEADER]
    for i in range(draw(st.integers(0, 4))):
        name = f"Functional.linear.{i}.forward.output.0"
        vals = [_cell(draw(cell_value)) or "N/A" for _ in range(16)]
        lines.append(",".join([name, name if i % 3 else "N/A", "torch.float32", "torch.float32", '"[2, 3]"',
                               '"[2, 3]"', *vals[:4], "12.5%", "N/A", " inf", "0.0%", *vals[4:12], "pass",
                               '"[""a"", ""b""]"', '"[\'File a.py, line 1\']"', '"[\'-1\', \'-1\']"']))
    return "\n".join(lines) + "\n"


@given(compare_csv(), st.data())
@fuzz_settings(80)
def test_compare_csv_mutated_never_crash(text, data):
    with Workdir() as tmp:
        p = tmp / "compare_result_rank0_20250101.csv"
        p.write_bytes(mutate_csv(text, data) if data.draw(st.integers(0, 4)) else text.encode())
        t = TALLY["compare_mutated"]
        t["tried"] += 1
        try:
            ds = _quiet_open(p, format="compare")
        except PrecnbError:
            t["refused"] += 1
            return
        except BaseException:
            t["crashes"] += 1
            raise
        t["loaded"] += 1
        validate(ds)


# --------------------------------------------------------------------------- low-level parsers

@given(st.one_of(st.binary(max_size=300),
                 st.builds(lambda s: s.encode("utf-8", "surrogatepass"), st.text(max_size=200)),
                 st.recursive(st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=5)),
                              lambda c: st.one_of(st.lists(c, max_size=3),
                                                  st.dictionaries(st.text(max_size=3), c, max_size=3)),
                              max_leaves=20).map(lambda o: json.dumps(o).encode())),
       st.data())
@pytest.mark.slow
@fuzz_settings(1000)
def test_json_bytes_parse_or_dump_format_error(raw, data):
    if data.draw(st.booleans()):
        raw = mutate_bytes(raw, data)
    t = TALLY["json_bytes"]
    t["tried"] += 1
    try:
        loads_json(raw, "x.json")
        t["loaded"] += 1
    except DumpFormatError as exc:
        t["refused"] += 1
        assert str(exc).startswith("x.json: ")
    except BaseException:
        t["crashes"] += 1
        raise


@given(st.one_of(st.text(max_size=40), st.sampled_from(["[" * 5000, "(" + "9" * 5000 + ")", "[1e400]", "[-1, 2]",
                                                        "[99999999999999999999, 9999999999]", "torch.Size([2, 3])"])))
@fuzz_settings(700)
def test_csv_cells_parse_or_value_error(text):
    t = TALLY["csv_cells"]
    t["tried"] += 1
    try:
        shape = parse_shape(text)
        assert shape is None or all(isinstance(d, int) and 0 <= d < 2**62 for d in shape)
        with contextlib.suppress(ValueError):  # parse_float's contract: a number, None or ValueError
            parse_float(text)
        t["loaded"] += 1
    except BaseException:
        t["crashes"] += 1
        raise
