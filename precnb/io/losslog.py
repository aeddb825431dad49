r"""Loss logs: a CSV ``step,loss[,rank]`` or TensorBoard event files, read into one table.

A dump often covers only the steps around an incident; the loss of every step is in the
training's own log. :func:`read_loss_log` returns a DataFrame with columns ``step`` (int),
``rank`` (float: NaN for a log of the whole job) and ``loss`` (float64, NaN / ±inf kept).

* **CSV**: a header naming ``step`` and ``loss`` (any order; ``rank`` optional; other columns
  ignored); one row per step (and rank). ``nan`` / ``inf`` cells are kept as such.
* **TensorBoard** (``events.out.tfevents.*``, a file or a folder searched down to 4 levels): read
  without TensorFlow or TensorBoard — the TFRecord framing (length, masked CRC-32C of the length,
  the record, masked CRC-32C of the record) and the few protobuf fields of ``Event`` →
  ``Summary`` → ``Value`` (``tag``; ``simple_value`` as ``SummaryWriter.add_scalar`` writes it,
  or a scalar ``tensor`` as ``tf.summary.scalar`` writes it) are decoded by bounds-checked code
  that never evaluates anything; every record's length checksum is verified, and the record
  checksum of every record whose value is used. The loss tag is the one named ``loss`` (or ending
  in ``/loss``, ``lm loss``, ...), training rather than validation; give ``tag=`` to choose. A
  ``rank{N}`` folder or file name gives the rank; otherwise the log is the job's.

Bad input raises :class:`~precnb.errors.DumpFormatError` naming the file and what is wrong.

Examples
--------
>>> import tempfile
>>> path = Path(tempfile.mkdtemp()) / "loss.csv"
>>> _ = path.write_text("step,loss,rank\n0,4.4,0\n0,4.3,1\n1,nan,0\n")
>>> read_loss_log(path).to_dict("records")[2]
{'step': 1, 'rank': 0.0, 'loss': nan}
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from precnb.errors import DumpFormatError

__all__ = ["is_event_file", "read_event_scalars", "read_loss_log"]

_EVENTS = "tfevents"
_RANK = re.compile(r"(?:^|[^a-z])rank[_-]?(\d{1,9})(?:[^0-9]|$)", re.IGNORECASE)
_MAX_RECORD = 1 << 30
_MAX_DEPTH = 4
_MAX_FILES = 10_000


def is_event_file(path: str | os.PathLike[str]) -> bool:
    """Whether *path* is named like a TensorBoard event file (``events.out.tfevents.*``)."""
    return _EVENTS in Path(path).name and Path(path).name.startswith("events")


# -- CRC-32C (Castagnoli), for TFRecord checksums -----------------------------------------------
def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def _crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    t = _TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    c = _crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# -- protobuf wire format (only what Event / Summary / Value / TensorProto need) ----------------
def _varint(buf: bytes, i: int, end: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= end or shift > 63:
            raise ValueError("truncated or overlong varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, Any]]:
    """Yield (field number, wire type, value) of a message in ``buf[start:end]``.

    Value: an int (varint), ``(lo, hi)`` bounds of a length-delimited field, or the raw bytes of
    a fixed 32/64-bit field.
    """
    i = start
    while i < end:
        key, i = _varint(buf, i, end)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i, end)
            yield num, wire, v
        elif wire == 1:
            if i + 8 > end:
                raise ValueError("truncated 64-bit field")
            yield num, wire, buf[i:i + 8]
            i += 8
        elif wire == 2:
            n, i = _varint(buf, i, end)
            if n > end - i:
                raise ValueError("length-delimited field runs past its message")
            yield num, wire, (i, i + n)
            i += n
        elif wire == 5:
            if i + 4 > end:
                raise ValueError("truncated 32-bit field")
            yield num, wire, buf[i:i + 4]
            i += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")


_DT_FLOAT, _DT_DOUBLE, _DT_HALF, _DT_BFLOAT16 = 1, 2, 19, 14


def _tensor_scalar(buf: bytes, lo: int, hi: int) -> float | None:  # noqa: C901
    """The value of a scalar (one element) TensorProto of a float dtype, else None."""
    dtype, dims, content = 0, 0, None
    floats: list[float] = []
    halves: list[int] = []
    for num, wire, v in _fields(buf, lo, hi):
        if num == 1 and wire == 0:
            dtype = int(v)
        elif num == 2 and wire == 2:  # TensorShapeProto: field 2 = dim {size = 1}
            a, b = v
            for dn, dw, dv in _fields(buf, a, b):
                if dn == 2 and dw == 2:
                    for sn, sw, sv in _fields(buf, dv[0], dv[1]):
                        if sn == 1 and sw == 0 and sv != 1:
                            dims += 1
        elif num == 4 and wire == 2:
            content = buf[v[0]:v[1]]
        elif num == 5:  # float_val: packed or not
            if wire == 5:
                floats.append(struct.unpack("<f", v)[0])
            elif wire == 2:
                raw = buf[v[0]:v[1]]
                floats += list(struct.unpack(f"<{len(raw) // 4}f", raw[: len(raw) // 4 * 4]))
        elif num == 6:  # double_val
            if wire == 1:
                floats.append(struct.unpack("<d", v)[0])
            elif wire == 2:
                raw = buf[v[0]:v[1]]
                floats += list(struct.unpack(f"<{len(raw) // 8}d", raw[: len(raw) // 8 * 8]))
        elif num == 13 and wire == 2:  # half_val: packed int32 holding the 16 bits
            a, b = v
            while a < b:
                x, a = _varint(buf, a, b)
                halves.append(x)
    if dims:
        return None
    if dtype == _DT_FLOAT:
        if content is not None and len(content) == 4:
            return float(struct.unpack("<f", content)[0])
        return float(floats[0]) if len(floats) == 1 else None
    if dtype == _DT_DOUBLE:
        if content is not None and len(content) == 8:
            return float(struct.unpack("<d", content)[0])
        return float(floats[0]) if len(floats) == 1 else None
    if dtype in (_DT_HALF, _DT_BFLOAT16):
        bits = struct.unpack("<H", content)[0] if content is not None and len(content) == 2 else (
            halves[0] if len(halves) == 1 else None)
        if bits is None:
            return None
        if dtype == _DT_HALF:
            return float(np.frombuffer(struct.pack("<H", bits & 0xFFFF), dtype=np.float16)[0])
        return float(np.frombuffer(struct.pack("<I", (bits & 0xFFFF) << 16), dtype=np.float32)[0])
    return None


def _event_scalars(buf: bytes, lo: int, hi: int) -> tuple[int | None, list[tuple[str, float]]]:
    """(step, [(tag, value)]) of one Event record."""
    step: int | None = None
    out: list[tuple[str, float]] = []
    for num, wire, v in _fields(buf, lo, hi):
        if num == 2 and wire == 0:
            step = int(v)
            if step >= 1 << 63:
                step -= 1 << 64
        elif num == 5 and wire == 2:  # Summary
            lo2, hi2 = v
            for sn, sw, sv in _fields(buf, lo2, hi2):
                if sn != 1 or sw != 2:
                    continue
                tag, value = None, None
                for vn, vw, vv in _fields(buf, sv[0], sv[1]):
                    if vn == 1 and vw == 2:
                        tag = buf[vv[0]:vv[1]].decode("utf-8", "replace")
                    elif vn == 2 and vw == 5:
                        value = float(struct.unpack("<f", vv)[0])
                    elif vn == 8 and vw == 2:
                        value = _tensor_scalar(buf, vv[0], vv[1])
                if tag is not None and value is not None:
                    out.append((tag, value))
    return step, out


def read_event_scalars(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Every scalar of one TensorBoard event file: columns ``step``, ``tag``, ``value``, ``record``.

    Raises
    ------
    DumpFormatError
        When the file cannot be read, a record's length checksum fails, or a used record's
        checksum fails / does not decode. A last record cut short (a log being written) is
        ignored.
    """
    try:
        buf = Path(path).read_bytes()
    except OSError as exc:
        raise DumpFormatError(str(path), f"cannot read: {exc.strerror or exc}") from exc
    rows: list[tuple[int, str, float, int]] = []
    i, n, k = 0, len(buf), 0
    while i < n:
        if i + 12 > n:
            break  # a truncated header: the writer was interrupted
        head = buf[i:i + 8]
        (length,) = struct.unpack("<Q", head)
        (crc,) = struct.unpack("<I", buf[i + 8:i + 12])
        if _masked(head) != crc:
            raise DumpFormatError(str(path), f"record {k} at byte {i}: length checksum mismatch (not a TensorBoard "
                                             "event file, or corrupted)")
        if length > _MAX_RECORD:
            raise DumpFormatError(str(path), f"record {k} at byte {i}: implausible length {length}")
        lo, hi = i + 12, i + 12 + length
        if hi + 4 > n:
            break  # the last record is incomplete
        try:
            step, scalars = _event_scalars(buf, lo, hi)
        except (ValueError, struct.error) as exc:
            raise DumpFormatError(str(path), f"record {k} at byte {i}: not a readable Event ({exc})") from None
        if scalars:
            (dcrc,) = struct.unpack("<I", buf[hi:hi + 4])
            if _masked(buf[lo:hi]) != dcrc:
                raise DumpFormatError(str(path), f"record {k} at byte {i}: data checksum mismatch (corrupted)")
            rows += [(int(step or 0), t, v, k) for t, v in scalars]
        i = hi + 4
        k += 1
    return pd.DataFrame(rows, columns=["step", "tag", "value", "record"])


_PREFERRED = ("loss", "train/loss", "train_loss", "loss/train", "lm loss", "train/lm loss", "lm-loss",
              "training_loss", "train/loss_step")
_NOT_TRAIN = ("val", "eval", "valid", "test", "scale", "lr", "grad")


def _loss_tag(tags: list[str], wanted: str | None) -> str | None:
    if wanted is not None:
        return wanted if wanted in tags else None
    low = {t: t.lower() for t in tags}
    for p in _PREFERRED:
        hit = [t for t in tags if low[t] == p]
        if hit:
            return hit[0]
    cands = [t for t in tags if re.search(r"(^|[/ _-])loss$", low[t]) and not any(
        re.search(rf"(^|[/ _-]){w}", low[t]) for w in _NOT_TRAIN)]
    return sorted(cands, key=len)[0] if cands else None


def _event_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        if depth >= _MAX_DEPTH:
            dirnames[:] = []
        dirnames.sort()
        out += [Path(dirpath) / f for f in sorted(filenames) if is_event_file(f)]
        if len(out) > _MAX_FILES:
            raise DumpFormatError(str(root), f"more than {_MAX_FILES} event files; point at one run's folder")
    return out


def _rank_of(path: Path, root: Path) -> float:
    rel = path.relative_to(root) if root in path.parents or path == root else Path(path.name)
    for part in reversed(rel.parts):
        m = _RANK.search(part)
        if m:
            return float(int(m.group(1)))
    return math.nan


def _read_events(root: Path, tag: str | None) -> pd.DataFrame:
    files = _event_files(root)
    if not files:
        raise DumpFormatError(str(root), "no TensorBoard event file (events.out.tfevents.*) in it")
    parts = []
    for f in files:
        df = read_event_scalars(f)
        df["rank"] = _rank_of(f, root if root.is_dir() else f.parent)
        df["file"] = str(f)
        parts.append(df)
    allv = pd.concat(parts, ignore_index=True)
    chosen = _loss_tag(sorted(set(allv["tag"])), tag)
    if chosen is None:
        tags = ", ".join(sorted(set(allv["tag"]))[:12]) or "none"
        raise DumpFormatError(str(root), (f"no scalar tag {tag!r}" if tag else "no loss scalar") + f" (tags: {tags})")
    sub = allv[allv["tag"] == chosen]
    # a step written twice (a restart appends to the log): the last record wins, as TensorBoard shows it
    sub = sub.sort_values(["rank", "file", "record"], kind="stable").drop_duplicates(["rank", "step"], keep="last")
    out = pd.DataFrame({"step": sub["step"].astype(np.int64).to_numpy(), "rank": sub["rank"].to_numpy(float),
                        "loss": sub["value"].to_numpy(float)})
    out.attrs["tag"] = chosen
    return out.sort_values(["step", "rank"], kind="stable").reset_index(drop=True)


def _read_csv(path: Path) -> pd.DataFrame:
    from precnb.io._csvutil import iter_rows, parse_float

    rows = iter_rows(path)
    try:
        _, header = next(rows)
    except StopIteration:
        raise DumpFormatError(str(path), "empty file (expected a header step,loss[,rank])") from None
    cols = [c.strip().lower() for c in header]
    if "step" not in cols or "loss" not in cols:
        raise DumpFormatError(str(path), f"line 1: the header must name step and loss (got {', '.join(cols)[:200]})")
    si, li = cols.index("step"), cols.index("loss")
    ri = cols.index("rank") if "rank" in cols else None
    steps: list[int] = []
    ranks: list[float] = []
    losses: list[float] = []
    for line, cells in rows:
        if len(cells) != len(cols):
            raise DumpFormatError(str(path), f"line {line}: {len(cells)} fields, the header has {len(cols)}")
        for name, j in (("step", si), ("rank", ri)):
            if j is None:
                continue
            txt = cells[j].strip()
            if name == "rank" and not txt:
                continue
            if not txt.isdigit() or len(txt) > 12:
                raise DumpFormatError(str(path), f"line {line}: {name} {txt[:40]!r} is not a non-negative integer")
        try:
            v = parse_float(cells[li], bools=False)
        except ValueError:
            raise DumpFormatError(str(path), f"line {line}: loss {cells[li][:40]!r} is not a number") from None
        steps.append(int(cells[si]))
        ranks.append(float(int(cells[ri])) if ri is not None and cells[ri].strip() else math.nan)
        losses.append(math.nan if v is None else float(v))
    df = pd.DataFrame({"step": np.asarray(steps, dtype=np.int64), "rank": np.asarray(ranks, dtype=float),
                       "loss": np.asarray(losses, dtype=float)})
    dup = df.duplicated(["step", "rank"], keep=False)
    if dup.any():
        first = df[dup].iloc[0]
        raise DumpFormatError(str(path), f"step {int(first['step'])}"
                              + (f" rank {int(first['rank'])}" if np.isfinite(first["rank"]) else "")
                              + " appears more than once")
    return df


def read_loss_log(path: str | os.PathLike[str], *, tag: str | None = None) -> pd.DataFrame:
    """Read a loss log (see the module docstring).

    Parameters
    ----------
    path : path
        A CSV file, a TensorBoard event file, or a folder of event files.
    tag : str, optional
        The TensorBoard scalar tag of the loss (default: found, see the module docstring).

    Returns
    -------
    pandas.DataFrame
        ``step`` (int64), ``rank`` (float, NaN = the whole job), ``loss`` (float64); ``attrs``
        ``source`` (the path) and, for TensorBoard, ``tag``.

    Raises
    ------
    DumpFormatError
        For a file that is neither, or is malformed (one line naming the file and the problem).
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise DumpFormatError(str(path), "no such file or folder")
    df = _read_events(p, tag) if p.is_dir() or is_event_file(p) else _read_csv(p)
    if not len(df):
        raise DumpFormatError(str(path), "no loss values")
    df.attrs["source"] = str(path)
    return df
