"""Optional dependencies: say which extra to install instead of failing with ModuleNotFoundError.

The core install (numpy, pandas, xarray, zarr, tqdm) reads, analyses and converts; the
report, the notebook templates and the explorer need the ``notebook`` extra; a Dask cluster
(``--scheduler``, ``client=``) and dask-backed datasets (``lazy=True``) the ``dask`` extra.

Examples
--------
>>> require("test", ("json",))  # present: nothing happens
>>> require("precnb report", ("no_such_module",))
Traceback (most recent call last):
...
precnb._extras.MissingExtraError: precnb report needs no_such_module, which is not installed: pip install 'precnb[...
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.util import find_spec

from precnb.errors import PrecnbError

__all__ = ["DASK", "DASK_ARRAYS", "NOTEBOOK", "REPORT", "TEMPLATE", "TEMPLATE_EXECUTE", "TEMPLATE_HTML",
           "MissingExtraError", "missing", "require"]

#: import names (not pip names) each feature needs
REPORT = ("jinja2", "markupsafe", "altair", "vl_convert")
TEMPLATE = ("nbformat", "papermill")
TEMPLATE_EXECUTE = ("nbformat", "papermill", "nbclient", "ipykernel")
TEMPLATE_HTML = ("nbformat", "nbconvert")
NOTEBOOK = ("ipywidgets", "altair", "anywidget", "vl_convert")
#: the ``dask`` extra: a cluster (``--scheduler``) needs both, dask-backed arrays dask alone
DASK = ("dask", "distributed")
DASK_ARRAYS = ("dask",)
_PIP_NAMES = {"vl_convert": "vl-convert-python"}


class MissingExtraError(PrecnbError, ImportError):
    """A feature needs an optional dependency that is not installed (the message says what to install)."""


def missing(modules: Sequence[str]) -> list[str]:
    """The modules of *modules* that cannot be imported (found without importing them)."""
    out = []
    for m in modules:
        try:
            if find_spec(m) is None:
                out.append(m)
        except (ImportError, ValueError):
            out.append(m)
    return out


def require(feature: str, modules: Sequence[str], extra: str = "notebook") -> None:
    """Raise :class:`MissingExtraError` naming the extra to install when a module is missing."""
    gone = missing(modules)
    if gone:
        names = ", ".join(_PIP_NAMES.get(m, m) for m in gone)
        raise MissingExtraError(f"{feature} needs {names}, which {'is' if len(gone) == 1 else 'are'} not "
                                f"installed: pip install 'precnb[{extra}]'")
