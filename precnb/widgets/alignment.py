"""The Alignment tab: both runs' module trees side by side, pairs linked, matched by hand.

Click a module (or call) on the left (baseline) and one on the right (target), then "Match" to
force that pair, or pick a call and "Unmatch" to leave it unpaired: the triage reruns with the
edited mapping (:meth:`precnb.Alignment.with_pairs`) and every view follows. "Save mapping"
writes precnb's mapping file (:meth:`precnb.Alignment.to_file`), which ``precnb diff --mapping``
and ``precnb.diagnose(..., mapping=...)`` reuse — msprobe's manual matching, inside the notebook.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import ipywidgets as ipw
import numpy as np
import pandas as pd

from precnb.widgets.charts import offline_chart
from precnb.widgets.findings import _error
from precnb.widgets.panel import ExplorerAPI, Panel

__all__ = ["AlignmentPanel", "divergence_ranks"]


def divergence_ranks(flagged: Any, by: str) -> dict[str, int]:
    """Rank of every module (or node) of the flagged grid by its first flagged record (1 = earliest).

    A module is as early as the earliest record inside it, so its ancestors share its rank.
    """
    pos = np.asarray(flagged.positions)
    if not np.isfinite(pos).any():
        return {}
    per_tensor = np.nanmin(np.where(np.isfinite(pos), pos, np.inf), axis=(0, 1))
    keys = flagged.ds[by].values.astype(str)
    keep = np.isfinite(per_tensor) & (keys != "")
    if keep.any():  # the earliest record of each key (one groupby, not a loop over every tensor)
        firsts = pd.Series(per_tensor[keep]).groupby(keys[keep], sort=False).min()
        best: dict[str, float] = {str(k): float(v) for k, v in firsts.items()}
    else:
        best = {}
    if by == "module":  # a module is as early as anything inside it
        for k, p in list(best.items()):
            parts = k.split(".")
            for i in range(1, len(parts)):
                anc = ".".join(parts[:i])
                best[anc] = min(best.get(anc, np.inf), p)
    order = {p: i + 1 for i, p in enumerate(sorted(set(best.values())))}  # ancestors share their child's rank
    return {k: order[p] for k, p in best.items()}


class AlignmentPanel(Panel):
    """Two trees, pair links, Match / Unmatch (rerun) and Save mapping."""

    title = "Alignment"
    lazy = True

    @classmethod
    def applies(cls, api: ExplorerAPI) -> bool:
        """Two runs were compared."""
        return api.triage is not None and bool(api.triage.paired)

    def __init__(self, api: ExplorerAPI) -> None:
        super().__init__(api)
        self.left: str | None = None
        self.right: str | None = None
        self.chart: Any = None
        self.rows: Any = None
        self._drawn_for: Any = None
        self._drawn_level: str | None = None
        # (run names, the chart's spec, the extent of the rows it was made for: precnb.viz.alignment.extent)
        self._template: tuple[Any, dict[str, Any], tuple[int, float]] | None = None

    def build(self) -> None:
        """The level choice, Match / Unmatch, Save mapping, the status lines and the (empty until drawn) chart box."""
        self.level = ipw.ToggleButtons(options=[("modules", "modules"), ("calls in the selected modules", "calls")],
                                       value="modules", style={"button_width": "auto"})
        self.match = ipw.Button(description="Match", icon="link", button_style="primary",
                                layout=ipw.Layout(width="110px"))
        self.unmatch = ipw.Button(description="Unmatch", icon="unlink", layout=ipw.Layout(width="110px"))
        self.path = ipw.Text(value="precnb_mapping.json", description="file", layout=ipw.Layout(width="320px"))
        # its own width (a fixed 190 px cut it to "replace a precnb mapp…", issue 51)
        self.overwrite = ipw.Checkbox(value=False, description="replace a precnb mapping", indent=False,
                                      layout=ipw.Layout(width="auto"))
        self.save = ipw.Button(description="Save mapping", icon="save", layout=ipw.Layout(width="140px"))
        self.status = ipw.HTML("<i>click a node on each side</i>")
        self.status.add_class("precnb-align-status")
        self.output = ipw.HTML("")
        self.output.add_class("precnb-align-output")
        self.summary = ipw.HTML("")
        self.chart_box = ipw.Box(layout=ipw.Layout(max_height="560px", overflow="auto", width="100%"))
        self.match.on_click(lambda _b: self.do_match())
        self.unmatch.on_click(lambda _b: self.do_unmatch())
        self.save.on_click(lambda _b: self.do_save())
        self.level.observe(lambda _c: self.draw(), names="value")
        self.children = [self.summary, ipw.HBox([self.level, self.match, self.unmatch]),
                         ipw.HBox([self.path, self.overwrite, self.save]), self.status, self.output, self.chart_box]
        self.add_class("precnb-alignment")

    # -- hooks --------------------------------------------------------------------------------
    def refresh(self) -> None:
        """New triage: redraw when the tab has been opened."""
        t = self.api.triage
        a = t.alignment if t is not None else None
        self.summary.value = (f"<div style='font-size:12px'>{html.escape(a.describe())}</div>" if a is not None else
                              "<i>no alignment (one run)</i>")
        if self.chart is not None and self.is_open():  # else redrawn when the tab is opened (on_show)
            self.draw()

    def on_show(self) -> None:
        """Draw on first opening."""
        if self._drawn_for is not self.api.triage:
            self.draw()

    # -- drawing ------------------------------------------------------------------------------
    def draw(self) -> None:
        """(Re)build both trees for the current level and selection."""
        from precnb.viz.alignment import alignment_frame

        t = self.api.triage
        if t is None or t.alignment is None or t.baseline is None:
            self.chart_box.children = [ipw.HTML("<i>no alignment (one run)</i>")]
            return
        level = self.level.value
        within: tuple[str | None, str | None] = (None, None)
        if level == "calls":
            within = self._module_pair()
        try:
            ranks = divergence_ranks(t.flagged(), "module" if level == "modules" else "node")
            self.rows, links = alignment_frame(t.alignment, t.baseline, t.target, level=level, within=within,
                                               ranks=ranks)
            self._show_chart(links, (str(t.names[0]), str(t.names[1])))
        except Exception as err:
            self.chart_box.children = [ipw.HTML(_error(err))]
            return
        if list(self.chart_box.children) != [self.chart]:
            self.chart_box.children = [self.chart]
        self._drawn_for = t
        self._drawn_level = level
        self._say()

    def _show_chart(self, links: Any, names: tuple[str, str]) -> None:
        """Show the trees of :attr:`rows` and *links* on the one chart widget.

        The spec is built once per shape (rows, top rank, run names: :func:`~precnb.viz.alignment.alignment_chart`
        with named data); a redraw (a Match, an Unmatch, another pick) swaps the data and the selections into it.
        """
        from precnb.viz.alignment import alignment_chart, chart_data, extent, resized, with_selected
        from precnb.widgets.charts import records, unvalidated

        rows = self.rows
        size = extent(rows)
        if self.chart is None or self._template is None or self._template[0] != names:
            chart = alignment_chart(rows, links, names=names, named=True)
            if self.chart is None:
                self.chart = offline_chart(chart)
            else:  # other runs: a new spec (and new selections, observed again)
                with self.chart.hold_sync():
                    self.chart.chart = unvalidated(chart)
            self.chart.selections.observe(self._on_left, names=["left"])
            self.chart.selections.observe(self._on_right, names=["right"])
            self._template = (names, self.chart.spec, size)
        elif self._template[2] != size:  # more or fewer rows (a Match, an Unmatch, another level): resized
            self._template = (names, resized(self._template[1], self._template[2], size), size)
        spec = with_selected(self._template[1], (self.left, self.right))
        spec["datasets"] = {k: records(v) for k, v in chart_data(rows, links).items()}
        self.chart.spec = spec

    def _module_pair(self) -> tuple[str | None, str | None]:
        """The modules whose calls to list: the selected ones (a partner completes a single pick)."""
        t = self.api.triage
        a = t.alignment
        left, right = self.left, self.right
        mods_b = set(t.baseline["module"].values.astype(str))
        mods_t = set(t.target["module"].values.astype(str))
        left = left if left in mods_b else None
        right = right if right in mods_t else None
        if left and not right:
            right = next((p.target for p in a.modules if p.baseline == left), None)
        if right and not left:
            left = next((p.baseline for p in a.modules if p.target == right), None)
        return left, right

    def _row(self, side: str, name: str | None) -> Any:
        if self.rows is None or name is None:
            return None
        m = self.rows[(self.rows["side"] == side) & (self.rows["name"] == name)]
        return m.iloc[0] if len(m) else None

    def _say(self) -> None:
        e = html.escape
        parts = []
        for side, name in (("baseline", self.left), ("target", self.right)):
            r = self._row(side, name)
            if name is None:
                parts.append(f"{side}: —")
            elif r is None:
                parts.append(f"{side}: <code>{e(name)}</code>")
            else:
                pair = (f" (paired with <code>{e(r['partner'])}</code> by {e(r['how'])}, {r['confidence']:.2f})"
                        if r["partner"] else f" ({e(r['status'])}{': ' + e(r['how']) if r['how'] else ''})")
                parts.append(f"{side}: <code>{e(name)}</code>{pair}")
        self.status.value = "<br>".join(parts)

    # -- picking ------------------------------------------------------------------------------
    def _picked(self, change: dict[str, Any], key: str) -> str | None:
        from precnb.viz.selections import read_point

        pts = read_point(change["new"])
        value = pts[-1].get(key) if pts else None
        return str(value) if value not in (None, "") else None

    def _on_left(self, change: dict[str, Any]) -> None:
        name = self._picked(change, "left_name")
        if name is not None:
            self.pick(left=name)

    def _on_right(self, change: dict[str, Any]) -> None:
        name = self._picked(change, "right_name")
        if name is not None:
            self.pick(right=name)

    def pick(self, *, left: str | None = None, right: str | None = None) -> None:
        """Select a baseline (left) and/or target (right) node, as clicks would."""
        if left is not None:
            self.left = left
        if right is not None:
            self.right = right
        self._say()

    # -- editing ------------------------------------------------------------------------------
    def _rerun(self, doc: dict[str, Any], what: str, done: Any) -> Any:
        """Rerun with *doc*; *done(triage)* says whether the edit took (None) or why not (a message)."""
        self.output.value = f"<i>{html.escape(what)}: rerunning the triage…</i>"
        try:
            t = self.api.rerun(mapping=doc)
        except Exception as err:
            self.output.value = _error(err)
            return None
        why_not = done(t)
        if why_not:
            self.output.value = _error(ValueError(why_not))
            return t
        f = t.finding if t is not None else None
        # the new finding's own words: the node can stay while what is said of it changes (an unpaired op)
        self.output.value = (f"{html.escape(what)}; first finding now: <b>{html.escape(f.node or '')}</b> "
                             f"{html.escape(f.reason)}" if f is not None else html.escape(what))
        return t

    def _names(self, side: str) -> set[str]:
        """What can be picked on one side at this level: the drawn tree's rows (modules, containers, calls)."""
        t = self.api.triage
        ds = t.baseline if side == "baseline" else t.target
        names = set(ds["module" if self.level.value == "modules" else "node"].values.astype(str))
        if self.rows is not None and self._drawn_level == self.level.value:
            names |= set(self.rows.loc[self.rows["side"] == side, "name"].astype(str))
        return names

    def do_match(self) -> Any:
        """Force the selected pair (modules or calls) and rerun; returns the new triage."""
        t = self.api.triage
        if t is None or t.alignment is None:
            return None
        if not (self.left and self.right):
            self.output.value = _error(ValueError("pick a baseline node (left) and a target node (right) first"))
            return None
        what = "module" if self.level.value == "modules" else "call"
        bad = [f"{side} {name!r}" for side, name in (("baseline", self.left), ("target", self.right))
               if name not in self._names(side)]
        if bad:  # a pick made at the other level (a module while calls are listed, or the reverse)
            self.output.value = _error(ValueError(f"{' and '.join(bad)} {'is' if len(bad) == 1 else 'are'} not a "
                                                  f"{what} of that run: pick a {what} on each side"))
            return None
        a = t.alignment
        left, right = self.left, self.right
        if self.level.value == "modules":
            doc = a.with_pairs(set_modules={left: right})
            pairs = lambda nt: {(p.baseline, p.target) for p in nt.alignment.modules}  # noqa: E731
        else:
            doc = a.with_pairs(set_nodes={left: right})
            pairs = lambda nt: {(p.baseline, p.target) for p in nt.alignment.nodes}  # noqa: E731
        return self._rerun(doc, f"matched {left} ↔ {right}", lambda nt: None if nt.alignment is not None and (
            left, right) in pairs(nt) else f"{left} ↔ {right} is not a pair after the rerun (the aligner refused it)")

    def do_unmatch(self) -> Any:
        """Leave the selected target call (or the partner of the selected baseline call) unpaired; rerun.

        The pick must be a paired call: a module picked at the "modules" level (still selected when
        the calls are listed) is not one, and nothing is said to be unpaired unless it is.
        """
        t = self.api.triage
        if t is None or t.alignment is None:
            return None
        if self.level.value != "calls":
            self.output.value = _error(ValueError("unmatch works on calls: choose 'calls in the selected modules'"))
            return None
        by_target = {p.target: p.baseline for p in t.alignment.nodes}
        by_base = {p.baseline: p.target for p in t.alignment.nodes}
        target = self.right if self.right in by_target else by_base.get(self.left or "")
        if not target:
            picked = self.right or self.left
            why = (f"{picked!r} is not a paired call (a module picked at the modules level, or an unpaired call): "
                   "pick a paired call in the list" if picked else "pick a paired call first")
            self.output.value = _error(ValueError(why))
            return None
        return self._rerun(t.alignment.with_pairs(unpair_targets={target}), f"unmatched {target}",
                           lambda nt: None if nt.alignment is not None and target not in {
                               p.target for p in nt.alignment.nodes} else f"{target} is still paired after the rerun")

    def do_save(self) -> Path | None:
        """Write precnb's mapping file of the current alignment; returns its path (None on a refusal).

        By :mod:`precnb._write`'s rules: never inside the runs' dumps, an existing file replaced
        only when "replace" is ticked and precnb wrote it; a refusal is one line in the panel.
        """
        t = self.api.triage
        if t is None or t.alignment is None:
            return None
        path = Path(self.path.value).expanduser()
        try:
            out = Path(t.alignment.to_file(path, overwrite=bool(self.overwrite.value),
                                           inputs=self.api.input_paths()))
        except Exception as err:
            self.output.value = _error(err)
            return None
        e = html.escape
        self.output.value = (f"written <code>{e(str(out))}</code> — reuse it with <code>precnb diff BASELINE "
                             f"TARGET --mapping {e(str(out))}</code>")
        return out
