"""Where the records of a JSON text's ``data`` object end, found by structure, not by line breaks.

A dump.json re-saved by another tool may be on one line (``json.dump`` without ``indent``), have
its records on very long lines, or its members in another order. :class:`Scanner` follows a
JSON text block by block (vectorised with numpy): strings are skipped (a quote after an odd run
of backslashes is escaped), braces and brackets outside strings move the depth. Inside ``data``
(depth 2), a ``}`` or ``]`` that returns to depth 2 ends a record and the comma after it is a
place to cut; the ``}`` that returns to depth 1 closes ``data``.

Nothing here is trusted: the reader parses every batch cut here and falls back to the whole-file
parse when one does not parse (:mod:`precnb.io.msprobe._json`).

Examples
--------
>>> s = Scanner(depth=2)
>>> buf = b'"a": {"x": "},"}, "b": [1], "c": {}}, "task": 1}'
>>> s.feed(buf, 0)
>>> s.cut, s.end  # the comma after "b"'s record (the last whole one followed by a comma), data's end
(26, 35)
>>> find_data(b'{"task": "x", "data" : {"a": 1}}')
23
"""

from __future__ import annotations

import numpy as np

__all__ = ["Scanner", "find_data"]

_QUOTE, _BACKSLASH, _COMMA = 34, 92, 44
_WS = b" \t\r\n"


def _unescaped(buf: bytes | bytearray, quotes: np.ndarray) -> np.ndarray:
    """The quotes of *quotes* (positions in *buf*) not escaped by an odd run of backslashes before them.

    Looks only before the quotes (a search of the whole buffer, fed again and again as it grows, is quadratic).
    """
    if not len(quotes):
        return quotes
    arr = np.frombuffer(buf, np.uint8)
    cand = quotes[(quotes > 0) & (arr[np.maximum(quotes - 1, 0)] == _BACKSLASH)]
    if not len(cand):
        return quotes
    escaped = []
    for p in cand.tolist():  # backslashes before a quote are rare in dumps: walk those back
        k = p - 1
        while k >= 0 and buf[k] == _BACKSLASH:
            k -= 1
        if (p - 1 - k) % 2:
            escaped.append(p)
    return np.setdiff1d(quotes, np.asarray(escaped, np.int64), assume_unique=True) if escaped else quotes


def _structure(buf: bytes | bytearray, start: int, in_string: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """(positions of braces / brackets outside strings in ``buf[start:]``, their depth steps, quotes seen)."""
    arr = np.frombuffer(buf, np.uint8)[start:]
    quotes = _unescaped(buf, np.flatnonzero(arr == _QUOTE) + start)
    low = arr | 0x20  # "{" 123 / "[" 91 -> 123, "}" 125 / "]" 93 -> 125
    cand = np.flatnonzero((low == 123) | (low == 125))
    pos = cand + start
    inside = (np.searchsorted(quotes, pos) + in_string) % 2 == 1
    pos = pos[~inside]
    steps = np.where((np.frombuffer(buf, np.uint8)[pos] | 0x20) == 123, 1, -1).astype(np.int64)
    return pos, steps, len(quotes)


class Scanner:
    """The structure of a JSON text fed block by block, from a known state (depth, outside strings).

    Attributes
    ----------
    cut : int
        Position (in the buffer last fed) of the last comma that follows a record of depth
        :attr:`level` (-1: none yet).
    end : int
        Position of the ``}`` that closes the object of depth :attr:`level` (-1: not reached).
    """

    def __init__(self, depth: int = 2) -> None:
        self.level = depth
        self.depth = depth
        self.in_string = False
        self.cut = -1
        self.end = -1
        self._pending = -1  # a record end whose comma is not in the buffer yet

    def feed(self, buf: bytes | bytearray, start: int) -> None:
        """Scan ``buf[start:]`` (``buf[:start]`` was scanned before, in the same buffer or its tail)."""
        if self.end >= 0:
            return  # the object is closed: what follows is not its business
        pos, steps, n_quotes = _structure(buf, start, self.in_string)
        self.in_string = bool((self.in_string + n_quotes) % 2)
        ends = []
        if self._pending >= 0:
            ends.append(self._pending)
            self._pending = -1
        if len(pos):
            depth = self.depth + np.cumsum(steps)
            closed = np.flatnonzero(depth < self.level)
            if len(closed):
                k = int(closed[0])
                self.end = int(pos[k])
                pos, depth, steps = pos[:k], depth[:k], steps[:k]
            self.depth = int(depth[-1]) if len(depth) else self.depth
            rec = pos[(depth == self.level) & (steps < 0)]
            if len(rec):
                ends = [int(p) for p in rec[-2:]]
        limit = self.end if self.end >= 0 else len(buf)
        for p in reversed(ends):
            q = p + 1
            while q < limit and buf[q] in _WS:
                q += 1
            if q >= limit:
                if self.end < 0 and p == ends[-1]:
                    self._pending = p  # the comma may come with the next block
                continue
            if buf[q] == _COMMA:
                self.cut = q
                break

    def rebase(self, offset: int) -> None:
        """The buffer lost its first *offset* bytes (everything up to and including the cut)."""
        self.cut = -1
        if self._pending >= 0:
            self._pending -= offset
        if self.end >= 0:
            self.end -= offset


def find_data(head: bytes) -> int:
    """Position of the ``{`` that opens the top-level ``data`` member in *head*, or -1.

    *head* is the beginning of the file; the first ``"data"`` key at depth 1 (outside strings)
    followed by ``:`` and ``{`` counts.
    """
    pos, steps, _ = _structure(head, 0, False)
    arr = np.frombuffer(head, np.uint8)
    quotes = _unescaped(head, np.flatnonzero(arr == _QUOTE))
    depth_after = np.cumsum(steps)
    i = head.find(b'"data"')
    while i >= 0:
        k = int(np.searchsorted(quotes, i))
        if k < len(quotes) and quotes[k] == i and k % 2 == 0:  # an opening quote
            j = int(np.searchsorted(pos, i))
            depth = int(depth_after[j - 1]) if j else 0
            if depth == 1:
                q = i + 6
                while q < len(head) and head[q] in _WS:
                    q += 1
                if q < len(head) and head[q] == ord(":"):
                    q += 1
                    while q < len(head) and head[q] in _WS:
                        q += 1
                    if q < len(head) and head[q] == ord("{"):
                        return q
        i = head.find(b'"data"', i + 1)
    return -1
