"""Issue #49, defect 2: an encoded surrogate (``ED A0 80``, invalid UTF-8) inside a dump.json string.

``json.loads(bytes)`` decodes with ``surrogatepass``: the batch path kept it as a lone ``\\ud800`` without a
word, and every writer later died with "internal error: UnicodeEncodeError". It is invalid UTF-8 like any
other: replaced by U+FFFD with a note naming the file, line and column, on the C path and the pure path alike.
"""

from __future__ import annotations

import shutil
import warnings

import pytest

from tests._inprocess_cli import run_cli
from tests.conftest import sample_path

BAD = b"\xed\xa0\x80"


def _inject(src, dst, needle: bytes, after: bool = False) -> None:
    shutil.copytree(src, dst)
    for f in sorted(dst.rglob("dump.json")):
        raw = f.read_bytes()
        i = raw.find(needle)
        assert i >= 0
        i += len(needle) if after else 1
        f.write_bytes(raw[:i] + BAD + raw[i:])


def _open(path, pure: bool, monkeypatch):
    import precnb

    monkeypatch.setenv("PRECNB_PURE_PARSER", "1") if pure else monkeypatch.delenv("PRECNB_PURE_PARSER", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return precnb.open_run(path, progress=False, workers=1)


def _encodable(ds) -> None:
    for name in ("tensor", "node", "module"):
        for v in ds[name].values:
            str(v).encode("utf-8")  # a lone surrogate raises here


@pytest.mark.parametrize("pure", [False, True], ids=["c", "pure"])
@pytest.mark.parametrize(("sample", "needle", "after"), [
    ("dp_nan", b'"Torch.sqrt.0.forward"', False),  # a node name
    ("sdc_tensor", b'"data_name": "', True),  # a data_name
])
def test_encoded_surrogate_is_replaced_and_named(tmp_path, monkeypatch, pure, sample, needle, after):
    from precnb.io.api import load_report

    run = tmp_path / "run"
    _inject(sample_path(sample), run, needle, after)
    ds = _open(run, pure, monkeypatch)
    _encodable(ds)
    text = str(load_report(ds).to_dict())
    assert "invalid UTF-8" in text and "line " in text and "column " in text
    import precnb

    precnb.to_zarr(ds, tmp_path / "out.zarr")  # used to die: UnicodeEncodeError


def test_encoded_surrogate_c_and_pure_agree(tmp_path, monkeypatch):
    import numpy as np

    run = tmp_path / "run"
    _inject(sample_path("sdc_tensor"), run, b'"data_name": "', True)
    c = _open(run, False, monkeypatch)
    pure = _open(run, True, monkeypatch)
    assert list(c["tensor"].values) == list(pure["tensor"].values)
    for v in ("max", "min", "mean", "norm"):
        np.testing.assert_array_equal(c[v].values, pure[v].values)


def test_cli_convert_and_info_name_the_position(tmp_path):

    run = tmp_path / "run"
    _inject(sample_path("dp_nan"), run, b'"Torch.sqrt.0.forward"')
    for args in (["info", str(run)], ["convert", str(run), "-o", str(tmp_path / "o.zarr")]):
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        assert "internal error" not in r.stderr
    r = run_cli("info", run)
    assert "line 2534 column 4 " in r.stdout + r.stderr
