"""Diagnosis panels: first divergence and NaN origin; each moves the explorer to its finding."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as ipw

__all__ = ["DivergencePanel", "NanOriginPanel", "finding_html"]



def _v(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.6g}"
    if isinstance(x, dict):
        return ", ".join(f"{k}={_v(v)}" for k, v in x.items() if k not in ("present",))
    return str(x)


def finding_html(f: Any) -> str:
    """HTML summary of a :class:`precnb.analysis.Finding` (reason, where, values, hints)."""
    from precnb.analysis.registry import title

    e = html.escape
    color = "#2a7" if f.kind == "none" else "#b00"
    out = [f"<div class='precnb-finding'><b style='color:{color}'>{e(title(f.kind))}"
           f"</b>: {e(f.reason)}"]
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
    if f.suspects[1:]:
        out.append("<div style='font-size:12px'><b>other suspects</b>: " + "; ".join(
            e(f"step {s.get('step')} rank {s.get('rank')} {s.get('node') or s.get('tensor')}"
              f" ({s.get('why', '')})") for s in f.suspects[1:5]) + "</div>")
    if f.structural:
        out.append(f"<div style='font-size:12px'><b>structural</b>: {len(f.structural)} node(s) "
                   "in one run only, e.g. " + e(", ".join(
                       f"{s['node']} (only in {s['only_in']})" for s in f.structural[:3])) + "</div>")
    out.append("</div>")
    return "".join(out)


def _error(err: Exception) -> str:
    return f"<span style='color:#b00'>{html.escape(type(err).__name__)}: {html.escape(str(err))}</span>"


class DivergencePanel(ipw.VBox):
    """Baseline / target pick, tolerance, "Find first divergence"; moves the explorer there."""

    def __init__(self, explorer: Any) -> None:
        self.explorer = explorer
        names = explorer.runs.names
        self.finding: Any = None
        self.baseline = ipw.Dropdown(description="baseline", options=names or ["—"],
                                   value=explorer.runs.baseline or (names[0] if names else "—"),
                                   layout=ipw.Layout(width="220px"))
        self.target = ipw.Dropdown(description="target", options=names or ["—"],
                                 value=explorer.runs.target or (names[-1] if names else "—"),
                                 layout=ipw.Layout(width="220px"))
        self.tolerance = ipw.Text(value="", placeholder="by dtype", description="rtol",
                                layout=ipw.Layout(width="180px"))
        self.button = ipw.Button(description="Find first divergence", button_style="primary",
                               icon="search", layout=ipw.Layout(width="200px"),
                               disabled=len(names) < 2)
        self.output = ipw.HTML("" if len(names) > 1 else
                             "<i>needs two runs: explore({'gpu': a, 'npu': b}) or baseline=…</i>")
        self.output.add_class("precnb-divergence-output")
        self.button.on_click(lambda _b: self.run())
        super().__init__([ipw.HBox([self.baseline, self.target, self.tolerance, self.button]),
                          self.output])

    def tolerance_value(self) -> Any:
        """The :class:`~precnb.analysis.Tolerance` from the box (blank: dtype defaults)."""
        from precnb.analysis import Tolerance

        text = self.tolerance.value.strip()
        return Tolerance(rtol=float(text)) if text else Tolerance()

    def run(self) -> Any:
        """Search (through the pipeline), show and move the explorer to the finding; returns it (or None)."""
        from precnb.pipeline import diagnose

        b, t = self.baseline.value, self.target.value
        if b == t:
            self.output.value = _error(ValueError("baseline and target are the same run"))
            return None
        self.output.value = "<i>searching…</i>"
        runs = self.explorer.runs
        triage = getattr(self.explorer, "triage", None)
        offset = triage.step_offset if triage is not None and triage.paired else None
        try:
            f = diagnose(runs.run(t), runs.run(b), kinds=["first_divergence"], tolerance=self.tolerance_value(),
                         step_offset=offset).finding
        except Exception as err:
            self.output.value = _error(err)
            return None
        self.show(f)
        if f.found:
            self.explorer.show_finding(f, color="reldiff", target=t, baseline=b)
        return f

    def show(self, f: Any) -> None:
        """Display a finding without moving."""
        self.finding = f
        self.output.value = finding_html(f)


class NanOriginPanel(ipw.VBox):
    """Run pick and "Find NaN origin"; moves the explorer to the first NaN / new inf."""

    def __init__(self, explorer: Any) -> None:
        self.explorer = explorer
        names = explorer.runs.names
        self.finding: Any = None
        self.run_pick = ipw.Dropdown(description="run", options=names or ["—"],
                                   value=explorer.runs.target or (names[-1] if names else "—"),
                                   layout=ipw.Layout(width="220px",
                                                   display=None if names else "none"))
        self.button = ipw.Button(description="Find NaN origin", button_style="danger", icon="search",
                               layout=ipw.Layout(width="180px"))
        self.output = ipw.HTML("")
        self.output.add_class("precnb-nan-output")
        self.button.on_click(lambda _b: self.run())
        super().__init__([ipw.HBox([self.run_pick, self.button]), self.output])

    def run(self) -> Any:
        """Search (through the pipeline), show and move the explorer to the finding; returns it (or None)."""
        from precnb.pipeline import diagnose

        run = self.run_pick.value if self.explorer.runs.names else None
        self.output.value = "<i>searching…</i>"
        try:
            f = diagnose(self.explorer.runs.run(run), kinds=["nan_origin"]).finding
        except Exception as err:
            self.output.value = _error(err)
            return None
        self.show(f)
        if f.found:
            self.explorer.show_finding(f, color="events", target=run)
        return f

    def show(self, f: Any) -> None:
        """Display a finding without moving."""
        self.finding = f
        self.output.value = finding_html(f)
