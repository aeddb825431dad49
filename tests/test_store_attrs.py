"""Issue #49 defect 6: a hand-edited zarr store is validated like a dump (exit 1, one line naming the store and
what is wrong), never an internal error or a usage error; ``info`` lists the attributes it could not read.

Every fixture is made here: ``precnb convert`` of the bundled ``dp_nan`` sample, then its attributes or
coordinates edited with zarr.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from tests._inprocess_cli import run_cli
from tests.conftest import sample_path

DEEP = '{"a":' * 5000 + "1" + "}" * 5000


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    out = tmp_path_factory.mktemp("store") / "s.zarr"
    r = run_cli("convert", sample_path("dp_nan"), "-o", out, "--workers", "1")  # tests/_inprocess_cli.py
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture
def cli(capsys):
    """``precnb ARGS`` in this process (the command line's own entry point): returncode, stdout, stderr."""
    from precnb.cli import main

    def run(*args):
        capsys.readouterr()
        code = main([*map(str, args), "--workers", "1"])
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)
    return run


def _attr(name, value):
    def edit(p):
        import zarr

        zarr.open_group(p, mode="r+").attrs[name] = value
    return edit


def _coord(name, change):
    def edit(p):
        import zarr

        arr = zarr.open_group(p, mode="r+")[name]
        arr[:] = change(arr[:])
    return edit


def _remove(name):
    return lambda p: shutil.rmtree(p / name)


def _dup_first(v):
    v = np.array(v, copy=True)
    v[0] = v[1]
    return v


EDITS = {
    "construct_deep": (_attr("construct", DEEP), "attribute construct is not what precnb writes: JSON nested"),
    "construct_nested": (_attr("construct", json.dumps({"a": {"b": "c"}})),
                         'attribute construct["a"] is an object, expected a string'),
    "construct_list": (_attr("construct", "[1, 2]"), "attribute construct is a list, expected an object"),
    "construct_not_json": (_attr("construct", "{not json"), "attribute construct is not JSON (line 1 column 2"),
    "stacks_numeric": (_attr("stacks", json.dumps({"Module.embed.Embedding.forward.0": 5})),
                       'attribute stacks["Module.embed.Embedding.forward.0"] is a number, expected a list'),
    "stacks_number": (_attr("stacks", "5"), "attribute stacks is a number, expected an object"),
    "scalar_args_deep": (_attr("scalar_args", DEEP), "attribute scalar_args is not what precnb writes"),
    "scalar_args_list": (_attr("scalar_args", "[1]"), "attribute scalar_args is a list"),
    "requires_grad_list": (_attr("requires_grad", "[true]"), "attribute requires_grad is a list"),
    "load_report_bad": (_attr("load_report", json.dumps({"read": 5})),
                        "attribute load_report is not a precnb load report"),
    "rank_dirs_list": (_attr("rank_dirs", "[1]"), "attribute rank_dirs is a list"),
    "comm_groups_object": (_attr("comm_groups", '{"a": 1}'), "attribute comm_groups is an object"),
    "duplicate_steps": (_coord("step", _dup_first), "the 'step' coordinate holds duplicate values (1)"),
    "duplicate_ranks": (_coord("rank", _dup_first), "the 'rank' coordinate holds duplicate values (1)"),
    "duplicate_tensors": (_coord("tensor", _dup_first), "the 'tensor' coordinate holds duplicate values"),
    "no_tensor_coordinate": (_remove("tensor"), "the 'tensor' coordinate is missing from the store"),
}
ATTRS = [k for k, (edit, _) in EDITS.items() if k.split("_")[0] not in ("duplicate", "no")]


def _edited(store, tmp_path, case):
    d = tmp_path / f"{case}.zarr"
    shutil.copytree(store, d)
    EDITS[case][0](d)
    return d


def _one_line(r, d, what):
    assert r.returncode == 1, (r.stdout, r.stderr)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "internal error" not in err and "usage error" not in err, err
    assert f"{d}: " in err and what in err, err


@pytest.mark.parametrize("case", sorted(EDITS))
def test_a_hand_edited_store_is_one_line_naming_it(store, tmp_path, case, cli):
    d = _edited(store, tmp_path, case)
    what = EDITS[case][1]
    _one_line(cli("nan", d), d, what)  # 'usage error: '145' is not in list' for a missing tensor coordinate
    _one_line(cli("diff", store, d), d, what)
    _one_line(cli("diff", d, store), d, what)


@pytest.mark.parametrize("case", sorted(EDITS))
def test_open_run_raises_a_dump_format_error(store, tmp_path, case):
    import precnb
    from precnb.errors import DumpFormatError

    d = _edited(store, tmp_path, case)
    with pytest.raises(DumpFormatError, match="hand-edited store") as info:
        precnb.open_run(d)
    assert str(d) in str(info.value)


@pytest.mark.parametrize("case", ATTRS)
def test_info_lists_the_attribute_it_could_not_read(store, tmp_path, case, cli):
    d = _edited(store, tmp_path, case)
    r = cli("info", d)
    assert r.returncode == 0, r.stderr
    name = case.split("_")[0] if not case.startswith(("scalar_args", "requires_grad", "load_report", "rank_dirs",
                                                      "comm_groups")) else "_".join(case.split("_")[:2])
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("NOT READ"))
    assert line.startswith(f"NOT READ   {d}/zarr.json: attribute {name}: {name}"), line
    assert EDITS[case][1].removeprefix("attribute ") in line, line
    assert "1 section(s) or leaf(s) not read" in r.stdout


@pytest.mark.parametrize("case", [k for k in EDITS if k not in ATTRS])
def test_info_refuses_a_store_whose_coordinates_are_broken(store, tmp_path, case, cli):
    d = _edited(store, tmp_path, case)
    _one_line(cli("info", d), d, EDITS[case][1])


def test_an_intact_store_and_a_json_object_attribute_are_read(store, tmp_path, cli):
    import precnb

    d = tmp_path / "obj.zarr"
    shutil.copytree(store, d)
    construct = json.loads(precnb.open_run(store).attrs["construct"])
    _attr("construct", construct)(d)  # a JSON object in zarr.json instead of JSON text: what precnb writes
    assert json.loads(precnb.open_run(d).attrs["construct"]) == construct
    r = cli("nan", d)
    assert r.returncode == 0 and "Torch.sqrt" in r.stdout, r.stderr
