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
Anything else (a byte-order mark, a node name seen twice, a batch the standard library refuses, a
``data`` that does not start in the first MiB) raises :class:`NotBatchableError`, and the reader
parses the whole file with :func:`precnb.io._jsonio.load_json` instead, which gives exactly the
standard library's answer and its error messages.

Two readers take the batches: :func:`parts` parses each with the standard library (msprobe's bare
``NaN`` / ``Infinity`` / ``-Infinity`` tokens included) for the pure Python parser, the reference;
:func:`raw_parts` hands each batch's text to the C reader :mod:`precnb.io._craw` (the fast path), which
gives back, as text, the members it does not read itself (:func:`member` parses those).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from precnb.io._fs import open_regular
from precnb.io.msprobe._scan import Scanner, find_data
from precnb.io.records import hashes_repeat

__all__ = ["BLOCK", "NotBatchableError", "batches", "member", "parts", "raw_parts"]

BLOCK = 256 << 10
"""Bytes read at a time by :func:`parts`; a batch holds the whole records of about one block.

Small enough that a batch's objects are still in the processor's caches when the walk, the run
facts and the value columns read them one after the other (``benchmarks/bench_large.py``: a
1 GB file loads about a quarter faster than with 4 MiB batches)."""
RAW_BLOCK = 1 << 20
"""Bytes read at a time by :func:`raw_parts`: the C reader builds no objects per leaf, so its batches need not
fit a cache, and larger ones cut the fixed cost per batch (300 MB file, 2026-12-03: 128 KiB 4.7-5.8 s,
256 KiB 4.4-5.4 s, 1 MiB 4.3-5.1 s per load, one noisy run each)."""
_HEAD_MAX = 1 << 20
_LONG = 4 * BLOCK  # a buffer this long without a line of msprobe's layout is cut by structure
_DATA_KEY = re.compile(rb'\n[ \t]*"data"[ \t]*:[ \t]*(\{)[ \t]*\r?\n([ \t]*)["}]')
_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F][0-9a-fA-F]{2}")
_BOM = b"\xef\xbb\xbf"


class NotBatchableError(Exception):
    """The file cannot be read batch by batch; parse it whole."""


def _utf8(raw: bytes) -> str:
    """*raw* decoded as strict UTF-8 (``UnicodeDecodeError``, a ``ValueError``, otherwise).

    Never ``json.loads(bytes)``: it decodes with ``surrogatepass``, which keeps an encoded surrogate
    (``ED A0 80``, invalid UTF-8) as a lone surrogate (U+D800) that no writer can encode later (issue #49): the
    whole-file parse replaces it by U+FFFD with a note naming its line and column, as any invalid UTF-8.
    """
    return raw.decode("utf-8")


def _loads(raw: bytes) -> Any:
    """The standard library's parse of *raw* (NaN and ±Infinity included), or :class:`NotBatchableError`."""
    if raw.find(b"\\") >= 0 and _SURROGATE_ESCAPE.search(raw):  # the whole-file parse replaces them, with a note
        raise NotBatchableError
    try:
        return json.loads(_utf8(raw))
    except (ValueError, RecursionError):  # JSONDecodeError, bad UTF-8, too many digits
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
                    piece = _take(buf, end)
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
            piece = _take(buf, end)
            scan.rebase(end + 1)
            scanned -= end + 1
            yield piece, None


def _take(buf: bytearray, end: int) -> bytes:
    """``buf[:end]`` as bytes, removed from *buf* with the separator byte after it (one copy of the piece).

    Examples
    --------
    >>> buf = bytearray(b"ab,cd")
    >>> _take(buf, 2), buf
    (b'ab', bytearray(b'cd'))
    """
    with memoryview(buf) as view:
        piece = bytes(view[:end])
    del buf[:end + 1]  # (a bytearray drops its first bytes without moving the rest)
    return piece


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
        for piece, tail in _pieces(fh, buf, indent):
            buf = b""
            if piece.strip():
                data = _loads(b"{" + piece + b"}")
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
    top = _loads(head + b"{}" + tail)
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
