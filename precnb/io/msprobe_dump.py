"""Reader for msprobe dumps (``dump.json`` + ``construct.json`` + ``stack.json``).

Handles PyTorch and MindSpore writers; tasks statistics, md5 (CRC-32 / XOR), tensor and
structure; levels L0, L1 and mix; ``rank{R}``, bare ``rank`` and ``proc{PID}`` folders;
both stack.json formats; Megatron ``[parent, micro_step]`` construct values; bare
``NaN``/``Infinity`` tokens; missing ``framework``/``level`` keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precnb.errors import DumpFormatError, NotADumpError
from precnb.io._assemble import FileRecords, LoadReport, RecordBuilder
from precnb.io._jsonio import load_json
from precnb.naming import module_path_of, parse_node

__all__ = ["RankDir", "discover", "is_msprobe_dump", "read_rank_dir"]

DUMP_FILES = ("dump.json", "debug.json")
_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^rank(\d*)$")
_PROC = re.compile(r"^proc(\d+)$")
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


def _dump_file(folder: Path) -> Path | None:
    for name in DUMP_FILES:
        p = folder / name
        if p.is_file():
            return p
    return None


def is_msprobe_dump(path: str | Path) -> bool:
    """Whether *path* looks like an msprobe dump root, step folder, rank folder or dump.json.

    Examples
    --------
    >>> is_msprobe_dump("/nonexistent")
    False
    """
    p = Path(path)
    if p.is_file():
        return p.name in DUMP_FILES or (p.suffix == ".json" and _sniff_dump_json(p))
    if not p.is_dir():
        return False
    if _dump_file(p):
        return True
    try:
        for child in p.iterdir():
            if child.is_dir() and (_RANK.match(child.name) or _PROC.match(child.name)
                                   or _STEP.match(child.name) or child.name in ("graph", "pynative")):
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


def _int_or(m: re.Match[str] | None, default: int = 0) -> int:
    if m is None or not m.group(1):
        return default
    return int(m.group(1))


def _rank_dirs_in_step(step_dir: Path, step: int, report: LoadReport) -> list[RankDir]:
    ranks: list[RankDir] = []
    procs: list[Path] = []
    for child in sorted(step_dir.iterdir(), key=lambda c: c.name):
        if not child.is_dir():
            continue
        if _RANK.match(child.name):
            df = _dump_file(child)
            if df is None:
                report.skipped.append((str(child), "no dump.json in rank folder (job died before the first flush?)"))
                continue
            ranks.append(RankDir(child, step, _int_or(_RANK.match(child.name)), df))
        elif _PROC.match(child.name):
            procs.append(child)
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
                report.skipped.append((str(p), "no dump.json in proc folder"))
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
        When nothing loadable is found.
    """
    report = report if report is not None else LoadReport()
    p = Path(path)
    if not p.exists():
        raise NotADumpError(f"{p}: no such file or directory")
    if p.is_file():
        if p.name not in DUMP_FILES and not _sniff_dump_json(p):
            raise NotADumpError(f"{p}: not an msprobe dump.json")
        folder = p.parent
        return [RankDir(folder, _step_of(folder.parent), _rank_of(folder), p)]
    df = _dump_file(p)
    if df is not None:  # a rank folder
        return [RankDir(p, _step_of(p.parent), _rank_of(p), df)]
    found: list[RankDir] = []
    children = sorted((c for c in p.iterdir() if c.is_dir()), key=lambda c: c.name)
    steps = [c for c in children if _STEP.match(c.name)]
    if steps:
        for s in steps:
            found += _rank_dirs_in_step(s, int(_STEP.match(s.name).group(1)), report)  # type: ignore[union-attr]
    elif any(_RANK.match(c.name) or _PROC.match(c.name) for c in children):
        found = _rank_dirs_in_step(p, _step_of(p), report)
    else:
        wrappers = [c for c in children if c.name in ("pynative", "graph")]
        if wrappers:
            # MindSpore writes graph/ and pynative/ trees; read pynative (dynamic graph) first
            chosen = sorted(wrappers, key=lambda c: c.name != "pynative")[0]
            for other in wrappers:
                if other is not chosen:
                    report.warnings.append(f"{other}: second MindSpore tree; open it separately")
            return discover(chosen, report)
    if not found:
        raise NotADumpError(f"{p}: no msprobe dump found (expected step*/rank*/dump.json below it)")
    return sorted(found, key=lambda r: (r.step, r.rank))


def _step_of(folder: Path) -> int:
    return _int_or(_STEP.match(folder.name))


def _rank_of(folder: Path) -> int:
    return _int_or(_RANK.match(folder.name))


def _is_tensor_leaf(v: dict[str, Any]) -> bool:
    t = v.get("type")
    return isinstance(t, str) and t not in _NON_TENSOR_TYPES and "dtype" in v and "shape" in v


def _walk(value: Any, prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (label, leaf) for every tensor leaf below *value*, msprobe compare naming."""
    if isinstance(value, dict):
        if _is_tensor_leaf(value):
            yield prefix, value
            return
        for k, v in value.items():
            if isinstance(v, (dict, list)):
                yield from _walk(v, f"{prefix}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, (dict, list)):
                yield from _walk(v, f"{prefix}.{i}")


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
            for label, lf in _walk(leaf, f"{node}.{pname}"):
                yield label, "grad", lf
        return
    sections = _BACKWARD_SECTIONS if node.endswith(".backward") or ".backward." in node else _FORWARD_SECTIONS
    used = False
    for key, role in sections:
        if key in record:
            used = True
            section = "parameters" if key == "parameters" else ("output" if key == "output" else "input")
            for label, lf in _walk(record[key], f"{node}.{section}"):
                yield label, role, lf
    if not used:  # debug.json and unknown shapes: walk everything
        for label, lf in _walk(record, node):
            yield label, "", lf


def _find_groups(value: Any, depth: int = 0) -> Iterator[list[int]]:
    """``group_ranks`` of ProcessGroup leaves (communication records)."""
    if depth > 6:
        return
    if isinstance(value, dict):
        g = value.get("group_ranks")
        if isinstance(g, list) and all(isinstance(x, int) for x in g):
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
            if isinstance(ms, int):
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
                    out[str(n)] = [str(f) for f in frames] if isinstance(frames, list) else []
        return out
    return {str(k): [str(f) for f in v] for k, v in raw.items() if isinstance(v, list)}


def _detect_framework(data: dict[str, Any]) -> str:
    for rec in data.values():
        for _, _, leaf in _leaves_of("x.0.forward", rec, "api"):
            t = leaf.get("type", "")
            if t.startswith("mindspore"):
                return "mindspore"
            if t.startswith("torch"):
                return "pytorch"
    return "pytorch"


def read_rank_dir(rd: RankDir, *, report: LoadReport | None = None) -> FileRecords:
    """Parse one (step, rank) folder into columnar records.

    Parameters
    ----------
    rd : RankDir
    report : LoadReport, optional
        Receives warnings about missing side files.

    Returns
    -------
    FileRecords

    Raises
    ------
    DumpFormatError
        When dump.json is unreadable or not an msprobe dump.
    """
    doc = load_json(rd.dump_file)
    if isinstance(doc, dict) and "data" not in doc and doc and all(
        isinstance(v, dict) and parse_node(k).direction for k, v in doc.items()
    ):
        doc = {"data": doc}  # a bare data object (e.g. an api_accuracy_checker forward.json)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        raise DumpFormatError(rd.dump_file, "not an msprobe dump.json (no 'data' object)")
    data: dict[str, Any] = doc["data"]
    parents: dict[str, str] = {}
    micro: dict[str, int] = {}
    stacks: dict[str, list[str]] = {}
    cpath, spath = rd.path / "construct.json", rd.path / "stack.json"
    for side, parse in ((cpath, "construct"), (spath, "stack")):
        if not side.is_file():
            continue
        try:
            raw = load_json(side)
        except DumpFormatError as exc:
            if report is not None:
                report.warnings.append(f"{exc} (ignored; values still loaded)")
            continue
        if parse == "construct":
            parents, micro = _parse_construct(raw)
        else:
            stacks = _parse_stack(raw)
    b = RecordBuilder(rd.step, rd.rank)
    data_names: list[str] = []
    any_data_name = False
    groups: dict[str, list[int]] = {}
    for node, record in data.items():
        nn = parse_node(node)
        if node.startswith(("Distributed.", "MintDistributed.")) and isinstance(record, dict):
            for g in _find_groups({k: record.get(k) for k in ("input_args", "input_kwargs")}):
                groups.setdefault(json.dumps(g), node)
                break
        parent = parents.get(node, "")
        module = nn.module if nn.kind != "api" else module_path_of(parent)
        for label, role, leaf in _leaves_of(node, record, nn.kind):
            stats = {"max": leaf.get("Max"), "min": leaf.get("Min"),
                     "mean": leaf.get("Mean"), "norm": leaf.get("Norm")}
            shape = leaf.get("shape")
            dn = leaf.get("data_name")
            if dn:
                any_data_name = True
            data_names.append(str(dn) if dn else "")
            crc = leaf.get("md5")
            b.add(
                label,
                stats,
                shape=shape if isinstance(shape, list) else None,
                crc=str(crc) if crc is not None else None,
                node=node,
                module=module,
                api=nn.api,
                kind=nn.kind,
                direction=nn.direction,
                role=role,
                dtype=str(leaf.get("dtype", "")),
                parent=parent or "",
                call=nn.call,
                micro_step=micro.get(node, -1),
            )
    framework = doc.get("framework") or _detect_framework(data)
    meta = {
        "task": doc.get("task", ""),
        "level": doc.get("level", ""),
        "framework": framework,
        "path": str(rd.path),
    }
    meta["comm_groups"] = groups
    rec = b.build(construct=parents, stacks=stacks, meta=meta)
    if any_data_name:
        rec.strings["data_name"] = data_names
    return rec
