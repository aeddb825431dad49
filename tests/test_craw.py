"""The reader of a batch's bytes (``precnb/io/_craw.c``) against the pure Python reference.

``tests/test_parse_paths.py`` reads every bundled, edge and generated dump with and without this
reader (the fast path, with scalar signatures and without); here: that the reader is taken
and hands back only what it must, that its numbers are Python's, and the texts only it sees
(members of one batch, the text between them).
"""

from __future__ import annotations

import json
import math
import random
import struct
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from precnb.errors import DumpFormatError
from precnb.io import _cext
from precnb.io.msprobe.discover import discover
from precnb.io.msprobe.parse import read_rank_dir
from tests._records_equal import records_differences
from tests.conftest import SHARED
from tests.test_fuzz_readers import fuzz_settings
from tests.test_parse_paths import INF_LEAF, LEAF, env

pytestmark = pytest.mark.skipif(_cext.CRAW is None, reason="precnb.io._craw is not built (no compiler at install)")
S1 = SHARED / "data_samples" / "msprobe" / "S1_baseline" / "statistics"


def _both(folder: Path) -> tuple[Any, Any]:
    """(C, pure) FileRecords of every rank folder below *folder*, without signatures (an error: its text)."""
    out = []
    for pure in (False, True):
        with env(PRECNB_PURE_PARSER="1" if pure else None):
            got = []
            for rd in discover(folder):
                try:
                    got.append(read_rank_dir(rd, signatures=False))
                except DumpFormatError as exc:
                    got.append(str(exc))
            out.append(got)
    return out[0], out[1]


def _same(folder: Path) -> None:
    fast, pure = _both(folder)
    assert len(fast) == len(pure)
    for a, b in zip(fast, pure, strict=True):
        if isinstance(a, str) or isinstance(b, str):
            assert a == b
        else:
            records_differences(a, b)


class _Spy:
    def __init__(self, real: Any) -> None:
        self.real, self.calls, self.back = real, 0, []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> Any:
            got = getattr(self.real, name)(*args)
            if name == "read_records":
                self.calls += 1
                if got[8] is not None:
                    start, end = got[8]
                    self.back.append(json.loads(b"{" + args[0][start:end] + b"}").popitem()[0])
            return got
        return call


@pytest.mark.skipif(not S1.is_dir(), reason="../shared S1 sample not on this machine")
def test_the_reader_is_taken_and_hands_back_only_the_probe_records(monkeypatch):
    """On a real msprobe dump (S1: a model step with its optimizer ops) only the two records the release
    probe reads go back to Python, with scalar signatures or without; with PRECNB_PURE_PARSER the reader is not
    used."""
    spy = _Spy(_cext.CRAW)
    monkeypatch.setattr(_cext, "CRAW", spy)
    rd = discover(S1)[0]
    for sigs in (False, True):
        spy.calls, spy.back = 0, []
        with env(PRECNB_PURE_PARSER=None):
            fast = read_rank_dir(rd, signatures=sigs)
        assert spy.calls > 0
        assert spy.back == ["Functional.embedding.0.forward", "Functional.cross_entropy.0.backward"]
        assert bool(fast.meta["facts"].get("scalar_sigs")) is sigs
        spy.calls = 0
        with env(PRECNB_PURE_PARSER="1"):
            records_differences(fast, read_rank_dir(rd, signatures=sigs))
        assert spy.calls == 0


def _number(text: str) -> Any:
    return _cext.CRAW.number_value(text.encode())


def _check_number(text: str) -> None:
    got = _number(text)
    if got is None:  # not read here (an int beyond 18 digits): the Python code reads the record
        assert "." not in text and "e" not in text.lower() and len(text.lstrip("-")) > 18
        return
    ref = json.loads(text)
    assert type(got) is type(ref), text
    if isinstance(ref, float):
        assert struct.pack("<d", got) == struct.pack("<d", ref) or (math.isnan(got) and math.isnan(ref)), text
    else:
        assert got == ref, text


@pytest.mark.parametrize("text", ["0", "-0", "0.0", "-0.0", "1", "-1", "123456789012345678", "1e5", "1E-5", "1e+5",
                                  "NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400", "4.9e-324",
                                  "2.2250738585072014e-308", "9007199254740993.0", "0.1", "0.30000000000000004",
                                  "1.7976931348623157e308", "1234567890123456789", "0.00000000000000000000001",
                                  "1.0000000000000000000000001", "3.6555705070495605", "-1.0958521670545451e-05"])
def test_numbers_are_read_as_the_standard_library_reads_them(text):
    _check_number(text)


@pytest.mark.parametrize("text", ["01", "1.", ".1", "-", "+1", "1e", "--1", "nan", "inf", "-NaN", "0x1", "1.e5",
                                  "1e+", "- 1", "Infinit", "NaNa"])
def test_what_is_not_a_json_number_is_not_read(text):
    assert _number(text) is None


@fuzz_settings(2000)
@given(x=st.floats(allow_nan=False, allow_infinity=False), digits=st.integers(1, 25))
def test_any_double_in_any_spelling(x, digits):
    for text in (repr(x), f"{x:.{digits}g}", f"{x:.{digits}e}"):
        _check_number(text.replace("inf", "1e999"))


def test_random_and_halfway_numbers():
    """The extended-precision fast path against float(), on shortest reprs and on exact midpoints between doubles."""
    rng = random.Random(30)
    for _ in range(20000):
        x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if math.isfinite(x):
            _check_number(repr(x))
            _check_number(f"{x:.17g}")
        f = struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0]
        if math.isfinite(f):
            _check_number(repr(f))
        a = abs(rng.uniform(1e-20, 1e20))
        mid = (Decimal(a) + Decimal(math.nextafter(a, math.inf))) / 2
        for places in (17, 18, 19, 25):
            _check_number(format(mid, f".{places}g").replace("E", "e"))
        m, e = rng.randint(0, 10**19 - 1), rng.randint(-30, 30)
        _check_number(f"{m}e{e}")


def _dump(root: Path, text: str) -> Path:
    d = root / "step0" / "rank0"
    d.mkdir(parents=True)
    (d / "dump.json").write_text(text)
    return root


LEAF_TEXT = json.dumps(LEAF)


@pytest.mark.parametrize("data", [
    f'"a.0.forward": {{"output": [{LEAF_TEXT}]}}, "a.0.forward": {{"input_args": [{LEAF_TEXT}]}}',  # a name twice
    f'"a.0.forward": {{"output": [{LEAF_TEXT}]}} "b.0.forward": {{}}',  # no comma
    f'"a.0.forward": {{"output": [{LEAF_TEXT}]}},, "b.0.forward": {{}}',
    f'"a.0.forward": {{"output": [{LEAF_TEXT},]}}',  # a trailing comma in a section
    f'"a.0.forward": {{"output": [{LEAF_TEXT}]}},',  # ... after the last record
    f'"a\\u00e9.0.forward": {{"output": [{LEAF_TEXT}]}}, "b.0.forward": {{"output": [{LEAF_TEXT}]}}',  # an escape
    f'"a.0.forward": {{"output": [{LEAF_TEXT.replace("torch.float32", "torch.float32 ü")}]}}',  # non-ASCII
    f'"a.0.forward": {{"output": [{LEAF_TEXT.replace("1.5", "01.5")}]}}',  # not a JSON number
    f'"a.0.forward": {{"output": [{LEAF_TEXT.replace("1.5", "1.5e99999")}]}}',
    f'"a.0.forward": {{"output": [{LEAF_TEXT.replace("[2, 3]", "[2, 30000000000000000000]")}]}}',
    f'"a.0.forward": {{"output": [{LEAF_TEXT.replace("NaN", "nan")}]}}',
    f'"a.0.forward": {{"output": [{LEAF_TEXT}], "output": []}}',  # a section twice
    f'"a.0.forward": {{"output": {{"x": {LEAF_TEXT}, "x": {LEAF_TEXT}}}}}',  # an item twice
    f'"a.0.forward": {{"output": [{LEAF_TEXT.replace("Max", "Min")}]}}',  # a statistic twice
    f'"a.0.forward": {{"output": [{LEAF_TEXT}]}}, "b": [1, 2',  # unterminated
    '"a.0.forward": {"output": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [], "Max": "\t"}]}',
])
@pytest.mark.parametrize("indent", [False, True])
def test_texts_only_the_reader_sees(tmp_path, data, indent):
    # (data9, an int beyond 64 bits in a shape, also checks the orjson path: orjson reads it as a float, 3e+19,
    # so _json._loads gives such a batch to the standard library)
    """Member texts as written (not through json.dumps): each reads as the pure reference reads it, or fails
    with the same error."""
    sep = "\n" if indent else ""
    text = '{"task": "statistics", "level": "L1", "data": {' + sep + data.replace(", \"", "," + sep + " \"") \
        + sep + "}}"
    _same(_dump(tmp_path, text))


def test_parameters_and_optimizer_facts(tmp_path):
    """requires_grad of parameters and an optimizer op's arguments, read without parsing the records into objects."""
    data = {"Module.fc.Linear.forward.0": {"input_args": [LEAF], "parameters": {
                "weight": dict(LEAF, requires_grad=True), "bias": dict(LEAF, requires_grad=False),
                "odd": {"requires_grad": True, "value": 1}}, "output": [LEAF]},
            "Tensor.mul_.0.forward": {"input_args": [LEAF, {"type": "float", "value": 0.9}],
                                      "input_kwargs": {"alpha": {"type": "int", "value": 2}}, "output": [LEAF]},
            "Tensor.lerp_.0.forward": {"input_args": [[LEAF, LEAF], {"type": "float", "value": 0.1}]}}
    root = _dump(tmp_path, json.dumps({"task": "statistics", "data": data}, indent=1))
    (root / "step0" / "rank0" / "construct.json").write_text(json.dumps(
        {"Module.fc.Linear.forward.0": None, "Tensor.mul_.0.forward": "optimizer",
         "Tensor.lerp_.0.forward": "optimizer.step"}))
    fast, pure = _both(root)
    records_differences(fast[0], pure[0])
    facts = fast[0].meta["facts"]
    assert facts["requires_grad"] == {"Module.fc.Linear.forward.0.parameters.weight": True,
                                      "Module.fc.Linear.forward.0.parameters.bias": False,
                                      "Module.fc.Linear.forward.0.parameters.odd": True}
    assert facts["scalar_args"] == {"Tensor.mul_": {"1": [0.9], "alpha": [2]}, "Tensor.lerp_": {"1": [0.1]}}


@pytest.mark.parametrize("block", [64, 1000])
def test_many_small_batches(tmp_path, monkeypatch, block):
    """Batches cut every few records (a large file's case): a record handed back at a batch's start or end, a node
    name in two batches (the whole parse then decides), the same records as the reference."""
    from precnb.io.msprobe import _json
    from tests.test_parse_paths import EDGE_RECORDS

    monkeypatch.setattr(_json, "RAW_BLOCK", block)
    data = {f"Functional.plain.{i}.forward": {"input_args": [LEAF], "output": [LEAF]} for i in range(40)}
    data.update(EDGE_RECORDS)
    root = _dump(tmp_path / "a", json.dumps({"task": "statistics", "data": data}, indent=1))
    spy = _Spy(_cext.CRAW)
    monkeypatch.setattr(_cext, "CRAW", spy)
    _same(root)
    assert spy.calls > 20 and len(spy.back) > 10  # many batches, and records handed back among them
    text = json.dumps({"task": "statistics", "data": data}, indent=1)
    twice = text.replace('"Functional.plain.39.forward"', '"Functional.plain.0.forward"')
    _same(_dump(tmp_path / "b", twice))
    if S1.is_dir():
        _same(S1)


def test_sections_read_where_they_stand(tmp_path, monkeypatch):
    """Each section is read in the one pass over its record; a record whose sections are not in reading order (a
    module's parameters after its output) is read again in two passes, and one found not plain after a section was
    read (a key beside the sections that holds something, a section twice) is rolled back and handed back: the same
    records, labels in the same order, as the reference."""
    leaf = LEAF_TEXT
    members = [  # (the release probe's records first: the first forward and backward ones are handed back)
        ('Functional.probe.0.forward', '{"is_recompute": false}'),
        ('Functional.probe.0.backward', f'{{"grad_input": [{leaf}]}}'),
        ('Module.fc.Linear.forward.0', json.dumps({"input_args": [LEAF], "output": [LEAF, LEAF],
                                                   "parameters": {"weight": dict(LEAF, requires_grad=True)}})),
        ('Module.fc.Linear.backward.0', json.dumps({"output": [LEAF], "input": [INF_LEAF]})),  # output, then input
        ('Tensor.add.0.forward', f'{{"input_args": [{leaf}], "output": [{leaf}], "odd": [1]}}'),  # not plain at last
        ('Tensor.add.1.forward', f'{{"input_args": [{leaf}], "output": [{leaf}], "input_args": [{leaf}]}}'),  # twice
        ('Tensor.add.2.forward', f'{{"input_args": [{leaf}], "is_recompute": false, "output": [{leaf}]}}'),
        ('Tensor.add.3.forward', f'{{"output": [{leaf}], "input_args": [{leaf}], "output": [{leaf}]}}'),  # twice
    ]
    data = ",\n".join(f'  "{k}": {v}' for k, v in members)
    text = '{\n "task": "statistics",\n "data": {\n' + data + '\n }\n}'
    root = _dump(tmp_path, text)
    spy = _Spy(_cext.CRAW)
    monkeypatch.setattr(_cext, "CRAW", spy)
    _same(root)
    assert spy.back == ["Functional.probe.0.forward", "Functional.probe.0.backward", "Tensor.add.0.forward",
                        "Tensor.add.1.forward", "Tensor.add.3.forward"]


@pytest.mark.parametrize("n_args", [3, 70])
def test_optimizer_tensor_arguments_are_not_built(tmp_path, n_args):
    """An optimizer op's positional tensors give its run facts nothing (they are not built for the scan): the
    scalar arguments among them, before and after the 64th, nested ones and a 0-d tensor keyword, are the
    reference's."""
    args: list[Any] = [LEAF if i % 3 else {"type": "float", "value": i / 4} for i in range(n_args)]
    args += [[LEAF, {"type": "int", "value": 7}], {"inner": {"type": "bool", "value": True}}, INF_LEAF]
    data = {"Tensor.mul_.0.forward": {"input_args": args, "input_kwargs": {
                "alpha": {"type": "int", "value": 2}, "lr": dict(INF_LEAF, shape=[]), "t": LEAF}, "output": [LEAF]},
            "Tensor.mul_.1.forward": {"input_args": [LEAF, {"type": "float", "value": 0.5}], "output": [LEAF]}}
    root = _dump(tmp_path, json.dumps({"task": "statistics", "data": data}, indent=1))
    (root / "step0" / "rank0" / "construct.json").write_text(json.dumps(dict.fromkeys(data, "optimizer")))
    fast, pure = _both(root)
    records_differences(fast[0], pure[0])
    got = fast[0].meta["facts"]["scalar_args"]["Tensor.mul_"]
    assert got["0"] == [0.0] and got["1"] == [0.5] and got[str(n_args)] == [7] and got["alpha"] == [2]
    if n_args > 64:
        assert got["66"] == [16.5]


@pytest.mark.parametrize("name", [
    "Module.fc.Linear.parameters_grad", "Module.fc.Linear.parameters_grad.3", "Cell.net.Dense.parameters_grad",
    "Module.parameters_grad", "Module..parameters_grad", "Modules.fc.Linear.parameters_grad", "Cell.parameters_grad.7",
    "Module.fc.Linear.parameters_grad.12345678901234567890", "Module.fc.Linear.parameters_grad.1a",
    "Module.fc.Linear.parameters_grad_x", "Tensor.parameters_grad.0.forward", "parameters_grad",
    "Module.fc.parameters_grad.Linear.parameters_grad.0", ".parameters_grad.0",
])
def test_parameters_grad_names(tmp_path, name):
    """A parameters_grad record's kind is told in C for the names name_parts splits in line (no node_kind call):
    the same records as the reference for those and for every other spelling."""
    data = {"Functional.probe.0.forward": {}, "Functional.probe.0.backward": {"grad_input": [LEAF]},
            name: {"weight": LEAF, "bias": [LEAF]}}
    _same(_dump(tmp_path, json.dumps({"task": "statistics", "data": data}, indent=1)))


@pytest.mark.parametrize("block", [64, 1 << 20])
def test_records_found_in_construct_order(tmp_path, monkeypatch, block):
    """The C reader looks for each record's name just after the last one found in construct.json's order: records in
    that order, out of it, far ahead of it, absent from it, and batches cut anywhere give the reference's records
    (node, parent and module columns included)."""
    from precnb.io.msprobe import _json

    monkeypatch.setattr(_json, "RAW_BLOCK", block)
    names = [f"Tensor.add.{i}.forward" for i in range(200)]
    parents = {n: ("optimizer" if i % 7 == 0 else f"Module.m{i % 5}.Linear.forward.0") for i, n in enumerate(names)}
    order = names[:50] + names[60:50:-1] + names[150:] + names[100:150:3] + [f"Tensor.extra.{i}.forward"
                                                                              for i in range(5)] + names[50:51]
    data = {n: {"input_args": [LEAF, {"type": "float", "value": 0.5}], "output": [LEAF]} for n in order}
    root = _dump(tmp_path, json.dumps({"task": "statistics", "data": data}, indent=1))
    (root / "step0" / "rank0" / "construct.json").write_text(json.dumps(parents))
    _same(root)
    fast, _ = _both(root)
    assert len(fast[0].labels) == 2 * len(order)


def test_order_arguments_are_checked():
    with pytest.raises(ValueError, match="one parent per node"):
        _cext.CRAW.read_records(b"", 0, {}, {}, [], [], [], [], [], [], [], [], False, False, False, ["a"], [], -1)


def test_repeated_optimizer_arguments(tmp_path):
    """An optimizer op whose API, parent and arguments (but its tensors) were read before adds nothing to the run
    facts and is not handed to them again: the same facts as the reference, in the same order, with arguments that
    repeat, change, come back, exceed the 64 values kept, differ only in a tensor or only in the parent."""
    data: dict[str, Any] = {}
    parents: dict[str, str] = {}
    for i in range(300):
        lr = [0.5, 0.25, 0.5, 0.125][i % 4] if i < 150 else i / 1000  # repeats, then more than 64 distinct values
        data[f"Tensor.mul_.{i}.forward"] = {"input_args": [dict(LEAF, Max=float(i)), {"type": "float", "value": lr}],
                                            "input_kwargs": {}, "output": [LEAF]}
        parents[f"Tensor.mul_.{i}.forward"] = "optimizer"
        data[f"Tensor.addcdiv_.{i}.forward"] = {"input_args": [LEAF, LEAF, LEAF],
                                                "input_kwargs": {"value": {"type": "float", "value": -(i % 3)}}}
        parents[f"Tensor.addcdiv_.{i}.forward"] = "optimizer" if i % 2 else f"Module.m{i % 3}.Adam.forward.0"
        data[f"Tensor.sqrt.{i}.forward"] = {"input_args": [LEAF], "output": [LEAF]}
        parents[f"Tensor.sqrt.{i}.forward"] = "optimizer.step"
    root = _dump(tmp_path, json.dumps({"task": "statistics", "data": data}, indent=1))
    (root / "step0" / "rank0" / "construct.json").write_text(json.dumps(parents))
    entries: list[int] = []
    real = _cext.CRAW.facts_batch
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_cext, "CRAW", _Spy(_cext.CRAW))
        mp.setattr(_cext.CRAW, "facts_batch", lambda todo, *a: (entries.append(len(todo)), real(todo, *a))[1],
                   raising=False)
        fast, pure = _both(root)
    assert 150 < sum(entries) < 600  # the repeats were not handed over (900 records, 450 with scalar arguments)
    records_differences(fast[0], pure[0])
    got = fast[0].meta["facts"]["scalar_args"]
    assert got["Tensor.mul_"]["1"][:4] == [0.5, 0.25, 0.125, 0.15] and len(got["Tensor.mul_"]["1"]) == 64
    assert got["Tensor.addcdiv_"]["value"] == [0, -1, -2]
