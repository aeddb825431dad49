"""A string column of few distinct texts kept as small integer codes (shapes, dtypes, roles of a file's tensors)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["TextColumn"]


class TextColumn:
    """A string column of few distinct texts, kept as small integer codes batch by batch (not a list of millions).

    Examples
    --------
    >>> col = TextColumn()
    >>> col.extend(["input", "output", "input"])
    >>> col.extend(["grad"])
    >>> col.array().tolist(), "grad" in col, "parameter" in col, len(col)
    (['input', 'output', 'input', 'grad'], True, False, 4)
    """

    __slots__ = ("_code", "_n", "_parts", "_texts")

    def __init__(self) -> None:
        self._code: dict[str, int] = {}
        self._texts: list[str] = []
        self._parts: list[np.ndarray] = []
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __contains__(self, text: object) -> bool:
        return text in self._code  # a text gets a code when it is first added

    def extend(self, texts: Sequence[str]) -> None:
        """Append *texts* (strings)."""
        code = self._code
        for t in set(texts) - code.keys():
            code[t] = len(self._texts)
            self._texts.append(t)
        kind = np.uint16 if len(self._texts) <= 1 << 16 else np.int32
        self._parts.append(np.fromiter(map(code.__getitem__, texts), kind, len(texts)))
        self._n += len(texts)

    def extend_coded(self, codes: bytes, texts: Sequence[str]) -> None:
        """Append one text per int32 of *codes*, an index into *texts* (each of them used; the C reader's form).

        Examples
        --------
        >>> col = TextColumn()
        >>> col.extend(["grad"])
        >>> col.extend_coded(np.array([1, 0, 1], np.int32).tobytes(), ["input", "grad"])
        >>> col.array().tolist(), len(col)
        (['grad', 'grad', 'input', 'grad'], 4)
        """
        code = self._code
        for t in texts:
            if t not in code:
                code[t] = len(self._texts)
                self._texts.append(t)
        kind = np.uint16 if len(self._texts) <= 1 << 16 else np.int32
        remap = np.fromiter(map(code.__getitem__, texts), kind, len(texts))
        local = np.frombuffer(codes, np.int32)
        self._parts.append(remap[local])
        self._n += len(local)

    def array(self) -> np.ndarray:
        """The column as an object array of str (the codes are let go)."""
        table = np.empty(len(self._texts), object)
        table[:] = self._texts
        codes = _join(self._parts, np.int32)
        return table[codes]


def _join(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    """*parts* concatenated into one array; *parts* is emptied."""
    out = np.concatenate(parts) if parts else np.zeros(0, dtype)
    parts.clear()
    return out
