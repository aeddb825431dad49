"""Reader for msprobe dumps (``dump.json`` + ``construct.json`` + ``stack.json`` per (step, rank) folder).

Handles PyTorch and MindSpore writers; tasks statistics, md5 (CRC-32 / XOR), tensor and
structure; levels L0, L1 and mix; ``rank{R}``, bare ``rank`` and ``proc{PID}`` folders; both
stack.json formats; Megatron ``[parent, micro_step]`` construct values; bare
``NaN``/``Infinity`` tokens; missing ``framework``/``level`` keys.

- :mod:`~precnb.io.msprobe.discover`: where the files are;
- :mod:`~precnb.io.msprobe.parse`: the one parser of a (step, rank) folder
  (:mod:`~precnb.io.msprobe._json` the JSON text batch by batch,
  :mod:`~precnb.io.msprobe.values` the value rules, :mod:`~precnb.io.msprobe.sides` the side tables);
- :mod:`~precnb.io.msprobe.load`: discovery, parsing and assembly of a run.

Examples
--------
>>> READER.name, READER.can_open("/nonexistent")
('msprobe', False)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from precnb.io.msprobe.discover import DUMP_FILES, RankDir, discover, is_msprobe_dump
from precnb.io.readers import Reader

__all__ = ["DUMP_FILES", "READER", "RankDir", "discover", "is_msprobe_dump", "read_rank_dir"]


def read_rank_dir(rd: RankDir, **kw: Any) -> Any:
    """Parse one (step, rank) folder (:func:`precnb.io.msprobe.parse.read_rank_dir`)."""
    from precnb.io.msprobe.parse import read_rank_dir as read

    return read(rd, **kw)


def _open(path: Path, **options: Any) -> Any:
    from precnb.io.msprobe.load import open_msprobe

    return open_msprobe(path, **options)


def _steps(path: Path, ranks: Any = None) -> list[int]:
    from precnb.io.msprobe.load import available_steps

    return available_steps(path, ranks)


def _stream(path: Path, **options: Any) -> Any:
    from precnb.io.msprobe.load import stream_msprobe

    return stream_msprobe(path, **options)


def _records(path: Path, step: int, rank: int, nodes: Any) -> dict[str, Any]:
    from precnb.io.msprobe.records import node_records

    return node_records(path, step, rank, nodes)


READER = Reader(name="msprobe", can_open=is_msprobe_dump, open=_open, description="an msprobe dump",
                available_steps=_steps, stream=_stream, detect_priority=10, node_records=_records)
