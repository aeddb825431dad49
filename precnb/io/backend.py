"""xarray backend entry point: ``xr.open_dataset(path, engine="precnb_msprobe")``."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import xarray as xr
from xarray.backends import BackendEntrypoint

__all__ = ["MsprobeBackendEntrypoint"]


class MsprobeBackendEntrypoint(BackendEntrypoint):
    """Open msprobe dumps, monitor output, kernel dumps and compare CSVs through xarray."""

    description = "msprobe dumps and monitor output as precnb canonical datasets"
    url = "https://github.com/precnb/precnb"
    open_dataset_parameters = ("filename_or_obj", "drop_variables")

    def open_dataset(  # type: ignore[override]
        self,
        filename_or_obj: str | os.PathLike[Any],
        *,
        drop_variables: str | Iterable[str] | None = None,
    ) -> xr.Dataset:
        """Open *filename_or_obj* with :func:`precnb.open_run`."""
        from precnb.io.api import open_run

        ds = open_run(os.fspath(filename_or_obj))
        if drop_variables:
            names = [drop_variables] if isinstance(drop_variables, str) else list(drop_variables)
            ds = ds.drop_vars(names, errors="ignore")
        return ds

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        """Only claim folders/files that look like msprobe output (never netCDF etc.)."""
        try:
            from precnb.io.msprobe_dump import is_msprobe_dump

            return is_msprobe_dump(os.fspath(filename_or_obj))
        except (TypeError, OSError):
            return False
