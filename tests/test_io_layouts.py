"""dump.json in any layout is read batch by batch (issue #30 item 2), with the whole-file parse's values.

Committed dumps re-written as another tool would write them — on one line (``json.dump`` without
``indent``), compact separators, ``indent=4``, keys sorted (``data`` first, records reordered),
``data`` before the other top-level members, one record per (long) line, a record on a line far
longer than a read block — are cut by structure (:mod:`precnb.io.msprobe._scan`): the batched path
is taken, in several batches, and the records equal the whole-file parse's and the raw JSON's.
"""

from __future__ import annotations

import json

import pytest

from precnb.io import msprobe as md
from precnb.io.msprobe import _json, _scan
from tests.conftest import sample_path
from tests.test_scale import check_against_raw_json, check_folder, same_records, whole

SAMPLES = [("dp_nan", "step1", "rank1"), ("divergence", "target", "step1", "rank0"),
           ("xfw", "ms_bug", "step0", "proc23813"), ("sdc_md5", "step1", "rank1")]


def _doc(parts: tuple[str, ...]) -> tuple[dict, dict]:
    folder = sample_path(*parts)
    dump = json.loads((folder / "dump.json").read_text())
    sides = {n: (folder / n).read_text() for n in ("construct.json", "stack.json") if (folder / n).exists()}
    return dump, sides


def _per_line(doc: dict) -> str:
    top = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items() if k != "data")
    recs = ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in doc["data"].items())
    return "{" + top + ', "data": {\n' + recs + "\n}}"


def _long_record(doc: dict) -> str:
    """msprobe's layout, one record on a single line of about 60 kB (longer than the read block here)."""
    data = dict(doc["data"])
    first = next(iter(data))
    data[first] = {**data[first], "note": ["x" * 60] * 1000}
    lines = json.dumps({**doc, "data": data}, indent=1).split("\n")
    key = f'  "{first}": {{'
    i = lines.index(key)
    j = lines.index("  },", i)
    return "\n".join([*lines[:i], key + " ".join(s.strip() for s in lines[i + 1:j]) + " },", *lines[j + 1:]])


LAYOUTS = {
    "one line": lambda d: json.dumps(d),
    "compact": lambda d: json.dumps(d, separators=(",", ":")),
    "indent 4": lambda d: json.dumps(d, indent=4),
    "keys sorted": lambda d: json.dumps(d, indent=1, sort_keys=True),
    "data first, one line": lambda d: json.dumps({"data": d["data"], **{k: v for k, v in d.items() if k != "data"}}),
    "a record per line": _per_line,
    "a record on a long line": _long_record,
}


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 8 KiB, so that a committed dump (about 100 kB) is cut into many batches."""
    monkeypatch.setattr(_json, "BLOCK", 8 << 10)
    monkeypatch.setattr(_json, "RAW_BLOCK", 8 << 10)  # the C reader's batches (loads without signatures)
    monkeypatch.setattr(_json, "_HEAD_MAX", 8 << 10)
    monkeypatch.setattr(_json, "_LONG", 32 << 10, raising=False)
    sizes: list[int] = []  # of the pieces of data cut (batches of records), then 1 for the top-level members
    real = _json._pieces

    def counting(*args):
        for piece, tail in real(*args):
            sizes.append(len(piece))
            if tail is not None:
                sizes.append(1)
            yield piece, tail

    monkeypatch.setattr(_json, "_pieces", counting)
    return sizes


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: "/".join(p))
def test_any_layout_is_read_batch_by_batch_with_the_same_values(tmp_path, monkeypatch, small_blocks, sample,
                                                                 layout):
    doc, sides = _doc(sample)
    folder = tmp_path / "step0" / "rank0"
    folder.mkdir(parents=True)
    size = (folder / "dump.json").write_text(LAYOUTS[layout](doc))
    for name, text in sides.items():
        (folder / name).write_text(text)
    gave_up = check_folder(folder, monkeypatch)  # default parse == whole-file parse == raw JSON
    assert not gave_up, "the batched parse gave up"
    assert len(small_blocks) >= 3 + size // (64 << 10)  # batches of records (and the top-level members)
    if layout != "a record on a long line" and size > 64 << 10:
        assert max(small_blocks) < size // 3  # no batch near the whole file
    # reordered layouts keep the file's order of records (what the whole parse keeps)
    rec = md.read_rank_dir(md.discover(folder)[0])
    ref = whole(md.discover(folder)[0])
    same_records(rec, ref)
    check_against_raw_json(md.discover(folder)[0], rec)


def test_the_original_layout_keeps_its_line_cuts(tmp_path, monkeypatch, small_blocks):
    doc, _sides = _doc(SAMPLES[0])
    folder = tmp_path / "step0" / "rank0"
    folder.mkdir(parents=True)
    (folder / "dump.json").write_text(json.dumps(doc, indent=1))
    fed = []
    real = _scan.Scanner.feed

    def feed(self, buf, start):
        fed.append(len(buf) - start)
        return real(self, buf, start)

    monkeypatch.setattr(_scan.Scanner, "feed", feed)
    assert not check_folder(folder, monkeypatch)
    monkeypatch.setattr(_json, "BLOCK", 8 << 10)
    monkeypatch.setattr(_json, "_HEAD_MAX", 8 << 10)
    monkeypatch.setattr(_scan.Scanner, "feed", feed)
    fed.clear()
    list(_json.parts(folder / "dump.json"))
    assert len(fed) == 1  # only the end of data is found by structure


@pytest.mark.parametrize("raw", [
    b'{"task": "x", "data": {"a.0.forward": {"s": "}, \\"b\\": {"}, "c.0.forward": {}}}',
    b'{"data": {"a.0.forward": {"s": "\\\\"}, "b.0.forward": [1, {"c": "]"}]}, "level": "L1"}',
    b'{"meta": {"data": {"x": 1}}, "data": {"a.0.forward": {"Max": NaN}}}',
    b'{"data": {"a.0.forward": {}}, "data": {"b.0.forward": {}}}',
    b'{"data": {"a.0.forward": {}, "a.0.forward": {"x": 2}}}',
    b'{"data": {"a.0.forward": {}}',
    b'{"data": {"a.0.forward": {}},}',
])
def test_structure_cuts_on_tricky_text_read_like_the_whole_parse(tmp_path, monkeypatch, raw):
    monkeypatch.setattr(_json, "BLOCK", 16)
    monkeypatch.setattr(_json, "RAW_BLOCK", 16)
    monkeypatch.setattr(_json, "_HEAD_MAX", 16)
    monkeypatch.setattr(_json, "_LONG", 16)
    folder = tmp_path / "step0" / "rank0"
    folder.mkdir(parents=True)
    (folder / "dump.json").write_bytes(raw)
    check_folder(folder, monkeypatch)  # equal records, or the same error


def test_scanner_follows_strings_and_depth():
    s = _scan.Scanner()
    data = {"a": {"x": '\\"}, ["{'}, "b": [1, [2]], "c": 3}
    text = json.dumps(data)[1:].encode() + b', "t": 1}'  # data's text after its "{", then another member
    assert b'\\\\\\"' in text  # an escaped backslash, then an escaped quote, inside a string
    for k in range(1, len(text) + 1):  # fed one byte at a time: the same answer as all at once
        s.feed(text[:k], k - 1)
    whole_scan = _scan.Scanner()
    whole_scan.feed(text, 0)
    assert (s.cut, s.end) == (whole_scan.cut, whole_scan.end)
    assert text[whole_scan.end - 3:whole_scan.end + 1] == b": 3}"
    assert text[whole_scan.cut - 4:whole_scan.cut + 1] == b"[2]],"
    assert _scan.find_data(b'{"x": "\\"data\\": {", "d": {"data": {}}, "data":{}}') == 47
    assert _scan.find_data(b'{"x": 1}') == -1


@pytest.mark.parametrize("indent", [1, None], ids=["msprobe layout", "one line"])
def test_a_record_with_a_long_string_is_read_batch_by_batch(tmp_path, monkeypatch, small_blocks, indent):
    """A 2 MB string (256 blocks of 8 KiB, escaped quotes and backslashes in it) is read batch by batch like the
    whole parse, each byte fed to the structure scanner once (issue 49: a 50 MB string took 55 s, the buffer copied
    and searched whole at every block; the growing buffer is now a bytearray searched in its new block only)."""
    doc, _sides = _doc(SAMPLES[0])
    name = next(iter(doc["data"]))
    long = ('a\\"b\\\\' + "x" * 1000) * 2000
    doc["data"][name]["long"] = long
    folder = tmp_path / "step0" / "rank0"
    folder.mkdir(parents=True)
    size = (folder / "dump.json").write_text(json.dumps(doc, indent=indent))
    fed: list[int] = []
    real = _scan.Scanner.feed

    def feed(self, buf, start):
        fed.append(len(buf) - start)
        return real(self, buf, start)

    monkeypatch.setattr(_scan.Scanner, "feed", feed)
    assert not check_folder(folder, monkeypatch), "the batched parse gave up"
    fed.clear()
    got = [d for top, d in _json.parts(folder / "dump.json") if not top]
    assert any(d.get(name, {}).get("long") == long for d in got)
    assert sum(fed) <= 2 * size  # linear: no byte scanned again as the buffer grows
