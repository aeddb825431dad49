"""The msprobe dump.json parser: one (step, rank) folder → :class:`~precnb.io._assemble.FileRecords`.

One parser for every file, clean or not. The JSON text is read batch by batch
(:mod:`precnb.io.msprobe._json`) when it is in msprobe's layout, else parsed whole with the
standard library's rules (:func:`precnb.io._jsonio.load_json`: bare ``NaN``/``Infinity`` tokens,
byte-order mark, invalid UTF-8 inside strings, lone surrogates); either way the same walk reads
the node records, so both give the same records, warnings and errors.

The walk names tensors as msprobe's compare does (``{node}.input.0``, ``{node}.output.0.1``,
``{node}.parameters.weight``, ``{node}.{param}`` for ``parameters_grad`` records); a leaf is an
object whose ``type`` is a string other than a non-tensor type and which has ``dtype`` and
``shape``. Values are read by :class:`~precnb.io.msprobe.values.Columns`.

Broken and hostile input
------------------------
Nothing raises anything but :class:`~precnb.errors.PrecnbError` subclasses: an unreadable,
empty, truncated or non-JSON dump.json, one that is not an object with a ``data`` object, or
values nested more than :data:`MAX_DEPTH` levels deep is a :class:`~precnb.errors.DumpFormatError`
naming the file and the position or node. Values of unexpected types load as far as they make
sense and are reported in ``FileRecords.meta["warnings"]`` (one line per kind of problem, with
the first example); numbers beyond the float range are ±inf, call counters and micro steps beyond
2**62 are -1; unreadable construct.json / stack.json are reported and ignored.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from precnb.errors import DumpFormatError
from precnb.io._assemble import FileRecords, LoadReport, dedup_labels
from precnb.io._jsonio import load_json
from precnb.io._runfacts import file_facts, merge_facts
from precnb.io.msprobe import _json
from precnb.io.msprobe.discover import RankDir
from precnb.io.msprobe.sides import json_type, read_sides
from precnb.io.msprobe.values import MAX_COUNTER, Columns, Issues, short
from precnb.naming import NodeName, module_path_of, parse_node

__all__ = ["MAX_DEPTH", "leaves_of", "read_rank_dir"]

#: values nested deeper than this below a node record make the file unreadable
MAX_DEPTH = 64
_MAX_INDEX = 2**31 - 1
_NON_TENSOR_TYPES = frozenset({"slice", "ellipsis", "torch.Size", "torch.dtype", "torch.device", "mindspore.dtype"})
# parameters are inputs of the forward: they come before the outputs in execution order
_FORWARD = (("input_args", "input", "input"), ("input_kwargs", "input", "input"),
            ("parameters", "parameters", "parameter"), ("output", "output", "output"))
_BACKWARD = (("input", "input", "input"), ("output", "output", "output"))
_ABSENT = object()
_CTX: dict[tuple[str, str, int], tuple[Any, ...]] = {}  # per process: the nodes of a run repeat in every file


class _TooDeepError(Exception):
    def __init__(self, where: str) -> None:
        self.where = where


def _counter(v: Any) -> int:
    return v if v.__class__ is int and -1 <= v <= MAX_COUNTER else -1


def _fast_node_name(node: str) -> NodeName | None:
    """:func:`precnb.naming.parse_node` for the common spellings, None for anything else.

    ``{api}.{call}.{forward|backward}`` and ``Module|Cell.{path}.{Class}.{forward|backward}.{call}``
    with ASCII names and short counters: what the regular expressions of :mod:`precnb.naming`
    match there (``tests/test_io_msprobe.py`` compares both on generated names).
    """
    if "parameters_grad" in node or not node.isascii() or "\n" in node:
        return None
    head, sep, last = node.rpartition(".")
    if not sep:
        return None
    if last == "forward" or last == "backward":
        api, sep, call = head.rpartition(".")
        if sep and api and call.isdigit() and len(call) < 19:
            return NodeName(node, "api", api, "", last, int(call))
        return None
    if last.isdigit() and len(last) < 19:
        body, sep, direction = head.rpartition(".")
        if sep and (direction == "forward" or direction == "backward"):
            pre, sep, body = body.partition(".")
            if sep and body and (pre == "Module" or pre == "Cell"):
                path, _, cls = body.rpartition(".")
                return NodeName(node, "module", cls, path, direction, int(last))
    return None


def _node_name(node: str) -> NodeName:
    """:func:`precnb.naming.parse_node`, with call counters beyond 2**62 (or 4300 digits) read as -1."""
    fast = _fast_node_name(node)
    if fast is not None:
        return fast
    try:
        nn = parse_node(node)
    except ValueError:  # a counter of more than 4300 digits
        return NodeName(node, "api", node, "", "", -1)
    return nn if -1 <= nn.call <= MAX_COUNTER else nn._replace(call=-1)


def _module_of(parent: str) -> str:
    try:
        return module_path_of(parent)
    except ValueError:
        return ""


def _context(node: str, parent: str, micro: int) -> tuple[Any, ...]:
    """(node, module, api, kind, direction, parent, call, micro step) of a node record."""
    key: Any = node if micro == -1 and not parent else (node, parent, micro)
    ctx = _CTX.get(key)
    if ctx is None:
        nn = _node_name(node)
        module = nn.module if nn.kind != "api" else (_module_of(parent) if parent else "")
        ctx = (node, module, nn.api, nn.kind, nn.direction, parent, _counter(nn.call), _counter(micro))
        if len(_CTX) > 200_000:
            _CTX.clear()
        _CTX[key] = ctx
    return ctx


class _Walk:
    """The tensor leaves of node records, in file order: leaf objects, labels, roles, nodes."""

    def __init__(self) -> None:
        self.leaves: list[dict[str, Any]] = []
        self.labels: list[str] = []
        self.roles: list[str] = []
        self.ctx: list[tuple[Any, ...]] = []  # one per node with leaves
        self.counts: list[int] = []  # leaves per entry of ctx

    def node(self, node: str, record: dict[str, Any], kind: str) -> int:
        """Add the leaves of one record; returns how many."""
        n0 = len(self.leaves)
        if kind == "param_grad":
            for pname, val in record.items():
                leaf = val[0] if val.__class__ is list and len(val) == 1 else val
                self.value(leaf, f"{node}.{pname}", "grad", 1)
            return len(self.leaves) - n0
        sections = _BACKWARD if node.endswith(".backward") or ".backward." in node else _FORWARD
        used = False
        for key, section, role in sections:
            v = record.get(key, _ABSENT)
            if v is _ABSENT:
                continue
            used = True
            if v.__class__ is list:  # the usual section: straight to its items
                if v:
                    self.children(enumerate(v), f"{node}.{section}", role, 1)
            elif v.__class__ is dict:
                self.value(v, f"{node}.{section}", role, 1)
        if not used:  # debug.json and unknown shapes: walk everything
            self.value(record, node, "", 0)
        return len(self.leaves) - n0

    def value(self, v: Any, prefix: str, role: str, depth: int) -> None:
        if v.__class__ is dict:
            if depth > MAX_DEPTH:
                raise _TooDeepError(prefix)
            t = v.get("type")
            if t.__class__ is str and "dtype" in v and "shape" in v and t not in _NON_TENSOR_TYPES:
                self.leaves.append(v)
                self.labels.append(prefix)
                self.roles.append(role)
            else:
                self.children(v.items(), prefix, role, depth)
        elif v.__class__ is list:
            if depth > MAX_DEPTH:
                raise _TooDeepError(prefix)
            self.children(enumerate(v), prefix, role, depth)

    def children(self, items: Iterable[tuple[Any, Any]], prefix: str, role: str, depth: int) -> None:
        """The reference walk of a container's items, with the common leaf read in line."""
        leaves, labels, roles = self.leaves, self.labels, self.roles
        d1 = depth + 1
        for k, v in items:
            cls = v.__class__
            if cls is dict:
                if d1 > MAX_DEPTH:
                    raise _TooDeepError(f"{prefix}.{k}")
                t = v.get("type")
                if t.__class__ is str and "dtype" in v and "shape" in v and t not in _NON_TENSOR_TYPES:
                    leaves.append(v)
                    labels.append(f"{prefix}.{k}")
                    roles.append(role)
                elif len(v) == 2 and "value" in v and v["value"].__class__ not in (dict, list) \
                        and t.__class__ is not dict and t.__class__ is not list:
                    continue  # a scalar argument: nothing below it
                elif v:
                    self.children(v.items(), f"{prefix}.{k}", role, d1)
            elif cls is list:
                if d1 > MAX_DEPTH:
                    raise _TooDeepError(f"{prefix}.{k}")
                if v:
                    self.children(enumerate(v), f"{prefix}.{k}", role, d1)


def leaves_of(node: str, record: Any, kind: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, role, leaf) of every tensor leaf of one node record, in file order.

    Examples
    --------
    >>> rec = {"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]}],
    ...        "output": [[{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]}]]}
    >>> [(label, role) for label, role, _ in leaves_of("Functional.relu.0.forward", rec)]
    [('Functional.relu.0.forward.input.0', 'input'), ('Functional.relu.0.forward.output.0.0', 'output')]
    """
    if not isinstance(record, dict):
        return []
    w = _Walk()
    w.node(node, record, kind or _node_name(node).kind)
    return list(zip(w.labels, w.roles, w.leaves, strict=True))


def _find_groups(value: Any, depth: int = 0) -> Iterable[list[int]]:
    """``group_ranks`` of ProcessGroup leaves (communication records); ranks in 0..2**31."""
    if depth > 6:
        return
    if isinstance(value, dict):
        g = value.get("group_ranks")
        if isinstance(g, list) and g and all(x.__class__ is int and 0 <= x <= _MAX_INDEX for x in g):
            yield [int(x) for x in g]
            return
        for v in value.values():
            if isinstance(v, (dict, list)):
                yield from _find_groups(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            if isinstance(v, (dict, list)):
                yield from _find_groups(v, depth + 1)


class _File:
    """The state of one file's parse: the walk, the columns, what was met."""

    def __init__(self, rd: RankDir, parents: Mapping[str, str], micro: Mapping[str, int]) -> None:
        self.rd, self.parents, self.micro = rd, parents, micro
        self.walk = _Walk()
        self.cols = Columns()
        self.issues = Issues()
        self.labels: list[str] = []
        self.roles: list[str] = []
        self.groups: dict[str, str] = {}
        self.facts: dict[str, Any] = {}
        self.ctx_cols: list[list[Any]] = [[] for _ in _CTX_NAMES]
        self.n_nodes = 0

    def batch(self, data: Mapping[str, Any]) -> None:
        """Read one batch of node records (all of ``data`` for a whole-file parse)."""
        w = self.walk
        walk_node, ctxs, counts = w.node, w.ctx, w.counts
        parents, micro = self.parents.get, self.micro.get
        self.n_nodes += len(data)
        for node, record in data.items():
            if record.__class__ is not dict:
                if record is not None:  # null records carry nothing
                    self.issues.add((self.cols.n + len(w.leaves), -1), "record", f"{short(node)}: {json_type(record)}")
                continue
            if node.startswith(("Distributed.", "MintDistributed.")):
                for g in _find_groups({k: record.get(k) for k in ("input_args", "input_kwargs")}):
                    self.groups.setdefault(json.dumps(g), node)
                    break
            ctx = _context(node, parents(node, "") or "", micro(node, -1))
            try:
                n = walk_node(node, record, ctx[3])
            except _TooDeepError as exc:
                where = short(exc.where, 120)
                raise DumpFormatError(self.rd.dump_file, f"node {short(node, 80)}: values nested more than "
                                                         f"{MAX_DEPTH} levels deep (at {where})") from None
            if n:
                ctxs.append(ctx)
                counts.append(n)
        if w.ctx:  # the batch's node contexts as columns (tuples dropped)
            for col, vals in zip(self.ctx_cols, zip(*w.ctx, strict=True), strict=True):
                col += vals
            w.ctx = []
        self.cols.add_batch(w.leaves, w.labels, self.issues)
        facts = file_facts(data, self.parents)  # parameters' requires_grad, optimizer scalar arguments
        if facts:
            merge_facts(self.facts, facts)
        self.labels += w.labels
        self.roles += w.roles
        w.leaves, w.labels, w.roles = [], [], []

    def build(self, top: Mapping[str, Any], notes: list[str], sides: tuple[Any, Any]) -> FileRecords:
        out: dict[str, str] = {}
        for i, key in enumerate(("task", "level", "framework")):
            v = top.get(key, "")
            if v is not None and not isinstance(v, str):
                self.issues.add((1 << 62, i), "top", f"{key}={short(v)}")
                v = ""
            out[key] = v or ""
        cols = self.cols
        framework = out["framework"] or ("mindspore" if cols.leaf_type.startswith("mindspore") else "pytorch")
        if not self.n_nodes:
            notes.append(f"{self.rd.dump_file}: 'data' is empty (nothing was dumped on this rank and step)")
        notes += self.issues.messages(self.rd.dump_file)
        meta: dict[str, Any] = {"task": out["task"], "level": out["level"], "framework": framework,
                                "path": str(self.rd.path), "comm_groups": self.groups, "warnings": notes}
        if self.facts:
            meta["facts"] = self.facts
        n = cols.n
        c = cols.finish()
        labels = self.labels
        index = dict(zip(labels, range(n), strict=True))
        if len(index) != n:
            labels = dedup_labels(labels)
            index = dict(zip(labels, range(n), strict=True))
        coords = _node_columns(self.ctx_cols, self.walk.counts, n)
        coords.update(role=self.roles, dtype=c["dtype"], shape=c["shape"])
        strings: dict[str, list[str]] = {}
        if cols.any_crc:
            strings["crc"] = [v or "" for v in cols.crc]
        if cols.any_data_name:
            strings["data_name"] = cols.data_name
        return FileRecords(
            step=self.rd.step, rank=self.rd.rank, labels=labels, coords=coords,
            values={k: c[k] for k in ("max", "min", "mean", "norm")}, null_stats=c["null"],
            seq=np.arange(n, dtype=np.int32), numel=c["numel"], strings=strings,
            construct=sides[0] if sides[0] is not None else {}, stacks=sides[1] if sides[1] is not None else {},
            meta=meta, label_index=index)


_CTX_NAMES = ("node", "module", "api", "kind", "direction", "parent", "call", "micro_step")


def _node_columns(cols: list[list[Any]], counts: list[int], n: int) -> dict[str, Any]:
    """Per-leaf coordinate arrays from the per-node context columns (one pointer copy per leaf)."""
    out: dict[str, Any] = {}
    reps = np.asarray(counts, np.int64)
    for j, name in enumerate(_CTX_NAMES):
        if j >= 6:
            per_node = np.asarray(cols[j], np.int64)
        else:
            per_node = np.empty(len(cols[j]), object)
            per_node[:] = cols[j]
        out[name] = np.repeat(per_node, reps) if n else per_node[:0]
    return out


def _wrap_bare_data(doc: Any) -> Any:
    if isinstance(doc, dict) and "data" not in doc and doc and all(
            isinstance(v, dict) and _node_name(k).direction for k, v in doc.items()):
        return {"data": doc}  # a bare data object (e.g. an api_accuracy_checker forward.json)
    return doc


def _whole(rd: RankDir, notes: list[str]) -> dict[str, Any]:
    """The whole-file parse (standard library rules); checks that it is an msprobe dump."""
    doc = _wrap_bare_data(load_json(rd.dump_file, notes))
    if not isinstance(doc, dict):
        raise DumpFormatError(rd.dump_file, f"not an msprobe dump.json: holds a JSON {json_type(doc)}, "
                                            "expected an object with a 'data' object")
    if "data" not in doc:
        raise DumpFormatError(rd.dump_file, "not an msprobe dump.json (no 'data' object)")
    if not isinstance(doc["data"], dict):
        raise DumpFormatError(rd.dump_file, f"not an msprobe dump.json: 'data' is a JSON "
                                            f"{json_type(doc['data'])}, expected an object of node records")
    return doc


def read_rank_dir(rd: RankDir, *, report: LoadReport | None = None) -> FileRecords:
    """Parse one (step, rank) folder into columnar records (the task run once per file).

    Parameters
    ----------
    rd : RankDir
    report : LoadReport, optional
        Also receives the warnings (they are always in ``meta["warnings"]``).

    Returns
    -------
    FileRecords
        ``construct`` and ``stacks`` are shared tables (parsed once per distinct file by the
        assembler); ``meta["warnings"]`` lists what was repaired or ignored.

    Raises
    ------
    DumpFormatError
        When dump.json is unreadable or not an msprobe dump, naming the position or node.
    """
    paused = gc.isenabled()
    gc.disable()  # millions of fresh containers, no cycles: the collector would only rescan them
    try:
        rec = _read(rd)
    finally:
        if paused:
            gc.enable()
    if report is not None:
        report.warnings.extend(rec.meta["warnings"])
    return rec


def _read(rd: RankDir) -> FileRecords:
    side_notes: list[str] = []
    parents, micro, construct, stack = read_sides(rd.path, side_notes)
    notes: list[str] = []
    f = _File(rd, parents, micro)
    top: Mapping[str, Any] = {}
    try:
        for is_top, part in _parts(rd):
            if is_top:
                top = part
            else:
                f.batch(part)
    except (_json.NotBatchableError, DumpFormatError, OSError):  # the whole-file parse decides (and words the error)
        doc = _whole(rd, notes)
        f = _File(rd, parents, micro)
        f.batch(doc["data"])
        top = doc
    return f.build(top, notes + side_notes, (construct, stack))


def _parts(rd: RankDir) -> Iterable[tuple[bool, Any]]:
    """(is_top, dict) parts of the batched parse: the node batches, then the top-level members."""
    prev = None
    for part in _json.batches(rd.dump_file):
        if prev is not None:
            yield False, prev
        prev = part
    if prev is not None:
        yield True, prev
