"""The explorer builds only its first screen: a tab not open at start is built when first opened (issue 51 item 8).

What a tab shows once opened is what it showed when every tab was built up front: the same widgets holding the
same text and options, the same charts' data, after a rerun too (the hooks a hidden tab missed are replayed).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import sample_path

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")
pytest.importorskip("altair")
import ipywidgets as ipw

from precnb.widgets import explore
from precnb.widgets.tabs import default_panels

_TRAITS = ("value", "description", "options", "disabled", "placeholder", "tooltip", "icon", "button_style",
           "_dom_classes", "min", "max")


def _eager(factory: Any) -> Any:
    """A factory that builds its panel at once (as every tab was built before issue 51 item 8)."""
    def make(api: Any) -> Any:
        p = factory(api)
        return p.ensure_built() if p is not None else None
    return make


def _eager_explore(target: Any, base: Any) -> Any:
    return explore(target, baseline=base, panels=[_eager(f) for f in default_panels()])


def snapshot(w: Any) -> Any:
    """A widget tree as data: each widget's type, its shown traits, its children (a chart: its type only)."""
    traits = {k: getattr(w, k) for k in _TRAITS if w.has_trait(k)}
    if isinstance(traits.get("options"), tuple):
        traits["options"] = [str(o) for o in traits["options"]]
    kids = [snapshot(c) for c in getattr(w, "children", ()) if isinstance(c, ipw.Widget)] if isinstance(
        w, ipw.Box) else []
    return (type(w).__name__, traits, kids)


def _widgets(ex: Any) -> int:
    """Widgets under the explorer (its layouts and styles left out)."""
    seen, todo = set(), [ex]
    while todo:
        w = todo.pop()
        if id(w) in seen:
            continue
        seen.add(id(w))
        todo += [c for c in getattr(w, "children", ()) if isinstance(c, ipw.Widget)]
    return len(seen)


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any]:
    return sample_path("renamed", "target"), sample_path("renamed", "baseline")


def test_tabs_not_open_at_start_are_placeholders_built_when_selected(pair):
    lazy, eager = explore(pair[0], baseline=pair[1]), _eager_explore(*pair)
    titles = [p.title for p in lazy.panels]
    assert titles == [p.title for p in eager.panels] and "Alignment" in titles and lazy.tabs.selected_index == 0
    # the first screen is built (the tab open at start included), the other tabs are empty boxes
    assert lazy.panels[0].is_built() and lazy.panels[0].children
    for p in lazy.panels[1:]:
        assert not p.is_built() and p.children == (), p.title
        assert "level" not in p.__dict__ and "path" not in p.__dict__  # no control of theirs made
    assert all(p.is_built() for p in eager.panels)
    assert _widgets(lazy) < _widgets(eager)
    assert snapshot(lazy.panels[0]) == snapshot(eager.panels[0])
    for i, title in enumerate(titles):
        if i == 0:
            continue
        for ex in (lazy, eager):
            ex.tabs.selected_index = i
        p, q = lazy.panels[i], eager.panels[i]
        assert p.is_built() and p.children, title
        assert snapshot(p) == snapshot(q), title
        if title == "Alignment":  # its drawn trees
            assert p.rows.equals(q.rows) and p.chart is not None
            assert p.chart.spec["datasets"] == q.chart.spec["datasets"]
        if title == "Hierarchy":
            assert p.frame.equals(q.frame) and p.chart is not None
    assert _widgets(lazy) == _widgets(eager)


def test_a_tab_opened_after_a_rerun_shows_what_it_would_have_shown(pair):
    lazy, eager = explore(pair[0], baseline=pair[1]), _eager_explore(*pair)
    for ex in (lazy, eager):
        ex.rerun(tolerance=1e-3)
        ex.bar.step(1)  # a selection change reaches every tab (on_select)
    assert not lazy.panel("Alignment").is_built() and not lazy.panel("Triage options").is_built()
    for title in ("Alignment", "Triage options", "Shards"):
        for ex in (lazy, eager):
            ex.tabs.selected_index = [p.title for p in ex.panels].index(title)
        assert snapshot(lazy.panel(title)) == snapshot(eager.panel(title)), title
    assert lazy.panel("Triage options").tolerance.value == "0.001"
    assert lazy.panel("Alignment").summary.value  # the rerun's refresh, replayed when built


def test_reading_an_unopened_tab_builds_it(pair):
    ex = explore(pair[0], baseline=pair[1])
    export = ex.panel("Export")
    assert not export.is_built()
    assert export.path.value == "precnb_report.html" and export.is_built() and export.children
    al = ex.panel("Alignment")
    al.pick(left="model.layers.1.mlp", right="decoder.layers.1.mlp")  # says the pick in its status line: built
    assert al.is_built() and "model.layers.1.mlp" in al.status.value
    with pytest.raises(AttributeError):
        ex.panel("Shards").no_such_thing  # noqa: B018
