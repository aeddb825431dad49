"""Write tests/fixtures/tensorboard/: the spike_data loss log as real TensorBoard event files.

Run with an interpreter that has ``tensorboard`` installed (a development tool, not a precnb
dependency)::

    python -m venv /tmp/tb && /tmp/tb/bin/pip install tensorboard
    /tmp/tb/bin/python tools/make_tensorboard_fixture.py

The files are written by TensorBoard's own ``EventFileWriter`` (TFRecord framing and CRC-32C),
with the protobuf messages of ``tensorboard.compat.proto``:

* ``simple/rank{R}/``: per-rank ``train/loss`` as ``Summary.Value.simple_value`` (what
  ``torch.utils.tensorboard.SummaryWriter.add_scalar`` writes), plus ``eval/loss`` and ``lr``
  tags that must not be taken for the training loss;
* ``tensor/``: the mean over ranks as ``loss``, a scalar float32 ``TensorProto`` in
  ``tensor_content`` with the ``scalars`` plugin (what TF2's ``tf.summary.scalar`` writes), step 3
  written twice (a restart: the last one counts).
"""

from __future__ import annotations

import csv
import shutil
import struct
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "tensorboard"
LOG = ROOT / "data_samples" / "spike_data" / "loss_log.csv"


def _simple(tag: str, value: float) -> summary_pb2.Summary.Value:
    return summary_pb2.Summary.Value(tag=tag, simple_value=value)


def _tensor(tag: str, value: float) -> summary_pb2.Summary.Value:
    t = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                               tensor_content=struct.pack("<f", value))
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    return summary_pb2.Summary.Value(tag=tag, tensor=t, metadata=meta)


def _write(folder: Path, events: list[tuple[int, list[summary_pb2.Summary.Value]]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    w = EventFileWriter(str(folder), filename_suffix=".precnb")
    for i, (step, values) in enumerate(events):
        w.add_event(event_pb2.Event(wall_time=1_700_000_000.0 + i, step=step,
                                    summary=summary_pb2.Summary(value=values)))
    w.close()


def main() -> None:
    """Write the fixture folders from the spike_data loss log."""
    rows = list(csv.DictReader(LOG.open()))
    by_rank: dict[int, list[tuple[int, float]]] = {}
    for r in rows:
        by_rank.setdefault(int(r["rank"]), []).append((int(r["step"]), float(r["loss"])))
    if OUT.exists():
        shutil.rmtree(OUT)
    for rank, series in by_rank.items():
        events = []
        for step, loss in series:
            events.append((step, [_simple("train/loss", loss), _simple("lr", 0.5)]))
            if step % 3 == 0:
                events.append((step, [_simple("eval/loss", loss * 1.1)]))
        _write(OUT / "simple" / f"rank{rank}", events)
    steps = sorted({s for s, _ in by_rank[0]})
    mean = {s: sum(dict(v)[s] for v in by_rank.values()) / len(by_rank) for s in steps}
    events = [(s, [_tensor("loss", mean[s])]) for s in steps[:4]]
    events.append((3, [_tensor("loss", mean[3])]))  # a restart writes step 3 again
    events += [(s, [_tensor("loss", mean[s])]) for s in steps[4:]]
    _write(OUT / "tensor", events)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
