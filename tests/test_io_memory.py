"""Loads that cannot fit are refused before parsing; the pure Python parser reads batch by batch, the same records."""

from __future__ import annotations

import numpy as np
import pytest

import precnb
from precnb.cli import main
from precnb.errors import InsufficientMemoryError, PrecnbError
from precnb.io import _memory
from precnb.io import msprobe as md
from tests.conftest import ROOT, spy_batches

DUMP = ROOT / "data_samples" / "dp_nan"


def test_a_load_that_cannot_fit_is_refused_before_parsing(monkeypatch):
    monkeypatch.setattr(_memory, "available_memory", lambda: 1000)
    parsed = []
    from precnb.io.msprobe import load

    monkeypatch.setattr(load, "read_rank_dir", lambda rd, **kw: parsed.append(rd))
    with pytest.raises(InsufficientMemoryError) as err:
        precnb.open_run(DUMP, workers=1)
    text = str(err.value)
    assert str(DUMP) in text and "dump.json" in text and "--steps / --ranks" in text
    assert isinstance(err.value, MemoryError) and isinstance(err.value, PrecnbError)
    assert not parsed
    monkeypatch.undo()
    monkeypatch.setattr(_memory, "available_memory", lambda: 1000)
    monkeypatch.setenv("PRECNB_NO_MEMORY_CHECK", "1")  # load anyway
    assert precnb.open_run(DUMP, workers=1).sizes["step"] == 3


def test_the_refusal_names_the_largest_file(monkeypatch):
    monkeypatch.setattr(_memory, "available_memory", lambda: 1000)
    files = sorted(DUMP.rglob("dump.json"), key=lambda p: (p.stat().st_size, str(p)))
    sizes = [p.stat().st_size for p in files]
    with pytest.raises(InsufficientMemoryError) as err:
        precnb.open_run(DUMP, workers=1)
    text = str(err.value)
    largest = [p for p, b in zip(files, sizes, strict=True) if b == sizes[-1]]
    assert any(f"largest file: {p}," in text for p in largest), text
    assert f"{len(files)} dump.json file(s)" in text


def test_the_cli_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(_memory, "available_memory", lambda: 1000)
    assert main(["info", str(DUMP)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "needs about" in err and "--steps / --ranks" in err


def test_memory_estimate_uses_the_largest_file():
    _memory.check_memory("x", [("a", 100), ("b", 10)], per_byte=1.0, largest_per_byte=1.5)  # plenty free
    avail = _memory.available_memory()
    assert avail is None or avail > 0


@pytest.mark.parametrize("sample", ["dp_nan", "divergence/target", "tp/tp2"])
def test_the_pure_parser_reads_batches_and_the_same_records(monkeypatch, sample):
    """The pure Python parser (the standard library's json) reads the files batch by batch too (no whole-file parse,
    whose memory is several times the file's), with the fast path's records."""
    rds = md.discover(ROOT / "data_samples" / sample)
    fast = [md.read_rank_dir(rd) for rd in rds]
    monkeypatch.setenv("PRECNB_PURE_PARSER", "1")
    gave_up = spy_batches(monkeypatch)
    pure = [md.read_rank_dir(rd) for rd in rds]
    assert not gave_up
    for a, b in zip(fast, pure, strict=True):
        assert a.labels == b.labels
        for k in a.values:
            assert np.array_equal(a.values[k].view(np.uint64), b.values[k].view(np.uint64))
        assert np.array_equal(a.null_stats, b.null_stats) and a.meta == b.meta


def test_side_text_without_orjson_is_the_standard_librarys_text(monkeypatch):
    import json
    import sys

    from precnb.schema import side_text

    monkeypatch.setitem(sys.modules, "orjson", None)  # the standard-library path, written in parts
    table = {f"Functional.op.{i}.forward": ("Module.é" if i % 7 else "") + str(i % 5) for i in range(70_001)}
    assert side_text(table) == json.dumps(table, ensure_ascii=False, separators=(",", ":"))
    table["Functional.bad.0.forward"] = "\ud800"  # a lone surrogate: ASCII escapes throughout
    assert side_text(table) == json.dumps(table, separators=(",", ":"))
