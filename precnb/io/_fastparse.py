"""Fast path for msprobe rank folders: same records as :func:`~precnb.io.msprobe_dump.read_rank_dir`.

The reference reader is exact and defensive; on large runs two things make it slow, and both
are done differently here for *clean* files without changing a single value, label,
coordinate or warning of the result:

* **JSON.** msprobe writes bare ``NaN`` / ``Infinity`` / ``-Infinity`` tokens (Python's
  ``allow_nan``), which orjson rejects, so every file of a run with a causal mask (``-inf``)
  fell back to the standard library parser, 3-5× slower. :func:`quote_tokens` quotes those
  tokens (``NaN`` → ``"NaN"``) at the byte level, only outside strings, and orjson parses the
  result. A token is quoted only as the value of ``Max``/``Min``/``Mean``/``Norm`` (read
  through the reference float conversion, which turns ``"NaN"`` into the same NaN and
  ``"-Infinity"`` into the same ``-inf``) or ``value`` (a scalar argument, never read); a
  token anywhere else (a shape element, a construct.json value, ...) sends the file to the
  reference reader. Whether a token is inside a string is decided by the parity of the
  unescaped quotes before it on its line (valid JSON strings cannot hold a raw newline; the
  whole text is scanned when the line holds a backslash or is very long).
* **Leaf walk.** One loop builds the columns directly (no generator per level, no per-leaf
  dict, cached shape text) instead of the generic walk and :class:`RecordBuilder`.

Anything the reference reader would warn about or reject — a value of an unexpected type, a
shape that is not a list of non-negative integers, an unsafe ``data_name``, nesting deeper
than ``MAX_DEPTH``, an empty ``data``, a missing ``framework``, a side file orjson cannot
read, any JSON orjson refuses, no ``data`` object — makes :func:`parse_rank_dir` return the
reference reader's own result (or raise its error), so the fast path only ever handles files
whose records it reproduces exactly (``tests/test_scale.py`` compares both on real and
adversarial inputs). It uses the reference reader's helpers for every value rule.

:func:`parse_rank_dir` is the task run once per (step, rank) file, in-process or on a dask
worker. Its stack.json travels as raw bytes plus a digest (:data:`SIDE_KEY`): the assembler
parses each distinct stack.json once instead of once per file (construct.json is needed for
the coordinates and parsed in the task, once per distinct content per process).
"""

from __future__ import annotations

import gc
import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from precnb.errors import DumpFormatError
from precnb.io._assemble import FileRecords
from precnb.io._jsonio import loads_json
from precnb.io._runfacts import file_facts

try:  # optional speed-up (the ``fast`` extra)
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised when the extra is missing
    _orjson = None

__all__ = ["SIDE_KEY", "available", "loads", "parse_rank_dir", "quote_tokens", "read_rank_dir", "resolve_sides"]

#: ``FileRecords.meta`` key holding ``{"construct": (digest, raw), "stack": (digest, raw)}`` (or None each)
SIDE_KEY = "_precnb_side_raw"

_SAFE_KEYS = frozenset({b"Max", b"Min", b"Mean", b"Norm", b"value"})
_QUOTED = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_WS = b" \t\n\r"
_QUOTE, _BACKSLASH, _MINUS = 34, 92, 45
_NAN = float("nan")


class _FallbackError(Exception):
    """The file is not clean: the reference reader must read it."""


def _reference() -> Any:
    from precnb.io import msprobe_dump

    return msprobe_dump


_NEEDED = ("read_rank_dir", "_stat_value", "_valid_shape", "_unsafe_data_name", "_node_name", "_counter",
           "_module_of", "_find_groups", "_parse_construct", "_parse_stack", "_NON_TENSOR_TYPES",
           "_FORWARD_SECTIONS", "_BACKWARD_SECTIONS", "MAX_DEPTH", "_is_file")


def available() -> bool:
    """Whether the fast path can run: orjson is installed and the reference reader has the helpers it reuses."""
    md = _reference()
    return _orjson is not None and all(hasattr(md, name) for name in _NEEDED)


# --------------------------------------------------------------------------------------- JSON
def _unescaped_quotes(raw: bytes) -> np.ndarray:
    """Positions of the quotes that open or close strings (not preceded by an odd backslash run)."""
    arr = np.frombuffer(raw, np.uint8)
    q = np.flatnonzero(arr == _QUOTE)
    if not len(q):
        return q
    prev = q[q > 0]
    suspects = prev[arr[prev - 1] == _BACKSLASH]
    if not len(suspects):
        return q
    escaped = set()
    for pos in suspects.tolist():
        n, i = 0, pos - 1
        while i >= 0 and raw[i] == _BACKSLASH:
            n += 1
            i -= 1
        if n % 2:
            escaped.add(pos)
    if not escaped:
        return q
    return q[~np.isin(q, np.fromiter(escaped, np.int64, len(escaped)))]


def _token_spans(raw: bytes) -> list[tuple[int, int]]:
    """(start, end) of every ``NaN``, ``Infinity`` and ``-Infinity`` in *raw*, strings included."""
    spans: list[tuple[int, int]] = []
    i = raw.find(b"NaN")
    while i >= 0:
        spans.append((i, i + 3))
        i = raw.find(b"NaN", i + 3)
    i = raw.find(b"Infinity")
    while i >= 0:
        spans.append((i - 1 if i and raw[i - 1] == _MINUS else i, i + 8))
        i = raw.find(b"Infinity", i + 8)
    spans.sort()
    return spans


def _key_before(raw: bytes, start: int, quotes: np.ndarray | None) -> bytes | None:
    """For a bare token at *start*: the member key it is the value of, b"" otherwise; None inside a string.

    Lines start outside strings in valid JSON (strings cannot hold a raw newline), so the
    token's own line is enough unless it holds a backslash or is very long (*quotes*, the
    global unescaped-quote positions, are used then).
    """
    if quotes is not None:
        i = int(np.searchsorted(quotes, start))
        if i % 2:
            return None
        if i < 2:
            return b""
        k_open, k_close = int(quotes[i - 2]), int(quotes[i - 1])
        if raw[k_close + 1:start].strip(_WS) != b":":
            return b""
        return raw[k_open + 1:k_close]
    seg = raw[raw.rfind(b"\n", 0, start) + 1:start]
    if seg.count(b'"') % 2:
        return None
    head = seg.rstrip(_WS)
    if not head.endswith(b":"):
        return b""
    head = head[:-1].rstrip(_WS)
    if not head.endswith(b'"'):
        return b""
    return head[head.rfind(b'"', 0, len(head) - 1) + 1:-1]


def quote_tokens(raw: bytes) -> bytes | None:
    """Return *raw* with bare ``NaN``/``±Infinity`` values quoted, or None when unsafe.

    Tokens inside strings are left alone. ``None`` means "use the reference parser": no bare
    token was found, or a bare token is not the value of ``Max``/``Min``/``Mean``/``Norm``/
    ``value`` (a shape element, a construct.json value, ...).

    Examples
    --------
    >>> quote_tokens(b'{"Max": NaN, "Min": -Infinity, "s": "NaN"}')
    b'{"Max": "NaN", "Min": "-Infinity", "s": "NaN"}'
    >>> quote_tokens(b'{"shape": [NaN]}') is None
    True
    """
    spans = _token_spans(raw)
    if not spans:
        return None
    quotes = None
    pieces: list[bytes] = []
    last = 0
    for start, end in spans:
        if quotes is None:
            line = raw.rfind(b"\n", 0, start) + 1
            if start - line > 4096 or raw.find(b"\\", line, start) >= 0:
                quotes = _unescaped_quotes(raw)
        key = _key_before(raw, start, quotes)
        if key is None:  # inside a string
            continue
        if key not in _SAFE_KEYS:
            return None  # an array element or a value that the reader looks at: be exact
        pieces += (raw[last:start], b'"', raw[start:end], b'"')
        last = end
    if not pieces:
        return None
    pieces.append(raw[last:])
    return b"".join(pieces)


def loads(raw: bytes, path: str | Path = "<bytes>", *, tokens: bool = True) -> Any:
    """Parse msprobe JSON bytes like :func:`precnb.io._jsonio.loads_json`, faster.

    Bare ``NaN``/``±Infinity`` values of statistics come back as the *strings* ``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``; the readers' float conversion maps them to exactly the
    floats the reference parser gives. Everything else is identical.

    Parameters
    ----------
    raw : bytes
    path : str or Path
        For error messages.
    tokens : bool
        Quote bare tokens for orjson (default). False: any bare token sends the text to the
        reference parser (for side files, whose values are all read).

    Returns
    -------
    object

    Raises
    ------
    DumpFormatError
        Exactly as the reference parser.

    Examples
    --------
    >>> loads(b'{"Max": NaN, "note": "NaN inside a string"}')
    {'Max': 'NaN', 'note': 'NaN inside a string'}
    """
    if _orjson is not None:
        try:
            return _orjson_doc(raw, tokens)[0]
        except _FallbackError:
            pass
    return loads_json(raw, path)


def _read_bytes(path: Path) -> bytes:
    try:
        with path.open("rb") as fh:
            return fh.read()
    except OSError as exc:
        raise DumpFormatError(path, f"cannot read: {exc.strerror or exc}") from None


def _digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


# ------------------------------------------------------------------------------- side tables
def _orjson_doc(raw: bytes, tokens: bool) -> tuple[Any, bool]:
    """Parse with orjson (bare tokens quoted when *tokens*); :class:`_FallbackError` when it refuses."""
    fixed = quote_tokens(raw) if tokens else None
    try:
        if fixed is not None:
            return _orjson.loads(fixed), True
        return _orjson.loads(raw), False
    except _orjson.JSONDecodeError:
        raise _FallbackError from None


_CONSTRUCT_CACHE: dict[bytes, tuple[dict[str, str], dict[str, int]]] = {}
_GOOD_STACKS: set[bytes] = set()


def _construct(md: Any, path: Path) -> tuple[dict[str, str], dict[str, int], tuple[bytes, bytes] | None]:
    """(parents, micro steps, (digest, raw)) of construct.json; empty when the file is missing."""
    if not md._is_file(path):
        if os.path.lexists(path):  # a FIFO, a device, a folder, a broken link: the reference reader says so
            raise _FallbackError
        return {}, {}, None
    raw = _read_bytes(path)
    key = _digest(raw)
    hit = _CONSTRUCT_CACHE.get(key)
    if hit is None:
        doc, _ = _orjson_doc(raw, False)
        if not isinstance(doc, dict):
            raise _FallbackError
        hit = md._parse_construct(doc)
        if len(_CONSTRUCT_CACHE) >= 8:
            _CONSTRUCT_CACHE.clear()
        _CONSTRUCT_CACHE[key] = hit
    return hit[0], hit[1], (key, raw)


def _stack(md: Any, path: Path) -> tuple[bytes, bytes] | None:
    """(digest, raw) of stack.json, checked readable once per distinct content per process."""
    if not md._is_file(path):
        if os.path.lexists(path):
            raise _FallbackError
        return None
    raw = _read_bytes(path)
    key = _digest(raw)
    if key not in _GOOD_STACKS:
        doc, _ = _orjson_doc(raw, False)
        if not isinstance(doc, dict):
            raise _FallbackError
        if len(_GOOD_STACKS) >= 64:
            _GOOD_STACKS.clear()
        _GOOD_STACKS.add(key)
    return key, raw


def parse_stack(raw: bytes) -> dict[str, list[str]]:
    """Parse stack.json bytes that :func:`parse_rank_dir` accepted, as the reference reader does."""
    return _reference()._parse_stack(_orjson.loads(raw))


def parse_construct(raw: bytes) -> dict[str, str]:
    """Parse construct.json bytes that :func:`parse_rank_dir` accepted into node → parent."""
    return _reference()._parse_construct(_orjson.loads(raw))[0]


def resolve_sides(rec: FileRecords, cache: dict[Any, Any] | None = None) -> FileRecords:
    """Turn the raw side tables of a :func:`parse_rank_dir` record into parsed dicts (in place).

    *cache* ((name, digest) → parsed dict) lets many records share one parse of identical files.
    """
    side = rec.meta.pop(SIDE_KEY, None)
    if not side:
        return rec
    cache = {} if cache is None else cache
    for name, parse in (("construct", parse_construct), ("stack", parse_stack)):
        item = side.get(name)
        if item is None:
            continue
        key = (name, item[0])
        if key not in cache:
            cache[key] = parse(item[1])
        if name == "construct":
            rec.construct = cache[key]
        else:
            rec.stacks = cache[key]
    return rec


# --------------------------------------------------------------------------------- leaf walk
_SHAPES: dict[Any, tuple[str, int]] = {}
_DTYPES: dict[str, str] = {}
_SAFE_NAMES: set[str] = set()
_CTX: dict[tuple[str, str, Any], tuple[Any, ...]] = {}


def _shape_info(md: Any, shape: Any) -> tuple[str, int, bool]:
    """(shape text, numel, holds 0/1) as ``RecordBuilder.add`` computes them for a valid shape.

    The cache is keyed by ``tuple(shape)``, which cannot tell ``2`` from ``2.0`` or ``1`` from
    ``True``: callers check ``type(sum(shape)) is int`` (no float) and, when the shape holds
    0 or 1 (the third item), that no element is a bool.
    """
    from precnb.io._assemble import _numel, _shape_text

    valid = md._valid_shape(shape)
    if valid is None:
        raise _FallbackError  # the reference reports it
    key = tuple(valid)
    hit = _SHAPES.get(key)
    if hit is None:
        hit = (_shape_text(valid), _numel(valid), any(d in (0, 1) for d in valid))
        if len(_SHAPES) > 50_000:
            _SHAPES.clear()
        _SHAPES[key] = hit
    return hit


def _slow_stats(md: Any, values: tuple[Any, Any, Any, Any]) -> tuple[float, float, float, float, int]:
    """Statistics that are not all floats: the reference rules (``_stat_value``)."""
    out: list[float] = []
    null = 0
    for bit, v in enumerate(values):
        if v.__class__ is str and v in _QUOTED:  # a bare token quoted for orjson
            f: float | None = _QUOTED[v]
        else:
            try:
                f = md._stat_value(v)
            except TypeError:
                raise _FallbackError from None  # the reference reports it
        if f is None:
            f = _NAN
            null |= 1 << bit
        out.append(f)
    return out[0], out[1], out[2], out[3], null


def _walker(md: Any, rows: list[tuple[Any, ...]], ctxs: list[tuple[Any, ...]]) -> Any:
    """A closure doing the reference ``_walk`` (msprobe compare naming) into *rows*.

    One row per tensor leaf: (label, role, max, min, mean, norm, null bits, shape text, numel,
    md5 or None, data_name, dtype); the node context of each row goes to *ctxs*. Common leaves
    are recognised and read while iterating their container (no call per leaf).
    """
    add_row, add_ctx = rows.append, ctxs.append
    shapes, dtypes, safe_names = _SHAPES, _DTYPES, _SAFE_NAMES
    non_tensor, max_depth = md._NON_TENSOR_TYPES, md.MAX_DEPTH

    def leaf(v: dict[str, Any], label: Any, role: str, ctx: tuple[Any, ...]) -> None:
        get = v.get
        mx, mn, me, no = get("Max"), get("Min"), get("Mean"), get("Norm")
        if mx.__class__ is float and mn.__class__ is float and me.__class__ is float and no.__class__ is float:
            null = 0
        else:
            mx, mn, me, no, null = _slow_stats(md, (mx, mn, me, no))
        shape = get("shape")
        try:
            info = shapes[tuple(shape)] if shape.__class__ is list else _shape_info(md, shape)
            if sum(shape).__class__ is not int or (info[2] and not all(d.__class__ is int for d in shape)):
                info = _shape_info(md, shape)  # a float or bool dimension: the reference rule decides
        except (KeyError, TypeError):
            info = _shape_info(md, shape)
        dtype = get("dtype")
        if dtype.__class__ is not str:
            if dtype is not None:
                raise _FallbackError
            dtype = ""
        crc = get("md5")
        if crc is not None and crc.__class__ is not str:
            raise _FallbackError
        dn = get("data_name")
        if dn is not None:
            if dn.__class__ is not str:
                raise _FallbackError
            if dn and dn not in safe_names:
                if md._unsafe_data_name(dn):
                    raise _FallbackError
                if len(safe_names) > 100_000:
                    safe_names.clear()
                safe_names.add(dn)
        add_row((label, role, mx, mn, me, no, null, info[0], info[1], crc, dn or "",
                 dtypes.setdefault(dtype, dtype)))
        add_ctx(ctx)

    def children(value: Any, prefix: str, role: str, ctx: tuple[Any, ...], depth: int) -> None:
        for k, v in (value.items() if isinstance(value, dict) else enumerate(value)):
            if isinstance(v, dict):
                if depth >= max_depth:
                    raise _FallbackError  # the reference raises "nested too deeply"
                get = v.get
                t = get("type")
                if isinstance(t, str) and t not in non_tensor and "dtype" in v and "shape" in v:
                    # the common leaf inline: float statistics, a known all-int shape, a string
                    # dtype, no md5 / data_name; anything else goes through leaf()
                    mx, mn, me, no, shape, dtype = get("Max"), get("Min"), get("Mean"), get("Norm"), \
                        get("shape"), get("dtype")
                    if mx.__class__ is float and mn.__class__ is float and me.__class__ is float \
                            and no.__class__ is float and dtype.__class__ is str and shape.__class__ is list \
                            and get("md5") is None and get("data_name") is None:
                        try:
                            info = shapes.get(tuple(shape))
                            fast = info is not None and not info[2] and sum(shape).__class__ is int
                        except TypeError:
                            fast = False
                        if fast:
                            add_row((f"{prefix}.{k}", role, mx, mn, me, no, 0, info[0], info[1], None, "",
                                     dtypes.setdefault(dtype, dtype)))
                            add_ctx(ctx)
                            continue
                    leaf(v, f"{prefix}.{k}", role, ctx)
                else:
                    children(v, f"{prefix}.{k}", role, ctx, depth + 1)
            elif isinstance(v, list):
                if depth >= max_depth:
                    raise _FallbackError
                children(v, f"{prefix}.{k}", role, ctx, depth + 1)

    def walk(value: Any, prefix: str, role: str, ctx: tuple[Any, ...], depth: int) -> None:
        if depth > max_depth:
            raise _FallbackError
        if isinstance(value, dict):
            t = value.get("type")
            if isinstance(t, str) and t not in non_tensor and "dtype" in value and "shape" in value:
                leaf(value, prefix, role, ctx)
                return
            children(value, prefix, role, ctx, depth)
        elif isinstance(value, list):
            children(value, prefix, role, ctx, depth)

    return walk


def _records(md: Any, data: dict[str, Any], parents: dict[str, str], micro: dict[str, int]
             ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], dict[str, str]]:
    """Walk every node of ``data``: (rows, node contexts, communication groups)."""
    import json

    fwd, bwd = md._FORWARD_SECTIONS, md._BACKWARD_SECTIONS
    rows: list[tuple[Any, ...]] = []
    ctxs: list[tuple[Any, ...]] = []
    walk = _walker(md, rows, ctxs)
    groups: dict[str, str] = {}
    ctx_cache = _CTX
    for node, record in data.items():
        if not isinstance(record, dict):
            if record is not None:
                raise _FallbackError  # the reference reports it
            continue
        if node.startswith(("Distributed.", "MintDistributed.")):
            for g in md._find_groups({k: record.get(k) for k in ("input_args", "input_kwargs")}):
                groups.setdefault(json.dumps(g), node)
                break
        parent = parents.get(node, "")
        key = (node, parent, micro.get(node, -1))
        ctx = ctx_cache.get(key)
        if ctx is None:  # the same nodes come back in every file of a run: computed once per process
            nn = md._node_name(node)
            module = nn.module if nn.kind != "api" else md._module_of(parent)
            ctx = (node, module, nn.api, nn.kind, nn.direction, parent or "", md._counter(nn.call),
                   md._counter(key[2]))
            if len(ctx_cache) > 200_000:
                ctx_cache.clear()
            ctx_cache[key] = ctx
        kind = ctx[3]
        if kind == "param_grad":
            for pname, val in record.items():
                leaf = val[0] if isinstance(val, list) and len(val) == 1 else val
                walk(leaf, f"{node}.{pname}", "grad", ctx, 1)
            continue
        sections = bwd if node.endswith(".backward") or ".backward." in node else fwd
        used = False
        for key, role in sections:
            if key in record:
                used = True
                section = "parameters" if key == "parameters" else ("output" if key == "output" else "input")
                walk(record[key], f"{node}.{section}", role, ctx, 1)
        if not used:
            walk(record, node, "", ctx, 0)
    return rows, ctxs, groups


def _dedup_labels(labels: list[str]) -> list[str]:
    """Rename repeated labels exactly as ``RecordBuilder.add`` does (``label#dupN``)."""
    out: list[str] = []
    seen: set[str] = set()
    for label in labels:
        if label in seen:
            label = f"{label}#dup{sum(lbl.startswith(label) for lbl in out)}"
        seen.add(label)
        out.append(label)
    return out


def _build(rd: Any, rows: list[tuple[Any, ...]], ctxs: list[tuple[Any, ...]], meta: dict[str, Any]) -> FileRecords:
    n = len(rows)
    cols = [list(c) for c in zip(*rows, strict=True)] if n else [[] for _ in range(12)]
    ccols = [list(c) for c in zip(*ctxs, strict=True)] if n else [[] for _ in range(8)]
    labels, roles, mx, mn, me, no, null, shape, numel, crc, dname, dtype = cols
    if len(set(labels)) != n:
        labels = _dedup_labels(labels)
    node, module, api, kind, direction, parent, call, micro = ccols
    coords = {"node": node, "module": module, "api": api, "kind": kind, "direction": direction,
              "role": roles, "dtype": dtype, "shape": shape, "parent": parent, "call": call,
              "micro_step": micro}
    values = {"max": np.asarray(mx, np.float64), "min": np.asarray(mn, np.float64),
              "mean": np.asarray(me, np.float64), "norm": np.asarray(no, np.float64)}
    strings: dict[str, list[str]] = {}
    if crc.count(None) != n:
        strings["crc"] = [v or "" for v in crc]
    if any(dname):
        strings["data_name"] = dname
    return FileRecords(
        step=rd.step, rank=rd.rank, labels=labels, coords=coords, values=values,
        null_stats=np.asarray(null, dtype=np.uint8), seq=np.arange(n, dtype=np.int32),
        numel=np.asarray(numel, dtype=np.int64), strings=strings, meta=meta)


# ------------------------------------------------------------------------------ entry points
def _clean_top(doc: dict[str, Any]) -> tuple[str, str, str]:
    out = []
    for key in ("task", "level", "framework"):
        v = doc.get(key, "")
        if v is not None and v.__class__ is not str:
            raise _FallbackError  # the reference reports it
        out.append(v or "")
    if not out[2]:
        raise _FallbackError  # the reference infers it from the tensors
    return out[0], out[1], out[2]


def parse_rank_dir(rd: Any) -> FileRecords:
    """Parse one (step, rank) folder; the task run per file, in-process or on a dask worker.

    Same values, labels, coordinates, meta and warnings as
    :func:`precnb.io.msprobe_dump.read_rank_dir` (which it returns itself for anything but a
    clean file); construct.json and stack.json come as ``meta[SIDE_KEY]`` (digest, raw bytes)
    for :func:`resolve_sides` (the assembler does it), so identical side files are parsed once.

    Parameters
    ----------
    rd : precnb.io.msprobe_dump.RankDir

    Returns
    -------
    FileRecords

    Raises
    ------
    DumpFormatError
        As the reference reader.
    """
    md = _reference()
    if not available():
        return md.read_rank_dir(rd)
    # the cyclic GC would scan the ~15,000 fresh containers of each file several times (a third
    # of the time); they hold no cycles (but the walker closure, freed at the next collection),
    # so it is paused while one file is parsed
    paused = gc.isenabled()
    gc.disable()
    try:
        return _parse(md, rd)
    finally:
        if paused:
            gc.enable()


def _parse(md: Any, rd: Any) -> FileRecords:
    try:
        doc, _ = _orjson_doc(_read_bytes(rd.dump_file), True)
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict) or not doc["data"]:
            raise _FallbackError
        data: dict[str, Any] = doc["data"]
        task, level, framework = _clean_top(doc)
        parents, micro, craw = _construct(md, rd.path / "construct.json")
        sraw = _stack(md, rd.path / "stack.json")
        rows, ctxs, groups = _records(md, data, parents, micro)
    except (_FallbackError, DumpFormatError, RecursionError):
        return md.read_rank_dir(rd)
    meta: dict[str, Any] = {"task": task, "level": level, "framework": framework, "path": str(rd.path),
                            "comm_groups": groups, "warnings": [], SIDE_KEY: {"construct": craw, "stack": sraw}}
    facts = file_facts(data, parents)
    if facts:
        meta["facts"] = facts
    return _build(rd, rows, ctxs, meta)


def read_rank_dir(rd: Any) -> FileRecords:
    """:func:`parse_rank_dir` with the side tables parsed: a drop-in for the reference reader.

    Examples
    --------
    >>> from precnb.io.msprobe_dump import discover
    >>> rec = read_rank_dir(discover(path)[0])  # doctest: +SKIP
    """
    return resolve_sides(parse_rank_dir(rd))
