"""The detail table: the selected records' values, dtype/shape, module path and stack frames."""

from __future__ import annotations

import html
import math
from typing import Any

import ipywidgets as ipw
import pandas as pd

__all__ = ["DetailPanel", "detail_html", "evidence_html"]

_CSS = """<style>
.precnb-detail{min-width:0;max-width:100%;line-height:1.3}
.precnb-detail table{border-collapse:collapse;font-size:11px;font-family:var(--jp-code-font-family,monospace);
width:100%;max-width:100%}
.precnb-detail th,.precnb-detail td{padding:1px 4px;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap;
vertical-align:middle}
.precnb-detail th{vertical-align:bottom}
.precnb-detail td.l,.precnb-detail th.l{text-align:left}
.precnb-detail tr.focus td{background:#fff3c4;font-weight:600}
.precnb-detail .nf{color:#c00;font-weight:600}
.precnb-detail .null{color:#999}
.precnb-detail td.l.t{white-space:normal;overflow-wrap:anywhere;line-height:1.25}
.precnb-detail td.l.t .m{display:block;color:#777;font-size:10px;font-weight:400;line-height:1.1}
.precnb-detail td{line-height:1.25}
.precnb-detail td .b{display:block;color:#777;font-size:11px}
.precnb-detail td .b.d{color:#b35900}
.precnb-detail .note{font-size:11px;color:#666;margin:2px 0}
.precnb-detail .path{font-size:11px;line-height:1.3;margin:2px 0;overflow-wrap:anywhere}
.precnb-detail details.precnb-stack summary{font-size:12px;line-height:1.3}
.precnb-detail .stack{font-size:11px;color:#333;margin:2px 0 0 0;padding-left:0;list-style:none}
.precnb-detail .stack li{margin:0 0 3px 0;overflow-wrap:anywhere}
.precnb-detail .stack .loc{color:#555}
.precnb-detail .stack code{display:block;white-space:pre-wrap;overflow-wrap:anywhere;margin-left:14px;color:#000}
.precnb-detail .stack li.lib{color:#999}
.precnb-detail .stack li.lib code{color:#888}
</style>"""

_STATS = ("max", "min", "mean", "norm")
_NULL_BITS = {"max": 1, "min": 2, "mean": 4, "norm": 8}


_MERGED_NULL = ("<span class='null' title='a partial sum across shards: only its mean can be merged from the "
                "shard statistics'>Σ</span>")


def _num(v: Any, null: bool = False, merged: bool = False) -> str:
    if null and merged:
        return _MERGED_NULL
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
    short = f"{f:.4g}"
    return short if short == f"{f:.6g}" else f"<span title='{f:.9g}'>{short}</span>"


def evidence_html(evidence: dict[str, Any]) -> str:
    """Module path and the whole stack (innermost first), each frame with its source line."""
    from precnb.analysis.findings.evidence import parse_frame

    e = html.escape
    path = list(reversed(evidence.get("module_path") or []))
    if evidence.get("node"):
        path.append(evidence["node"])
    out = [f"<div class='path'><b>module path</b>: {e(' › '.join(path) or '—')}</div>"]
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


def _bit(col: str) -> int:
    return _NULL_BITS.get(col.split("_")[0], 0)


def detail_html(frame: pd.DataFrame, evidence: dict[str, Any] | None = None, *,
                focus: str | None = None, title: str = "") -> str:
    """HTML for :func:`precnb.viz.detail_frame` plus evidence of the focused tensor.

    Two runs: one column per statistic, the target's value over the baseline's (orange where they
    differ), so the table fits the notebook; each run's nulls are its own.
    """
    e = html.escape
    out = [_CSS, "<div class='precnb-detail'>"]
    if title:
        out.append(f"<b>{e(title)}</b>")
    if not len(frame):
        out.append("<div><i>no records here</i></div></div>")
        return "".join(out)
    base = frame.attrs.get("baseline") or ""
    stats = [s for s in (*_STATS, "nans", "zeros") if s in frame]
    paired = [s for s in stats if base and f"{s}_{base}" in frame]
    lead = ["rel_diff"] if "rel_diff" in frame else []
    labels = {s: (f"{s}<br><span class='b'>{e(base)}</span>" if s in paired else e(s)) for s in stats}
    head = ["tensor <span class='b'>role · dtype · shape</span>"]
    out.append("<table><tr>" + "".join(f"<th class='l'>{h}</th>" for h in head)
               + "".join(f"<th>{e(h)}</th>" for h in lead) + "".join(f"<th>{labels[s]}</th>" for s in stats)
               + "</tr>")
    any_merged_null = False
    for r in frame.to_dict("records"):  # (not itertuples: a run named "dump (baseline)" is no identifier)
        cls = " class='focus'" if focus and r["tensor"] == focus else ""
        # role, dtype and shape under the label: the table fits a 552 px column (issue 51: JupyterLab at 1000 px
        # with its file browser open)
        cells = [f"<td class='l t'>{e(str(r['tensor']))}<span class='m'>{e(str(r['role']))} · "
                 f"{e(str(r['dtype']).replace('torch.', ''))} · {e(str(r['shape']))}</span></td>"]
        nulls = int(r.get("null_stats", 0) or 0)
        bnulls = int(r.get(f"null_stats_{base}", 0) or 0) if base else 0
        merged = str(r.get("merged", "") or "") == "partial_sum"
        cells += [f"<td>{_num(r[c])}</td>" for c in lead]
        for s in stats:
            mine = _num(r[s], bool(nulls & _bit(s)), merged)
            any_merged_null |= merged and bool(nulls & _bit(s))
            if s in paired:
                theirs = _num(r[f"{s}_{base}"], bool(bnulls & _bit(s)))
                differ = " d" if theirs != mine else ""
                mine += f"<span class='b{differ}'>{theirs}</span>"
            cells.append(f"<td>{mine}</td>")
        out.append(f"<tr{cls}>{''.join(cells)}</tr>")
    out.append("</table>")
    total, first = frame.attrs.get("rows_total"), int(frame.attrs.get("first_row", 0) or 0)
    if total and total > len(frame):
        out.append(f"<div class='note'>records {first + 1}–{first + len(frame)} of {total} at this step and rank, in "
                   "execution order, around the selected one</div>")
    if any_merged_null:
        out.append(f"<div class='note'>{_MERGED_NULL}: a partial sum across shards (each rank holds an addend): "
                   "its max, min and norm cannot be derived from the shard statistics, only its mean</div>")
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
        # no scroll box of its own (issue 51: a table scrolled inside it lost its header under the chart's
        # legend, and the stack was below its fold): the table fits the column, the page scrolls
        super().__init__([self.html], layout=ipw.Layout(width="100%", min_width="0"))
        self.add_class("precnb-detail-panel")

    def show(self, frame: pd.DataFrame, evidence: dict[str, Any] | None, *, focus: str | None,
             title: str) -> None:
        """Render *frame* (from :func:`precnb.viz.detail_frame`) and *evidence*."""
        self.frame = frame
        self.evidence = evidence or {}
        self.html.value = detail_html(frame, evidence, focus=focus, title=title)
