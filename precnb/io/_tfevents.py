"""TensorBoard event files read without TensorFlow: the TFRecord framing and the few protobuf fields of a scalar.

A record is its length (u64), the masked CRC-32C of the length, the record, the masked CRC-32C of the
record. An ``Event`` holds ``step`` and a ``Summary`` of ``Value`` s (``tag``; ``simple_value`` as
``SummaryWriter.add_scalar`` writes it, or a scalar ``tensor`` as ``tf.summary.scalar`` writes it). Decoded
by bounds-checked code that never evaluates anything; used by :func:`precnb.io.losslog.read_loss_log`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from precnb.errors import DumpFormatError

__all__ = ["is_event_file", "read_event_scalars"]

_EVENTS = "tfevents"
#: the longest record read (a scalar Event is a few dozen bytes; images and graphs that large are not read: the
#: file is refused, naming the record, rather than held in memory: a 1 GiB record used to be allowed, issue #49)
_MAX_RECORD = 16 << 20


def is_event_file(path: str | os.PathLike[str]) -> bool:
    """Whether *path* is named like a TensorBoard event file (``events.out.tfevents.*``)."""
    return _EVENTS in Path(path).name and Path(path).name.startswith("events")


# -- CRC-32C (Castagnoli), for TFRecord checksums: google-crc32c, a core dependency (C; its own pure Python
# fallback where the C extension is not built). precnb keeps no CRC code of its own --
_CRC: Any = None


def _crc32c(data: bytes | memoryview) -> int:
    global _CRC
    if _CRC is None:
        import google_crc32c

        _CRC = google_crc32c.value
    return int(_CRC(bytes(data) if isinstance(data, memoryview) else data))


def _masked(data: bytes) -> int:
    c = _CRC(data) if _CRC is not None and isinstance(data, bytes) else _crc32c(data)
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


def _add_scalar_record(b: bytes, n: int, tags: dict[bytes, str]) -> tuple[int, str, float] | None:
    """(step, tag, value) of an Event exactly as ``SummaryWriter.add_scalar`` writes it, else None.

    ``wall_time`` (fixed64), ``step`` (varint), ``summary {value {tag, simple_value}}`` and nothing else:
    decoded here without the generic field walk (2,000,000 such records took 52 s through :func:`_fields`).
    Any other shape returns None and goes through :func:`_event_scalars`, which gives the same answer for
    this one.
    """
    if n < 20 or b[0] != 0x09 or b[9] != 0x10:
        return None
    i, step, shift = 10, 0, 0
    while True:
        if i >= n or shift > 63:
            return None
        c = b[i]
        step |= (c & 0x7F) << shift
        i += 1
        if c < 0x80:
            break
        shift += 7
    if i + 6 > n or b[i] != 0x2A or b[i + 2] != 0x0A or b[i + 4] != 0x0A:
        return None
    summary, value, tl = b[i + 1], b[i + 3], b[i + 5]
    end = i + 6 + tl
    if summary != value + 2 or value != tl + 7 or tl >= 0x80 or end + 5 != n or b[end] != 0x15:
        return None
    raw = b[i + 6:end]
    tag = tags.get(raw)
    if tag is None:
        tag = tags[raw] = raw.decode("utf-8", "replace")
    step = step & ((1 << 64) - 1)
    return (step - (1 << 64) if step >= 1 << 63 else step), tag, float(struct.unpack_from("<f", b, end + 1)[0])


def read_event_scalars(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Every scalar of one TensorBoard event file: columns ``step``, ``tag``, ``value``, ``record``.

    Raises
    ------
    DumpFormatError
        When the file cannot be read, a record's length checksum fails, or a used record's
        checksum fails / does not decode. A last record cut short (a log being written) is
        ignored.
    """
    from precnb.io._fs import open_regular

    try:
        fh = open_regular(path)  # a FIFO in a --loss folder is refused, never opened (issue #49)
    except OSError as exc:
        raise DumpFormatError(str(path), f"cannot read: {exc.strerror or exc}") from None
    rows: list[tuple[int, str, float, int]] = []
    tags: dict[bytes, str] = {}
    i, k = 0, 0
    with fh:
        while True:
            try:
                head12 = fh.read(12)
            except OSError as exc:
                raise DumpFormatError(str(path), f"cannot read at byte {i}: {exc.strerror or exc}") from None
            if len(head12) < 12:
                break  # the end, or a truncated header: the writer was interrupted
            head = head12[:8]
            (length,) = struct.unpack("<Q", head)
            (crc,) = struct.unpack("<I", head12[8:12])
            if _masked(head) != crc:
                raise DumpFormatError(str(path), f"record {k} at byte {i}: length checksum mismatch (not a "
                                                 "TensorBoard event file, or corrupted)")
            if length > _MAX_RECORD:
                raise DumpFormatError(str(path), f"record {k} at byte {i}: {length} bytes is longer than a scalar "
                                                 f"event file's records may be ({_MAX_RECORD >> 20} MiB)")
            body = fh.read(length + 4)
            if len(body) < length + 4:
                break  # the last record is incomplete
            simple = _add_scalar_record(body, length, tags)
            step: int | None
            scalars: list[tuple[str, float]]
            if simple is not None:
                step, scalars = simple[0], [(simple[1], simple[2])]
            else:
                try:
                    step, scalars = _event_scalars(body, 0, length)
                except (ValueError, struct.error) as exc:
                    raise DumpFormatError(str(path), f"record {k} at byte {i}: not a readable Event ({exc})") from None
            if scalars:
                (dcrc,) = struct.unpack("<I", body[length:length + 4])
                if _masked(body[:length]) != dcrc:
                    raise DumpFormatError(str(path), f"record {k} at byte {i}: data checksum mismatch (corrupted)")
                rows += [(int(step or 0), t, v, k) for t, v in scalars]
            i += 12 + length + 4
            k += 1
    return pd.DataFrame(rows, columns=["step", "tag", "value", "record"])
