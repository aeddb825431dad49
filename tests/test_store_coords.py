"""``convert`` hands the reader's string coordinates to xarray without copying every string (issue #23)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from precnb.io.store import _coord_vars


def test_string_coordinates_keep_the_readers_strings():
    names = np.array([f"Functional.linear.{i}.forward.output.0" for i in range(50)], dtype=object)
    nodes = np.array([f"Functional.linear.{i}.forward" for i in range(50)], dtype=object)
    ds = xr.Dataset({}, coords=_coord_vars({"tensor": names, "node": (("tensor",), nodes)}))
    assert ds["node"].variable._data is nodes  # no pandas round trip: the same array, the same str objects
    assert ds["node"].values[7] is nodes[7]
    ref = xr.Dataset({}, coords={"tensor": names, "node": (("tensor",), nodes)})
    assert ds.identical(ref) and ds["node"].dtype == object and ds.indexes["tensor"].dtype == object
