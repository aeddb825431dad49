"""The raw records of a few named nodes of one (step, rank) dump.json, read on demand.

A node's record is found by its key (``"Tensor.__add__.6.forward": {``) in the file's bytes
(memory-mapped, so a gigabyte file costs nothing to search) and only that JSON object is
decoded, with msprobe's bare ``NaN``/``Infinity`` tokens, as the standard library reads them.

Examples
--------
>>> import precnb
>>> recs = node_records(precnb.sample_path("xfw/ms_bug"), 0, 0, ["Tensor.__add__.6.forward", "no.such.node"])
>>> sorted(recs), recs["Tensor.__add__.6.forward"]["input_args"][1]
(['Tensor.__add__.6.forward'], {'type': 'float', 'value': 0.01})
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from precnb.errors import NotADumpError
from precnb.io._fs import open_regular
from precnb.io.msprobe.discover import discover

__all__ = ["node_records"]

_WINDOW = 1 << 16  # first guess at a record's size; doubled until the object is complete
_MAX_RECORD = 1 << 28


def _decode_at(buf: Any, start: int) -> Any:
    """The JSON value starting at byte *start* of *buf* (None when it is not one)."""
    decoder = json.JSONDecoder()
    size = _WINDOW
    while True:
        chunk = bytes(buf[start:start + size])
        try:
            text = chunk.decode("utf-8", errors="replace")
            value, _ = decoder.raw_decode(text)
            return value
        except json.JSONDecodeError:
            if start + size >= len(buf) or size >= _MAX_RECORD:
                return None
            size *= 2


def _find(buf: Any, node: str, data_at: int) -> int:
    """Byte offset of *node*'s record value in the ``data`` object (-1 when absent)."""
    for key in (json.dumps(node), json.dumps(node, ensure_ascii=False)):
        needle = key.encode("utf-8") + b":"
        at = buf.find(needle, data_at)
        while at >= 0:
            after = at + len(needle)
            while after < len(buf) and buf[after:after + 1] in (b" ", b"\n", b"\r", b"\t"):
                after += 1
            if buf[after:after + 1] in (b"{", b"n"):  # an object (or null) follows the key
                return after
            at = buf.find(needle, after)
    return -1


def node_records(path: Path, step: int, rank: int, nodes: Sequence[str]) -> dict[str, Any]:
    """Node → record (a dict) of *nodes* in the dump.json of (*step*, *rank*) below *path*.

    Nodes the file does not hold, or a (step, rank) the run does not have, are left out; a file
    that cannot be read gives ``{}`` (the caller's finding stays as it was).
    """
    step_dir = Path(path) / f"step{step}"  # the usual layout: list that step's folders only, not the whole run
    try:
        found = discover(step_dir if step_dir.is_dir() else path, steps=[step], ranks=[rank])
    except NotADumpError:  # not this (step, rank)
        return {}
    rds = [rd for rd in found if rd.step == step and rd.rank == rank]
    out: dict[str, Any] = {}
    for rd in rds[:1]:
        try:
            with open_regular(rd.dump_file) as fh:
                if fh.seek(0, 2) == 0:
                    return out
                with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                    data_at = buf.find(b'"data"')
                    if data_at < 0:
                        return out
                    for node in dict.fromkeys(nodes):
                        at = _find(buf, node, data_at)
                        if at >= 0:
                            rec = _decode_at(buf, at)
                            if isinstance(rec, dict):
                                out[node] = rec
        except (OSError, ValueError):
            return out
    return out
