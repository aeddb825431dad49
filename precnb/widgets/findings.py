"""Findings: the bar above the heat map (previous / next finding, suspects as links) and the Finding tab.

Both act on the explorer through its API only (:class:`precnb.widgets.panel.ExplorerAPI`).
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as ipw

from precnb.widgets.panel import ExplorerAPI, Panel

__all__ = ["FindingBar", "FindingPanel", "finding_html", "finding_title", "suspect_label", "why_html"]



def _v(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.6g}"
    if isinstance(x, dict):
        return ", ".join(f"{k}={_v(v)}" for k, v in x.items() if k not in ("present",))
    return str(x)


def finding_html(f: Any, *, suspects: bool = True) -> str:
    """HTML summary of a :class:`precnb.analysis.Finding` (reason, where, values, hints; suspects as text)."""
    e = html.escape
    color = ("#5d6675" if f.nothing_compared else "#2a7") if f.kind == "none" else "#b00"
    title, _, reason = f.headline.partition(": ")
    out = [f"<div class='precnb-finding'><b style='color:{color}'>{e(title)}</b>: {e(reason)}"]
    if f.kind != "none":
        rows = [("step", f.step), ("rank", f.rank), ("node", f.node), ("tensor", f.tensor),
                ("module", f.module)]
        out.append("<table style='font-size:12px'>" + "".join(
            f"<tr><td><b>{k}</b></td><td class='precnb-finding-{k}'><code>{e(str(v))}</code></td></tr>"
            for k, v in rows if v is not None) + "</table>")
        vals = [(k, v) for k, v in f.values.items() if isinstance(v, (dict, float, int))]
        if vals:
            out.append("<div style='font-size:12px'>" + "<br>".join(
                f"<b>{e(str(k))}</b>: {e(_v(v))}" for k, v in vals[:4]) + "</div>")
    for c in getattr(f, "causes", None) or []:
        out.append(f"<div class='precnb-finding-cause' style='font-size:12px'><b>cause"
                   f"{'' if c.get('certain') else '?'}</b>: {e(str(c.get('text', '')))}</div>")
    gap = getattr(f, "gap", None)
    if gap:
        clean = ", ".join(str(t.get("tensor")) for t in gap.get("last_clean") or []) or "-"
        out.append("<div class='precnb-finding-gap' style='font-size:12px'><b>coverage gap in "
                   f"{e(str(gap.get('module') or 'the model'))}</b>: {e(str(gap.get('missing', '')))}<br>"
                   f"<b>last clean</b>: <code>{e(clean)}</code> · <b>first bad</b>: "
                   f"<code>{e(str(gap['first_bad']['tensor']))}</code></div>")
    trend = (f.evidence or {}).get("trend") if isinstance(f.evidence, dict) else None
    if trend and trend.get("modules"):
        out.append("<div class='precnb-finding-trend' style='font-size:12px'><b>modules by lead time</b>: " + e(
            "; ".join(f"{m.get('module') or m['node']} ({m['stat']} {m['direction']} from step {m['onset_step']})"
                      for m in trend["modules"][:5])) + "</div>")
    if f.hints:
        out.append("<ul style='margin:2px 0'>" + "".join(f"<li>{e(h)}</li>" for h in f.hints[:5])
                   + "</ul>")
    plan = getattr(f, "dump_plan", None)
    if plan:
        out.append(f"<div class='precnb-finding-plan' style='font-size:12px'><b>next dump</b>: {e(plan['summary'])}"
                   " (<code>precnb plan</code> / <code>finding.plan()</code>)</div>")
    if suspects and f.suspects[1:]:
        out.append("<div style='font-size:12px'><b>other suspects</b>: " + "; ".join(
            e(f"step {s.get('step')} rank {s.get('rank')} {s.get('node') or s.get('tensor')}"
              f" ({s.get('why', '')})") for s in f.suspects[1:5]) + "</div>")
    if f.structural:
        out.append(f"<div style='font-size:12px'><b>structural</b>: {len(f.structural)} node(s) "
                   "in one run only, e.g. " + e(", ".join(
                       f"{s['node']} (only in {s['only_in']})" for s in f.structural[:3])) + "</div>")
    assumed = getattr(f, "assumptions", None) or []  # the triage's, the same for every finding
    if assumed:
        out.append("<div class='precnb-finding-assumed' style='font-size:12px'><b>assumed</b>: <ul style='margin:0'>"
                   + "".join(f"<li data-kind='{e(str(a.get('kind')))}'>{e(str(a.get('text') or a.get('kind')))}</li>"
                             for a in assumed) + "</ul></div>")
    out.append("</div>")
    return "".join(out)


def _error(err: Exception) -> str:
    # the write rules' refusal names the command-line flag; in a panel the switch is the "replace" box
    text = str(err).replace("(pass --overwrite to replace it)", "(tick the replace box to replace it)")
    return f"<span style='color:#b00'>{html.escape(type(err).__name__)}: {html.escape(text)}</span>"


def finding_title(f: Any, index: int | None = None, total: int | None = None) -> str:
    """``"First divergence (1 of 2): Functional.gelu.0.forward at step 1, rank 0 · blocks.0.mlp"``.

    A merged record's where adds the rank as dumped behind it (``evidence["dump"]``), e.g. the departing copy's.
    """
    n = f" ({index + 1} of {total})" if index is not None and total else ""
    if not f.found:
        title, _, reason = f.headline.partition(": ")
        return f"{title}{n}: {reason}"
    where = f" at step {f.step}, rank {f.rank}" if f.step is not None else ""
    dump = (f.evidence or {}).get("dump") if isinstance(f.evidence, dict) else None
    if where and isinstance(dump, dict) and dump.get("rank") is not None and dump["rank"] != f.rank:
        where += f" (dump rank {dump['rank']})"  # a merged record: the rank as dumped behind it
    mod = f" · {f.module}" if f.module else ""
    return f"{f.title}{n}: {f.node or f.tensor or ''}{where}{mod}"


def why_html(f: Any) -> str:
    """The finding's why under its title: its causes, else its reason (:func:`precnb.analysis.findings.why_lines`)."""
    from precnb.analysis.findings import why_lines

    lines = why_lines(f) if f is not None else []
    if not lines:
        return ""
    return ("<div style='font-size:13px; line-height:1.35; margin:0 0 2px 72px; white-space:normal'>"
            + "<br>".join(html.escape(t) for t in lines) + "</div>")


def suspect_label(s: dict[str, Any]) -> str:
    """Button text of a suspect: ``"step 1 · rank 0 · Distributed.all_reduce.0.forward (inherited …)"``."""
    return f"step {s.get('step')} · rank {s.get('rank')} · {s.get('node') or s.get('tensor')} ({s.get('why', '')})"


def _colour(f: Any) -> str:
    """Red for a finding, amber for a clean result that warns (a pre-flight warning), green otherwise."""
    if f is None:
        return "#2a7"
    if f.found:
        return "#b00"
    return "#b76e00" if isinstance(f.stats, dict) and f.stats.get("status") == "warn" else "#2a7"


def _located(f: Any) -> bool:
    return bool(f is not None and f.found and f.step is not None and f.rank is not None)


class FindingBar(ipw.VBox):
    """The finding shown now, ◀ / ▶ through the triage's findings, and its suspects as links."""

    max_suspects = 5

    def __init__(self, api: ExplorerAPI) -> None:
        self.api = api
        self.index = 0
        self.previous = ipw.Button(description="", icon="chevron-left", tooltip="previous finding (p)",
                                   layout=ipw.Layout(width="34px"))
        self.next = ipw.Button(description="", icon="chevron-right", tooltip="next finding (n)",
                               layout=ipw.Layout(width="34px"))
        self.label = ipw.HTML("")
        self.label.add_class("precnb-finding-title")
        self.why = ipw.HTML("")  # why: the finding's cause (or reason), as the text summary says it
        self.why.add_class("precnb-finding-why")
        self.suspects = ipw.HBox([], layout=ipw.Layout(flex_flow="row wrap"))
        self.suspects.add_class("precnb-suspects")
        self.previous.on_click(lambda _b: self.step(-1))
        self.next.on_click(lambda _b: self.step(1))
        super().__init__([ipw.HBox([self.previous, self.next, self.label]), self.why, self.suspects])
        self.add_class("precnb-finding-bar")

    def found(self) -> list[Any]:
        """The findings that can be shown (found ones, most important first)."""
        return [f for f in self.api.findings() if f.found]

    def step(self, delta: int) -> Any:
        """Show the next (*delta* = 1) or previous (-1) finding; returns it (None when there is none)."""
        found = self.found()
        if not found:
            return None
        cur = self.api.current_finding
        here = next((i for i, f in enumerate(found) if f is cur), self.index)
        self.index = (here + delta) % len(found)
        f = found[self.index]
        self.api.show_finding(f)
        return f

    def update(self) -> None:
        """Say which finding is shown; list its suspects as buttons."""
        found = self.found()
        cur = self.api.current_finding
        self.index = next((i for i, f in enumerate(found) if f is cur), self.index)
        many = len(found) > 1
        self.previous.disabled = self.next.disabled = not many
        if cur is None:
            t = self.api.triage
            f0 = t.finding if t is not None else None
            text = html.escape(finding_title(f0)) if f0 is not None else "no diagnosis run"
            self.label.value = f"<span style='color:{_colour(f0)}'>{text}</span>"
            self.why.value = why_html(f0)
            self.suspects.children = []
            return
        color = _colour(cur)
        idx = found.index(cur) if cur in found else None
        self.label.value = (f"<b style='color:{color}'>{html.escape(finding_title(cur, idx, len(found)))}</b>")
        self.why.value = why_html(cur)
        buttons = []
        for s in [s for s in cur.suspects[1:] if s.get("step") is not None][: self.max_suspects]:
            b = ipw.Button(description=suspect_label(s), tooltip=suspect_label(s),  # the whole text, wrapped (CSS)
                           layout=ipw.Layout(width="auto", max_width="100%", height="auto"))
            b.add_class("precnb-suspect")
            b.on_click(lambda _b, s=s: self.go(s))
            buttons.append(b)
        head = [ipw.HTML("<span style='font-size:12px'><b>suspects</b>:</span>")] if buttons else []
        self.suspects.children = [*head, *buttons]

    def go(self, suspect: dict[str, Any]) -> None:
        """Select a suspect's record."""
        cur = self.api.current_finding
        from precnb.analysis.registry import lookup

        d = lookup(cur.kind) if cur is not None else None
        unmerged = bool(d is not None and d.explorer.unmerged and self.api.data.raw() is not None)
        ds = self.api.data.raw() if unmerged else self.api.data.target()
        if ds is None:
            return
        tensor = suspect.get("tensor")
        if not tensor or tensor not in ds.indexes["tensor"]:
            node = suspect.get("node")
            cands = [str(t) for t, n in zip(ds["tensor"].values, ds["node"].values, strict=True) if n == node]
            tensor = next((t for t in cands if ".output" in t), cands[0] if cands else None)
        if tensor is None:
            return
        self.api.select_record(int(suspect["step"]), int(suspect["rank"]), str(tensor), unmerged=unmerged)


class FindingPanel(Panel):
    """The tab with the current finding in full (reason, values, hints) and every finding as a link."""

    title = "Finding"
    lazy = True

    def build(self) -> None:
        """The finding's text and the list of findings."""
        self.output = ipw.HTML("")
        self.output.add_class("precnb-finding-output")
        self.list = ipw.VBox([])
        self.list.add_class("precnb-findings-list")
        self.children = [self.output, self.list]
        self.refresh()

    def refresh(self) -> None:
        """List the triage's findings (found ones as links) and show the current one."""
        t = self.api.triage
        items: list[ipw.Widget] = []
        for f in (t.findings if t is not None else []):
            if _located(f):
                b = ipw.Button(description=finding_title(f), layout=ipw.Layout(width="auto", max_width="720px"))
                b.on_click(lambda _b, f=f: self.api.show_finding(f))
                items.append(b)
            else:
                title, _, reason = f.headline.partition(": ")
                items.append(ipw.HTML(f"<span style='font-size:12px'><b>{html.escape(title)}</b>: "
                                      f"{html.escape(reason)}</span>"))
        self.list.children = items
        self.on_select()

    def on_select(self) -> None:
        """Show the current finding (or the triage's first when none is shown)."""
        t = self.api.triage
        f = self.api.current_finding or (t.finding if t is not None else None)
        self.output.value = finding_html(f) if f is not None else "<i>no diagnosis run (auto=False)</i>"
