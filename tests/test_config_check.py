"""msprobe config_check packs: the real packs read back exactly; broken and hostile zips refused safely."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

import precnb
from precnb.errors import DumpFormatError
from precnb.io import config_check as cc

ROOT = Path(__file__).resolve().parents[1]
PACKS = ROOT / "data_samples" / "preflight" / "packs"


def pack(name: str) -> Path:
    p = PACKS / name
    if not p.exists():
        pytest.skip(f"bundled pack {p} missing (run `make samples`)")
    return p


def test_real_pack_values_equal_the_zip_entries():
    path = pack("healthy/baseline.zip")
    assert cc.is_config_check(path) and precnb.detect_format(path) == "config_check"
    ds = precnb.open_run(path, progress=False)
    with zipfile.ZipFile(path) as zf:
        weights = json.loads(zf.read("weights/step1/rank1/weight.json"))
        data = json.loads(zf.read("dataset/step0/rank0/dataset.json"))
        env = json.loads(zf.read("env"))
    for name, feats in weights.items():
        for stat in ("max", "min", "mean", "norm"):
            assert float(ds[stat].sel(step=1, rank=1, tensor=f"Weights.{name}")) == feats[stat]
    assert float(ds["mean"].sel(step=0, rank=0, tensor="Dataset.args.0")) == data["args"]["0"]["mean"]
    assert list(ds["role"].sel(tensor="Weights.embed.weight").values.ravel()) == ["parameter"]
    side = json.loads(ds.attrs["config_check"])
    assert side["env"] == {k: v for k, v in env.items() if k in cc.ENV_KEYS} and side["env_variables"] == len(env)
    assert side["hyperparameters"]["static"]["lr"] == 0.01 and "torch" in side["pip"]
    assert "torch.manual_seed" in side["random"]["0"]


def _zip(path: Path, entries: dict[str, bytes], **infos: dict) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            for k, v in infos.get(name, {}).items():
                setattr(info, k, v)
            zf.writestr(info, data)
    return path


GOOD = {"weights/step0/rank0/weight.json": json.dumps({"fc.weight": {"max": 1.0, "min": -1.0, "mean": 0.0,
                                                                     "norm": 2.0}}).encode()}


@pytest.mark.parametrize("bad", ["../evil.json", "/etc/passwd", "weights/../../x", "C:/x", "a\\b"])
def test_unsafe_entry_names_are_refused(tmp_path, bad):
    path = _zip(tmp_path / "p.zip", {**GOOD, bad: b"{}"})
    with pytest.raises(DumpFormatError, match="unsafe entry name") as err:
        cc.open_config_check(path)
    assert str(path) in str(err.value)
    assert not (tmp_path.parent / "evil.json").exists()


def test_symlink_and_encrypted_entries_are_refused(tmp_path):
    link = _zip(tmp_path / "l.zip", {**GOOD, "env": b"/etc/passwd"}, env={"external_attr": 0o120777 << 16})
    with pytest.raises(DumpFormatError, match="symbolic link"):
        cc.open_config_check(link)
    enc = _zip(tmp_path / "e.zip", {**GOOD, "pip": b"torch=1"})
    raw = bytearray(enc.read_bytes())  # set the "encrypted" flag of every entry (local and central headers)
    for sig, off in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        i = raw.find(sig)
        while i >= 0:
            raw[i + off] |= 0x1
            i = raw.find(sig, i + 4)
    enc.write_bytes(bytes(raw))
    with pytest.raises(DumpFormatError, match="encrypted"):
        cc.open_config_check(enc)


def test_size_limits_and_zip_bombs(tmp_path):
    class Small(cc.Limits):
        entry_bytes = 1000
        entries = 3

    big = _zip(tmp_path / "b.zip", {**GOOD, "pip": b"x=1\n" * 1000})
    with pytest.raises(DumpFormatError, match="bytes uncompressed"):
        cc.open_config_check(big, limits=Small)
    many = _zip(tmp_path / "m.zip", {**GOOD, **{f"random/rank{i}.json": b"{}" for i in range(5)}})
    with pytest.raises(DumpFormatError, match="entries"):
        cc.open_config_check(many, limits=Small)
    bomb = _zip(tmp_path / "z.zip", {**GOOD, "pip": b"0" * (3 * 2**20)})
    with pytest.raises(DumpFormatError, match="compression ratio"):
        cc.open_config_check(bomb)


def test_broken_packs_name_the_file_and_entry(tmp_path):
    bad_json = _zip(tmp_path / "j.zip", {**GOOD, "dataset/step0/rank0/dataset.json": b"{not json"})
    with pytest.raises(DumpFormatError) as err:
        cc.open_config_check(bad_json)
    assert "j.zip" in str(err.value) and "dataset/step0/rank0/dataset.json" in str(err.value)
    wrong = _zip(tmp_path / "w.zip", {"env": b"[1, 2]"})
    with pytest.raises(DumpFormatError, match="expected a JSON object"):
        cc.open_config_check(wrong)
    truncated = tmp_path / "t.zip"
    truncated.write_bytes(pack("healthy/baseline.zip").read_bytes()[:200])
    assert not cc.is_config_check(truncated)
    with pytest.raises(DumpFormatError, match="not a readable zip"):
        cc.open_config_check(truncated)


def test_secrets_in_env_and_pickles_are_never_read(tmp_path):
    env = {"AWS_SECRET_ACCESS_KEY": "hunter2", "HF_TOKEN": "x", "NCCL_DETERMINISTIC": "1"}
    path = _zip(tmp_path / "s.zip", {**GOOD, "env": json.dumps(env).encode(),
                                     "weights/model.pkl": b"\x80\x04cos\nsystem\n."})
    ds = cc.open_config_check(path)
    assert "hunter2" not in json.dumps(dict(ds.attrs)) and json.loads(ds.attrs["config_check"])["env"] == {
        "NCCL_DETERMINISTIC": "1"}
    assert list(ds["tensor"].values) == ["Weights.fc.weight"]


def test_other_zips_are_not_packs(tmp_path):
    other = _zip(tmp_path / "o.zip", {"readme.txt": b"hello"})
    assert not cc.is_config_check(other)
    assert not cc.is_config_check(tmp_path)


# ----------------------------------------------------------------------------- issue 23, item 9 (and 7)
def _feats(v: float) -> dict:
    return {"max": v, "min": -v, "mean": v / 2, "norm": 2 * v}


def _data(v: float) -> bytes:
    return json.dumps({"args": {"0": _feats(v)}, "kwargs": {}}).encode()


def _skipped(ds) -> list[tuple[str, str]]:
    return [(x["path"], x["reason"]) if isinstance(x, dict) else tuple(x)
            for x in json.loads(ds.attrs["load_report"])["skipped"]]


@pytest.mark.parametrize("first, second, kept", [
    ("dataset/step1/rank0/dataset.json", "dataset/step01/rank0/dataset.json", "dataset/step1/rank0/dataset.json"),
    ("dataset/step1/rank00/dataset.json", "dataset/step1/rank0/dataset.json", "dataset/step1/rank0/dataset.json"),
    ("weights/step2/rank1/weight.json", "weights/step002/rank1/weight.json", "weights/step2/rank1/weight.json"),
    ("random/rank00.json", "random/rank0.json", "random/rank0.json"),
])
def test_two_spellings_of_one_number_are_named_never_merged(tmp_path, first, second, kept):
    body = (lambda v: json.dumps({"torch.rand": [{"count": v, "stack": []}]}).encode()) if "random" in first \
        else (lambda v: json.dumps({"fc.weight": _feats(v)}).encode()) if "weights" in first else _data
    path = _zip(tmp_path / "p.zip", {**GOOD, first: body(1), second: body(7)})
    ds = cc.open_config_check(path)
    other = second if kept == first else first
    (entry,) = [s for s in _skipped(ds) if s[0].endswith(f"[{other}]")]
    assert entry[1].startswith("not loaded: entry") and f"[{kept}] (loaded)" in entry[1]
    value = 1 if kept == first else 7
    if "dataset" in first:
        assert float(ds["max"].sel(step=1, rank=0, tensor="Dataset.args.0")) == value
    elif "weights" in first:
        assert float(ds["max"].sel(step=2, rank=1, tensor="Weights.fc.weight")) == value
    else:
        assert json.loads(ds.attrs["config_check"])["random"]["0"]["torch.rand"][0]["count"] == value


def test_non_ascii_digits_and_huge_numbers_are_named(tmp_path):
    path = _zip(tmp_path / "p.zip", {**GOOD, "dataset/step1/rank0/dataset.json": _data(1),
                                     "dataset/step\u0661/rank0/dataset.json": _data(9),  # Arabic-Indic one
                                     "dataset/step99999999999999999999/rank0/dataset.json": _data(3)})
    ds = cc.open_config_check(path)
    assert float(ds["max"].sel(step=1, rank=0, tensor="Dataset.args.0")) == 1
    reasons = dict(_skipped(ds))
    assert reasons[f"{path} [dataset/step\u0661/rank0/dataset.json]"].startswith(
        "not loaded: step or rank number not in ASCII digits")
    assert "out of range" in reasons[f"{path} [dataset/step99999999999999999999/rank0/dataset.json]"]
    assert sorted(int(s) for s in ds["step"].values) == [0, 1]
    from precnb.cli import main

    assert main(["info", str(path)]) == 1  # named on the command line, no OverflowError
    assert main(["preflight", str(path), str(path)]) == 1


def test_a_duplicate_entry_name_is_named(tmp_path):
    path = tmp_path / "d.zip"
    import warnings

    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as zf:
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name
        zf.writestr("weights/step0/rank0/weight.json", json.dumps({"fc.weight": _feats(1)}))
        zf.writestr("weights/step0/rank0/weight.json", json.dumps({"fc.weight": _feats(5)}))
    ds = cc.open_config_check(path)
    assert float(ds["max"].sel(step=0, rank=0, tensor="Weights.fc.weight")) == 1
    (entry,) = _skipped(ds)
    assert "holds entry 'weights/step0/rank0/weight.json' more than once" in entry[1]


def test_non_numeric_features_are_not_nan_and_the_data_check_counts_right(tmp_path):
    from precnb.pipeline.run import preflight

    entries = {f"dataset/step{s}/rank0/dataset.json": _data(s + 1) for s in range(4)}
    base = _zip(tmp_path / "b.zip", {**GOOD, **entries})
    odd = {**entries, "dataset/step2/rank0/dataset.json": json.dumps(
        {"args": {"0": {"max": "abc", "min": "x", "mean": [1], "norm": {}}}, "kwargs": {}}).encode()}
    target = _zip(tmp_path / "t.zip", {**GOOD, **odd})
    ds = cc.open_config_check(target)
    assert not bool(ds["present"].sel(step=2, rank=0, tensor="Dataset.args.0"))  # absent, not a NaN statistic
    (entry,) = _skipped(ds)
    assert entry[0].endswith("[dataset/step2/rank0/dataset.json]")
    assert "feature 'max' is 'abc', not a number" in entry[1]
    checks = {c["name"]: c for c in preflight(base, target=target)["checks"]}
    data = checks["data"]
    assert data["status"] == "warn" and "at 3 of 4 common (step, rank) entries" in data["message"]
    assert "1 could not be compared" in data["message"] and "step 2 rank 0" in data["message"]


@pytest.mark.parametrize("cut", [200, 0.5])
def test_a_truncated_pack_given_as_the_input_says_so(tmp_path, cut):
    """Issue 23 item 11: a truncated zip passed to info/preflight is named as a truncated zip."""
    data = pack("healthy/baseline.zip").read_bytes()
    truncated = tmp_path / "t.zip"
    truncated.write_bytes(data[:cut if isinstance(cut, int) else int(len(data) * cut)])
    with pytest.raises(precnb.errors.NotADumpError) as err:
        precnb.open_run(truncated)
    msg = str(err.value)
    assert "t.zip" in msg and "truncated or damaged zip" in msg and "not a recognised input" not in msg
