"""xarray backend engines, one per reader: ``xr.open_dataset(path, engine="precnb_msprobe")``.

``engine="precnb"`` detects the format; ``engine="precnb_NAME"`` uses the reader ``NAME`` of the
registry (:mod:`precnb.io.readers`). The built-in engines are declared in precnb's
``[project.entry-points."xarray.backends"]`` as ``precnb_NAME = "precnb.io.backend:NAME"`` (a test
keeps that list equal to the registry's built-in readers); a plug-in reader can declare its own
the same way, pointing at :func:`engine` through a module attribute of its own.

``guess_can_open`` claims only what a reader's own test recognises (never a plain zarr store,
which is xarray's), so opening a netCDF file without an engine never reaches precnb.

Examples
--------
>>> engine("msprobe").reader_name
'msprobe'
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import xarray as xr
from xarray.backends import BackendEntrypoint

__all__ = ["PrecnbBackendEntrypoint", "engine"]


class PrecnbBackendEntrypoint(BackendEntrypoint):
    """Open any input precnb reads (the format is detected) as a precnb canonical dataset."""

    reader_name: str | None = None
    description = "precnb readers: msprobe dumps, monitor output, kernel dumps, compare CSVs as canonical datasets"
    url = "https://github.com/precnb/precnb"
    open_dataset_parameters = ("filename_or_obj", "drop_variables", "steps", "ranks", "errors", "workers")

    def open_dataset(  # type: ignore[override]
        self,
        filename_or_obj: str | os.PathLike[Any],
        *,
        drop_variables: str | Iterable[str] | None = None,
        steps: Iterable[int] | None = None,
        ranks: Iterable[int] | None = None,
        errors: Any = "report",
        workers: int | str | None = None,
    ) -> xr.Dataset:
        """Open *filename_or_obj* with :func:`precnb.open_run`."""
        from precnb.io.api import open_run

        ds = open_run(os.fspath(filename_or_obj), format=self.reader_name,
                      steps=None if steps is None else list(steps), ranks=None if ranks is None else list(ranks),
                      errors=errors, workers=workers)
        if drop_variables:
            names = [drop_variables] if isinstance(drop_variables, str) else list(drop_variables)
            ds = ds.drop_vars(names, errors="ignore")
        return ds

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        """Claim only what a precnb reader recognises (never netCDF, never a plain zarr store)."""
        try:
            path = Path(os.fspath(filename_or_obj))
        except TypeError:
            return False
        from precnb.io.readers import get_reader, readers

        if self.reader_name is not None:
            reader = get_reader(self.reader_name)
            return reader.name != "zarr" and reader.detects(path)
        return any(r.name != "zarr" and r.detects(path) for r in readers())


_ENGINES: dict[str, type[PrecnbBackendEntrypoint]] = {}


def engine(name: str) -> type[PrecnbBackendEntrypoint]:
    """The xarray engine class of the reader *name* (created once)."""
    cls = _ENGINES.get(name)
    if cls is None:
        cls = type(f"Precnb_{name}_BackendEntrypoint", (PrecnbBackendEntrypoint,),
                   {"reader_name": name, "description": f"precnb reader {name!r} as a canonical dataset",
                    "__doc__": f"Open input of the precnb reader {name!r} as a canonical dataset."})
        _ENGINES[name] = cls
    return cls


def __getattr__(name: str) -> Any:
    """``precnb.io.backend.msprobe`` etc.: the engine of each built-in reader (entry-point targets)."""
    from precnb.io.readers import BUILTIN

    if name in BUILTIN:
        return engine(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
