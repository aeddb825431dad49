"""The detail table: the selected records' values, dtype/shape, module path and stack frames."""

from __future__ import annotations

import html
import math
from typing import Any

import ipywidgets as ipw
import pandas as pd

__all__ = ["DetailPanel", "detail_html", "evidence_html"]

_CSS = """<style>
.precnb-detail table{border-collapse:collapse;font-size:12px;font-family:var(--jp-code-font-family,monospace)}
.precnb-detail th,.precnb-detail td{padding:1px 6px;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}
.precnb-detail td.l,.precnb-detail th.l{text-align:left}
.precnb-detail tr.focus td{background:#fff3c4;font-weight:600}
.precnb-detail .nf{color:#c00;font-weight:600}
.precnb-detail .null{color:#999}
.precnb-detail .stack{font-size:11px;color:#333;margin:2px 0 0 0;padding-left:0;list-style:none}
.precnb-detail .stack li{margin:0 0 3px 0}
.precnb-detail .stack .loc{color:#555}
.precnb-detail .stack code{display:block;white-space:pre-wrap;margin-left:14px;color:#000}
.precnb-detail .stack li.lib{color:#999}
.precnb-detail .stack li.lib code{color:#888}
</style>"""

_STATS = ("max", "min", "mean", "norm")
_NULL_BITS = {"max": 1, "min": 2, "mean": 4, "norm": 8}


def _num(v: Any, null: bool = False) -> str:
    if null:
        return "<span class='null'>null</span>"
    try:
        f = float(v)
    except (TypeError, ValueError):
        return html.escape(str(v))
    if math.isnan(f):
        return "<span class='nf'>nan</span>"
    if math.isinf(f):
        return f"<span class='nf'>{'inf' if f > 0 else '-inf'}</span>"
    return f"{f:.6g}"


def evidence_html(evidence: dict[str, Any]) -> str:
    """Module path and the whole stack (innermost first), each frame with its source line."""
    from precnb.analysis.evidence import parse_frame

    e = html.escape
    path = list(reversed(evidence.get("module_path") or []))
    if evidence.get("node"):
        path.append(evidence["node"])
    out = [f"<div><b>module path</b>: {e(' › '.join(path) or '—')}</div>"]
    frames = [parse_frame(f) for f in evidence.get("stack") or []]
    if not frames:
        out.append("<div><b>stack</b>: not recorded</div>")
        return "".join(out)
    items = []
    for f in frames:
        loc = (f"{f['file']}:{f['line']} in {f['func']}" if f["file"] else "")
        items.append(f"<li class='{'lib' if f['lib'] else 'user'}'><span class='loc'>{e(loc)}</span>"
                     f"<code>{e(f['code'])}</code></li>")
    user = sum(1 for f in frames if not f["lib"])
    out.append(f"<details open class='precnb-stack'><summary><b>stack</b> (innermost first; {len(frames)} "
               f"frame(s), {user} in your code)</summary><ul class='stack'>{''.join(items)}</ul></details>")
    return "".join(out)


def detail_html(frame: pd.DataFrame, evidence: dict[str, Any] | None = None, *,
                focus: str | None = None, title: str = "") -> str:
    """HTML for :func:`precnb.viz.detail_frame` plus evidence of the focused tensor."""
    e = html.escape
    out = [_CSS, "<div class='precnb-detail'>"]
    if title:
        out.append(f"<b>{e(title)}</b>")
    if not len(frame):
        out.append("<div><i>no records here</i></div></div>")
        return "".join(out)
    base = frame.attrs.get("baseline") or ""
    cols: list[str] = ["rel_diff"] if "rel_diff" in frame else []
    for s in [*_STATS, "nans", "zeros"]:
        if s in frame:
            cols.append(s)
        if base and f"{s}_{base}" in frame:
            cols.append(f"{s}_{base}")
    head = ["tensor", "role", "dtype", "shape", *cols]
    out.append("<table><tr>" + "".join(
        f"<th class='{'l' if h in ('tensor', 'role', 'dtype', 'shape') else ''}'>{e(h)}</th>"
        for h in head) + "</tr>")
    for row in frame.itertuples(index=False):
        r = row._asdict()
        cls = " class='focus'" if focus and r["tensor"] == focus else ""
        cells = [f"<td class='l'>{e(str(r['tensor']))}</td>", f"<td class='l'>{e(str(r['role']))}</td>",
                 f"<td class='l'>{e(str(r['dtype']).replace('torch.', ''))}</td>",
                 f"<td class='l'>{e(str(r['shape']))}</td>"]
        nulls = int(r.get("null_stats", 0) or 0)
        cells += [f"<td>{_num(r[c], bool(nulls & _NULL_BITS.get(c.split('_')[0], 0)))}</td>"
                  for c in cols]
        out.append(f"<tr{cls}>{''.join(cells)}</tr>")
    out.append("</table>")
    if evidence:
        out.append(evidence_html(evidence))
    out.append("</div>")
    return "".join(out)


class DetailPanel(ipw.VBox):
    """Shows the records of the selected (step, rank) and cell, the focused tensor highlighted."""

    def __init__(self) -> None:
        self.html = ipw.HTML("<i>select a heat-map cell</i>")
        self.frame = pd.DataFrame()
        self.evidence: dict[str, Any] = {}
        super().__init__([self.html], layout=ipw.Layout(max_height="460px", overflow="auto"))
        self.add_class("precnb-detail-panel")

    def show(self, frame: pd.DataFrame, evidence: dict[str, Any] | None, *, focus: str | None,
             title: str) -> None:
        """Render *frame* (from :func:`precnb.viz.detail_frame`) and *evidence*."""
        self.frame = frame
        self.evidence = evidence or {}
        self.html.value = detail_html(frame, evidence, focus=focus, title=title)
