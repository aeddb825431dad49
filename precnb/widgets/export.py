"""Export panel: write the self-contained HTML report (``precnb.report.write_html``).

The write follows :mod:`precnb._write`: the folder must exist, the file must not be inside the
explored runs' dumps, and an existing file is replaced only when "replace" is ticked and it is
a report precnb wrote; a refusal is shown in the panel, one line.
"""

from __future__ import annotations

import html
import inspect
from pathlib import Path
from typing import Any

import ipywidgets as ipw

from precnb._exporters import exporter
from precnb.widgets.findings import _error

__all__ = ["ExportPanel"]


class ExportPanel(ipw.HBox):
    """A path and an "Export report" button; the findings shown so far go into the report."""

    def __init__(self, explorer: Any) -> None:
        self.explorer = explorer
        self.path = ipw.Text(value="precnb_report.html", description="file",
                           layout=ipw.Layout(width="360px"))
        self.button = ipw.Button(description="Export report", icon="download",
                               layout=ipw.Layout(width="160px"))
        self.overwrite = ipw.Checkbox(value=False, description="replace a precnb report", indent=False,
                                      layout=ipw.Layout(width="190px"))
        self.status = ipw.HTML("")
        self.status.add_class("precnb-export-status")
        self.button.on_click(lambda _b: self.export())
        super().__init__([self.path, self.overwrite, self.button, self.status])

    def export(self) -> Path | None:
        """Call ``precnb.report.write_html(ds, path, ...)``; report a missing module clearly."""
        try:
            write_html = exporter("html")  # precnb.report.write_html; widgets do not import the report
        except Exception as err:
            self.status.value = ("<span style='color:#b00'>HTML export is not available: "
                                 f"precnb.report.write_html cannot be imported ({html.escape(str(err))})"
                                 "</span>")
            return None
        path = Path(self.path.value).expanduser()
        kw: dict[str, Any] = {}
        params = inspect.signature(write_html).parameters
        accepts = lambda n: n in params or any(  # noqa: E731
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        findings = self.explorer.findings()
        if findings and accepts("findings"):
            kw["findings"] = findings
        triage = getattr(self.explorer, "triage", None)
        source: Any = triage
        if triage is None:  # an explorer made by hand: its runs, its chosen baseline
            source = self.explorer.runs.ds
            base = getattr(self.explorer.runs, "baseline", None)
            if base is not None and "run" in self.explorer.runs.ds.dims and accepts("baseline"):
                kw["baseline"] = base
        if accepts("overwrite"):
            kw["overwrite"] = bool(self.overwrite.value)
        if accepts("inputs"):  # the explored runs' dumps stay read-only whatever the source object is
            from precnb._write import dataset_inputs

            kw["inputs"] = dataset_inputs(self.explorer.runs.ds)
        try:
            out = write_html(source, path, **kw)
        except Exception as err:
            self.status.value = _error(err)
            return None
        path = Path(out) if isinstance(out, (str, Path)) else path
        self.status.value = f"written <code>{html.escape(str(path))}</code>"
        return path
