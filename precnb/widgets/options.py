"""The Triage tab: every option of the pipeline, and "Rerun" through :func:`precnb.diagnose`.

Baseline and target (two of the runs), their parallel layouts, the step offset ("auto", a
number, or blank for the default), the tolerance (a relative tolerance, or blank for the dtype
defaults) and a mapping file. Rerunning replaces the explorer's runs and findings; the notes say
what the pipeline did (shards merged, names aligned, offset detected).
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as ipw

from precnb.widgets.findings import _error
from precnb.widgets.panel import Panel

__all__ = ["TriagePanel", "parse_options"]


def _text(description: str, value: str, placeholder: str, width: str = "380px") -> ipw.Text:
    return ipw.Text(value=value, placeholder=placeholder, description=description,
                    layout=ipw.Layout(width=width), style={"description_width": "110px"})


def _shown(v: Any) -> str:
    if v is None:
        return ""
    describe = getattr(v, "describe", None)
    if callable(describe) and not isinstance(v, (str, int, float)):
        try:
            return str(describe())
        except TypeError:
            pass
    return str(v)


def parse_options(*, target_layout: str, baseline_layout: str, step_offset: str, tolerance: str,
                  mapping: str) -> dict[str, Any]:
    """The text boxes as :func:`precnb.diagnose` options (blank: the option's default).

    Examples
    --------
    >>> parse_options(target_layout="tp=2", baseline_layout="", step_offset="auto", tolerance="1e-3",
    ...               mapping="")
    {'target_layout': 'tp=2', 'baseline_layout': None, 'step_offset': 'auto', 'tolerance': 0.001, 'mapping': None}

    Raises
    ------
    ValueError
        For a step offset or tolerance that is not a number.
    """
    off = step_offset.strip()
    if off and off != "auto":
        try:
            off_v: Any = int(off)
        except ValueError:
            raise ValueError(f"step offset {off!r} is not 'auto' or a whole number") from None
    else:
        off_v = off or None
    tol = tolerance.strip()
    try:
        tol_v = float(tol) if tol else None
    except ValueError:
        raise ValueError(f"tolerance {tol!r} is not a number (a relative tolerance such as 1e-3)") from None
    return {"target_layout": target_layout.strip() or None, "baseline_layout": baseline_layout.strip() or None,
            "step_offset": off_v, "tolerance": tol_v, "mapping": mapping.strip() or None}


class TriagePanel(Panel):
    """Options of the triage and a button that reruns it."""

    title = "Triage options"
    lazy = True

    def build(self) -> None:
        """The option boxes and the Rerun button, showing the triage's options."""
        api = self.api
        names = list(api.sources())
        self.baseline = ipw.Dropdown(description="baseline", options=["(none)", *names], value="(none)",
                                     layout=ipw.Layout(width="230px"), style={"description_width": "110px"})
        self.target = ipw.Dropdown(description="target", options=names or ["—"], value=names[-1] if names else "—",
                                   layout=ipw.Layout(width="230px"), style={"description_width": "110px"})
        self.target_layout = _text("target layout", "", "e.g. tp=2 (blank: none)")
        self.baseline_layout = _text("baseline layout", "", "e.g. tp=1,pp=2")
        self.step_offset = _text("step offset", "", "auto / number (blank: 0 or auto)")
        self.tolerance = _text("tolerance", "", "rtol, e.g. 1e-3 (blank: by dtype)")
        self.mapping = _text("mapping file", "", "precnb or msprobe mapping", "420px")
        self.button = ipw.Button(description="Rerun triage", icon="refresh", button_style="primary",
                                 layout=ipw.Layout(width="160px"))
        self.output = ipw.HTML("")
        self.output.add_class("precnb-triage-output")
        self.button.on_click(lambda _b: self.run())
        self.children = [ipw.HBox([self.baseline, self.target, self.button]),
                         ipw.HBox([self.target_layout, self.baseline_layout]),
                         ipw.HBox([self.step_offset, self.tolerance]), self.mapping, self.output]
        self.add_class("precnb-triage-panel")
        self.refresh()

    def refresh(self) -> None:
        """Show the options and notes of the explorer's triage."""
        t = self.api.triage
        names = list(self.api.sources())
        self.target.options = names or ["—"]
        self.baseline.options = ["(none)", *names]
        if t is None:
            return
        o = t.options
        b, tg = (str(x) for x in t.names)
        if tg in names:
            self.target.value = tg
        self.baseline.value = b if b in names else "(none)"
        self.target_layout.value = _shown(o.target_layout)
        self.baseline_layout.value = _shown(o.baseline_layout)
        self.step_offset.value = "" if o.step_offset is None else str(o.step_offset)
        tol = o.tolerance
        self.tolerance.value = "" if tol is None else (str(tol) if isinstance(tol, (int, float)) else
                                                       str(getattr(tol, "rtol", "") or ""))
        self.mapping.value = o.mapping if isinstance(o.mapping, str) else ("(set in the Alignment tab)"
                                                                           if o.mapping else "")
        notes = list(t.notes)
        if t.step_offset:
            notes.append(f"step offset {t.step_offset} (target step = baseline step + {t.step_offset})")
        self.output.value = ("<div style='font-size:12px'>" + "<br>".join(html.escape(n) for n in notes)
                             + "</div>") if notes else ""

    def options(self) -> dict[str, Any]:
        """The options the boxes say (see :func:`parse_options`)."""
        mapping = self.mapping.value
        if mapping == "(set in the Alignment tab)":
            t = self.api.triage
            opts = parse_options(target_layout=self.target_layout.value, baseline_layout=self.baseline_layout.value,
                                 step_offset=self.step_offset.value, tolerance=self.tolerance.value, mapping="")
            opts["mapping"] = t.options.mapping if t is not None else None
            return opts
        return parse_options(target_layout=self.target_layout.value, baseline_layout=self.baseline_layout.value,
                             step_offset=self.step_offset.value, tolerance=self.tolerance.value, mapping=mapping)

    def run(self) -> Any:
        """Rerun the triage with the options shown; returns the new triage (None on a bad option)."""
        try:
            opts = self.options()
        except ValueError as err:
            self.output.value = _error(err)
            return None
        base = self.baseline.value
        if base != "(none)" and base == self.target.value:
            self.output.value = _error(ValueError("baseline and target are the same run"))
            return None
        if base == "(none)" and opts.get("baseline_layout"):
            self.output.value = _error(ValueError("a baseline layout needs a baseline"))
            return None
        self.output.value = "<i>running the triage…</i>"
        try:
            return self.api.rerun(target=self.target.value, baseline=None if base == "(none)" else base, **opts)
        except Exception as err:  # shown in the panel: the explorer keeps its current runs
            self.output.value = _error(err)
            return None
