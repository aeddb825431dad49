"""The filter bar: which steps, ranks and tensors the heat map shows, and how it is coloured."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ipywidgets as ipw
import numpy as np
import xarray as xr

from precnb.viz.values import METRICS, row_groups
from precnb.widgets._inputs import parse_ranks

__all__ = ["COLOR_OPTIONS", "FilterPanel"]

COLOR_OPTIONS = [("first bad (causal order)", "first_bad"), ("rel. diff vs baseline", "reldiff"),
                 ("statistic", "stat"), ("non-finite count", "nonfinite"), ("NaN / new inf count", "events")]


def _dd(description: str, options: Any, value: Any, width: str = "150px") -> ipw.Dropdown:
    return ipw.Dropdown(description=description, options=options, value=value,
                        layout=ipw.Layout(width=width), style={"description_width": "initial"})


def _stats(ds: xr.Dataset) -> list[str]:
    return [s for s in ("norm", "max", "min", "mean") if s in ds] + sorted(
        str(n) for n, v in ds.data_vars.items() if v.dtype.kind == "f" and n not in ("norm", "max", "min", "mean"))


class FilterPanel(ipw.VBox):
    """Search, step range, ranks, row groups, role, rows, x, colour, statistic, sort, run.

    Parameters
    ----------
    ds : xarray.Dataset
        One run (the explorer's target run); sets the ranges and choices.
    runs : list of str
        Run names when comparing (enables the run picker and the rel. diff colour).
    on_change : callable
        Called with no arguments after any user change (not inside :meth:`quiet`).
    tensor_metrics : bool
        The runs are a tensor-mode pair with :func:`precnb.tensor_metrics`: the "tensor metric"
        colour (and its metric choice) is offered.
    """

    def __init__(self, ds: xr.Dataset, runs: list[str], on_change: Callable[[], None], *,
                 tensor_metrics: bool = False) -> None:
        self._on_change = on_change
        self._muted = 0
        self.steps = ipw.IntRangeSlider(value=(0, 0), min=0, max=0, description="steps", continuous_update=False,
                                        layout=ipw.Layout(width="250px"))
        self.ranks = ipw.Text(value="", description="ranks", continuous_update=False,
                              layout=ipw.Layout(width="170px"))
        self.pattern = ipw.Text(value="", placeholder="module or node", description="search",
                                continuous_update=False, layout=ipw.Layout(width="260px"))
        self.pattern.add_class("precnb-search")
        self.regex = ipw.Checkbox(value=False, description="regex", indent=False, layout=ipw.Layout(width="62px"))
        # what the search matches (modules, then nodes, in execution order): choosing one selects it
        self.matches = ipw.Dropdown(description="go to", options=[("—", "")], value="",
                                    layout=ipw.Layout(width="300px", display="none"),
                                    style={"description_width": "initial"})
        self.matches.add_class("precnb-search-matches")
        self.show_groups = {g: ipw.Checkbox(value=g != "optimizer", description=g, indent=False,
                                            layout=ipw.Layout(width="88px"))
                            for g in ("forward", "backward", "optimizer")}
        self.role = _dd("role", ["all", "input", "output", "parameter", "grad", "state"], "all", "120px")
        self.rows = _dd("rows", ["module", "node", "tensor"], "module", "135px")
        self.by = _dd("x", ["step", "rank"], "step", "100px")
        self.color = _dd("colour", COLOR_OPTIONS, "first_bad", "230px")
        self.stat = _dd("stat", ["norm"], "norm", "120px")
        self.sort = _dd("sort", [("first occurrence", "first"), ("colour", "value")], "first", "180px")
        self.metric = _dd("metric", [(v, k) for k, v in METRICS.items()], "cosine", "230px")
        self.run = _dd("run", [""], "", "150px")
        self.nonfinite_only = ipw.Checkbox(value=False, description="non-finite only", indent=False,
                                           layout=ipw.Layout(width="125px"))
        self.top_k = ipw.BoundedIntText(value=40, min=5, max=400, description="top",
                                        layout=ipw.Layout(width="95px"), style={"description_width": "initial"})
        self.message = ipw.HTML("")
        self.reset(ds, runs, tensor_metrics=tensor_metrics)
        self.color.observe(self._show_metric, names="value")
        for w in self._controls():
            w.observe(self._changed, names="value")
        wrap = ipw.Layout(flex_flow="row wrap")
        super().__init__([
            ipw.HBox([self.pattern, self.regex, self.matches, self.steps, self.ranks, *self.show_groups.values()],
                     layout=wrap),
            ipw.HBox([self.color, self.metric, self.rows, self.by, self.stat, self.sort, self.run, self.role,
                      self.nonfinite_only, self.top_k], layout=wrap),
            self.message,
        ])
        self.add_class("precnb-filters")

    def reset(self, ds: xr.Dataset, runs: list[str], *, tensor_metrics: bool = False) -> None:
        """Take the ranges and choices of new runs (after a rerun), keeping what still applies."""
        with self.quiet():
            steps = [int(s) for s in ds["step"].values] or [0]
            self.available_ranks = [int(r) for r in ds["rank"].values]
            lo, hi = min(steps), max(steps)
            self.steps.min, self.steps.max = min(lo, self.steps.min), max(hi, self.steps.max)
            self.steps.value = (lo, hi)
            self.steps.min, self.steps.max = lo, hi
            # short enough for the box (issue 51: "all 8 (e.g. 0" was cut); the syntax is in its tooltip
            self.ranks.placeholder = f"all {len(self.available_ranks)}"
            self.ranks.tooltip = "ranks to show, e.g. 0-7,12 (blank: all)"
            if self.ranks.value.strip():
                try:
                    parse_ranks(self.ranks.value, self.available_ranks)
                except ValueError:
                    self.ranks.value = ""
            stats = _stats(ds) or ["norm"]
            self.stat.options = stats
            self.stat.value = self.stat.value if self.stat.value in stats else stats[0]
            colors = [c for c in COLOR_OPTIONS if c[1] != "reldiff" or len(runs) > 1]
            if tensor_metrics:
                colors.insert(2, ("tensor metric (whole tensors)", "tensor"))
            current = self.color.value
            self.color.options = colors
            self.color.value = current if current in [v for _, v in colors] else "first_bad"
            self.run.options = runs or [""]
            self.run.value = runs[-1] if runs else ""
            self.run.layout.display = None if len(runs) > 1 else "none"
            self._show_metric()

    def _show_metric(self, _change: Any = None) -> None:
        self.metric.layout.display = None if self.color.value == "tensor" else "none"

    def _controls(self) -> list[ipw.ValueWidget]:
        return [self.steps, self.ranks, self.pattern, self.regex, *self.show_groups.values(), self.role, self.rows,
                self.by, self.color, self.metric, self.stat, self.sort, self.run, self.nonfinite_only, self.top_k]

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

    def groups(self) -> list[str]:
        """Row groups shown."""
        return [g for g, w in self.show_groups.items() if w.value]

    def matcher(self) -> Callable[[str], bool] | None:
        """The search as a predicate on a name (None: no search; a bad regex is reported and ignored)."""
        text = self.pattern.value.strip()
        if not text:
            return None
        if self.regex.value:
            try:
                rx = re.compile(text)
            except re.error as err:
                self.message.value = f"<span style='color:#b00'>bad regex: {err}</span>"
                return None
            return lambda s: bool(rx.search(s))
        low = text.lower()
        return lambda s: low in s.lower()

    def list_matches(self, ds: xr.Dataset, limit: int = 40) -> list[tuple[str, str]]:
        """Modules, then nodes, whose name matches the search, in execution order: ``(label, "kind:name")``.

        Fills the "go to" list (hidden when the search is empty).
        """
        match = self.matcher()
        if match is None:
            with self.quiet():
                self.matches.options, self.matches.value = [("—", "")], ""
            self.matches.layout.display = "none"
            return []
        seq = np.asarray(ds["seq"].values)
        first = np.where(seq >= 0, seq, np.iinfo(np.int32).max).min(axis=(0, 1)) if seq.size else np.zeros(0)
        seen: dict[str, float] = {}
        for kind, names in (("module", ds["module"].values.astype(str)), ("node", ds["node"].values.astype(str))):
            for name, f in zip(names, np.asarray(first).ravel(), strict=False):
                key = f"{kind}:{name}"
                if name and match(name) and f < seen.get(key, np.inf):
                    seen[key] = float(f)
        keys = sorted(seen, key=lambda k: (not k.startswith("module:"), seen[k], k))[:limit]
        out = [(f"{k.split(':', 1)[0]} {k.split(':', 1)[1]}", k) for k in keys]
        with self.quiet():
            self.matches.options = [(f"{len(seen)} match(es)" if out else "no match", ""), *out]
            self.matches.value = ""
        self.matches.layout.display = None
        return out

    def tensor_mask(self, ds: xr.Dataset, nonfinite: np.ndarray | None = None, *,
                    groups: np.ndarray | None = None) -> np.ndarray:
        """Boolean mask over ``tensor`` from the search, row groups, role and non-finite boxes.

        *nonfinite* is the per-tensor "has a non-finite record" vector (for the checkbox); *groups* each
        tensor's row group (:func:`precnb.viz.values.row_groups` of *ds*, computed when not given).
        """
        keep = np.isin(row_groups(ds) if groups is None else groups, self.groups())
        match = self.matcher()
        if match is not None:
            nodes = ds["node"].values.astype(str)
            modules = ds["module"].values.astype(str)
            labels = ds["tensor"].values.astype(str)
            keep &= np.fromiter((match(n) or match(m) or match(t) for n, m, t in zip(nodes, modules, labels,
                                                                                       strict=True)),
                                bool, len(labels))
        if self.role.value != "all":
            keep &= ds["role"].values.astype(str) == self.role.value
        if self.nonfinite_only.value and nonfinite is not None:
            keep &= nonfinite
        return keep

    def show(self, *, step: int | None = None, rank: int | None = None, color: str | None = None,
             group: str | None = None, tensor_visible: bool = True) -> None:
        """Make a record visible: widen the step range / ranks, show its group, clear filters hiding it."""
        with self.quiet():
            lo, hi = self.steps.value
            if step is not None and not lo <= step <= hi:
                self.steps.value = (min(lo, step), max(hi, step))
            ranks = self.rank_list()
            if rank is not None and ranks is not None and rank not in ranks:
                self.ranks.value = ""
            if group is not None and group in self.show_groups:
                self.show_groups[group].value = True
            if not tensor_visible:
                self.pattern.value = ""
                self.role.value = "all"
                self.nonfinite_only.value = False
            if color is not None and color in [v for _, v in self.color.options]:
                self.color.value = color
