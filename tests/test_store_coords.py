"""``convert`` hands the reader's string coordinates to xarray without copying every string (issue #23)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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
