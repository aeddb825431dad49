"""Issue #49: every reader and every side input goes through the one input-safety layer (precnb._files).

The readers are enumerated from the registry (precnb.io.readers.readers()) and the side inputs from
precnb.io._fs.SIDE_INPUTS, so a new one is fed the same hostile inputs without editing this file: a FIFO
(must not block), /dev/zero (must not stream), a 100,000-deep JSON document and invalid UTF-8 (an encoded
surrogate). Each must give one PrecnbError line naming the path, within a few seconds, or load without a
lone surrogate.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import warnings
from pathlib import Path

import pytest

from precnb.errors import PrecnbError
from precnb.io._fs import SIDE_INPUTS
from precnb.io.readers import readers

HOSTILE = ("fifo", "dev_zero", "deep", "bad_utf8")
#: the file name each built-in reader looks for first (others get the hostile path itself)
NAMES = {"msprobe": "step0/rank0/dump.json", "zarr": "zarr.json", "monitor": "grad_norm.csv",
         "kernel": "statistic.csv", "compare": "compare_result.csv", "config_check": "pack.zip",
         "kernel_tensors": "x.npy"}
SIDE_NAMES = {"rank table": "table.json", "loss log": "loss.csv", "TensorBoard event file": "events.out.tfevents.1",
              "mapping file": "mapping.yaml"}


def _make(tmp_path: Path, kind: str, rel: str) -> Path:
    p = tmp_path / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dev_zero":
        p.symlink_to("/dev/zero")
    elif kind == "deep":
        p.write_text("[" * 100_000 + "]" * 100_000)
    else:
        p.write_bytes(b'{"task": "statistics", "a\xed\xa0\x80": "b\xed\xa0\x80", "data": {}}\n')
    return p


class _Hang(Exception):
    pass


def _bounded(fn, seconds=20):
    def alarm(*_):
        raise _Hang(f"no answer within {seconds} s (blocked on a FIFO or streaming a device?)")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _no_surrogate(obj) -> None:
    text = repr(obj)
    assert not re.search(r"\\ud[89a-f][0-9a-f]{2}", text), "a lone surrogate was kept"


def _check(call, path: Path) -> None:
    try:
        out = _bounded(call)
    except PrecnbError as exc:
        msg = str(exc)
        assert "\n" not in msg.strip(), msg
        return
    if out is not None and hasattr(out, "attrs"):  # loaded: nothing unencodable kept
        for name in ("tensor", "node"):
            if name in getattr(out, "coords", {}):
                _no_surrogate(list(out[name].values))
    else:
        _no_surrogate(out)


def test_every_reader_and_side_input_is_listed():
    names = {r.name for r in readers()}
    assert set(NAMES) <= names | set(NAMES)  # plug-ins get the hostile path itself
    for spec in SIDE_INPUTS.values():
        mod, _, fn = spec.partition(":")
        assert callable(getattr(importlib.import_module(mod), fn))


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("reader", [r.name for r in readers()])
def test_readers_refuse_hostile_files(tmp_path, reader, kind):
    import precnb

    rel = NAMES.get(reader, "input")
    path = _make(tmp_path / "run", kind, rel)
    top = tmp_path / "run" if "/" in rel or reader in ("zarr", "monitor", "kernel") else path
    _check(lambda: precnb.open_run(top, format=reader, workers=1, progress=False), path)
    _check(lambda: precnb.open_run(path, format=reader, workers=1, progress=False), path)


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("side", sorted(SIDE_INPUTS))
def test_side_inputs_refuse_hostile_files(tmp_path, side, kind):
    mod, _, fn = SIDE_INPUTS[side].partition(":")
    read = getattr(importlib.import_module(mod), fn)
    path = _make(tmp_path, kind, SIDE_NAMES.get(side, "side"))
    if kind in ("fifo", "dev_zero"):
        with pytest.raises(PrecnbError, match="regular file"):
            _bounded(lambda: read(path))
        return
    _check(lambda: read(path), path)


def test_no_reader_opens_files_around_the_layer():
    """A new reader cannot forget the layer: no bare open()/read_bytes()/read_text() of an input under precnb/io."""
    root = Path(__file__).resolve().parents[1] / "precnb" / "io"
    allowed = {"_memory.py"}  # /proc and cgroup files of the machine, not inputs
    bare = re.compile(r"(?<![\w.`])open\(|\.open\(\"rb\"\)|\.read_bytes\(\)|\.read_text\(")
    found = []
    for f in root.rglob("*.py"):
        if f.name in allowed:
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if bare.search(code) and ">>>" not in code and "def open" not in code and "os.open(" not in code:
                found.append(f"{f.relative_to(root)}:{n}: {line.strip()}")
    assert not found, "open through precnb._files (open_regular / read_input):\n" + "\n".join(found)
