"""The reader registry: built-in readers, run-time and entry-point plug-ins, CLI choices, xarray engines."""

from __future__ import annotations

import sys
import tomllib
import warnings

import numpy as np
import pytest
import xarray as xr

import precnb
from precnb.cli import build_parser
from precnb.errors import NotADumpError
from precnb.io import readers
from precnb.io.readers import BUILTIN, Reader, get_reader, reader_names
from tests.conftest import ROOT

TOY = """\
from pathlib import Path

import numpy as np

from precnb.io._assemble import RecordBuilder, assemble
from precnb.io.readers import Reader


def can_open(path):
    return Path(path).suffix == ".toy"


def open_toy(path, **_):
    b = RecordBuilder(step=0, rank=0)
    for i, line in enumerate(Path(path).read_text().split()):
        b.add(f"t{i}.output.0", {"max": float(line), "min": float(line), "mean": float(line), "norm": 0.0},
              node=f"t{i}", kind="api", role="output")
    return assemble([b.build()], source_format="toy")


READER = Reader(name="toy", can_open=can_open, open=open_toy, description="toy file")
"""


@pytest.fixture
def plugin_env(tmp_path, monkeypatch):
    """A fake installed distribution declaring ``precnb.readers`` entry points; returns a writer."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def install(entry_points: dict[str, str], modules: dict[str, str]) -> None:
        for name, code in modules.items():
            (site / f"{name}.py").write_text(code)
        dist = site / "toyplugin-1.0.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplugin\nVersion: 1.0\n")
        lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
        (dist / "entry_points.txt").write_text(f"[precnb.readers]\n{lines}\n")
        readers.refresh()

    yield install
    for mod in ("toy_reader", "broken_reader"):
        sys.modules.pop(mod, None)
    readers.refresh()


def test_builtin_readers_in_listing_and_detection_order():
    assert reader_names()[:7] == ("msprobe", "monitor", "kernel", "kernel_tensors", "compare", "config_check", "zarr")
    order = [r.name for r in readers.readers() if r.name in BUILTIN]
    assert order == ["zarr", "msprobe", "config_check", "monitor", "kernel", "kernel_tensors", "compare"]
    for name in BUILTIN:
        assert get_reader(name).name == name and (get_reader(name).description or name == "kernel_tensors")


def test_detection_and_open_come_from_the_registry():
    assert precnb.detect_format(ROOT / "data_samples" / "dp_nan") == "msprobe"
    assert precnb.detect_format(ROOT / "data_samples" / "monitor" / "monitor_output") == "monitor"
    with pytest.raises(ValueError, match="unknown format 'nope'; expected one of msprobe, monitor"):
        precnb.open_run(ROOT / "data_samples" / "dp_nan", format="nope")
    assert precnb.available_steps(ROOT / "data_samples" / "dp_nan") == [0, 1, 2]
    assert precnb.available_steps(ROOT / "data_samples" / "monitor") is None  # steps are inside the CSVs


def test_cli_format_choices_are_the_registry(plugin_env):
    plugin_env({"toy": "toy_reader:READER"}, {"toy_reader": TOY})
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        fmt = [a for a in parser._actions if a.dest == "format"]
        if fmt:
            assert tuple(fmt[0].choices) == reader_names(), name
    assert "toy" in reader_names()


def test_xarray_engines_are_one_per_builtin_reader(tmp_path):
    engines = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["xarray.backends"]
    assert set(engines) == {"precnb"} | {f"precnb_{n}" for n in BUILTIN}
    assert {k for k in xr.backends.list_engines() if k.startswith("precnb")} == set(engines)
    dump = ROOT / "data_samples" / "dp_nan"
    expected = precnb.open_run(dump, progress=False)
    xr.testing.assert_identical(xr.open_dataset(dump, engine="precnb_msprobe"), expected)
    xr.testing.assert_identical(xr.open_dataset(dump, engine="precnb"), expected)
    store = precnb.to_zarr(expected, tmp_path / "run.zarr")
    xr.testing.assert_identical(xr.open_dataset(store, engine="precnb_zarr").load(), precnb.open_run(store))
    mon = xr.open_dataset(ROOT / "data_samples" / "monitor" / "monitor_output", engine="precnb_monitor")
    assert mon.attrs["source_format"] == "monitor"


def test_entry_point_plugin_reads_its_format(plugin_env, tmp_path):
    plugin_env({"toy": "toy_reader:READER"}, {"toy_reader": TOY})
    f = tmp_path / "run.toy"
    f.write_text("1.5 -inf nan")
    assert precnb.detect_format(f) == "toy"
    ds = precnb.open_run(f)
    assert ds.attrs["source_format"] == "toy"
    got = ds["max"].sel(step=0, rank=0).values
    assert got[0] == 1.5 and got[1] == -np.inf and np.isnan(got[2])
    with pytest.raises(NotADumpError, match="toy file"):
        precnb.detect_format(tmp_path)


def test_broken_plugins_warn_and_never_break_precnb(plugin_env, tmp_path):
    broken_test = TOY.replace("return Path(path).suffix == \".toy\"", "raise RuntimeError('bug in can_open')")
    plugin_env({"missing": "no_such_module:READER", "notareader": "json:loads", "msprobe": "toy_reader:READER",
                "buggy": "broken_reader:READER"},
               {"toy_reader": TOY, "broken_reader": broken_test.replace('name="toy"', 'name="buggy"')})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = reader_names()
        assert precnb.detect_format(ROOT / "data_samples" / "dp_nan") == "msprobe"
        ds = precnb.open_run(ROOT / "data_samples" / "dp_nan", progress=False)
        with pytest.raises(NotADumpError, match="not a recognised input"):  # every test asked, the bug only warns
            precnb.detect_format(tmp_path)
    text = " ".join(str(w.message) for w in caught)
    assert "msprobe" in names and names.count("msprobe") == 1
    assert "'missing' (no_such_module:READER) could not be loaded: ModuleNotFoundError" in text
    assert "'notareader' (json:loads) could not be loaded" in text
    assert "reuses a built-in format name" in text
    assert "'buggy': its format test failed" in text
    assert ds.attrs["source_format"] == "msprobe"
    assert "missing" not in reader_names()


def test_register_at_run_time(tmp_path):
    ns: dict[str, object] = {}
    exec(compile(TOY, "toy_reader", "exec"), ns)
    reader = ns["READER"]
    assert isinstance(reader, Reader)
    readers.register(reader)
    try:
        f = tmp_path / "a.toy"
        f.write_text("2.0")
        assert precnb.open_run(f)["max"].item() == 2.0
        with pytest.raises(ValueError, match="built-in"):
            readers.register(Reader(name="msprobe", can_open=bool, open=print))
    finally:
        readers.unregister("toy")
    assert "toy" not in reader_names()


def test_plugin_list_is_not_loaded_to_name_it(plugin_env):
    plugin_env({"lazy": "toy_reader:READER"}, {"toy_reader": TOY.replace('name="toy"', 'name="lazy"')})
    assert "lazy" in reader_names()
    assert "toy_reader" not in sys.modules
    assert get_reader("lazy").name == "lazy"
    assert "toy_reader" in sys.modules
