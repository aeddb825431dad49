"""Evidence attached to findings: statistics of one entry, stack frames, module path."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.masks import stat_vars
from precnb.schema import NULL_BITS, entry_dtype, side_table

__all__ = ["entry_values", "node_evidence", "parse_frame"]

_FRAME = re.compile(r"^\s*File\s+(?P<file>.+?),\s+line\s+(?P<line>\d+),\s+in\s+(?P<func>[^,\n]+),?\s*(?P<code>.*)$",
                    re.DOTALL)
_LIB = ("site-packages", "dist-packages", "/lib/python3", "\\lib\\python3", "<frozen")



def entry_values(ds: xr.Dataset, *, step: int, rank: int, tensor: str) -> dict[str, Any]:
    """Statistics and metadata of one (step, rank, tensor) entry; ``None`` for null stats."""
    if tensor not in ds.indexes["tensor"]:
        return {"present": False}
    e = ds.sel(step=step, rank=rank, tensor=tensor)
    if not bool(e["present"]):
        return {"present": False}
    null = int(e["null_stats"])
    out: dict[str, Any] = {"present": True}
    for s in stat_vars(ds):
        bit = NULL_BITS.get(s, 0)
        out[s] = None if (bit and null & bit) else float(e[s])
    out["dtype"] = entry_dtype(ds, tensor, step, rank)
    out["shape"] = str(e["shape"].values)
    if "crc" in ds and str(e["crc"].values):
        out["crc"] = str(e["crc"].values)
    return out


def node_evidence(ds: xr.Dataset, node: str) -> dict[str, Any]:
    """Stack frames and module ancestry of *node* (from stack.json / construct.json)."""
    stacks = side_table(ds, "stacks")
    tree = side_table(ds, "construct")
    chain: list[str] = []
    cur, seen = node, {node}
    while (parent := tree.get(cur)) and parent not in seen:
        chain.append(parent)
        seen.add(parent)
        cur = parent
    return {"stack": list(stacks.get(node, [])), "module_path": chain}


def first_by_seq(mask: np.ndarray, seq: np.ndarray) -> int | None:
    """Index of the True entry with the smallest non-negative seq, or None."""
    if not mask.any():
        return None
    s = np.where(mask & (seq >= 0), seq, np.iinfo(np.int64).max)
    j = int(np.argmin(s))
    return j if s[j] != np.iinfo(np.int64).max else int(np.flatnonzero(mask)[0])


def parse_frame(frame: Any) -> dict[str, Any]:
    r"""Split a stack.json frame into location, function and code; flag library frames.

    Examples
    --------
    >>> f = parse_frame("File /a/model.py, line 7, in forward, \n y = f(x)")
    >>> f["file"], f["line"], f["func"], f["code"], f["lib"]
    ('/a/model.py', '7', 'forward', 'y = f(x)', False)
    """
    text = str(frame)
    m = _FRAME.match(text)
    if not m:
        return {"file": "", "line": "", "func": "", "code": text.strip(), "raw": text, "lib": False}
    file = m.group("file").strip()
    return {"file": file, "line": m.group("line"), "func": m.group("func").strip(),
            "code": " ".join(m.group("code").split()), "raw": text,
            "lib": any(s in file for s in _LIB)}
