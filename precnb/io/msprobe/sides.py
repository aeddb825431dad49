"""construct.json (node → parent module, Megatron micro steps) and stack.json (node → call stack).

Both are the same for every file of a run, so each distinct content is parsed once per
process: the parse task reads the bytes and a digest, checks them once, and hands them to the
assembler as :class:`~precnb.io._assemble.SharedTable` objects, which parse each distinct table
once for the whole run (only the raw bytes cross to and from worker processes).

A missing side file is normal (``extra_info=false``); an unreadable one, or one that does not
hold a JSON object, is reported in the file's warnings and ignored (values still load).

Examples
--------
>>> parse_construct({"Functional.linear.0.forward": ["Module.fc.Linear.forward.0", 3]})
({'Functional.linear.0.forward': 'Module.fc.Linear.forward.0'}, {'Functional.linear.0.forward': 3})
>>> parse_stack({"0": [["Functional.linear.0.forward"], ["File a.py, line 1"]]})
{'Functional.linear.0.forward': ['File a.py, line 1']}
"""

from __future__ import annotations

import hashlib
import itertools
import operator
from pathlib import Path
from typing import Any, NamedTuple

from precnb.errors import DumpFormatError
from precnb.io import _why
from precnb.io._assemble import SharedTable
from precnb.io._cext import craw
from precnb.io._fs import is_file, open_regular
from precnb.io._jsonio import loads_json
from precnb.io.msprobe.values import MAX_COUNTER

__all__ = ["Sides", "parse_construct", "parse_stack", "read_sides"]

_CONSTRUCT: dict[bytes, tuple[dict[str, str], dict[str, int], dict[str, str] | None]] = {}  # digest -> parsed
_GOOD_STACKS: set[bytes] = set()
_CACHE_MAX = 8 << 20  # a larger construct.json (one huge file) is parsed where it is used, not kept
_PLAIN_PARENTS = frozenset({str, type(None)})


def parse_construct(raw: Any) -> tuple[dict[str, str], dict[str, int]]:
    """(node → parent, node → Megatron micro step) of a parsed construct.json.

    The usual table (every value a string or null) is returned as *raw* itself, its nulls set to
    ``""`` in place: a construct.json of a large dump holds millions of nodes, and a copy of it
    costs a second or more.
    """
    parents: dict[str, str] = {}
    micro: dict[str, int] = {}
    if not isinstance(raw, dict):
        return parents, micro
    if set(map(type, raw.values())) <= _PLAIN_PARENTS and "megatron_micro_step_number" not in raw:
        for node in list(itertools.compress(raw, map(operator.is_, raw.values(), itertools.repeat(None)))):
            raw[node] = ""  # the roots (no parent); the values of existing keys: the order is kept
        # a few thousand parents for hundreds of thousands of nodes: one string object per distinct parent
        # (the parser makes a new one for every value); the values of existing keys: the order is kept
        one: dict[str, str] = {}
        raw.update(zip(raw, map(one.setdefault, raw.values(), raw.values()), strict=True))
        return raw, micro
    for node, val in raw.items():
        if node == "megatron_micro_step_number":
            continue
        if isinstance(val, list) and len(val) == 2:  # Megatron [parent, micro_step]
            parent, ms = val
            if ms.__class__ is int and 0 <= ms <= MAX_COUNTER:
                micro[node] = ms
            val = parent
        parents[node] = val if isinstance(val, str) else ""
    return parents, micro


def parse_stack(raw: Any) -> dict[str, list[str]]:
    """Node → frames of a parsed stack.json (both msprobe layouts)."""
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


def plain_construct(raw: bytes) -> tuple[dict[str, str], dict[str, str]] | None:
    """(node → parent, node → node) of a plain construct.json's bytes read in C, or None.

    None when :mod:`precnb.io._craw` is not built (or switched off) or the text is not the plain
    layout (see ``precnb/io/_craw_construct.c``); :func:`parse_construct` of the parsed text then
    gives the same parents. The second table maps each node to the parents table's own key object
    (the intern table of :mod:`precnb.io.msprobe.parse`). One pass over the bytes instead of a
    parse into a dict, its normalisation and the intern table (a large dump's construct.json holds
    over a million nodes).

    Examples
    --------
    >>> got = plain_construct(b'{"f.0.forward": "Module.m.M.forward.0", "Module.m.M.forward.0": null}')
    >>> got is None or got[0] == {"f.0.forward": "Module.m.M.forward.0", "Module.m.M.forward.0": ""}
    True
    """
    reader = craw()
    return None if reader is None else reader.construct_table(raw)


def construct_table(raw: bytes) -> dict[str, str]:
    """Node → parent of construct.json bytes already checked by :func:`read_sides`."""
    got = plain_construct(raw)
    return got[0] if got is not None else parse_construct(loads_json(raw))[0]


def stack_table(raw: bytes) -> dict[str, list[str]]:
    """Node → frames of stack.json bytes already checked by :func:`read_sides`."""
    return parse_stack(loads_json(raw))


def _read(path: Path, notes: list[str]) -> tuple[bytes, bytes] | None:
    """(digest, bytes) of a side file, None when it is missing or unreadable (then noted)."""
    if not is_file(path):
        special = _why.not_a_file_reason(path) or (
            f"{path.name}: {_why.missing_reason(path)}" if path.is_symlink() and not path.exists() else None)
        if special:  # a FIFO or /dev/zero is never opened; say why the side table is missing
            notes.append(f"{path}: {special} (ignored; values still loaded without "
                         f"{'module paths' if path.name == 'construct.json' else 'stack frames'})")
        return None
    try:
        with open_regular(path) as fh:
            raw = fh.read()
    except OSError as exc:
        notes.append(f"{DumpFormatError(path, f'cannot read: {exc.strerror or exc}')} (ignored; values still loaded)")
        return None
    return hashlib.blake2b(raw, digest_size=16).digest(), raw


def _parse_checked(path: Path, raw: bytes, notes: list[str]) -> Any:
    """The parsed side file, or None (noted) when it is not JSON or not an object."""
    mine: list[str] = []
    try:
        doc = loads_json(raw, path, mine)
    except DumpFormatError as exc:
        notes.append(f"{exc} (ignored; values still loaded)")
        return None
    notes += mine
    if not isinstance(doc, dict):
        notes.append(f"{path}: holds a JSON {type(doc).__name__}, not an object (ignored; values still loaded)")
        return None
    return doc, not mine


class Sides(NamedTuple):
    """What :func:`read_sides` read of a rank folder's side files."""

    parents: dict[str, str]  #: node → parent module ("" for a root)
    micro: dict[str, int]  #: node → Megatron micro step
    names: dict[str, str] | None  #: node → *parents*' own key object, when the C reader built it
    construct: SharedTable | None
    stack: SharedTable | None


def read_sides(folder: Path, notes: list[str]) -> Sides:
    """(parents, micro steps, intern table, construct table, stack table) of a rank folder; problems go to *notes*."""
    parents: dict[str, str] = {}
    micro: dict[str, int] = {}
    names: dict[str, str] | None = None
    construct: SharedTable | None = None
    stack: SharedTable | None = None
    got = _read(folder / "construct.json", notes)
    if got is not None:
        key, raw = got
        hit = _CONSTRUCT.get(key)
        if hit is None:
            plain = plain_construct(raw)
            clean = plain is not None  # strict JSON without escapes: nothing for the standard library to repair
            if plain is not None:
                hit = (plain[0], {}, plain[1])
            else:
                checked = _parse_checked(folder / "construct.json", raw, notes)
                if checked is not None:
                    hit = (*parse_construct(checked[0]), None)
                    clean = checked[1]
            if hit is not None and clean and len(raw) <= _CACHE_MAX:  # the same bytes elsewhere: no second look
                if len(_CONSTRUCT) >= 8:
                    _CONSTRUCT.clear()
                # without the intern table: each file's parse adds to its own (files may be read in threads)
                _CONSTRUCT[key] = (hit[0], hit[1], None)
        if hit is not None:
            parents, micro, names = hit
            # the bytes are let go (parsed already; a worker process sends the table's own text): a large
            # construct.json would stay in memory twice, as text and as the table, until the dataset is built
            construct = SharedTable(("construct", key), None, construct_table, parents)
    got = _read(folder / "stack.json", notes)
    if got is not None:
        key, raw = got
        ok = key in _GOOD_STACKS
        if not ok:
            checked = _parse_checked(folder / "stack.json", raw, notes)
            ok = checked is not None
            if ok and checked[1]:
                if len(_GOOD_STACKS) >= 64:
                    _GOOD_STACKS.clear()
                _GOOD_STACKS.add(key)
        if ok:
            stack = SharedTable(("stack", key), raw, stack_table)
    return Sides(parents, micro, names, construct, stack)


def json_type(v: Any) -> str:
    """The JSON name of a parsed value's type (``"object"``, ``"array"``, ...).

    Examples
    --------
    >>> json_type([]), json_type(None), json_type(1.5)
    ('array', 'null', 'number')
    """
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(v), type(v).__name__)
