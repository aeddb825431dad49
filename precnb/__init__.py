"""precnb: numerical-accuracy triage of distributed training, in Jupyter.

Load msprobe dumps and monitor output as xarray datasets indexed by step, rank and
tensor, find where two runs first diverge and where NaN/Inf came from, merge TP/PP
shards, and explore it all in linked notebook widgets.

``import precnb`` stays light: not even xarray until a dataset is needed (the ``ds.prec`` accessor is
registered when xarray is imported); the readers, analysis, charts and widgets are imported on first use.

Examples
--------
>>> import precnb
>>> precnb.__version__  # doctest: +ELLIPSIS
'0.1...'
"""

from __future__ import annotations

import importlib
from typing import Any

from precnb._version import __version__

_LAZY = {
    "open_run": "precnb.io.api",
    "open_runs": "precnb.pipeline.sources",
    "load_report": "precnb.io.api",
    "detect_format": "precnb.io.api",
    "available_steps": "precnb.io.api",
    "combine_runs": "precnb.combine",
    "load_tensor": "precnb.io.tensors",
    "tensor_metrics": "precnb.tensor_compare",
    "to_zarr": "precnb.io.store",
    "open_store": "precnb.io.store",
    "validate": "precnb.schema",
    "sample_path": "precnb._samples_path",
    "first_divergence": "precnb.analysis",
    "align": "precnb.pipeline.sources",
    "Alignment": "precnb.analysis",
    "first_divergence_stepwise": "precnb.analysis",
    "nan_origin": "precnb.analysis",
    "anomalies": "precnb.analysis",
    "Tolerance": "precnb.analysis",
    "Finding": "precnb.analysis",
    "Layout": "precnb.analysis",
    "merge_shards": "precnb.analysis",
    "check_replicas": "precnb.analysis",
    "check_departures": "precnb.analysis.replicas.departures",  # issue #28
    "follow_devices": "precnb.pipeline.run",
    "read_rank_table": "precnb.io.rank_table",
    "explore": "precnb.widgets",
    "diagnose": "precnb.pipeline",
    "Triage": "precnb.pipeline",
    "Options": "precnb.pipeline",
    "preflight": "precnb.pipeline.run",
    "write_html": "precnb.report",
}

_SUBMODULES = {"accessor", "analysis", "cli", "errors", "io", "naming", "pipeline", "report", "schema", "viz",
               "widgets"}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        mod = importlib.import_module(_LAZY[name])
        value = getattr(mod, name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"precnb.{name}")
    raise AttributeError(f"module 'precnb' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


# the ``ds.prec`` accessor is registered with xarray as soon as xarray is imported (now, if it is already): the CLI
# answers --help and --version without importing xarray (issue #50)
from precnb._xarray_hook import register_accessor_with_xarray  # noqa: E402

register_accessor_with_xarray()
