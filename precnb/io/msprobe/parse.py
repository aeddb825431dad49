"""The msprobe dump.json parser: one (step, rank) folder → :class:`~precnb.io._assemble.FileRecords`.

One parser for every file, clean or not, with two paths that give identical records:

- **the fast path** (the default when the optional extension :mod:`precnb.io._craw` is built,
  ``precnb/io/_craw.c``): each batch's text (:func:`precnb.io.msprobe._json.raw_parts`) is read in
  C and no Python object is built per leaf, only the labels, node names, the shared dtype / shape
  texts and, for the run facts, the scalar arguments of the records that have them. It reads only
  the records it can prove plain and hands every other member back as its text, which the
  standard library parses and the reference walk reads;
- **the pure Python reference** (``PRECNB_PURE_PARSER=1``, or no extension built): each batch is
  parsed by the standard library's ``json`` (:func:`precnb.io.msprobe._json.parts`) and every
  record read by :class:`~precnb.io.msprobe.walk.Walk`.

Both read the JSON text batch by batch when it is in msprobe's layout, else the whole file with the
standard library's rules (:func:`precnb.io._jsonio.load_json`: bare ``NaN``/``Infinity`` tokens,
byte-order mark, invalid UTF-8 inside strings, lone surrogates), so both give the same records,
warnings and errors (``tests/test_parse_paths.py`` and the differential fuzzer
``tests/test_fuzz_differential.py`` check it). A C reader of the bytes was chosen over a faster
parser of objects (orjson, python-rapidjson) because the objects themselves were most of the cost:
the work after such a parse still cost more than the parse (``benchmarks/RESULTS_large.md`` has
the figures, against ``json.loads`` with the garbage collector on and paused).

Each record is read once: :class:`~precnb.io.msprobe.walk.Walk` collects its tensor leaves and
their labels, :class:`~precnb.io._runfacts.FileFacts` its run facts (``requires_grad``, optimizer
arguments); the leaves' values are read a batch at a time by
:class:`~precnb.io.msprobe.values.Columns` and the per-node coordinates once per file by
:func:`~precnb.io.msprobe.nodes.node_columns`.

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

import itertools
import json
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from precnb.dtypes import dtype_kind
from precnb.errors import DumpFormatError
from precnb.io._assemble import FileRecords, LoadReport, dedup_labels
from precnb.io._cext import craw
from precnb.io._gc import paused_gc
from precnb.io._memory import return_free_memory
from precnb.io._runfacts import UNDEFINED_PREFIXES, FileFacts
from precnb.io.msprobe import _json
from precnb.io.msprobe._whole import find_groups, framework_of_leaf, whole_doc
from precnb.io.msprobe.discover import RankDir
from precnb.io.msprobe.nodes import NodeParts, node_columns
from precnb.io.msprobe.release import file_facts, stack_format
from precnb.io.msprobe.sides import json_type, read_sides
from precnb.io.msprobe.values import Columns, Issues, TextColumn, short
from precnb.io.msprobe.walk import MAX_DEPTH, NO_SIGNATURE, TooDeepError, Walk, leaves_of
from precnb.io.records import distinct
from precnb.naming import COMM_PREFIXES

__all__ = ["MAX_DEPTH", "leaves_of", "read_rank_dir"]

#: without signatures, the API records the run facts still read: the collectives (reduce op, p2p peers)
_NO_SIGNATURE = NO_SIGNATURE
#: unreadable sections and leaves listed per file (all are counted)
MAX_UNREAD = 1000
#: a dump.json this large hands the C heap's free memory back between the steps of its parse (the
#: peak RSS of a one-file load is set there; a small file's steps do not need the few milliseconds)
_LARGE = 32 << 20


class _File:
    """The state of one file's parse: the walk, the columns, the nodes that had tensors, what was met."""

    def __init__(self, rd: RankDir, parents: Mapping[str, str], micro: Mapping[str, int],
                 signatures: bool = True, names: dict[str, str] | None = None) -> None:
        self.rd, self.parents, self.micro = rd, parents, micro
        # construct.json's own node-name objects (the C reader of construct.json builds them with the parents):
        # the names kept (nodes, parts, signatures) are the table's anyway; the batches' copies go with their batch
        self.names: dict[str, str] = dict(zip(parents, parents, strict=True)) if names is None else names
        self.walk = Walk()
        self.cols = Columns()
        self.issues = Issues()
        self.labels: list[str] = []
        self.roles = TextColumn()
        self.groups: dict[str, str] = {}
        self.facts = FileFacts(signatures=signatures)
        self.signatures = signatures
        self.nodes: list[str] = []  # the node records that had tensors, in file order
        self.counts: list[int] = []  # tensors per entry of nodes
        self.hashes: list[np.ndarray] = []  # of the labels, batch by batch
        self.parts = NodeParts()  # the split names of nodes
        self.n_nodes = 0
        self.backward: str | None = None  # the sections of the first backward record: "grad" (1.0.1) / "io"
        self.is_recompute: bool | None = None  # whether the first forward record carries is_recompute
        self.probe = True  # until both are known
        self.large = False  # a large file: free memory is handed back between the steps of build()
        self._parents: list[str] = []  # of the current batch's nodes that had tensors
        self._todo: list[tuple[int, str, dict[str, Any], str]] = []  # the current batch's run facts to read
        # for the C reader: construct.json's nodes (the tables' own key objects) and parents in its order, and where
        # in it the last record was found (a dump's records mostly come in that order)
        self.order: list[Any] = []

    def batch(self, data: Mapping[str, Any]) -> None:
        """Read one parsed batch of node records (all of ``data`` for a whole-file parse) with :meth:`record`.

        The pure Python reference (:meth:`batch_raw` reads the same records from their text, with the
        same lists: ``tests/test_parse_paths.py``).
        """
        w = self.walk
        nodes = self.nodes
        self._parents = []  # of this batch's nodes that had tensors (NodeParts keeps them)
        self._todo = []  # (flags, node, record, parent) for the run facts
        self.n_nodes += len(data)
        n_had = len(nodes)
        # the parents in one C-level pass (construct.json's table holds strings only: "" for a root)
        name = self.names.get
        for (node, record), parent in zip(data.items(), map(self.parents.get, data, itertools.repeat("")),
                                          strict=True):
            self.record(name(node, node), record, parent)
        self.facts.batch(self._todo)  # the run facts, in file order
        self._todo = []
        self.parts.add(nodes[n_had:], self._parents)
        self.cols.add_batch(w.leaves, w.labels, self.issues)
        self.hashes.append(np.fromiter(map(hash, w.labels), np.int64, len(w.labels)))  # for distinct() at build
        self.labels += w.labels
        self.roles.extend(w.roles)
        w.leaves, w.labels, w.roles = [], [], []

    def batch_raw(self, raw: bytes, reader: ModuleType, name_hashes: list[np.ndarray]) -> None:
        """Read one batch from its text: the plain records in C (:mod:`precnb.io._craw`), the others by :meth:`record`.

        The C reader appends what :meth:`batch` would for every record it can prove plain and hands
        back the span of any other member, which the standard library parses
        (:func:`~precnb.io.msprobe._json.member`) and :meth:`record` reads, in file order; text that
        is not JSON members raises :class:`~precnb.io.msprobe._json.NotBatchableError` (the whole-file
        parse then decides, and words the error). With scalar signatures, the API forward records
        that hold a ``{type, value}`` argument come with their ``input_args`` / ``input_kwargs`` as
        objects for :meth:`~precnb.io._runfacts.FileFacts.api`.
        """
        w = self.walk
        nodes, labels, cols = self.nodes, self.labels, self.cols
        self._parents = []  # of this batch's nodes that had tensors (NodeParts keeps them)
        self._todo = []  # (flags, node, record, parent) for the run facts, in file order
        n_had = len(nodes)
        pos = 0
        while True:
            roles: list[str] = []
            shapes: list[str] = []
            dtypes: list[str] = []
            try:
                got = reader.read_records(raw, pos, self.names, self.parents, labels, roles, shapes, dtypes, nodes,
                                          self._parents, self.counts, self._todo, self.backward is None,
                                          self.is_recompute is None, self.signatures, *self.order)
            except ValueError:  # not a sequence of JSON members
                raise _json.NotBatchableError from None
            self.n_nodes += got[1]
            self.order[2] = got[12]
            name_hashes.append(np.frombuffer(got[6], np.int64))
            if shapes:  # (the distinct texts of the leaves read: none when no leaf was)
                cols.add_raw(got, shapes, dtypes)
                self.roles.extend_coded(got[9], roles)
                self.hashes.append(np.frombuffer(got[5], np.int64))
            back = got[8]
            if back is None:
                break
            start, pos = back
            node, record = _json.member(raw[start:pos])
            self.n_nodes += 1
            name_hashes.append(np.array([hash(node)], np.int64))
            self.record(self.names.get(node, node), record, self.parents.get(node, ""))
            if w.leaves:  # its columns now: the leaves stay in file order
                cols.add_batch(w.leaves, w.labels, self.issues)
                self.hashes.append(np.fromiter(map(hash, w.labels), np.int64, len(w.labels)))
                labels += w.labels
                self.roles.extend(w.roles)
                w.leaves, w.labels, w.roles = [], [], []
        self.facts.batch(self._todo)
        self._todo = []
        self.parts.add(nodes[n_had:], self._parents)

    def record(self, node: str, record: Any, parent: str) -> None:
        """Read one node record with the reference walk (its run facts noted for :meth:`batch`)."""
        w = self.walk
        leaves = w.leaves
        if record.__class__ is not dict:
            if record is not None:  # null records carry nothing
                self.issues.add((self.cols.n + len(leaves), -1), "record", f"{short(node)}: {json_type(record)}")
                w.unread.append((node, "", f"a JSON {json_type(record)}, not an object of sections"))
            return
        if self.probe:
            self.look(node, record)
        if node.startswith(COMM_PREFIXES):
            for g in find_groups({k: record.get(k) for k in ("input_args", "input_kwargs")}):
                self.groups.setdefault(json.dumps(g), node)
                break
        n0 = len(leaves)
        try:
            w.node(node, record)
        except TooDeepError as exc:
            where = short(exc.where, 120)
            raise DumpFormatError(self.rd.dump_file, f"node {short(node, 80)}: values nested more than "
                                                     f"{MAX_DEPTH} levels deep (at {where})") from None
        if len(leaves) > n0:
            self.nodes.append(node)
            self._parents.append(parent)
            self.counts.append(len(leaves) - n0)
        flags = 0
        if "parameters" in record or parent.startswith("optimizer") or (  # OPTIMIZER_NAME's markers hold
                "_fused_" in node or "addcdiv_" in node or "_foreach_lerp_" in node) or node.startswith(
                UNDEFINED_PREFIXES):
            flags = 1
        if node.endswith(".forward") and (not node.startswith(("Module.", "Cell.")) if self.signatures
                                          else node.startswith(_NO_SIGNATURE)):
            flags |= 2
        if flags:
            self._todo.append((flags, node, record, parent))

    def look(self, node: str, record: dict[str, Any]) -> None:
        """Release facts from the first backward and the first forward record (:mod:`.release`)."""
        if self.backward is None and (node.endswith(".backward") or ".backward." in node):
            if "grad_input" in record or "grad_output" in record:
                self.backward = "grad"
            elif "input" in record or "output" in record:
                self.backward = "io"
        elif self.is_recompute is None and (node.endswith(".forward") or ".forward." in node):
            self.is_recompute = "is_recompute" in record
        self.probe = self.backward is None or self.is_recompute is None

    def int_stats(self, c: Mapping[str, Any]) -> str | None:
        """``"null"`` / ``"filled"``: the Mean of the first integer tensor with a dimension (among the first leaves)."""
        dtypes, shapes, null = c["dtype"][:20000], c["shape"], c["null"]
        ints = {d for d in set(dtypes) if dtype_kind(d) == "int"}
        if not ints:
            return None
        for i, d in enumerate(dtypes):
            if d in ints and shapes[i] not in ("[]", ""):
                return "null" if null[i] & 4 else "filled"
        return None

    def coords(self, c: dict[str, Any], n: int) -> dict[str, np.ndarray]:
        """The per-tensor coordinates (final values: the assembler takes them as they are); the lists go."""
        self.names = {}
        parts, nodes, counts = self.parts, self.nodes, self.counts
        self.parts, self.nodes, self.counts = NodeParts(), [], []
        coords: dict[str, np.ndarray] = node_columns(nodes, parts.parents, counts, self.micro, n, parts,
                                                     consume=True)
        del parts, nodes, counts
        coords["role"], coords["dtype"], coords["shape"] = self.roles.array(), c.pop("dtype"), c.pop("shape")
        self.roles = TextColumn()
        return coords

    def build(self, top: Mapping[str, Any], notes: list[str], sides: tuple[Any, Any]) -> FileRecords:
        out: dict[str, str] = {}
        for i, key in enumerate(("task", "level", "framework")):
            v = top.get(key, "")
            if v is not None and not isinstance(v, str):
                self.issues.add((1 << 62, i), "top", f"{key}={short(v)}")
                v = ""
            out[key] = v or ""
        cols = self.cols
        framework = out["framework"] or framework_of_leaf(cols.leaf_type)
        path = self.rd.dump_file
        if not self.n_nodes:
            notes.append(f"{path}: 'data' is empty (nothing was dumped on this rank and step)")
        notes += self.issues.messages(path)
        w = self.walk
        if w.unknown:
            keys = ", ".join(f"{k!r} ({n})" for k, n in w.unknown.items())
            notes.append(f"{path}: {sum(w.unknown.values())} tensor(s) under record key(s) precnb does not know: "
                         f"{keys}; read as {{node}}.{{key}}.N with no role")
        inner = [u for u in w.unread if u[1]]  # records that are not objects have their own line ("record")
        if inner:
            node, where, why = inner[0]
            notes.append(f"{path}: {len(inner)} section(s) or leaf(s) precnb cannot read, not loaded (first: "
                         f"{short(node, 80)} {where}: {why}); see precnb.load_report(ds).unread")
        meta: dict[str, Any] = {"task": out["task"], "level": out["level"], "framework": framework,
                                "path": str(self.rd.path), "comm_groups": self.groups, "warnings": notes}
        if w.unread:
            meta["unread"] = [(str(path), node, where, why) for node, where, why in w.unread[:MAX_UNREAD]]
            meta["unread_count"] = len(w.unread)
        facts = self.facts.result()
        if facts:
            meta["facts"] = facts
        n = cols.n
        c = cols.finish()
        meta["release_facts"] = file_facts(
            top=top, framework=framework, folder=self.rd.path.name, backward=self.backward,
            is_recompute=self.is_recompute, kinds=self.parts.kinds, calls=self.parts.calls,
            has_parameters="parameter" in self.roles, int_stats=self.int_stats(c),
            stack=stack_format(sides[1].raw) if sides[1] is not None else None)
        # what is built from here on is what the dataset keeps: each list it is built from is let go once
        # read (a large file's peak memory is this step's)
        if self.large:
            return_free_memory()  # the batches' value arrays, joined above
        coords: dict[str, Any] = self.coords(c, n)  # (FileRecords takes lists or final arrays)
        labels = self.labels
        self.labels = []
        unique = distinct(labels, np.concatenate(self.hashes) if self.hashes else None)
        self.hashes = []
        if not unique:
            labels = dedup_labels(labels)
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
            meta=meta, unique_labels=unique)


def read_rank_dir(rd: RankDir, *, report: LoadReport | None = None, signatures: bool = True) -> FileRecords:
    """Parse one (step, rank) folder into columnar records (the task run once per file).

    Parameters
    ----------
    rd : RankDir
    report : LoadReport, optional
        Also receives the warnings (they are always in ``meta["warnings"]``).
    signatures : bool
        Whether to note the API calls' scalar-argument checksums (``meta["facts"]["scalar_sigs"]``).
        They are compared between the files of one step only (rank-dependent calls): a step read
        from one file needs none.

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
    with paused_gc():  # millions of fresh containers, no cycles: the collector would only rescan them
        rec = _read(rd, signatures)
    if report is not None:
        report.warnings.extend(rec.meta["warnings"])
    return rec


def _read(rd: RankDir, signatures: bool = True) -> FileRecords:
    side_notes: list[str] = []
    parents, micro, names, construct, stack = read_sides(rd.path, side_notes)
    try:
        large = rd.dump_file.stat().st_size >= _LARGE
    except OSError:
        large = False
    if large:
        return_free_memory()  # construct.json's text and parse (see precnb.io._memory)
    notes: list[str] = []
    f = _File(rd, parents, micro, signatures, names)
    f.large = large
    top: Mapping[str, Any] = {}
    # the batches' text is read in C when the C reader is built (no parse into objects)
    reader = craw() if parents.__class__ is dict else None
    try:
        if reader is not None:
            name_hashes: list[np.ndarray] = []
            # (names maps each of parents' keys to itself; the set: the C reader's optimizer records read, see _craw)
            f.order = [list(parents), list(parents.values()), -1, set()]
            for is_top, raw in _json.raw_parts(rd.dump_file, name_hashes):
                if is_top:
                    top = raw
                else:
                    f.batch_raw(raw, reader, name_hashes)
                    raw = b""
        else:
            for is_top, part in _json.parts(rd.dump_file):
                if is_top:
                    top = part
                else:
                    f.batch(part)
                    part = {}  # freed now, while its objects are still in the caches (not after the next parse)
    except (_json.NotBatchableError, DumpFormatError, OSError):  # the whole-file parse decides (and words the error)
        doc = whole_doc(rd, notes)
        f = _File(rd, parents, micro, signatures, names)
        f.batch(doc["data"])
        top = doc
    f.large = large  # (f is a new one after a whole-file parse)
    if large:
        return_free_memory()  # the last batches' objects
    return f.build(top, notes + side_notes, (construct, stack))
