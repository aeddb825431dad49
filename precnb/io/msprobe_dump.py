"""Reader for msprobe dumps (``dump.json`` + ``construct.json`` + ``stack.json``).

Handles PyTorch and MindSpore writers; tasks statistics, md5 (CRC-32 / XOR), tensor and
structure; levels L0, L1 and mix; ``rank{R}``, bare ``rank`` and ``proc{PID}`` folders;
both stack.json formats; Megatron ``[parent, micro_step]`` construct values; bare
``NaN``/``Infinity`` tokens; missing ``framework``/``level`` keys.

Broken and hostile input
------------------------
Nothing below raises anything but :class:`~precnb.errors.PrecnbError` subclasses:

- an unreadable, empty, truncated or non-JSON dump.json, one that is not an object with a
  ``data`` object, or values nested more than :data:`MAX_DEPTH` levels deep, is a
  :class:`~precnb.errors.DumpFormatError` naming the file and the position or node; the other
  ranks still load (``open_run`` lists the file in the load report);
- values of an unexpected type are loaded as far as they make sense and reported in
  ``FileRecords.meta["warnings"]`` (one line per kind of problem, with the first example):
  a statistic that is not a number, a boolean, null or a numeric string (``"nan"``,
  ``"1e400"``) is null; a shape that is not a list of non-negative integers (with fewer
  than 2**62 elements) gives ``numel == -1`` and ``shape == ""``; a dtype, md5 or data_name
  that is not a string is ignored; a node record that is not an object is skipped;
- numbers beyond the float range are ±inf, call counters and micro steps beyond 2**62 are -1;
- a ``data_name`` that would leave ``dump_tensor_data/`` (``../../etc/passwd``, an absolute
  path) is kept as written but reported; :func:`precnb.load_tensor` refuses it;
- unreadable construct.json / stack.json are reported and ignored (values still load); missing
  ones are normal (``extra_info=false``);
- folders: unreadable folders are reported, symlinks that loop back to an ancestor folder are
  ignored (reported), rank / step numbers beyond 2**31 are reported and skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from precnb.errors import DumpFormatError, NotADumpError
from precnb.io import _why
from precnb.io._assemble import FileRecords, LoadReport, RecordBuilder, stat_value
from precnb.io._dupes import keep_one_per_number
from precnb.io._jsonio import load_json
from precnb.io._runfacts import file_facts
from precnb.naming import NodeName, module_path_of, parse_node

__all__ = ["MAX_DEPTH", "RankDir", "discover", "is_msprobe_dump", "read_rank_dir"]

DUMP_FILES = ("dump.json", "debug.json")
#: values nested deeper than this below a node record make the file unreadable
MAX_DEPTH = 64
_MAX_INDEX = 2**31 - 1  # step / rank numbers
_MAX_COUNTER = 2**62  # call counters, micro steps, numel
_STEP = re.compile(r"^step([0-9]+)$")
_RANK = re.compile(r"^rank([0-9]*)$")
_PROC = re.compile(r"^proc([0-9]+)$")
_NON_TENSOR_TYPES = {"slice", "ellipsis", "torch.Size", "torch.dtype", "torch.device", "mindspore.dtype"}


@dataclass(frozen=True)
class RankDir:
    """One (step, rank) folder of a dump."""

    path: Path
    step: int
    rank: int
    dump_file: Path

    @property
    def key(self) -> str:
        """``"step,rank"`` text key."""
        return f"{self.step},{self.rank}"


# ------------------------------------------------------------------------------ filesystem
def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except OSError:  # permission denied on a parent, name too long, ...
        return False


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except OSError:
        return False


def _list_dir(p: Path) -> list[Path]:
    """Children of *p* sorted by name; raises OSError when *p* cannot be listed."""
    return sorted(p.iterdir(), key=lambda c: c.name)


def _why_os(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _is_link(p: Path) -> bool:
    try:
        return p.is_symlink()
    except OSError:
        return False


def _dump_file(folder: Path) -> Path | None:
    for name in DUMP_FILES:
        p = folder / name
        if _is_file(p):
            return p
    return None


def _no_dump_reason(folder: Path) -> str:
    """Why a rank/proc folder has no readable dump.json: the real reason, not a guess."""
    for name in DUMP_FILES:
        f = folder / name
        special = _why.not_a_file_reason(f)
        if special:
            return special
        if f.is_symlink() and not f.exists():
            return f"{name}: {_why.missing_reason(f)}"
    try:
        next(folder.iterdir(), None)
    except OSError as exc:
        return f"cannot list folder: {_why_os(exc)}"
    return "no dump.json in rank folder (job died before the first flush?)"


def _loops_back(child: Path) -> bool:
    """Whether *child* is a symlink to its own folder or one of that folder's ancestors."""
    try:
        if not child.is_symlink():
            return False
        target = child.resolve()
        here = child.parent.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink cycle (Python < 3.13): not a folder at all
        return False
    return target == here or target in here.parents


def _number(m: re.Match[str] | None, default: int = 0) -> int | None:
    """The folder number of a step/rank/proc match; None when beyond 2**31."""
    if m is None or not m.group(1):
        return default
    digits = m.group(1)
    if len(digits) > 10 or int(digits) > _MAX_INDEX:
        return None
    return int(digits)


def is_msprobe_dump(path: str | Path) -> bool:
    """Whether *path* looks like an msprobe dump root, step folder, rank folder or dump.json.

    Examples
    --------
    >>> is_msprobe_dump("/nonexistent")
    False
    """
    p = Path(path)
    if _is_file(p):
        return p.name in DUMP_FILES or (p.suffix == ".json" and _sniff_dump_json(p))
    if not _is_dir(p):
        return False
    if _dump_file(p):
        return True
    try:
        for child in p.iterdir():
            if (_RANK.match(child.name) or _PROC.match(child.name) or _STEP.match(child.name)
                    or child.name in ("graph", "pynative")) and _is_dir(child):
                return True
    except OSError:
        return False
    return False


def _sniff_dump_json(p: Path) -> bool:
    """A renamed dump.json (``{"task": .., "data": {..}}``) or a bare ``data`` object."""
    try:
        with p.open("rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if b'"data"' in head and (b'"task"' in head or b'"level"' in head or b'"framework"' in head):
        return True
    return bool(re.search(rb'"[A-Za-z_]+\.[^"]*\.(forward|backward)[^"]*"\s*:\s*\{', head)) and (
        b'"input_args"' in head or b'"output"' in head or b'"input"' in head)


def _rank_dirs_in_step(step_dir: Path, step: int, report: LoadReport) -> list[RankDir]:
    ranks: list[RankDir] = []
    procs: list[Path] = []
    try:
        children = _list_dir(step_dir)
    except OSError as exc:
        report.skipped.append((str(step_dir), f"cannot list folder: {_why_os(exc)}"))
        return ranks
    for child in children:
        rank_m, proc_m = _RANK.match(child.name), _PROC.match(child.name)
        if not (rank_m or proc_m):
            continue
        if _loops_back(child):
            report.skipped.append((str(child), "ignored: symlink to one of its parent folders (a loop)"))
            continue
        if not _is_dir(child):
            if _is_link(child):
                report.skipped.append((str(child), "broken symlink"))
            continue
        if rank_m:
            rank = _number(rank_m)
            if rank is None:
                report.skipped.append((str(child), f"rank number out of range (0..{_MAX_INDEX})"))
                continue
            df = _dump_file(child)
            if df is None:
                report.skipped.append((str(child), _no_dump_reason(child)))
                continue
            ranks.append(RankDir(child, step, rank, df))
        else:
            procs.append(child)
    ranks = [rd for _, rd in keep_one_per_number([(rd.rank, rd) for rd in ranks], "rank",
                                                 lambda n: f"rank{n}", report, name=lambda rd: rd.path.name,
                                                 where=lambda rd: str(rd.path))]
    procs = [p for _, p in keep_one_per_number([(_number(_PROC.match(p.name)), p) for p in procs],
                                                "process", lambda n: f"proc{n}", report,
                                                name=lambda p: p.name)]
    if procs and ranks:
        for p in procs:
            report.skipped.append((str(p), "ignored: proc* folder (rank* folders exist; msprobe tools do the same)"))
    elif procs:
        if len(procs) > 1:
            report.warnings.append(
                f"{step_dir}: {len(procs)} proc* folders; numbered as ranks 0..{len(procs) - 1} by name"
            )
        for i, p in enumerate(procs):
            df = _dump_file(p)
            if df is None:
                report.skipped.append((str(p), _no_dump_reason(p)))
                continue
            ranks.append(RankDir(p, step, i, df))
    return ranks


def discover(path: str | Path, report: LoadReport | None = None) -> list[RankDir]:
    """Find the (step, rank) folders below *path*.

    Parameters
    ----------
    path : str or Path
        A dump root (holding ``step*``), a ``stepN`` folder, a rank folder, or a dump.json.
    report : LoadReport, optional
        Receives skipped folders.

    Returns
    -------
    list of RankDir
        Sorted by (step, rank).

    Raises
    ------
    NotADumpError
        When nothing loadable is found (the reasons of skipped folders are included).

    Examples
    --------
    >>> discover("/nonexistent")
    Traceback (most recent call last):
    ...
    precnb.errors.NotADumpError: /nonexistent: no such file or directory
    """
    report = report if report is not None else LoadReport()
    p = Path(path)
    try:
        exists = p.exists()
    except OSError as exc:
        raise NotADumpError(f"{p}: cannot access: {_why_os(exc)}") from None
    if not exists:
        raise NotADumpError(f"{p}: {_why.missing_reason(p)}")
    special = _why.not_a_file_reason(p, "it") if _why.kind_of(p) not in (None, "a folder") else None
    if special:
        raise NotADumpError(f"{p}: {special}")
    if _is_file(p):
        if p.name not in DUMP_FILES and not _sniff_dump_json(p):
            raise NotADumpError(f"{p}: not an msprobe dump.json")
        folder = p.parent
        return [RankDir(folder, _step_of(folder.parent), _rank_of(folder), p)]
    df = _dump_file(p)
    if df is not None:  # a rank folder
        return [RankDir(p, _step_of(p.parent), _rank_of(p), df)]
    try:
        children = [c for c in _list_dir(p) if _is_dir(c) or _is_link(c)]
    except OSError as exc:
        raise NotADumpError(f"{p}: cannot list folder: {_why_os(exc)}") from None
    found: list[RankDir] = []
    steps = [c for c in children if _STEP.match(c.name)]
    skipped_before = len(report.skipped)
    if steps:
        # step1 beside step01: keep one, report the other (their values would overwrite each other)
        numbered = [(n, s) for s in steps if _is_dir(s) and not _loops_back(s)
                    and (n := _number(_STEP.match(s.name))) is not None]
        kept = {id(s) for _, s in keep_one_per_number(numbered, "step", lambda n: f"step{n}", report,
                                                      name=lambda s: s.name)}
        steps = [s for s in steps if id(s) in kept or all(s is not t for _, t in numbered)]
        for s in steps:
            if _loops_back(s):
                report.skipped.append((str(s), "ignored: symlink to one of its parent folders (a loop)"))
                continue
            if not _is_dir(s):
                report.skipped.append((str(s), "broken symlink"))
                continue
            step = _number(_STEP.match(s.name))
            if step is None:
                report.skipped.append((str(s), f"step number out of range (0..{_MAX_INDEX})"))
                continue
            found += _rank_dirs_in_step(s, step, report)
    elif any(_RANK.match(c.name) or _PROC.match(c.name) for c in children):
        found = _rank_dirs_in_step(p, _step_of(p), report)
    else:
        wrappers = [c for c in children if c.name in ("pynative", "graph") and _is_dir(c) and not _loops_back(c)]
        if wrappers:
            # MindSpore writes graph/ and pynative/ trees; read pynative (dynamic graph) first
            chosen = sorted(wrappers, key=lambda c: c.name != "pynative")[0]
            for other in wrappers:
                if other is not chosen:
                    report.warnings.append(f"{other}: second MindSpore tree; open it separately")
            return discover(chosen, report)
    if not found:
        failures = [f"{q}: {r}" for q, r in report.skipped[skipped_before:] if not r.startswith("ignored")]
        reasons = f" ({'; '.join(failures[:3])})" if failures else ""
        raise NotADumpError(f"{p}: no msprobe dump found (expected step*/rank*/dump.json below it){reasons}")
    return sorted(found, key=lambda r: (r.step, r.rank))


def _step_of(folder: Path) -> int:
    return _number(_STEP.match(folder.name)) or 0


def _rank_of(folder: Path) -> int:
    return _number(_RANK.match(folder.name)) or 0


# ------------------------------------------------------------------------------ leaf values
class _TooDeepError(Exception):
    def __init__(self, where: str) -> None:
        self.where = where


def _short(v: Any, n: int = 40) -> str:
    text = repr(v)
    return text if len(text) <= n else text[: n - 3] + "..."


class _Issues:
    """Problems met in one file: counted per kind, reported with the first example."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first: dict[str, str] = {}

    def add(self, kind: str, example: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.first.setdefault(kind, example)

    def messages(self, where: Path) -> list[str]:
        text = {
            "stat": "statistic(s) neither a number nor null; loaded as null",
            "shape": "tensor(s) whose shape is not a list of non-negative integers; numel unknown",
            "field": "dtype/md5/data_name value(s) that are not strings; ignored",
            "record": "node record(s) that are not JSON objects; skipped",
            "data_name": "data_name(s) pointing outside dump_tensor_data; precnb.load_tensor refuses them",
            "top": "top-level task/level/framework value(s) that are not strings; ignored",
        }
        return [f"{where}: {n} {text[k]} (first: {self.first[k]})" for k, n in self.counts.items()]


_stat_value = stat_value  # the reference rules (also used by the fast parser)


def _valid_shape(shape: Any) -> list[int] | None:
    """*shape* when it is a list of non-negative ints with fewer than 2**62 elements, else None."""
    if not isinstance(shape, list):
        return None
    n = 1
    for d in shape:
        if d.__class__ is not int or d < 0 or d > _MAX_COUNTER:
            return None
        n *= d
    return shape if n < _MAX_COUNTER else None


def _unsafe_data_name(name: str) -> bool:
    """Whether a data_name would resolve outside ``dump_tensor_data/``."""
    if "\x00" in name or not name.strip():
        return True
    posix = PurePosixPath(name.replace("\\", "/"))
    return posix.is_absolute() or ".." in posix.parts or bool(PureWindowsPath(name).drive)


def _counter(v: Any) -> int:
    return v if v.__class__ is int and -1 <= v <= _MAX_COUNTER else -1


def _node_name(node: str) -> NodeName:
    """:func:`parse_node`, with call counters beyond 2**62 (or 4300 digits) read as -1."""
    try:
        nn = parse_node(node)
    except ValueError:  # a counter of more than 4300 digits
        return NodeName(node, "api", node, "", "", -1)
    return nn if -1 <= nn.call <= _MAX_COUNTER else nn._replace(call=-1)


def _module_of(parent: str) -> str:
    try:
        return module_path_of(parent)
    except ValueError:
        return ""


def _is_tensor_leaf(v: dict[str, Any]) -> bool:
    t = v.get("type")
    return isinstance(t, str) and t not in _NON_TENSOR_TYPES and "dtype" in v and "shape" in v


def _walk(value: Any, prefix: str, depth: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (label, leaf) for every tensor leaf below *value*, msprobe compare naming.

    Raises ``_TooDeepError`` beyond :data:`MAX_DEPTH` levels.
    """
    if depth > MAX_DEPTH:
        raise _TooDeepError(prefix)
    if isinstance(value, dict):
        if _is_tensor_leaf(value):
            yield prefix, value
            return
        for k, v in value.items():
            if isinstance(v, (dict, list)):
                yield from _walk(v, f"{prefix}.{k}", depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, (dict, list)):
                yield from _walk(v, f"{prefix}.{i}", depth + 1)


# parameters are inputs of the forward: they come before the outputs in execution order
_FORWARD_SECTIONS = (("input_args", "input"), ("input_kwargs", "input"), ("parameters", "parameter"),
                     ("output", "output"))
_BACKWARD_SECTIONS = (("input", "input"), ("output", "output"))


def _leaves_of(node: str, record: Any, kind: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    if not isinstance(record, dict):
        return
    if kind == "param_grad":
        for pname, val in record.items():
            leaf = val[0] if isinstance(val, list) and len(val) == 1 else val
            for label, lf in _walk(leaf, f"{node}.{pname}", 1):
                yield label, "grad", lf
        return
    sections = _BACKWARD_SECTIONS if node.endswith(".backward") or ".backward." in node else _FORWARD_SECTIONS
    used = False
    for key, role in sections:
        if key in record:
            used = True
            section = "parameters" if key == "parameters" else ("output" if key == "output" else "input")
            for label, lf in _walk(record[key], f"{node}.{section}", 1):
                yield label, role, lf
    if not used:  # debug.json and unknown shapes: walk everything
        for label, lf in _walk(record, node):
            yield label, "", lf


def _find_groups(value: Any, depth: int = 0) -> Iterator[list[int]]:
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


def _parse_construct(raw: Any) -> tuple[dict[str, str], dict[str, int]]:
    parents: dict[str, str] = {}
    micro: dict[str, int] = {}
    if not isinstance(raw, dict):
        return parents, micro
    for node, val in raw.items():
        if node == "megatron_micro_step_number":
            continue
        if isinstance(val, list) and len(val) == 2:  # Megatron [parent, micro_step]
            parent, ms = val
            if ms.__class__ is int and 0 <= ms <= _MAX_COUNTER:
                micro[node] = ms
            val = parent
        parents[node] = val if isinstance(val, str) else ""
    return parents, micro


def _parse_stack(raw: Any) -> dict[str, list[str]]:
    if not isinstance(raw, dict):
        return {}
    first = raw.get("0")
    if isinstance(first, list) and len(first) == 2 and isinstance(first[0], list):
        out: dict[str, list[str]] = {}
        for group in raw.values():
            if isinstance(group, list) and len(group) == 2:
                nodes, frames = group
                for n in nodes if isinstance(nodes, list) else []:
                    if isinstance(n, str):
                        out[n] = [f for f in frames if isinstance(f, str)] if isinstance(frames, list) else []
        return out
    return {k: [f for f in v if isinstance(f, str)] for k, v in raw.items() if isinstance(v, list)}


def _detect_framework(data: dict[str, Any]) -> str:
    try:
        for rec in data.values():
            for _, _, leaf in _leaves_of("x.0.forward", rec, "api"):
                t = leaf.get("type", "")
                if t.startswith("mindspore"):
                    return "mindspore"
                if t.startswith("torch"):
                    return "pytorch"
    except _TooDeepError:
        pass
    return "pytorch"


def _side_tables(rd: RankDir, notes: list[str]) -> tuple[dict[str, str], dict[str, int], dict[str, list[str]]]:
    parents: dict[str, str] = {}
    micro: dict[str, int] = {}
    stacks: dict[str, list[str]] = {}
    for name in ("construct.json", "stack.json"):
        side = rd.path / name
        if not _is_file(side):
            special = _why.not_a_file_reason(side) or (
                f"{name}: {_why.missing_reason(side)}" if side.is_symlink() and not side.exists() else None)
            if special:  # a FIFO or /dev/zero is never opened; say why the side table is missing
                notes.append(f"{side}: {special} (ignored; values still loaded without "
                             f"{'module paths' if name == 'construct.json' else 'stack frames'})")
            continue
        try:
            raw = load_json(side, notes)
        except DumpFormatError as exc:
            notes.append(f"{exc} (ignored; values still loaded)")
            continue
        if not isinstance(raw, dict):
            notes.append(f"{side}: holds a JSON {type(raw).__name__}, not an object (ignored; values still loaded)")
            continue
        if name == "construct.json":
            parents, micro = _parse_construct(raw)
        else:
            stacks = _parse_stack(raw)
    return parents, micro, stacks


def read_rank_dir(rd: RankDir, *, report: LoadReport | None = None) -> FileRecords:
    """Parse one (step, rank) folder into columnar records.

    Parameters
    ----------
    rd : RankDir
    report : LoadReport, optional
        Also receives the warnings (they are always in ``meta["warnings"]``).

    Returns
    -------
    FileRecords
        ``meta["warnings"]`` lists what was repaired or ignored (unreadable side files,
        values of unexpected types, unsafe data_name values, ...).

    Raises
    ------
    DumpFormatError
        When dump.json is unreadable or not an msprobe dump, naming the position or node.
    """
    notes: list[str] = []
    doc = load_json(rd.dump_file, notes)
    if isinstance(doc, dict) and "data" not in doc and doc and all(
        isinstance(v, dict) and _node_name(k).direction for k, v in doc.items()
    ):
        doc = {"data": doc}  # a bare data object (e.g. an api_accuracy_checker forward.json)
    if not isinstance(doc, dict):
        raise DumpFormatError(rd.dump_file, f"not an msprobe dump.json: holds a JSON {_json_type(doc)}, "
                                            "expected an object with a 'data' object")
    if "data" not in doc:
        raise DumpFormatError(rd.dump_file, "not an msprobe dump.json (no 'data' object)")
    if not isinstance(doc["data"], dict):
        raise DumpFormatError(rd.dump_file, f"not an msprobe dump.json: 'data' is a JSON {_json_type(doc['data'])}, "
                                            "expected an object of node records")
    data: dict[str, Any] = doc["data"]
    parents, micro, stacks = _side_tables(rd, notes)
    issues = _Issues()
    b = RecordBuilder(rd.step, rd.rank)
    data_names: list[str] = []
    any_data_name = False
    groups: dict[str, list[int]] = {}
    leaf_type = ""
    for node, record in data.items():
        if not isinstance(record, dict):
            if record is not None:  # null records carry nothing
                issues.add("record", f"{_short(node)}: {_json_type(record)}")
            continue
        nn = _node_name(node)
        if node.startswith(("Distributed.", "MintDistributed.")):
            for g in _find_groups({k: record.get(k) for k in ("input_args", "input_kwargs")}):
                groups.setdefault(json.dumps(g), node)
                break
        parent = parents.get(node, "")
        module = nn.module if nn.kind != "api" else _module_of(parent)
        call, ms = _counter(nn.call), _counter(micro.get(node, -1))
        try:
            leaves = list(_leaves_of(node, record, nn.kind))
        except _TooDeepError as exc:
            raise DumpFormatError(rd.dump_file, f"node {_short(node, 80)}: values nested more than {MAX_DEPTH} "
                                                f"levels deep (at {_short(exc.where, 120)})") from None
        for label, role, leaf in leaves:
            stats: dict[str, float | None] = {}
            for stat, key in (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "Norm")):
                try:
                    stats[stat] = _stat_value(leaf.get(key))
                except TypeError:
                    stats[stat] = None
                    issues.add("stat", f"{label} {key}={_short(leaf.get(key))}")
            shape = leaf.get("shape")
            valid = _valid_shape(shape)
            if valid is None:
                issues.add("shape", f"{label} shape={_short(shape)}")
            dtype = leaf.get("dtype")
            if not isinstance(dtype, str):
                if dtype is not None:
                    issues.add("field", f"{label} dtype={_short(dtype)}")
                dtype = ""
            crc = leaf.get("md5")
            if crc is not None and not isinstance(crc, str):
                issues.add("field", f"{label} md5={_short(crc)}")
                crc = ""
            dn = leaf.get("data_name")
            if dn is not None and not isinstance(dn, str):
                issues.add("field", f"{label} data_name={_short(dn)}")
                dn = None
            if dn:
                any_data_name = True
                if _unsafe_data_name(dn):
                    issues.add("data_name", f"{label} data_name={_short(dn, 80)}")
            data_names.append(dn or "")
            if not leaf_type and leaf["type"].startswith(("torch", "mindspore")):
                leaf_type = leaf["type"]
            b.add(
                label,
                stats,
                shape=valid,
                crc=crc,
                node=node,
                module=module,
                api=nn.api,
                kind=nn.kind,
                direction=nn.direction,
                role=role,
                dtype=dtype,
                parent=parent or "",
                call=call,
                micro_step=ms,
            )
    top: dict[str, str] = {}
    for key in ("task", "level", "framework"):
        v = doc.get(key, "")
        if v is not None and not isinstance(v, str):
            issues.add("top", f"{key}={_short(v)}")
            v = ""
        top[key] = v or ""
    framework = top["framework"] or ("mindspore" if leaf_type.startswith("mindspore") else "pytorch")
    if not data:
        notes.append(f"{rd.dump_file}: 'data' is empty (nothing was dumped on this rank and step)")
    notes += issues.messages(rd.dump_file)
    meta = {
        "task": top["task"],
        "level": top["level"],
        "framework": framework,
        "path": str(rd.path),
        "comm_groups": groups,
        "warnings": notes,
    }
    facts = file_facts(data, parents)
    if facts:
        meta["facts"] = facts
    rec = b.build(construct=parents, stacks=stacks, meta=meta)
    if any_data_name:
        rec.strings["data_name"] = data_names
    if report is not None:
        report.warnings.extend(notes)
    return rec


def _json_type(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(v), type(v).__name__)
