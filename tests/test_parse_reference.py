"""The msprobe parser against a plain reference reader written here from the documented rules.

The parser reads records once, batch by batch, with its walk, run facts, value columns and
per-node coordinates specialised for speed (``precnb/io/msprobe``). This file re-derives every
tensor of a real dump from ``json.loads`` of the file, :func:`precnb.naming.parse_node` and a
recursive walk of the naming rules (msprobe compare's ``{node}.input.0``, ``{node}.output.0.1``,
``{node}.parameters.weight``, ``{node}.{param}`` for ``parameters_grad``), and the run facts with
the straightforward two-pass implementation the parser replaced; both parse paths (batch by batch
with orjson, and whole with the standard library) must give exactly those records.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from precnb.io._runfacts import _API, _plain, api_of, is_optimizer_node
from precnb.io.msprobe.discover import discover
from precnb.io.msprobe.nodes import NodeParts, _module_of, name_parts
from precnb.io.msprobe.parse import read_rank_dir
from precnb.io.records import _shape_text, stat_value
from precnb.naming import module_path_of, parse_node
from tests.conftest import SAMPLES, shared_path

_NON_TENSOR = {"slice", "ellipsis", "torch.Size", "torch.dtype", "torch.device", "mindspore.dtype"}
# every key of a record is a section, on forward and backward records alike: record key -> (label part, role);
# read inputs and parameters first, then outputs, then the keys precnb does not know (own name, no role)
_INPUTS = {"input_args": ("input", "input"), "input_kwargs": ("input", "input"), "input": ("input", "input"),
           "grad_output": ("input", "input"), "parameters": ("parameters", "parameter")}
_OUTPUTS = {"output": ("output", "output"), "grad_input": ("output", "output")}
_OTHER = {"parameters_grad": ("parameters_grad", "grad")}
_TENSOR_FIELDS = {"dtype", "shape", "Max", "Min", "Mean", "Norm", "md5", "data_name"}


# ------------------------------------------------------------------------------ reference reader
def _is_leaf(v: dict) -> bool:
    t = v.get("type")
    return isinstance(t, str) and "dtype" in v and "shape" in v and t not in _NON_TENSOR


def _unreadable(v: dict) -> bool:
    """Tensor fields on an object that is not a leaf."""
    t = v.get("type")
    if isinstance(t, str):
        return t not in _NON_TENSOR and ("Tensor" in t or bool(_TENSOR_FIELDS & set(v)))
    return isinstance(v.get("dtype"), str) and isinstance(v.get("shape"), list)


def _walk(v: Any, prefix: str, role: str, out: list, unread: list | None = None) -> None:
    if isinstance(v, dict):
        if _is_leaf(v):
            out.append((prefix, role, v))
            return
        if len(v) == 2 and "value" in v and not isinstance(v["value"], (dict, list)) \
                and not isinstance(v.get("type"), (dict, list)):
            return  # a scalar argument
        if _unreadable(v):
            if unread is not None:
                unread.append(prefix)
            return
        for k, x in v.items():
            _walk(x, f"{prefix}.{k}", role, out, unread)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _walk(x, f"{prefix}.{i}", role, out, unread)


def ref_leaves(node: str, record: dict, unread: list | None = None) -> list:
    """(label, role, leaf) of one record by the naming rules; *unread* receives the paths of what cannot be read."""
    out: list = []
    if parse_node(node).kind == "param_grad":
        for pname, val in record.items():
            _walk(val[0] if isinstance(val, list) and len(val) == 1 else val, f"{node}.{pname}", "grad", out, unread)
        return out
    known = {**_INPUTS, **_OUTPUTS, **_OTHER}
    if not any(k in known for k in record) and (_is_leaf(record) or _unreadable(record)):
        _walk(record, node, "", out, unread)  # the record is itself a tensor
        return out
    order = [k for k in record if k in _INPUTS] + [k for k in record if k in _OUTPUTS] + \
        [k for k in record if k in _OTHER] + [k for k in record if k not in known]
    for key in order:
        section, role = known.get(key, (key, ""))
        value = record[key]
        if isinstance(value, (list, dict)):
            _walk(value, f"{node}.{section}", role, out, unread)
        elif value is not None and key in known and unread is not None:
            unread.append(f"{node}.{key}")
    return out


def ref_signature(record: dict) -> int:
    """:func:`precnb.io._runfacts.scalar_signature` as first written: one recursive walk of every argument."""
    import zlib

    def walk(value: Any, path: str, out: list, depth: int) -> None:
        if depth > 4:
            return
        if isinstance(value, dict):
            kind = value.get("type")
            if isinstance(kind, str):
                if "value" in value and "shape" not in value:
                    v = value["value"]
                    if v is None or type(v) in (bool, int, float, str):
                        out.append(f"{path}={_plain(kind, v)!r}")
                return
            for k, x in value.items():
                if k != "tensor":
                    walk(x, f"{path}.{k}", out, depth + 1)
        elif isinstance(value, list):
            for i, x in enumerate(value):
                walk(x, f"{path}.{i}", out, depth + 1)

    out: list = []
    if isinstance(record.get("input_args"), list):
        for i, x in enumerate(record["input_args"]):
            walk(x, str(i), out, 1)
    if isinstance(record.get("input_kwargs"), dict):
        for k, x in record["input_kwargs"].items():
            walk(x, str(k), out, 1)
    return (zlib.crc32(";".join(out).encode("utf-8", "replace")) or 1) if out else 0


def ref_facts(data: dict, parents: dict) -> dict:  # noqa: C901
    """The run facts as the two-pass implementation computed them (one more walk of every record)."""
    grads: dict = {}
    scalars: dict = {}

    def scal(value: Any, path: str, found: dict, depth: int, kwarg: bool) -> None:
        if depth > 8:
            return
        if isinstance(value, dict):
            kind = value.get("type")
            if isinstance(kind, str):
                if "value" in value and "shape" not in value:
                    v = _plain(kind, value["value"])
                elif kwarg and value.get("shape") == [] and "Max" in value:
                    v = _plain("float", value.get("Max"))
                else:
                    return
                if v is not None:
                    add(found.setdefault(path, []), v)
                return
            for k, x in value.items():
                scal(x, f"{path}.{k}", found, depth + 1, kwarg)
        elif isinstance(value, list):
            for x in value:
                scal(x, path, found, depth + 1, kwarg)

    def add(values: list, v: Any) -> None:
        if len(values) < 64 and not any(type(v) is type(x) and v == x for x in values):
            values.append(v)

    for node, record in data.items():
        if not isinstance(record, dict):
            continue
        params = record.get("parameters")
        if isinstance(params, dict):
            for pname, leaf in params.items():
                if isinstance(leaf, dict) and isinstance(leaf.get("requires_grad"), bool):
                    grads[f"{node}.parameters.{pname}"] = leaf["requires_grad"]
        parent = parents.get(node, "")
        if not is_optimizer_node(node, parent):
            continue
        found: dict = {}
        if isinstance(record.get("input_args"), list):
            for i, x in enumerate(record["input_args"]):
                scal(x, str(i), found, 1, False)
        if isinstance(record.get("input_kwargs"), dict):
            for k, x in record["input_kwargs"].items():
                scal(x, str(k), found, 1, True)
        into = scalars.setdefault(api_of(node), {}) if found else {}
        for path, vals in found.items():
            for v in vals:
                add(into.setdefault(path, []), v)
    # the facts read for the analyses of parallel runs: checked per record with the public rules, so what is
    # tested here is which records the parser hands them (every API forward record; Distributed ones for the
    # reduce op and P2P peers)
    from precnb.io._runfacts import p2p_peers, reduce_op, undefined_leaves

    undefined: dict = {}
    sigs: dict = {}
    reduce_ops: dict = {}
    peers: set = set()
    for node, record in data.items():
        if not isinstance(record, dict):
            continue
        undefined.update(undefined_leaves(node, record))
        if node.endswith(".forward") and not node.startswith(("Module.", "Cell.")):
            if ref_signature(record):
                sigs[node] = ref_signature(record)
            if node.startswith(("Distributed.", "MintDistributed.")):
                op = reduce_op(record)
                if op and not op.upper().endswith("SUM"):
                    reduce_ops[node] = op
                peers.update(p2p_peers(node, record))
    return {k: v for k, v in (("requires_grad", grads), ("scalar_args", scalars), ("undefined", undefined),
                              ("scalar_sigs", sigs), ("reduce_ops", reduce_ops), ("p2p_peers", sorted(peers))) if v}


def reference_records(folder: Path) -> dict[str, Any]:
    """Every tensor of one (step, rank) folder: labels, coordinates, statistics, null bits, numel, facts."""
    data = json.loads((folder / "dump.json").read_bytes().decode("utf-8"))["data"]
    construct = {}
    if (folder / "construct.json").exists():
        construct = json.loads((folder / "construct.json").read_text())
    parents = {k: (v[0] if isinstance(v, list) else v) for k, v in construct.items()}
    parents = {k: v if isinstance(v, str) else "" for k, v in parents.items()}
    micro = {k: v[1] for k, v in construct.items() if isinstance(v, list) and isinstance(v[1], int)}
    rows: dict[str, list] = {k: [] for k in ("label", "role", "node", "module", "api", "kind", "direction", "parent",
                                             "call", "micro_step", "dtype", "shape", "numel", "null",
                                             "max", "min", "mean", "norm", "unread")}
    for node, record in data.items():
        if not isinstance(record, dict):
            if record is not None:
                rows["unread"].append(node)  # a record that is not an object
            continue
        nn = parse_node(node)
        parent = parents.get(node, "")
        for label, role, leaf in ref_leaves(node, record, rows["unread"]):
            module = nn.module if nn.kind != "api" else module_path_of(parent)
            shape = leaf["shape"]
            null = 0
            for bit, key in enumerate(("Max", "Min", "Mean", "Norm")):
                v = stat_value(leaf.get(key))
                null |= (v is None) << bit
                rows[key.lower()].append(math.nan if v is None else v)
            values = dict(label=label, role=role, node=node, module=module, api=nn.api, kind=nn.kind,
                          direction=nn.direction, parent=parent, call=nn.call, micro_step=micro.get(node, -1),
                          dtype=leaf["dtype"], shape=_shape_text(shape), numel=int(np.prod(shape, dtype=np.int64)),
                          null=null)
            for k, v in values.items():
                rows[k].append(v)
    rows["facts"] = ref_facts(data, parents)  # type: ignore[assignment]
    return rows


# ------------------------------------------------------------------------------ the comparison
def _same_floats(a: np.ndarray, b: list[float]) -> bool:
    return a.dtype == np.float64 and np.array_equal(a.view(np.uint64), np.asarray(b, np.float64).view(np.uint64))


def check_folder(folder: Path) -> int:
    """Both parse paths give the reference records of *folder*; returns the number of tensors."""
    ref = reference_records(folder)
    rd = next(d for d in discover(folder.parent.parent if folder.parent.name.startswith("step") else folder)
              if d.path == folder)
    for whole in (False, True):
        old = os.environ.pop("PRECNB_JSON_WHOLE", None)
        if whole:
            os.environ["PRECNB_JSON_WHOLE"] = "1"
        try:
            rec = read_rank_dir(rd)
        finally:
            os.environ.pop("PRECNB_JSON_WHOLE", None)
            if old is not None:
                os.environ["PRECNB_JSON_WHOLE"] = old
        assert rec.labels == ref["label"], (folder, whole)
        for name in ("role", "node", "module", "api", "kind", "direction", "parent", "call", "micro_step",
                     "dtype", "shape"):
            got = np.asarray(rec.coords[name]).tolist()
            assert got == ref[name], (folder, whole, name, next((i, g, r) for i, (g, r) in
                                                                enumerate(zip(got, ref[name], strict=True)) if g != r))
        for name in ("max", "min", "mean", "norm"):
            assert _same_floats(rec.values[name], ref[name]), (folder, whole, name)
        assert rec.null_stats.tolist() == ref["null"], (folder, whole)
        assert rec.numel.tolist() == ref["numel"], (folder, whole)
        assert rec.meta.get("facts", {}) == ref["facts"], (folder, whole)
        unread = [f"{node}.{where}" if where else node for _f, node, where, _why in rec.meta.get("unread", [])]
        assert sorted(unread) == sorted(ref["unread"]), (folder, whole)
        assert rec.meta.get("unread_count", 0) == len(ref["unread"]), (folder, whole)
    return len(ref["label"])


def _msprobe_folders(root: Path) -> list[Path]:
    return sorted({p.parent for p in root.rglob("dump.json") if p.parent.parent.name.startswith("step")})


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_sections_fixtures_equal_the_reference_reader():
    """Every key of a record read (an "input" section on a forward record, "input_args" on a backward one,
    1.0.x's grad_input/grad_output, a key precnb does not know), and the same unreadable items listed."""
    folders = _msprobe_folders(FIXTURES / "msprobe_sections")
    assert len(folders) == 7, folders
    assert sum(check_folder(f) for f in folders) == 11 + 16 + 16 + 2 * 6 + 6 + 4
    assert reference_records(FIXTURES / "msprobe_sections" / "odd" / "step0" / "rank")["unread"] == [
        "Functional.relu.0.forward.input.1", "Functional.relu.0.forward.output", "Functional.broken.0.forward"]


def test_releases_fixtures_equal_the_reference_reader():
    """The conformance matrix's dumps (one per mindstudio-probe release), when present on this branch."""
    root = FIXTURES / "msprobe_releases"
    folders = _msprobe_folders(root) if root.is_dir() else []
    if not folders:
        pytest.skip("no tests/fixtures/msprobe_releases on this branch")
    assert sum(check_folder(f) for f in folders) > 1000


@pytest.mark.slow
def test_bundled_samples_equal_the_reference_reader():
    folders = _msprobe_folders(SAMPLES)
    assert len(folders) >= 20, folders
    tensors = sum(check_folder(f) for f in folders)
    assert tensors > 5000


@pytest.mark.shared
@pytest.mark.parametrize("sample", ["S1_baseline", "S5_tp_shards", "S13_ms_vs_pt"])
def test_shared_samples_equal_the_reference_reader(sample):
    folders = _msprobe_folders(shared_path("data_samples", "msprobe", sample))
    assert folders
    assert sum(check_folder(f) for f in folders[:12]) > 100


@pytest.mark.shared
def test_shared_s1_facts_hold_the_optimizer_arguments():
    """The facts the reference computes are real ones (Adam's betas and lr on S1), not empty dicts."""
    folder = _msprobe_folders(shared_path("data_samples", "msprobe", "S1_baseline", "statistics"))[0]
    facts = read_rank_dir(next(d for d in discover(folder.parent.parent) if d.path == folder)).meta["facts"]
    assert facts == reference_records(folder)["facts"]
    assert facts["scalar_args"] and facts["requires_grad"]
    assert any(v for args in facts["scalar_args"].values() for v in args.values())


# ------------------------------------------------------------------------------ node names
_PARTS = ["Tensor", "mul_", "0", "12", "forward", "backward", "", "a.b", "Module", "Cell", "parameters_grad",
          "\u0663", "x\n", "9" * 19, "9" * 18, "debug"]


def _names() -> list[str]:
    return [".".join(c) for k in range(1, 5) for c in itertools.product(_PARTS, repeat=k)]


def test_name_parts_is_parse_node():
    """The string-method split of the common spellings gives what the regular expressions give."""
    names = _names()
    assert len(names) > 60_000
    for node in names:
        nn = parse_node(node)
        call = nn.call if -1 <= nn.call <= 2**62 else -1
        assert name_parts(node) == (nn.kind, nn.api, nn.module, nn.direction, call), node


def test_module_of_is_module_path_of():
    """The parent -> module path of the coordinates is naming.module_path_of (string methods, same answer)."""
    for parent in [*_names(), "", "optimizer", "clip_grad", "Module." + "9" * 5000 + ".forward.0"]:
        try:
            want = module_path_of(parent)
        except ValueError:  # a counter of more than 4300 digits: no module
            want = ""
        assert _module_of(parent) == want, parent


def test_split_nodes_is_name_parts():
    """NodeParts' in-line split of the node names gives name_parts' parts (an API's module: its parent's)."""
    names = _names()
    parents = [names[(i * 7919) % len(names)] if i % 3 else "" for i in range(len(names))]
    parts = NodeParts()  # in two batches: the cache of parents' modules carries over
    parts.add(names[:len(names) // 2], parents[:len(names) // 2])
    parts.add(names[len(names) // 2:], parents[len(names) // 2:])
    got = list(zip(parts.kinds, parts.apis, parts.modules, parts.dirs, parts.calls, strict=True))
    for node, parent, (kind, api, module, direction, call) in zip(names, parents, got, strict=True):
        k, a, m, d, c = name_parts(node)
        assert (kind, api, module, direction, call) == (k, a, _module_of(parent) if k == "api" else m, d, c), node


def test_api_of_is_its_pattern():
    for node in _names():
        m = _API.match(node)
        assert api_of(node) == (m.group("api") if m else node), node


def test_optimizer_prefilter_covers_every_marker():
    """The parser hands a record to the run facts when its name holds "_fused_", "addcdiv_" or "_foreach_lerp_":
    every optimizer marker must hold one of them, or its records would lose their scalar arguments."""
    from precnb.io._runfacts import _OPTIMIZER_MARKERS

    for marker in _OPTIMIZER_MARKERS:
        assert "_fused_" in marker or "addcdiv_" in marker or "_foreach_lerp_" in marker, marker


def test_scalar_signature_is_the_reference_walk_for_every_kind_of_argument():
    """The in-line reading of the usual arguments gives the checksum of the reference walk, argument by argument."""
    from precnb.io._runfacts import scalar_signature

    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0}
    values = [0, -3, 2**70, 1.5, -0.0, float("nan"), float("inf"), -float("inf"), True, False, None, "NaN",
              "-Infinity", "Infinity", "x", "y" * 70, [1], {"a": 1}]
    args: list[Any] = [t, 7, "s", None, [t, {"type": "int", "value": 3}], [[[[[{"type": "int", "value": 1}]]]]],
                       {"type": 5, "value": 1},
                       {"class_type": "P2POp", "tensor": t, "peer": {"type": "int", "value": 2}},
                       {"type": "float", "value": 1.0, "shape": []}, {"type": "float"}, {"value": 2}]
    for kind in ("int", "float", "str", "bool"):
        args += [{"type": kind, "value": v} for v in values]
    records = [{"input_args": args}, {"input_args": args[::-1], "input_kwargs": {"a": args[-1], "b": t, "c": args}},
               {"input_args": [t] * 70 + [{"type": "int", "value": 1}] * 3}, {"input_args": "x", "input_kwargs": []},
               {"input_args": [t], "input_kwargs": {}}, {}]
    records += [{"input_args": [a]} for a in args] + [{"input_kwargs": {"k": a}} for a in args]
    sigs = [scalar_signature(r) for r in records]
    assert sigs == [ref_signature(r) for r in records]
    assert len(set(sigs)) > 30 and 0 in sigs  # a checksum that tells arguments apart


def test_statistic_columns_follow_stat_value_for_every_kind_of_value():
    """The value columns (one numpy conversion, the exact rules where numpy refuses) equal stat_value element by
    element, null bits included, for each kind of value alone in a column and all of them mixed."""
    from precnb.io.msprobe.values import Columns, Issues

    odd: list[Any] = [1.5, -0.0, 7, 2**70, 10**400, -(10**400), True, False, None, float("nan"), float("inf"),
                      "NaN", "-Infinity", "Infinity", "1e400", " 2.5 ", "1_000", "null", "", "n/a", "None", "abc",
                      [1.0], [], {"a": 1}]
    columns = [[v] * 3 for v in odd] + [odd, [[1.0], [2.0]], [[1.0, 2.0]], [1.0, None, None]]
    for col in columns:
        leaves = [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1], "Max": v, "Min": 0.0,
                   "Mean": v, "Norm": 1.0} for v in col]
        cols, issues = Columns(), Issues()
        cols.add_batch(leaves, [f"t{i}" for i in range(len(col))], issues)
        out = cols.finish()
        for i, v in enumerate(col):
            try:
                want = stat_value(v)
            except TypeError:
                want = None
            got = out["max"][i]
            assert (want is None) == bool(out["null"][i] & 1) == bool(out["null"][i] & 4), (col, v)
            if want is None:
                assert np.isnan(got), (col, v)
            else:
                assert _same_floats(np.array([got]), [want]) and math.copysign(1, got) == math.copysign(1, want), v
        refused = sum(1 for v in col if not isinstance(v, str | int | float | type(None)) or (
            isinstance(v, str) and v.strip().lower() not in ("", "null", "none", "n/a") and not _numeric(v)))
        assert sum(m.count("statistic") for m in issues.messages("f")) == (1 if refused else 0), col


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_dtype_shape_and_crc_columns_follow_the_rules_batch_after_batch():
    """dtype/md5 values that are not strings are ignored and reported, shapes that are not lists of non-negative
    ints give numel -1, whatever came in earlier batches (the per-process caches of distinct values)."""
    from precnb.io.msprobe.values import Columns, Issues, valid_shape

    dtypes: list[Any] = ["torch.float32", None, 5, True, ["x"], {"a": 1}, "torch.bf16", 1]
    shapes: list[Any] = [[2, 3], [2, -1], [True, 2], [2.0, 3], [], "23", {2: 3}, [2, 3], [1], [2**62, 2]]
    crcs: list[Any] = [None, "abc", 7, None]
    cols, issues = Columns(), Issues()
    want_dtype, want_numel, want_crc, bad = [], [], [], 0
    for batch in ([0], [0, 1, 2], [3, 0], [4, 5, 6], [7], [0, 6], list(range(8))):
        leaves, labels = [], []
        for j in batch:
            shape, crc = shapes[j % len(shapes)], crcs[j % len(crcs)]
            leaf = {"type": "torch.Tensor", "dtype": dtypes[j], "shape": shape, "Max": 1.0, "Min": 0.0,
                    "Mean": 0.5, "Norm": 1.0}
            if crc is not None:
                leaf["md5"] = crc
            leaves.append(leaf)
            labels.append(f"t{len(want_dtype)}")
            ok = dtypes[j] if isinstance(dtypes[j], str) else ""
            bad += not isinstance(dtypes[j], str) and dtypes[j] is not None
            bad += crc is not None and not isinstance(crc, str)
            want_dtype.append(ok)
            valid = valid_shape(shape)
            want_numel.append(-1 if valid is None else int(np.prod(valid, dtype=object)))
            want_crc.append(crc if crc is None or isinstance(crc, str) else "")
        cols.add_batch(leaves, labels, issues)
    out = cols.finish()
    assert out["dtype"].dtype == object and out["dtype"].tolist() == want_dtype
    assert out["numel"].tolist() == want_numel
    assert cols.crc == want_crc
    fields = [m for m in issues.messages("f") if "dtype/md5/data_name" in m]
    assert len(fields) == 1 and fields[0].startswith(f"f: {bad} dtype/md5/data_name"), fields


def test_data_names_first_met_in_a_later_batch_stay_aligned():
    from precnb.io.msprobe.values import Columns, Issues

    def leaf(name=None):
        out = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
               "Norm": 1.0}
        if name is not None:
            out["data_name"] = name
        return out

    cols = Columns()
    for batch in ([leaf(), leaf()], [leaf("a.pt"), leaf()], [leaf()], [leaf(""), leaf("b.pt")]):
        cols.add_batch(batch, [f"t{cols.n + i}" for i in range(len(batch))], Issues())
    assert cols.any_data_name and not cols.any_crc
    assert cols.data_name == ["", "", "a.pt", "", "", "", "b.pt"]
