"""Offline HTML reports and reusable notebook templates.

:func:`to_html` / :func:`write_html` build one self-contained HTML file per incident: the
findings first (NaN/Inf origin, anomalies, first divergence, replica check), then a heat map
linked to a line chart that works in the browser without a kernel, then tables of values,
module paths and stack frames. No external URL; the vega bundle is inlined once.

:mod:`precnb.report.notebooks` lists, fills and exports the notebook templates
(``precnb template``).

Importing :mod:`precnb` does not import this package (it needs jinja2, altair and
vl-convert-python: ``pip install 'precnb[notebook]'``).

Examples
--------
>>> import precnb
>>> precnb.report.write_html(precnb.sample_path("dp_nan"), "dp_nan.html")  # doctest: +SKIP
PosixPath('dp_nan.html')
"""

from __future__ import annotations

from precnb._extras import REPORT, require

require("precnb.report", REPORT)  # a clear ImportError naming the extra, not ModuleNotFoundError

from precnb.report._charts import Limits  # noqa: E402
from precnb.report.html import render, to_html, write_html  # noqa: E402

__all__ = ["Limits", "render", "to_html", "write_html"]
