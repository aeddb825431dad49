"""Hostile and wrong mapping files fail cleanly or are said to be wrong (issue 23, items 2, 5, 7, 11).

* A 1.5 kB "billion laughs" YAML used to hang ``align``/``diff`` for minutes at 5.5 GB: aliases are
  refused at once (with the C loader when available); ``!!python`` tags are named; values must be
  plain scalars of bounded size; a deeply nested JSON or YAML mapping is an input error, not a
  RecursionError; a symlink loop or a FIFO given as ``--mapping`` is named as such.
* Mapping pairs are checked against both runs: a pair naming nothing is reported and ignored; a
  file saved by ``align -o`` and reused with the runs swapped is detected, said and read reversed
  (the real first divergence stays the finding); many-to-one module pairs are refused, while
  msprobe's data mapping may map several tensors onto one.
* ``precnb.align("dirA", "dirB")`` accepts paths, as ``diagnose`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import precnb
from precnb.mapping import MappingError, load_mapping, parse_mapping
from tests._inprocess_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 240

LAUGHS = "\n".join(["a: &a ['lol','lol','lol','lol','lol','lol','lol','lol','lol']"]
                   + [f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},"
                      f"*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]" for i in range(8)]
                   + ["ms_api: *i"]) + "\n"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args)  # `python -m precnb ARGS` in this process (tests/_inprocess_cli.py)


# ----------------------------------------------------------------------------- item 2: plain YAML only
def test_billion_laughs_fails_fast_with_a_clear_error(tmp_path):
    bomb = tmp_path / "laughs.yaml"
    bomb.write_text(LAUGHS)
    assert bomb.stat().st_size < 2048
    t0 = time.perf_counter()
    with pytest.raises(MappingError, match=r"laughs.yaml: YAML alias \*a at line 2: .*aliases .* are refused"):
        load_mapping(bomb)
    assert time.perf_counter() - t0 < 2.0
    api = tmp_path / "api.yaml"  # the same, hidden in an msprobe API mapping
    api.write_text(LAUGHS.replace("ms_api: *i", "- {ms_api: *i, pt_api: x}").replace("a: &a", "- a: &a", 1)
                   .replace("\nb:", "\n- b:"))
    with pytest.raises(MappingError, match="alias"):
        load_mapping(api)


def test_the_cli_refuses_billion_laughs_at_once(tmp_path, samples):
    bomb = tmp_path / "laughs.yaml"
    bomb.write_text(LAUGHS)
    t0 = time.perf_counter()
    p = _cli("diff", str(samples("renamed", "baseline")), str(samples("renamed", "target")), "--mapping", str(bomb))
    assert p.returncode == 1 and "YAML alias *a" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert time.perf_counter() - t0 < 120


@pytest.mark.parametrize("text, why", [
    ("!!python/object/apply:os.system ['echo pwned']\n", r"YAML tag 'tag:yaml.org,2002:python/object/apply:os.system'"),
    ("a: !!python/name:os.system\n", "YAML tag 'tag:yaml.org,2002:python/name:os.system'"),
    ("a: !!binary aGVsbG8=\n", "YAML tag 'tag:yaml.org,2002:binary'"),
    ("a: !custom x\n", "YAML tag '!custom'"),
    ("a: 2024-01-01\n", "a date value"),
    ("a: " + "x" * 5000 + "\n", "a value of 5000 characters"),
    ("[" * 200 + "]" * 200 + "\n", "nested deeper than 32 levels"),
    ("a:\n" + "".join("  " * i + f" - b{i}:\n" for i in range(1, 60)), "nested deeper than 32 levels"),
])
def test_yaml_that_is_not_plain_is_named(tmp_path, text, why):
    f = tmp_path / "m.yaml"
    f.write_text(text)
    with pytest.raises(MappingError, match=why.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        load_mapping(f)


def test_deeply_nested_json_is_an_input_error(tmp_path):
    f = tmp_path / "deep.json"
    f.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(MappingError, match=r"deep\.json: nested deeper than 32 levels"):
        load_mapping(f)
    g = tmp_path / "deep2.json"
    g.write_text('{"modules": ' + "[" * 50 + "]" * 50 + "}")
    with pytest.raises(MappingError, match="nested deeper than 32 levels"):
        load_mapping(g)
    p = _cli("align", str(ROOT / "data_samples" / "renamed" / "baseline"), str(ROOT / "data_samples" / "renamed" /
             "target"), "--mapping", str(f))
    assert p.returncode == 1 and "nested deeper" in p.stderr and "RecursionError" not in p.stderr, p.stderr


def test_api_mapping_values_must_be_names():
    with pytest.raises(MappingError, match=r"\[0\] ms_api and pt_api must be API names"):
        parse_mapping([{"ms_api": ["x"] * 3, "pt_api": "Torch.add"}])
    with pytest.raises(MappingError, match=r"\[1\] ms_args must be a list of argument / output indices"):
        parse_mapping([{"ms_api": "a", "pt_api": "b"}, {"ms_api": "a", "pt_api": "b", "ms_args": [{"x": 1}]}])
    spec = parse_mapping([{"ms_api": "Functional.add", "pt_api": "Torch.add", "ms_args": [0, 1], "junk": 1}])
    assert spec.api == [{"ms_api": "Functional.add", "pt_api": "Torch.add", "ms_args": [0, 1]}]


@pytest.mark.slow
def test_the_c_loader_reads_a_large_mapping_quickly(tmp_path):
    yaml = pytest.importorskip("yaml")
    if not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML without libyaml")
    f = tmp_path / "big.yaml"
    with open(f, "w") as fh:
        for i in range(200_000):
            fh.write(f"Functional.linear.{i}.forward.input.0: Functional.linear.{i}.forward.input.0\n")
    assert f.stat().st_size > 10 << 20
    t0 = time.perf_counter()
    spec = load_mapping(f)
    assert spec.kind == "data" and len(spec.data) == 200_000
    assert time.perf_counter() - t0 < 60  # the pure-Python loader takes minutes


# ----------------------------------------------------------------------------- item 11: messages
def test_a_symlink_loop_and_a_fifo_are_named(tmp_path):
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    with pytest.raises(MappingError, match=r"loop\.yaml: symbolic link loop"):
        load_mapping(loop)
    with pytest.raises(MappingError, match=r"missing\.yaml: no such mapping file"):
        load_mapping(tmp_path / "missing.yaml")
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo.yaml"
        os.mkfifo(fifo)
        with pytest.raises(MappingError, match=r"fifo.yaml: cannot read: it is a FIFO \(named pipe\)"):
            load_mapping(fifo)
    p = _cli("diff", str(ROOT / "data_samples" / "renamed" / "baseline"),
             str(ROOT / "data_samples" / "renamed" / "target"), "--mapping", str(loop))
    assert p.returncode == 1 and "symbolic link loop" in p.stderr and "no such mapping file" not in p.stderr


def test_align_accepts_paths(samples):
    a = precnb.align(str(samples("renamed", "baseline")), samples("renamed", "target"))
    assert not a.identical and a.module_map()["decoder.layers.0.self_attention.linear_q"] == \
        "model.layers.0.self_attn.q_proj"
    with pytest.raises(TypeError, match=r"baseline: expected a run path or an xarray\.Dataset, got int"):
        precnb.align(1, samples("renamed", "target"))


# ----------------------------------------------------------------------------- item 5: pairs checked
def _runs(samples):
    from tests.conftest import open_quiet

    return open_quiet(samples("divergence", "baseline")), open_quiet(samples("divergence", "target"))


def test_pairs_that_name_nothing_are_reported_and_ignored(samples):
    base, target = _runs(samples)
    junk = {"schema": "precnb.mapping/1",
            "modules": [{"baseline": "no.such", "target": "blocks.0"}],
            "nodes": [{"baseline": "Functional.nope.0.forward", "target": "Functional.linear.0.forward"}],
            "tensors": [{"baseline": "Nope.0.forward.input.0", "target": "Functional.linear.0.forward.input.0"},
                        {"baseline": "Functional.linear.0.forward.input.0", "target": "Nope.1.forward.input.0"}],
            "unpair": ["Functional.nope.3.forward"]}
    a = precnb.align(base, target, mapping=junk)
    assert not [p for p in a.tensors + a.nodes + a.modules if p.how == "user"]
    text = "\n".join(a.mapping_problems)
    for needle in ("modules pair 'no.such' -> 'blocks.0' ignored: the baseline has no module 'no.such'",
                   "nodes pair 'Functional.nope.0.forward' -> 'Functional.linear.0.forward' ignored",
                   "the baseline has no tensor 'Nope.0.forward.input.0'",
                   "the target has no tensor 'Nope.1.forward.input.0'",
                   "unpair 'Functional.nope.3.forward' ignored"):
        assert needle in text, text
    assert a.tensor_map()["Functional.linear.0.forward.input.0"] == "Functional.linear.0.forward.input.0"
    assert a.to_dict()["mapping_problems"] == a.mapping_problems


def test_msprobe_data_mapping_names_are_checked_and_may_map_many_to_one(samples, tmp_path):
    base, target = _runs(samples)
    dm = tmp_path / "dm.yaml"
    dm.write_text("Functional.linear.0.forward.input.0: Nope.2.forward.input.0\n"
                  "Functional.linear.1.forward.output.0: Functional.linear.0.forward.output.0\n"
                  "Functional.linear.2.forward.output.0: Functional.linear.0.forward.output.0\n")
    a = precnb.align(base, target, mapping=str(dm))
    assert any("'Functional.linear.0.forward.input.0': 'Nope.2.forward.input.0' ignored: names no tensor of the "
               "baseline" in p for p in a.mapping_problems), a.mapping_problems
    tmap = a.tensor_map()
    assert tmap["Functional.linear.1.forward.output.0"] == tmap["Functional.linear.2.forward.output.0"] == \
        "Functional.linear.0.forward.output.0"  # the data format maps several onto one
    assert tmap["Functional.linear.0.forward.input.0"] != "Nope.2.forward.input.0"


def test_many_to_one_module_pairs_are_refused(samples):
    base, target = _runs(samples)
    doc = {"modules": [{"baseline": "blocks.0", "target": "blocks.0"}, {"baseline": "blocks.0.mlp",
                                                                              "target": "blocks.0"}],
           "nodes": [{"baseline": "Functional.linear.0.forward", "target": "Functional.linear.0.forward"},
                     {"baseline": "Functional.linear.0.forward", "target": "Functional.linear.1.forward"}]}
    a = precnb.align(base, target, mapping=doc)
    assert a.module_map()["blocks.0"] == "blocks.0"
    text = "\n".join(a.mapping_problems)
    assert "modules pair 'blocks.0.mlp' -> 'blocks.0' ignored: 'blocks.0' is already paired" in text, text
    assert "nodes[1]: baseline 'Functional.linear.0.forward' is paired twice" in text


def test_a_mapping_reused_with_the_runs_swapped_is_detected(samples, tmp_path):
    gt = json.loads(samples("renamed", "ground_truth.json").read_text())
    fault = next(f for f in gt["faults"] if f.get("kind") == "divergence")
    out = tmp_path / "map.json"
    p = _cli("align", str(samples("renamed", "baseline")), str(samples("renamed", "target")), "-o", str(out))
    assert p.returncode == 0, p.stderr
    p = _cli("diff", str(samples("renamed", "target")), str(samples("renamed", "baseline")), "--mapping", str(out),
             "--json")
    assert p.returncode == 0, p.stderr
    finding = json.loads(p.stdout)
    assert (finding["kind"], finding["step"], finding["node"]) == ("first_divergence", fault["step"], fault["node"])
    assert "saved with baseline and target swapped; read reversed" in p.stderr, p.stderr
    p = _cli("diff", str(samples("renamed", "baseline")), str(samples("renamed", "target")), "--mapping", str(out),
             "--json")
    assert p.returncode == 0 and "mapping:" not in p.stderr, p.stderr  # as written: nothing to say
