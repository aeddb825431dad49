"""Evidence attached to findings: statistics of one entry, stack frames, module path."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.masks import stat_vars
from precnb.schema import META_FIELDS, NULL_BITS, entry_meta, entry_stack, meta_changes, read_side_table

__all__ = ["departing_copy", "entry_values", "label_elsewhere", "node_evidence", "parse_frame", "shard_suspect",
           "stat_distance"]

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
    meta = entry_meta(ds, tensor, step, rank)  # that rank's own (a label may name another op elsewhere)
    out["dtype"] = meta["dtype"]
    out["shape"] = meta["shape"]
    if "crc" in ds and str(e["crc"].values):
        out["crc"] = str(e["crc"].values)
    return out


def stat_distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest difference of two entries' statistics, relative to *b*'s magnitude (max |x|)."""
    scale = max((abs(float(b[s])) for s in ("max", "min") if b.get(s) is not None), default=0.0) or 1e-30
    out = 0.0
    for s in ("max", "min", "mean", "norm"):
        x, y = a.get(s), b.get(s)
        if x is None or y is None:
            continue
        x, y = float(x), float(y)
        if np.isnan(x) and np.isnan(y):
            continue
        out = max(out, abs(x - y) / scale if np.isfinite(x - y) else np.inf)
    return out


def departing_copy(ds: xr.Dataset, baseline: dict[str, Any], *, step: int, rank: int, tensor: str
                   ) -> dict[str, Any] | None:
    """Which copy of a merged replicated entry departs from the *baseline* entry's values.

    A merge keeps the group's first copy and, where the copies differ, the first differing one beside it
    (``copy_rank``, ``copy_max`` …: :func:`precnb.analysis.layout.merge.merge_shards`). The copy farther from
    the baseline departs: ``{"rank": its dump rank, "agrees": the other's, "values": its statistics}``; None when
    the entry's copies agree or the baseline has no value.

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> departing_copy(empty_dataset(), {"present": True, "max": 1.0}, step=0, rank=0, tensor="x") is None
    True
    """
    if "copy_rank" not in ds.data_vars or tensor not in ds.indexes["tensor"] or not baseline.get("present"):
        return None
    e = ds.sel(step=step, rank=rank, tensor=tensor)
    other = int(e["copy_rank"])
    if other < 0:
        return None
    first = entry_values(ds, step=step, rank=rank, tensor=tensor)
    # the copy is there (copy_rank >= 0): a NaN among its statistics is its value (a copy that went NaN departs), not
    # an absent statistic
    copy = {s: float(e[f"copy_{s}"]) for s in ("max", "min", "mean", "norm")}
    first_rank = int(e["copy_first_rank"]) if "copy_first_rank" in ds.data_vars else None
    if stat_distance(copy, baseline) > stat_distance(first, baseline):
        return {"rank": other, "agrees": first_rank, "values": copy}
    return {"rank": first_rank, "agrees": other, "values": {s: first.get(s) for s in copy}}


def shard_suspect(ds: xr.Dataset, baseline: dict[str, Any], *, step: int, rank: int, tensor: str, rtol: float
                  ) -> dict[str, Any] | None:
    """Which member of a merged shard entry that differs from the *baseline* entry is behind the difference.

    A merged shard (TP, CP or a data-parallel replica's part of the batch) is compared whole; the merge keeps,
    per entry, the member that is odd in its group and the members holding the merged extremes
    (:func:`precnb.analysis.layout.merge.merge_shards`). In that order: a member whose statistics are not
    finite while another's are, the member holding the merged Max when the Max goes beyond the baseline's by
    more than *rtol*, the one holding the Min when the Min does (an extreme that falls short of the baseline's says
    nothing about its holder: the member that held the baseline's may be another one). A copy of another rank's
    shard is found by the pipeline, over every step read. Returns ``{"rank": dump rank, "why": text}``; when
    extremes agree, ``{"rank": None, "vouched": [their holders], "by": ["Max", "Min"], "why": …}`` (a
    group with one other member names it); None when nothing singles out a member.

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> shard_suspect(empty_dataset(), {"present": True, "max": 1.0}, step=0, rank=0, tensor="x", rtol=0.0) is None
    True
    """
    if "shard_odd_rank" not in ds.data_vars or tensor not in ds.indexes["tensor"] or not baseline.get("present"):
        return None
    e = ds.sel(step=step, rank=rank, tensor=tensor)
    odd = int(e["shard_odd_rank"])
    if odd >= 0:
        return {"rank": odd, "why": f"rank {odd}'s shard is odd in its group: its statistics are not finite while "
                                    "another shard's are"}
    mine = entry_values(ds, step=step, rank=rank, tensor=tensor)
    agree: list[int] = []
    agreed: list[str] = []
    for stat, var, sign in (("max", "shard_max_rank", 1.0), ("min", "shard_min_rank", -1.0)):
        a, b, holder = mine.get(stat), baseline.get(stat), int(e[var])
        if a is None or b is None or holder < 0:
            continue
        a, b = float(a), float(b)
        scale = max(abs(a), abs(b))
        if not np.isfinite(a - b):
            return {"rank": holder, "why": f"the merged {stat.capitalize()}, which differs, is rank {holder}'s"}
        if abs(a - b) > rtol * scale:
            if sign * (a - b) > 0:  # beyond the baseline's extreme: the member holding it went there
                return {"rank": holder, "why": f"the merged {stat.capitalize()}, which goes beyond the baseline's, "
                                              f"is rank {holder}'s"}
            continue  # short of the baseline's extreme: the member that held it is not known (it may be any)
        agree.append(holder)
        agreed.append(stat.capitalize())
    if agree:  # the members holding extremes that agree: the rest of the group is suspect (see the caller)
        verb = "agree" if len(agreed) > 1 else "agrees"
        return {"rank": None, "vouched": sorted(set(agree)), "by": agreed,
                "why": f"the merged {' and '.join(agreed)} {verb} with the baseline"}
    return None


def node_evidence(ds: xr.Dataset, node: str, *, step: int | None = None, rank: int | None = None,
                  tensor: str | None = None) -> dict[str, Any]:
    """Stack frames and module ancestry of *node* (from stack.json / construct.json).

    With *step* and *rank*, as that rank recorded them (its own stack frames and parent: one label
    may name another op on another rank); *tensor* names the node's tensor to take the parent of.
    """
    tree = read_side_table(ds, "construct")
    parent = tree.get(node)
    if step is not None and rank is not None and ds.attrs.get("meta_changes"):  # that rank's own parent
        label = tensor if tensor is not None else _a_label(ds, node)
        own = meta_changes(ds).get("parent", {}).get(label or "", {}).get((int(step), int(rank)))
        if own:
            parent = own
    chain: list[str] = []
    seen = {node}
    while parent and parent not in seen:
        chain.append(parent)
        seen.add(parent)
        parent = tree.get(parent)
    return {"stack": entry_stack(ds, node, step, rank), "module_path": chain}


def _a_label(ds: xr.Dataset, node: str) -> str | None:
    """A tensor label of *node* (None when the run holds none)."""
    cols = np.flatnonzero(np.asarray(ds["node"].values) == node)
    return str(ds["tensor"].values[cols[0]]) if len(cols) else None


def label_elsewhere(ds: xr.Dataset, tensor: str, *, step: int, rank: int) -> list[dict[str, Any]]:
    """Where else the label *tensor* names another op: other metadata than at (*step*, *rank*).

    A rank that runs one op more (or less) shifts its call counters, so one label names different
    ops on different ranks. Returns one dict per other metadata: ``module``, ``shape``, ``parent``,
    ``ranks`` and ``steps`` where the label has it (empty when every entry agrees).
    """
    table = meta_changes(ds)
    if tensor not in ds.indexes["tensor"] or not any(tensor in table.get(f, {}) for f in META_FIELDS):
        return []
    j = int(ds.indexes["tensor"].get_loc(tensor))
    present = np.asarray(ds["present"].values[:, :, j], bool)
    here = entry_meta(ds, tensor, step, rank, table)
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    for si, ri in np.argwhere(present).tolist():
        s, r = int(ds["step"].values[si]), int(ds["rank"].values[ri])
        m = entry_meta(ds, tensor, s, r, table)
        key = tuple(m[f] for f in META_FIELDS)
        if key == tuple(here[f] for f in META_FIELDS):
            continue
        g = groups.setdefault(key, {**{f: m[f] for f in META_FIELDS}, "ranks": [], "steps": []})
        if r not in g["ranks"]:
            g["ranks"].append(r)
        if s not in g["steps"]:
            g["steps"].append(s)
    return [{**g, "ranks": sorted(g["ranks"]), "steps": sorted(g["steps"])} for g in groups.values()]


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
