r"""dump.json as a sequence of small JSON documents: the ``data`` object cut between node records.

Parsing a dump.json into one Python object tree costs several times the file's size in memory
and, with millions of fresh containers, most of its time in the cyclic garbage collector. msprobe
writes the file with ``json.dump(..., indent=1)``: every node record of ``data`` starts on a line
of its own and ends with ``}`` at the record's indentation. :func:`batches` reads the file in
blocks and cuts ``data`` there into batches of whole records, each parsed on its own
(``{<records>}``) and dropped once read, so only one batch of objects lives at a time. A file in
any other layout (one line, as ``json.dump`` without ``indent`` writes it; records on very long
lines; the top-level members in another order) is cut where its structure says a record ends
(:mod:`precnb.io.msprobe._scan`: strings skipped, braces counted, by byte offsets), so it is read
batch by batch too.

The cut is checked, never trusted: every batch must parse as a JSON object, and the text
around ``data`` (``{"task": ..., "data": {}, ...}``) must parse with that empty ``data`` as its
only ``data``. Because ``{a}`` and ``{b}`` both valid means ``{a, b}`` is valid with the members
of both, in order, a file whose batches all parse is the file the whole parse would have read.
Anything else (a byte-order mark, a node name seen twice, JSON that orjson refuses, a ``data``
that does not start in the first MiB) raises :class:`NotBatchableError`, and the reader parses
the whole file with :func:`precnb.io._jsonio.load_json` instead, which gives exactly the standard
library's answer and its error messages.

msprobe writes bare ``NaN`` / ``Infinity`` / ``-Infinity`` tokens, which orjson rejects.
:func:`quote_tokens` turns ``"K": NaN`` into ``"K": "NaN"`` for the keys ``Max``, ``Min``,
``Mean``, ``Norm`` and ``value`` only; the statistic rules read those strings as the same
floats (``"-Infinity"`` → ``-inf``). The pattern cannot match inside a string of valid JSON: its
first quote is not escaped (no backslash before it), so inside a string it would close the
string and leave the bare word ``Max`` after it, which is not JSON. A module named ``NaNGuard``
or a string argument ``"Max: NaN"`` is therefore left alone, and any other bare token (a
shape element, a construct.json value) leaves the batch unparsable by orjson: the whole file
then goes through the standard library.

Examples
--------
>>> quote_tokens(b'{"Max": NaN, "Min": -Infinity, "s": "Max\\\\": NaN", "NaNGuard": 1}')
b'{"Max": "NaN", "Min": "-Infinity", "s": "Max\\\\": NaN", "NaNGuard": 1}'
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from precnb.io._cext import CRAW, cwalk
from precnb.io._fs import open_regular
from precnb.io.msprobe._scan import Scanner, find_data
from precnb.io.records import hashes_repeat

try:  # optional speed-up (the ``fast`` extra)
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised when the extra is missing
    _orjson = None  # type: ignore[assignment]

__all__ = ["BLOCK", "NotBatchableError", "batches", "has_orjson", "member", "parts", "quote_tokens", "raw_parts"]

BLOCK = (128 if _orjson is not None else 256) << 10
"""Bytes read at a time; a batch holds the whole records of about one block.

Small enough that a batch's objects are still in the processor's caches when the walk, the run
facts and the value columns read them one after the other (``benchmarks/bench_large.py``: a
1 GB file loads about a quarter faster than with 4 MiB batches). With orjson, 128 KiB batches
(about a MiB of objects, one core's L2 cache here) load a 200 MB file 5-8 % faster than 256 KiB
ones (medians of 4, 2026-12-03; 64 KiB as fast, 32 KiB slower); the standard library's parse,
with more fixed cost per call, keeps 256 KiB."""
RAW_BLOCK = 1 << 20
"""Bytes read at a time by :func:`raw_parts`: the C reader builds no objects per leaf, so its batches need not
fit a cache, and larger ones cut the fixed cost per batch (300 MB file, 2026-12-03: 128 KiB 4.7-5.8 s,
256 KiB 4.4-5.4 s, 1 MiB 4.3-5.1 s per load, one noisy run each)."""
_HEAD_MAX = 1 << 20
_LONG = 4 * BLOCK  # a buffer this long without a line of msprobe's layout is cut by structure
_DATA_KEY = re.compile(rb'\n[ \t]*"data"[ \t]*:[ \t]*(\{)[ \t]*\r?\n([ \t]*)["}]')
_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F][0-9a-fA-F]{2}")
_BEFORE = re.compile(rb'"(?:Max|Min|Mean|Norm|value)"[ \t\r\n]*:[ \t\r\n]*\Z')
_AFTER = frozenset(b" \t\r\n,}]")
_MINUS, _BACKSLASH = 45, 92
_BOM = b"\xef\xbb\xbf"
#: an integer orjson reads as a float (it keeps ints of 64 bits only): 20 digits, or "-" and 19 (conservatively:
#: digits of a fraction or a string count too)
_LONG_INT = re.compile(rb"\d{20}|-\d{19}")


class NotBatchableError(Exception):
    """The file cannot be read batch by batch; parse it whole."""


def has_orjson() -> bool:
    """Whether orjson is installed (without it every file is parsed whole by the standard library)."""
    return _orjson is not None


def quote_tokens(raw: bytes, *, nan: bool = True) -> bytes:
    """*raw* with the bare ``NaN``/``±Infinity`` values of statistics and scalar values quoted.

    ``nan=False`` quotes the ``±Infinity`` ones only (looking for ``NaN`` costs a scan of its own).

    Examples
    --------
    >>> quote_tokens(b'{"Norm": Infinity, "shape": [NaN]}')
    b'{"Norm": "Infinity", "shape": [NaN]}'
    """
    c = cwalk()
    if c is not None and raw.__class__ is bytes:  # the same, in one C pass (tests/test_cwalk.py)
        quoted: bytes = c.quote_tokens(raw, nan)
        return quoted
    spans = []
    for token in (b"NaN", b"Infinity") if nan else (b"Infinity",):
        i = raw.find(token)
        while i >= 0:
            start, end = i, i + len(token)
            if token == b"Infinity" and i and raw[i - 1] == _MINUS:
                start -= 1
            if end == len(raw) or raw[end] in _AFTER:
                m = _BEFORE.search(raw, max(0, start - 40), start)
                if m is not None and (m.start() == 0 or raw[m.start() - 1] != _BACKSLASH):
                    spans.append((start, end))
            i = raw.find(token, end)
    if not spans:
        return raw
    spans.sort()
    out: list[bytes] = []
    last = 0
    for start, end in spans:
        out += (raw[last:start], b'"', raw[start:end], b'"')
        last = end
    out.append(raw[last:])
    return b"".join(out)


def _utf8(raw: bytes) -> str:
    """*raw* decoded as strict UTF-8 (``UnicodeDecodeError``, a ``ValueError``, otherwise).

    Never ``json.loads(bytes)``: it decodes with ``surrogatepass``, which keeps an encoded surrogate
    (``ED A0 80``, invalid UTF-8) as a lone surrogate (U+D800) that no writer can encode later (issue #49): the
    whole-file parse replaces it by U+FFFD with a note naming its line and column, as any invalid UTF-8.
    """
    return raw.decode("utf-8")


def _loads(raw: bytes, nan: bool = False) -> tuple[Any, bool]:
    """(the parsed text, whether its NaN tokens needed quoting); *nan*: quote them before the first try.

    Without *nan* the NaN tokens are quoted only when the first parse fails.
    """
    if raw.find(b"\\") >= 0 and _SURROGATE_ESCAPE.search(raw):  # the whole-file parse replaces them, with a note
        raise NotBatchableError
    if _orjson is None:
        try:
            return json.loads(_utf8(raw)), False
        except (ValueError, RecursionError):  # JSONDecodeError, bad UTF-8, too many digits
            raise NotBatchableError from None
    if (CRAW.long_ints(raw) if CRAW is not None and cwalk() is not None else _LONG_INT.search(raw) is not None):
        try:  # orjson would read 30000000000000000000 as 3e+19: the standard library keeps the int
            return json.loads(_utf8(raw)), False
        except (ValueError, RecursionError):
            raise NotBatchableError from None
    try:
        return _orjson.loads(quote_tokens(raw, nan=nan)), nan
    except _orjson.JSONDecodeError:  # also bad UTF-8, lone surrogates, numbers beyond 64 bits
        if nan or raw.find(b"NaN") < 0:
            raise NotBatchableError from None
    # A batch without NaN tokens parses as it is: quote_tokens finds a NaN only where it is a bare
    # token (never inside a string of valid JSON), so once orjson accepts the text, the quoting of
    # NaN would have changed nothing. Otherwise the text quoted in full decides.
    try:
        return _orjson.loads(quote_tokens(raw)), True
    except _orjson.JSONDecodeError:
        raise NotBatchableError from None


def _head(fh: IO[bytes]) -> tuple[bytes, bytes | None, bytes]:
    """(text up to ``data``'s ``{``, the records' indentation, the rest of the block after the ``{``).

    The indentation is None when the file is not in msprobe's layout (one line, another writer's
    line breaks): its records are then cut by structure (:class:`~precnb.io.msprobe._scan.Scanner`).
    """
    buf = fh.read(max(BLOCK, _HEAD_MAX))
    if buf.startswith(_BOM):
        raise NotBatchableError
    m = _DATA_KEY.search(buf, 0, _HEAD_MAX)
    if m is not None:
        return buf[:m.start(1)], m.group(2), buf[m.start(1) + 1:]
    brace = find_data(buf[:_HEAD_MAX])
    if brace < 0:
        raise NotBatchableError
    return buf[:brace], None, buf[brace + 1:]


def _pieces(fh: IO[bytes], buf: bytes | bytearray, indent: bytes | None,
            size: int | None = None) -> Iterator[tuple[bytes, bytes | None]]:
    """``(records, None)`` pieces of ``data``'s text between records, then ``(last records, text after data)``.

    In msprobe's layout a piece ends where a line holds a record's closing brace at the records'
    indentation; otherwise (or when no such line comes within :data:`_LONG` bytes) where the
    structure says a record ended. *buf* starts right after ``data``'s ``{``.
    """
    long = _LONG if size is None else max(_LONG, 4 * size)
    size = BLOCK if size is None else size
    sep = b"\n" + indent + b"}," if indent is not None else None
    scan = Scanner() if sep is None else None
    scanned = 0  # bytes of buf the scanner has seen
    # a growing buffer (a record of 50 MB is read in hundreds of blocks: appending to bytes would copy it each time,
    # and the separator is looked for in the new block only, the rest of the buffer holding none)
    buf = bytearray(buf)
    while True:
        block = fh.read(size)
        if block:
            buf += block
            if scan is None and sep is not None:
                cut = buf.rfind(sep, max(0, len(buf) - len(block) - len(sep) + 1))
                if cut >= 0:
                    end = cut + len(sep) - 1  # the comma after a record's closing brace
                    piece, buf = bytes(buf[:end]), buf[end + 1:]
                    yield piece, None
                    continue
                if len(buf) < long:
                    continue  # records longer than a block: read on
                scan = Scanner()  # no line of msprobe's layout for a while: follow the structure
        if scan is None:  # end of file in msprobe's layout: data's end by structure (other members may follow)
            scan = Scanner()
        scan.feed(buf, scanned)
        scanned = len(buf)
        if scan.end >= 0:
            yield bytes(buf[:scan.end]), bytes(buf[scan.end + 1:]) + fh.read()
            return
        if not block:
            raise NotBatchableError  # the file ends inside data
        if scan.cut >= 0:
            end = scan.cut
            piece, buf = bytes(buf[:end]), buf[end + 1:]
            scan.rebase(end + 1)
            scanned -= end + 1
            yield piece, None


def batches(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield the node records of ``data`` in batches (dicts, file order), then the other top-level members.

    The last dict yielded holds the members other than ``data`` (``task``, ``level``, ...).
    Raises :class:`NotBatchableError`, possibly after some batches (the caller starts again with the
    whole-file parse), when the file is not in msprobe's layout or a batch does not parse.

    Examples
    --------
    >>> import json, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "dump.json")
    >>> doc = {"task": "statistics", "data": {"a.0.forward": {"x": 1}, "b.0.forward": {"Max": float("nan")}}}
    >>> _ = open(p, "w").write(json.dumps(doc, indent=1))
    >>> [list(d) for d in batches(p)]
    [['a.0.forward', 'b.0.forward'], ['task']]
    """
    for _, part in parts(path):
        yield part


def parts(path: str | Path) -> Iterator[tuple[bool, dict[str, Any]]]:
    """:func:`batches` as ``(is_top, dict)`` pairs: no look-ahead is needed to tell the top-level members.

    A batch is let go as soon as the caller asks for the next one (before the next block is read):
    a caller that drops its own reference first has its objects freed while they are still in the
    processor's caches.

    Examples
    --------
    >>> import json, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "dump.json")
    >>> _ = open(p, "w").write(json.dumps({"task": "statistics", "data": {"a.0.forward": {}}}, indent=1))
    >>> [(is_top, list(d)) for is_top, d in parts(p)]
    [(False, ['a.0.forward']), (True, ['task'])]
    """
    if os.environ.get("PRECNB_JSON_WHOLE"):  # parse whole files only (to check one path against the other)
        raise NotBatchableError
    with open_regular(path) as fh:
        head, indent, buf = _head(fh)
        hashes: list[Any] = []  # of the node names of each batch: a name in two batches is checked at the end
        first = True
        nan = False
        for piece, tail in _pieces(fh, buf, indent):
            buf = b""
            if piece.strip():
                data, nan = _loads(b"{" + piece + b"}", nan)  # once NaN needed quoting, always quote it
            elif first and tail is not None:  # "data": {} (nothing dumped)
                data = {}
            else:  # "{ , ..." or a trailing comma: not JSON
                raise NotBatchableError
            piece = b""
            first = False
            hashes.append(np.fromiter(map(hash, data), np.int64, len(data)))
            yield False, data
            data = {}  # let the batch go before the next block is parsed
            if tail is not None:
                if _repeats(hashes):  # a node name in two batches: the whole parse keeps its last record
                    raise NotBatchableError
                yield True, _top(head, tail)
                return


def raw_parts(path: str | Path, name_hashes: list[np.ndarray]) -> Iterator[tuple[bool, Any]]:
    r""":func:`parts` with each batch's text (``bytes``: the members between data's records) instead of its parse.

    The caller reads each text (:mod:`precnb.io._craw`, the members it hands back with :func:`member`)
    and appends the hashes of the node names it met to *name_hashes* before asking for the next one:
    two equal names anywhere in ``data`` (in one batch too, which a parse into a dict would have
    merged) raise :class:`NotBatchableError` at the end, as in :func:`parts`.

    Examples
    --------
    >>> import json, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "dump.json")
    >>> _ = open(p, "w").write(json.dumps({"task": "statistics", "data": {"a.0.forward": {}}}, indent=1))
    >>> [(is_top, part) for is_top, part in raw_parts(p, [])]
    [(False, b'\n  "a.0.forward": {}\n '), (True, {'task': 'statistics'})]
    """
    if os.environ.get("PRECNB_JSON_WHOLE"):  # parse whole files only (to check one path against the other)
        raise NotBatchableError
    with open_regular(path) as fh:
        head, indent, buf = _head(fh)
        first = True
        for piece, tail in _pieces(fh, buf, indent, RAW_BLOCK):
            buf = b""
            if piece and not piece.isspace():
                yield False, piece
            elif not (first and tail is not None):  # "{ , ..." or a trailing comma: not JSON
                raise NotBatchableError
            piece = b""
            first = False
            if tail is not None:
                if name_hashes and hashes_repeat(np.concatenate(name_hashes)):
                    raise NotBatchableError  # a node name twice: the whole parse keeps its last record
                yield True, _top(head, tail)
                return


def member(text: bytes) -> tuple[str, Any]:
    """The one ``"name": value`` member of *text*, parsed by the standard library (NaN and ±Infinity included).

    Raises :class:`NotBatchableError` where the whole-file parse must decide: not one valid member,
    invalid UTF-8, escaped lone surrogates (which the whole-file parse replaces, with a note), nesting
    too deep for the standard library.

    Examples
    --------
    >>> member(b'"a.0.forward": {"output": [NaN]}')
    ('a.0.forward', {'output': [nan]})
    """
    if text.find(b"\\") >= 0 and _SURROGATE_ESCAPE.search(text):
        raise NotBatchableError
    try:
        doc = json.loads("{" + _utf8(text) + "}")
    except (ValueError, RecursionError):  # JSONDecodeError, bad UTF-8
        raise NotBatchableError from None
    if len(doc) != 1:
        raise NotBatchableError
    return next(iter(doc.items()))


def _top(head: bytes, tail: bytes) -> dict[str, Any]:
    """The top-level members other than ``data``: the text around data, parsed with ``"data": {}`` in its place.

    data's members are the records read; whatever the order of the top-level members, data is the one
    found if the text around it parses with it as its only ``data`` (else :class:`NotBatchableError`).
    """
    top = _loads(head + b"{}" + tail, True)[0]
    if not isinstance(top, dict) or top.get("data") != {}:
        raise NotBatchableError
    del top["data"]
    return top


def _repeats(hashes: list[Any]) -> bool:
    """Whether two node names may be the same (two equal hashes; a batch's own names are distinct).

    A sort of the names' hashes instead of a set of millions of names; two names that only share
    their hash send the file to the whole-file parse, which reads it right either way.
    """
    return len(hashes) > 1 and hashes_repeat(np.concatenate(hashes))
