"""Export panel: write the self-contained HTML report (``precnb.report.write_html``).

Writing takes a few seconds (charts are rendered offline): the panel says what it is doing while
it runs, the button is disabled meanwhile, and the outcome (the path, or the error) stays shown.
The write follows :mod:`precnb._write`: the folder must exist, the file must not be inside the
explored runs' dumps, and an existing file is replaced only when "replace" is ticked and it is
a report precnb wrote; a refusal is shown in the panel, one line.
"""

from __future__ import annotations

import html
import inspect
import time
from pathlib import Path
from typing import Any

import ipywidgets as ipw

from precnb._exporters import exporter
from precnb.widgets.findings import _error
from precnb.widgets.panel import Panel

__all__ = ["ExportPanel"]


class ExportPanel(Panel):
    """A path and an "Export report" button; the findings shown so far go into the report."""

    title = "Export"
    lazy = True

    def build(self) -> None:
        """The path, replace box, Export button and progress bar."""
        self.path = ipw.Text(value="precnb_report.html", description="file", layout=ipw.Layout(width="360px"))
        # its own width (a fixed 190 px cut it to "replace a precnb mapp…", issue 51)
        self.overwrite = ipw.Checkbox(value=False, description="replace a precnb report", indent=False,
                                      layout=ipw.Layout(width="auto"))
        self.button = ipw.Button(description="Export report", icon="download", layout=ipw.Layout(width="160px"))
        self.progress = ipw.IntProgress(value=0, min=0, max=3, description="", bar_style="info",
                                        layout=ipw.Layout(width="160px", visibility="hidden"))
        self.status = ipw.HTML("")
        self.status.add_class("precnb-export-status")
        self.button.on_click(lambda _b: self.export())
        self.children = [ipw.HBox([self.path, self.overwrite, self.button, self.progress]), self.status]

    def _stage(self, n: int, text: str) -> None:
        self.progress.value = n
        self.status.value = f"<i>{html.escape(text)}</i>"

    def export(self) -> Path | None:
        """Call ``precnb.report.write_html(source, path, ...)``; a refusal or error is one line in the panel."""
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
        findings = self.api.findings()
        if findings and accepts("findings"):
            kw["findings"] = findings
        triage = self.api.triage
        source: Any = triage
        if triage is None:  # an explorer made by hand: its runs, its chosen baseline
            source = self.api.runs.ds
            base = self.api.runs.baseline
            if base is not None and "run" in self.api.runs.ds.dims and accepts("baseline"):
                kw["baseline"] = base
        if accepts("overwrite"):
            kw["overwrite"] = bool(self.overwrite.value)
        if accepts("inputs"):  # the explored runs' dumps stay read-only whatever the source object is
            kw["inputs"] = self.api.input_paths()
        self.button.disabled = True
        self.progress.layout.visibility = "visible"
        self.progress.bar_style = "info"
        t0 = time.perf_counter()
        self._stage(1, f"writing {path.name}: rendering charts and tables offline (a few seconds)…")
        try:
            out = write_html(source, path, **kw)
        except Exception as err:
            self.progress.bar_style = "danger"
            self.status.value = _error(err)
            return None
        finally:
            self.button.disabled = False
        path = Path(out) if isinstance(out, (str, Path)) else path
        self.progress.value = self.progress.max
        self.progress.bar_style = "success"
        size = path.stat().st_size / 2**20 if path.exists() else 0.0
        self.status.value = (f"written <code>{html.escape(str(path))}</code> ({size:.1f} MB, "
                             f"{time.perf_counter() - t0:.1f} s)")
        return path
