"""``convert`` hands the reader's string coordinates to xarray without copying every string (issue #23)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from precnb.io._zarr_steps import coord_vars as _coord_vars


def test_string_coordinates_keep_the_readers_strings():
    names = np.array([f"Functional.linear.{i}.forward.output.0" for i in range(50)], dtype=object)
    nodes = np.array([f"Functional.linear.{i}.forward" for i in range(50)], dtype=object)
    ds = xr.Dataset({}, coords=_coord_vars({"tensor": names, "node": (("tensor",), nodes)}))
    assert ds["node"].variable._data is nodes  # no pandas round trip: the same array, the same str objects
    assert ds["node"].values[7] is nodes[7]
    ref = xr.Dataset({}, coords={"tensor": names, "node": (("tensor",), nodes)})
    assert ds.identical(ref) and ds["node"].dtype == object and ds.indexes["tensor"].dtype == object


def test_convert_reports_from_the_metadata_without_reopening_the_store(tmp_path, monkeypatch, capsys):
    import precnb
    import precnb.io.store as store
    from precnb.cli import main
    from precnb.io.api import load_report

    src = Path(__file__).resolve().parents[1] / "data_samples" / "dp_nan"
    out = tmp_path / "run.zarr"

    def refuse(*a, **k):
        raise AssertionError("convert reopened the whole store")

    monkeypatch.setattr(store, "open_store", refuse)
    assert main(["convert", str(src), "-o", str(out)]) == 0
    monkeypatch.undo()
    ds = precnb.open_run(out)
    sizes, attrs = store.store_outline(out)
    assert sizes == {d: ds.sizes[d] for d in ("step", "rank", "tensor")}
    assert f"({sizes['step']} steps × {sizes['rank']} ranks × {sizes['tensor']} tensors)" in capsys.readouterr().out
    assert attrs == ds.attrs and load_report(xr.Dataset(attrs=attrs)) == load_report(ds)
    assert ds.identical(precnb.open_run(src))


def _grown_tree(root: Path) -> Path:
    """Two ranks, three steps; a node first recorded at step 1 and a checksum first seen at step 2."""
    import json
    import shutil

    src = Path(__file__).resolve().parents[1] / "data_samples" / "dp_nan"
    shutil.copytree(src, root)
    dumps = sorted(root.glob("step*/rank*/dump.json"))
    steps = sorted({p.parent.parent.name for p in dumps})
    assert len(steps) >= 2, steps
    first = [p for p in dumps if p.parent.parent.name == steps[0]]
    victim = next(iter(json.loads(first[0].read_text())["data"]))
    for f in first:
        d = json.loads(f.read_text())
        d["data"].pop(victim, None)
        f.write_text(json.dumps(d, indent=1))
    last = next(p for p in dumps if p.parent.parent.name == steps[-1])
    d = json.loads(last.read_text())
    node = next(v for v in d["data"].values() if any(isinstance(a, dict) and "dtype" in a
                                                     for a in v.get("input_args", [])))
    next(a for a in node["input_args"] if isinstance(a, dict) and "dtype" in a)["md5"] = "deadbeef"
    last.write_text(json.dumps(d, indent=1))
    return root


@pytest.mark.slow
def test_streamed_string_coordinates_are_written_a_chunk_at_a_time(tmp_path, monkeypatch):
    """convert memory (issue #23): xarray writes the string coordinates as fill values, the columns follow a chunk at
    a time; the store reopens identical (tensors added at a later step start inside a chunk), with the metadata a
    one-piece write gives."""
    import json

    import zarr

    import precnb
    from precnb.io import _zarr_steps

    tree = _grown_tree(tmp_path / "tree")
    eager = precnb.open_run(tree, progress=False)
    assert "crc" in eager and eager.sizes["step"] >= 2
    monkeypatch.setattr(_zarr_steps, "STRING_CHUNK", 5)
    written: list[dict[str, set]] = []
    to_zarr = xr.Dataset.to_zarr

    def spy(ds, *a, **k):
        written.append({n: set(v.values.tolist()) for n, v in ds.variables.items()
                        if v.dtype.kind in "OT" and v.ndim == 1})
        return to_zarr(ds, *a, **k)

    monkeypatch.setattr(xr.Dataset, "to_zarr", spy)
    store = precnb.to_zarr(tree, tmp_path / "s.zarr", progress=False)
    monkeypatch.undo()
    assert {n: vals for n, vals in written[0].items() if n in ("tensor", "node", "module")} == {
        "tensor": {""}, "node": {""}, "module": {""}}  # no string column went through xarray whole
    xr.testing.assert_identical(precnb.open_run(store), eager)
    xr.testing.assert_identical(precnb.open_run(store, lazy=True).compute(), eager)
    group = zarr.open_group(store, mode="r")
    tensor = group["tensor"]
    assert isinstance(tensor, zarr.Array) and tensor.chunks == (5,) and tensor.nchunks > 2
    ref = precnb.to_zarr(eager, tmp_path / "ref.zarr")

    def meta(p: Path, name: str) -> dict:
        m = json.loads((p / name / "zarr.json").read_text())
        m.pop("chunk_grid")
        return m

    for name in eager.variables:
        assert meta(store, name) == meta(ref, name), name  # crc (added at the last step) names the coordinates too
