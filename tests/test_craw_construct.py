"""construct.json read in C (``precnb/io/_craw_construct.c``) against the standard library's tables.

:func:`precnb.io.msprobe.sides.plain_construct` must give exactly the tables
:func:`~precnb.io.msprobe.sides.parse_construct` gives for the parsed text (same parents, same
order, nulls as ``""``), or None: then the reference reads the text. Checked on every construct.json
of the bundled and shared samples (Megatron's micro-step tables among them) and on generated ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from precnb.io import _cext
from precnb.io.msprobe import sides as sides_module
from precnb.io.msprobe.discover import discover
from precnb.io.msprobe.parse import read_rank_dir
from precnb.io.msprobe.sides import parse_construct, plain_construct, read_sides
from tests.conftest import SHARED, shared_path
from tests.test_fuzz_readers import fuzz_settings
from tests.test_parse_paths import env

pytestmark = pytest.mark.skipif(_cext.CRAW is None, reason="precnb.io._craw is not built (no compiler at install)")
ROOT = Path(__file__).resolve().parents[1]


def _same_as_reference(raw: bytes) -> bool:
    """Whether the C tables equal the reference's for *raw*; True when the C reader declined (None)."""
    got = plain_construct(raw)
    if got is None:
        return True
    parents, names = got
    want = parse_construct(json.loads(raw))[0]
    assert parents == want and list(parents) == list(want)
    assert list(names) == list(parents)
    assert all(k is v for k, v in zip(parents, names.values(), strict=True))  # the keys' own objects
    assert all(v.__class__ is str for v in parents.values())
    # one object per distinct parent text, as the reference keeps them
    assert len({id(v) for v in parents.values()}) == len(set(parents.values()))
    return True


def _files() -> list[Path]:
    found = sorted((ROOT / "data_samples").rglob("construct.json"))
    found += sorted((SHARED / "data_samples" / "msprobe").rglob("construct.json"))
    found += sorted((SHARED / "fixtures").rglob("construct.json"))
    return found


def test_every_sample_construct_json_reads_as_the_reference_reads_it():
    files = _files()
    assert len(files) > 50
    taken = micro = 0
    for path in files:
        raw = path.read_bytes()
        assert _same_as_reference(raw), path
        doc = json.loads(raw)
        if plain_construct(raw) is not None:
            taken += 1
        elif isinstance(doc, dict) and any(isinstance(v, list) for v in doc.values()):
            micro += 1  # Megatron's [parent, micro step]: the reference's
        else:
            assert b"\\" in raw, f"{path}: a plain table was not read in C"
    assert taken > 20 and micro > 0


def test_texts_it_declines():
    for text in (b"", b"[]", b"null", b'{"a":1}', b'{"a":"\\u0041"}', b'\xef\xbb\xbf{}', b'{"a":"b",}',
                 b'{"a":"b"} x', b'{"a":"\xff"}', b'{"megatron_micro_step_number":{"a":0}}', b'{"a":["b",1]}',
                 b'{"a":nul}', b'{"a":"b" "c":"d"}', b'{"a\tb":"c"}', b'{"a":"b"', b'{"a" "b"}', b'{,}',
                 b'{"a":true}', '{"a":"b"}'.encode("utf-16")):
        assert plain_construct(text) is None, text


def test_what_the_reference_reads_alike():
    assert plain_construct(b" \n{}\r\n ") == ({}, {})
    dup = b'{"a": null, "b": "x", "a": "y"}'  # the last value, at the first key's place (as json.loads)
    assert plain_construct(dup) == ({"a": "y", "b": "x"}, {"a": "a", "b": "b"})
    assert _same_as_reference(dup)
    assert plain_construct('{"Module.é.forward.0": "Module.ü.M.forward.0"}'.encode())[0] == {
        "Module.é.forward.0": "Module.ü.M.forward.0"}


_NAME = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@fuzz_settings(40)
@given(st.dictionaries(_NAME, st.one_of(st.none(), _NAME, st.sampled_from(["Module.a.A.forward.0", ""])),
                       max_size=30),
       st.sampled_from([None, 1, 2]), st.booleans())
def test_generated_tables(table, indent, ascii_only):
    raw = json.dumps(table, indent=indent, ensure_ascii=ascii_only).encode()
    assert _same_as_reference(raw)
    if b"\\" not in raw:
        assert plain_construct(raw) is not None


def test_a_load_reads_its_construct_json_in_c_and_the_pure_parser_alike():
    folder = shared_path("data_samples", "msprobe", "S1_baseline", "statistics")
    rd = discover(folder)[0]
    sides_module._CONSTRUCT.clear()  # no table cached by an earlier load
    notes: list[str] = []
    sides = read_sides(rd.path, notes)
    assert sides.names is not None and notes == []
    assert all(k is v for k, v in zip(sides.parents, sides.names.values(), strict=True))
    sides_module._CONSTRUCT.clear()
    with env(PRECNB_PURE_PARSER="1"):
        pure = read_sides(rd.path, [])
    assert pure.names is None and pure.parents == sides.parents and list(pure.parents) == list(sides.parents)
    rec = read_rank_dir(rd)
    table = rec.construct.get()
    keys = {id(k) for k in table}
    kept = [n for n in rec.coords["node"] if n in table]
    assert kept and all(id(n) in keys for n in kept)


def test_a_cached_construct_json_gives_each_file_its_own_intern_table(tmp_path):
    # the parse of a file adds api and module names to its intern table (files may be read in threads), so the
    # cached construct.json table of several rank folders must not hand the same dict to each
    folder = shared_path("data_samples", "msprobe", "S1_baseline", "statistics")
    rd = discover(folder)[0]
    sides_module._CONSTRUCT.clear()
    first = read_sides(rd.path, [])
    second = read_sides(rd.path, [])
    assert first.parents is second.parents  # the cache was used
    assert second.names is None or second.names is not first.names
