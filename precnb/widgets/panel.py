"""The explorer's panel protocol: a tab is one module that talks to the explorer through :class:`ExplorerAPI`.

A panel is built with the explorer's API (``factory(api) -> Panel``, or None when it does not
apply to these runs) and is told when the runs or triage change (:meth:`Panel.refresh`), when
the selection changes (:meth:`Panel.on_select`) and when its tab is opened
(:meth:`Panel.on_show`). It acts on the explorer only through the API (show a finding,
select a record, narrow the view, rerun the triage); nothing calls back into it otherwise.
``Explorer(panels=[...])`` takes the factories; :func:`precnb.widgets.tabs.default_panels` lists the built-in ones.

Examples
--------
>>> from precnb.widgets.panel import Panel
>>> class Notes(Panel):
...     title = "Notes"
...     def refresh(self):
...         self.children = [ipw.HTML(f"{len(self.api.findings())} finding(s)")]
>>> ex = precnb.explore(run, panels=[*default_panels(), Notes])  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import ipywidgets as ipw

if TYPE_CHECKING:
    from precnb.widgets._data import ExplorerData
    from precnb.widgets._inputs import Runs
    from precnb.widgets.filters import FilterPanel

__all__ = ["ExplorerAPI", "Panel", "PanelFactory", "PanelProtocol", "built", "run_hook"]


class ExplorerAPI(Protocol):
    """What a panel may read and do (implemented by :class:`precnb.widgets.explorer.Explorer`)."""

    runs: Runs
    triage: Any
    data: ExplorerData
    filters: FilterPanel
    step: int | None
    rank: int | None
    tensor: str | None
    row: str | None
    unmerged: bool
    current_finding: Any

    def show_finding(self, f: Any) -> None:
        """Move every view to a finding."""

    def select_record(self, step: int, rank: int, tensor: str, *, unmerged: bool = False) -> None:
        """Select one record (as a click on its cell would)."""

    def narrow(self, text: str, *, regex: bool = False) -> None:
        """Show only the tensors whose node or module matches *text* (empty: all)."""

    def rerun(self, **options: Any) -> Any:
        """Run the triage again with these options (as :func:`precnb.diagnose` takes them)."""

    def findings(self) -> list[Any]:
        """The findings shown so far (the triage's, most important first)."""

    def sources(self) -> dict[str, Any]:
        """The runs as given (before merging), by name."""

    def input_paths(self) -> list[str]:
        """The paths the runs were read from: writes stay out of them."""


@runtime_checkable
class PanelProtocol(Protocol):
    """A tab of the explorer."""

    title: str

    def refresh(self) -> None:
        """The explorer's runs or triage changed."""

    def on_select(self) -> None:
        """The selected record changed."""

    def on_show(self) -> None:
        """The panel's tab was opened."""


PanelFactory = Callable[["ExplorerAPI"], "PanelProtocol | None"]


class Panel(ipw.VBox):
    """Convenience base: an ``ipywidgets.VBox`` holding the API, with no-op hooks.

    Subclasses set :attr:`title`, build their widgets in ``__init__`` (after ``super().__init__``)
    and override the hooks they need; :meth:`applies` says whether the panel fits the runs.

    A *lazy* panel (:attr:`lazy` True) builds its widgets in :meth:`build` instead, the first time its
    tab is opened (or :meth:`ensure_built` is called, or any of its public attributes is read, e.g.
    ``panel.match`` from a test or a script): until then it is an empty box and the explorer holds its
    hooks back (:meth:`is_built`, :meth:`defer`), replaying them once it is built, so that what it shows
    when opened is what an eagerly built panel would show (issue 51: ``explore()`` builds only the first
    screen). ``__init__`` of a lazy panel sets only plain (non-widget) state.
    """

    title: ClassVar[str] = ""
    lazy: ClassVar[bool] = False

    def __init__(self, api: ExplorerAPI, children: Sequence[ipw.Widget] = ()) -> None:
        super().__init__(list(children))
        self.api = api
        self._deferred: list[str] = []  # hooks the explorer held back while the panel was not built
        self._built = not self.lazy

    # -- building on demand -------------------------------------------------------------------
    def build(self) -> None:
        """Create the panel's widgets (a lazy panel: on first opening or first use)."""

    def is_built(self) -> bool:
        """Whether the widgets exist (always for a panel that is not :attr:`lazy`)."""
        return bool(self.__dict__.get("_built", True))

    def ensure_built(self) -> Panel:
        """Build the widgets now when not built yet, then replay the hooks held back meanwhile; returns self."""
        if not self.is_built():
            self._built = True  # first: reads made while building do not build again
            self.build()
            deferred, self._deferred = self._deferred, []
            for hook in ("refresh", "on_select"):  # each once, in the order the explorer calls them
                if hook in deferred:
                    getattr(self, hook)()
        return self

    def defer(self, hook: str) -> None:
        """Hold back a hook (``"refresh"``, ``"on_select"``) until the panel is built."""
        if hook not in self._deferred:
            self._deferred.append(hook)

    def __getattr__(self, name: str) -> Any:
        # called only for an attribute not found: a public one of an unbuilt lazy panel builds it
        if not name.startswith("_") and not self.__dict__.get("_built", True):
            self.ensure_built()
            return getattr(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def create(cls, api: ExplorerAPI) -> Panel | None:
        """The factory: an instance when :meth:`applies`, else None."""
        return cls(api) if cls.applies(api) else None

    @classmethod
    def applies(cls, api: ExplorerAPI) -> bool:
        """Whether the panel fits these runs (default: always)."""
        return True

    def refresh(self) -> None:
        """The explorer's runs or triage changed."""

    def on_select(self) -> None:
        """The selected record changed."""

    def on_show(self) -> None:
        """The panel's tab was opened."""

    def is_open(self) -> bool:
        """Whether the panel's tab is the one shown now (a costly redraw can wait for :meth:`on_show`)."""
        tabs, panels = getattr(self.api, "tabs", None), getattr(self.api, "panels", None)
        i = getattr(tabs, "selected_index", None)
        return panels is not None and i is not None and 0 <= i < len(panels) and panels[i] is self


def built(panel: Any) -> Any:
    """*panel*, its widgets built (a lazy :class:`~precnb.widgets.panel.Panel` builds on first opening)."""
    ensure = getattr(panel, "ensure_built", None)
    return ensure() if callable(ensure) else panel


def run_hook(panel: Any, hook: str) -> None:
    """Call *panel*'s *hook* (``refresh`` / ``on_select``); a lazy panel not built yet replays it once built."""
    is_built = getattr(panel, "is_built", None)
    if callable(is_built) and not is_built():
        panel.defer(hook)
    else:
        getattr(panel, hook)()
