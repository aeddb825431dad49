"""The filter bar: which steps, ranks and tensors the heat map shows, and how it is coloured."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ipywidgets as ipw
import numpy as np
import xarray as xr

from precnb.widgets._inputs import parse_ranks

__all__ = ["FilterPanel"]

_COLOR_OPTIONS = [("statistic", "stat"), ("rel. diff vs baseline", "reldiff"),
                  ("non-finite count", "nonfinite"), ("NaN / new inf", "events")]


def _dd(description: str, options: Any, value: Any, width: str = "150px") -> ipw.Dropdown:
    return ipw.Dropdown(description=description, options=options, value=value,
                      layout=ipw.Layout(width=width), style={"description_width": "initial"})


class FilterPanel(ipw.VBox):
    """Step range, ranks, tensor/module regex, direction, role, statistic, colour, non-finite only.

    Parameters
    ----------
    ds : xarray.Dataset
        One run (the explorer's target run); sets the ranges and choices.
    runs : list of str
        Run names when comparing (enables the run picker and the rel. diff colour).
    on_change : callable
        Called with no arguments after any user change (not inside :meth:`quiet`).
    """

    def __init__(self, ds: xr.Dataset, runs: list[str], on_change: Callable[[], None]) -> None:
        self._on_change = on_change
        self._muted = 0
        steps = [int(s) for s in ds["step"].values] or [0]
        self.available_ranks = [int(r) for r in ds["rank"].values]
        stats = [s for s in ("norm", "max", "min", "mean") if s in ds] + sorted(
            n for n, v in ds.data_vars.items() if v.dtype.kind == "f" and n not in
            ("norm", "max", "min", "mean"))
        colors = [c for c in _COLOR_OPTIONS if c[1] != "reldiff" or len(runs) > 1]
        self.steps = ipw.IntRangeSlider(value=(min(steps), max(steps)), min=min(steps),
                                      max=max(steps), description="steps", continuous_update=False,
                                      layout=ipw.Layout(width="260px"))
        self.ranks = ipw.Text(value="", placeholder=f"all {len(self.available_ranks)} (e.g. 0-7,12)",
                            description="ranks", continuous_update=False,
                            layout=ipw.Layout(width="180px"))
        self.pattern = ipw.Text(value="", placeholder="regex on tensor / module",
                              description="match", continuous_update=False,
                              layout=ipw.Layout(width="230px"))
        self.direction = _dd("direction", ["all", "forward", "backward", "optimizer"], "all", "150px")
        self.role = _dd("role", ["all", "input", "output", "parameter", "grad", "state"], "all", "120px")
        self.rows = _dd("rows", ["module", "node", "tensor"], "module", "135px")
        self.by = _dd("x", ["step", "rank"], "step", "100px")
        self.color = _dd("colour", colors, "stat", "195px")
        self.stat = _dd("stat", stats, stats[0] if stats else "norm", "120px")
        self.run = _dd("run", runs or [""], runs[-1] if runs else "", "135px")
        self.run.layout.display = None if len(runs) > 1 else "none"
        self.nonfinite_only = ipw.Checkbox(value=False, description="non-finite only", indent=False,
                                         layout=ipw.Layout(width="130px"))
        self.top_k = ipw.BoundedIntText(value=40, min=5, max=200, description="top",
                                      layout=ipw.Layout(width="95px"),
                                      style={"description_width": "initial"})
        self.message = ipw.HTML("")
        for w in self._controls():
            w.observe(self._changed, names="value")
        wrap = ipw.Layout(flex_flow="row wrap")
        super().__init__([
            ipw.HBox([self.steps, self.ranks, self.pattern, self.nonfinite_only, self.top_k], layout=wrap),
            ipw.HBox([self.rows, self.by, self.color, self.stat, self.run, self.direction, self.role],
                     layout=ipw.Layout(flex_flow="row wrap")),
            self.message,
        ])
        self.add_class("precnb-filters")

    def _controls(self) -> list[ipw.ValueWidget]:
        return [self.steps, self.ranks, self.pattern, self.direction, self.role, self.rows,
                self.by, self.color, self.stat, self.run, self.nonfinite_only, self.top_k]

    def _changed(self, _change: dict[str, Any]) -> None:
        if not self._muted:
            self._on_change()

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Change several controls without calling ``on_change`` for each."""
        self._muted += 1
        try:
            yield
        finally:
            self._muted -= 1

    # -- reading ----------------------------------------------------------------------------
    def step_list(self, ds: xr.Dataset) -> list[int]:
        """Steps inside the slider range."""
        lo, hi = self.steps.value
        return [int(s) for s in ds["step"].values if lo <= int(s) <= hi]

    def rank_list(self) -> list[int] | None:
        """Ranks typed in the box (None: all); a bad entry is reported and ignored."""
        try:
            out = parse_ranks(self.ranks.value, self.available_ranks)
        except ValueError as err:
            self.message.value = f"<span style='color:#b00'>{err}</span>"
            return None
        self.message.value = ""
        return out

    def tensor_mask(self, ds: xr.Dataset, nonfinite: np.ndarray | None = None) -> np.ndarray:
        """Boolean mask over ``tensor`` from the regex, direction, role and non-finite boxes.

        *nonfinite* is the per-tensor "has a non-finite record" vector (for the checkbox).
        """
        keep = np.ones(ds.sizes["tensor"], bool)
        if self.pattern.value.strip():
            try:
                rx = re.compile(self.pattern.value.strip())
            except re.error as err:
                self.message.value = f"<span style='color:#b00'>bad regex: {err}</span>"
                return keep
            labels = ds["tensor"].values.astype(str)
            modules = ds["module"].values.astype(str)
            keep &= np.fromiter((bool(rx.search(t) or rx.search(m))
                                 for t, m in zip(labels, modules, strict=True)), bool, len(labels))
        for name, w in (("direction", self.direction), ("role", self.role)):
            if w.value != "all":
                keep &= ds[name].values.astype(str) == w.value
        if self.nonfinite_only.value and nonfinite is not None:
            keep &= nonfinite
        return keep

    def show(self, *, step: int | None = None, rank: int | None = None, color: str | None = None,
             tensor_visible: bool = True) -> None:
        """Make a finding visible: widen the step range / ranks, clear filters hiding it."""
        with self.quiet():
            lo, hi = self.steps.value
            if step is not None and not lo <= step <= hi:
                self.steps.value = (min(lo, step), max(hi, step))
            ranks = self.rank_list()
            if rank is not None and ranks is not None and rank not in ranks:
                self.ranks.value = ""
            if not tensor_visible:
                self.pattern.value = ""
                self.direction.value = "all"
                self.role.value = "all"
                self.nonfinite_only.value = False
            if color is not None and color in [v for _, v in self.color.options]:
                self.color.value = color
