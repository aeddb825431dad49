"""Read-only pre-flight checklist panel of the explorer (the pipeline's ``preflight`` result)."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as ipw

__all__ = ["PreflightPanel", "preflight_html"]

_COLORS = {"fail": "#b00", "warn": "#b76e00", "pass": "#2a7", "skip": "#777"}


def preflight_html(finding: Any) -> str:
    """HTML of the checklist held by a pre-flight finding (every string escaped)."""
    e = html.escape
    checks = [c for c in (finding.evidence.get("checks") or []) if isinstance(c, dict)]
    failed = sum(1 for c in checks if c.get("status") == "fail")
    warned = sum(1 for c in checks if c.get("status") == "warn")
    if failed:
        head = (f"<b style='color:#b00'>Pre-flight: {failed} check(s) failed</b> — later differences may be "
                "consequences")
    elif warned:  # not "passed": a warning may be the cause (a weight left at zero)
        head = (f"<b style='color:#b76e00'>Pre-flight: no check failed, {warned} warning(s)</b> — read them before "
                "trusting a layer-by-layer comparison")
    else:
        head = "<b style='color:#2a7'>Pre-flight checks passed</b>"
    rows = []
    for c in checks:
        status = str(c.get("status"))
        rows.append(f"<tr class='precnb-check' data-check='{e(str(c.get('name')))}'>"
                    f"<td><b>{e(str(c.get('title') or c.get('name')))}</b></td>"
                    f"<td style='color:{_COLORS.get(status, '#000')}'>{e(status)}</td>"
                    f"<td>{e(str(c.get('message', '')))}</td></tr>")
    # the table wraps its text to the cell's width (issue 51: 3-14 px wider than a 568 px notebook)
    style = ("<style>.precnb-preflight table{font-size:12px;width:100%;max-width:100%}.precnb-preflight td"
             "{overflow-wrap:anywhere;vertical-align:top;padding:1px 6px 1px 0}</style>")
    return f"<div class='precnb-preflight'>{style}{head}<table>{''.join(rows)}</table></div>"


class PreflightPanel(ipw.HTML):
    """The checklist as one HTML line per check; shown above the diagnosis tabs."""

    def __init__(self, finding: Any) -> None:
        super().__init__(preflight_html(finding))
        self.finding = finding
        self.add_class("precnb-preflight-panel")
