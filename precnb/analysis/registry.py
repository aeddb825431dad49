"""The diagnosis registry: every kind of finding precnb can produce, in one place.

A diagnosis is a pure function of a :class:`Context` (the prepared runs and the options)
that returns findings of one kind. Registering it is what makes it exist everywhere: the
pipeline (:func:`precnb.diagnose`) runs every registered diagnosis that applies, findings are
ordered by its ``priority``, the CLI summary and the explorer/report titles read its
``title``, and the report lists its ``description`` among the checks run. A new diagnosis is
one module that calls :func:`register` (listed in :data:`BUILTIN_MODULES` or loaded through the
``precnb.diagnoses`` entry-point group) plus its test.

Examples
--------
>>> from precnb.analysis import registry
>>> registry.title("nan_origin")
'NaN/Inf origin'
>>> [d.kind for d in registry.diagnoses()][:2]
['preflight', 'first_divergence']
>>> registry.title("loss_spike")
'Loss spike'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from precnb._plugins import PluginRegistry
from precnb.analysis.hooks import (
    GROUPS,
    LEGACY,
    CliHooks,
    ExplorerHooks,
    FindingHooks,
    InputHooks,
    OrderHooks,
    ReportHooks,
    StepwiseHooks,
)

if TYPE_CHECKING:
    import xarray as xr

__all__ = [
    "BUILTIN_MODULES",
    "ENTRY_POINT_GROUP",
    "REGISTRY",
    "Context",
    "Diagnosis",
    "checklist",
    "diagnoses",
    "get",
    "kinds",
    "lookup",
    "order_findings",
    "refresh",
    "register",
    "title",
    "unregister",
]

Mode = Literal["single", "pair", "any"]


@dataclass
class Context:
    """Everything a diagnosis may look at: prepared runs and resolved options.

    Attributes
    ----------
    target : xarray.Dataset
        The run diagnosed (shards merged when a target layout was given).
    baseline : xarray.Dataset or None
        The run it is compared with (merged likewise), in its own names.
    raw_target, raw_baseline : xarray.Dataset or None
        The runs before shard merging (the replica check reads these).
    target_layout, baseline_layout : precnb.analysis.Layout or None
    alignment : precnb.analysis.Alignment or None
        How the baseline's names map onto the target's (None: identical names).
    tolerance : precnb.analysis.Tolerance or None
    step_offset : int, "auto" or None
        Target step = baseline step + offset (None: 0 when both runs hold the same steps,
        else detected).
    crc : {"report", "strict"}
    names : (str, str)
        Display names (baseline, target).
    params : dict
        What the pipeline hands the diagnoses (``spike_rule``, ``limit``, what was read beside the run, ...).
    options : dict
        Each diagnosis's own options by kind (an instance of its :attr:`Diagnosis.options`).
    cache : dict
        Intermediate results shared between diagnoses of one pipeline run.
    """

    target: xr.Dataset
    baseline: xr.Dataset | None = None
    raw_target: xr.Dataset | None = None
    raw_baseline: xr.Dataset | None = None
    target_layout: Any = None
    baseline_layout: Any = None
    alignment: Any = None
    tolerance: Any = None
    step_offset: int | Literal["auto"] | None = None
    crc: Literal["report", "strict"] = "report"
    names: tuple[str, str] = ("baseline", "target")
    params: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def paired(self) -> bool:
        """True when there is a baseline."""
        return self.baseline is not None


@dataclass(frozen=True, init=False)
class Diagnosis:
    """One registered diagnosis: a core of eight fields and optional hook groups (:mod:`precnb.analysis.hooks`).

    Attributes
    ----------
    kind : str
        The ``Finding.kind`` it produces (``"first_divergence"``).
    title : str
        Shown in summaries, the report and the explorer (``"First divergence"``).
    priority : int
        Findings are ordered by it (lower first) among the found ones.
    mode : {"single", "pair", "any"}
        Runs on one run only, on a (baseline, target) pair only, or on both.
    run : callable
        ``run(ctx) -> Finding | list[Finding]``.
    description : str
        What it checks, in words (the report's "checks run").
    applies : callable, optional
        ``applies(ctx) -> bool`` beyond *mode* (e.g. "a layout was given").
    options : type, optional
        Its own options: a frozen dataclass of :func:`precnb.analysis.options.option` fields, each a keyword of
        :func:`precnb.diagnose` and a flag of its generated subcommand, read as ``ctx.options[kind]``.
    cli, explorer, report, order, steps, finding, reads : hook group
        The optional groups (:data:`precnb.analysis.hooks.GROUPS`): its subcommand; the records the explorer flags;
        its report table, colour, checklist and not-applicable text; its place among the findings; its step-wise
        search or first-steps read; its evidence and dump plan; what it reads beside the run. Each hook may also be
        given by its own name (``Diagnosis(..., command="diff", flags=f)``, as before the groups).
    """

    kind: str
    title: str
    priority: int
    mode: Mode
    run: Callable[[Context], Any]
    description: str
    applies: Callable[[Context], bool] | None = None
    options: type | None = None
    cli: CliHooks = field(default_factory=CliHooks)
    explorer: ExplorerHooks = field(default_factory=ExplorerHooks)
    report: ReportHooks = field(default_factory=ReportHooks)
    order: OrderHooks = field(default_factory=OrderHooks)
    steps: StepwiseHooks = field(default_factory=StepwiseHooks)
    finding: FindingHooks = field(default_factory=FindingHooks)
    reads: InputHooks = field(default_factory=InputHooks)

    def __init__(self, kind: str, title: str, priority: int, mode: Mode, run: Callable[[Context], Any],
                 description: str, applies: Callable[[Context], bool] | None = None, options: type | None = None,
                 **hooks: Any) -> None:
        core = {"kind": kind, "title": title, "priority": priority, "mode": mode, "run": run,
                "description": description, "applies": applies, "options": options}
        groups = {g: hooks.pop(g, None) or cls() for g, cls in GROUPS.items()}  # a group left out (or None): off
        unknown = sorted(set(hooks) - set(LEGACY))
        if unknown:
            raise TypeError(f"Diagnosis got unknown keyword(s) {unknown}; valid: {[*core, *GROUPS, *LEGACY]}")
        for name, value in hooks.items():  # a hook by its own name: into its group
            groups[LEGACY[name]] = replace(groups[LEGACY[name]], **{name: value})
        for name, value in {**core, **groups}.items():
            object.__setattr__(self, name, value)

    def applicable(self, ctx: Context) -> bool:
        """Whether it runs on *ctx*."""
        if self.mode == "single" and ctx.paired:
            return False
        if self.mode == "pair" and not ctx.paired:
            return False
        return True if self.applies is None else bool(self.applies(ctx))

    def why_not(self, ctx: Context) -> str:
        """Why it does not run on *ctx* (its ``not_applicable`` text when *applies* said no)."""
        if self.mode == "pair" and not ctx.paired:
            return f"{self.title.lower()} needs a baseline run"
        if self.mode == "single" and ctx.paired:
            return f"{self.title.lower()} looks at one run (diagnose the target alone)"
        return self.report.not_applicable or f"{self.title.lower()} does not apply to these inputs"


def _as_diagnosis(obj: Any, kind: str) -> Diagnosis:
    """A loaded plug-in as a Diagnosis: the object itself, what a factory returns, or what its module registered."""
    if isinstance(obj, ModuleType):  # ``kind = "mypkg.diag"``: importing the module registered it
        found = _REGISTRY.registered().get(kind)
        if found is None:
            raise TypeError(f"importing {obj.__name__} registered no diagnosis of kind {kind!r}")
        return found
    if not isinstance(obj, Diagnosis) and callable(obj):
        obj = obj()
    if not isinstance(obj, Diagnosis):
        raise TypeError(f"not a precnb.analysis.registry.Diagnosis but {type(obj).__name__}")
    if obj.kind != kind:
        raise TypeError(f"declares the kind {obj.kind!r}")
    return obj


ENTRY_POINT_GROUP = "precnb.diagnoses"
#: the diagnoses, by kind: an instance of the generic plug-in registry (:mod:`precnb._plugins`). The
#: built-in ones register themselves when :data:`BUILTIN_MODULES` are imported (on first use).
_REGISTRY: PluginRegistry[Diagnosis] = PluginRegistry(ENTRY_POINT_GROUP, kind="diagnosis", convert=_as_diagnosis)
REGISTRY = _REGISTRY
_TITLES_WITHOUT_DIAGNOSIS = {"none": "Nothing found"}
BUILTIN_MODULES: tuple[str, ...] = ("precnb.analysis.diagnoses", "precnb.analysis.spike.diagnosis")
"""Modules whose import registers the built-in diagnoses."""
_loaded = False
_ALL: dict[str, Diagnosis] | None = None


def register(diagnosis: Diagnosis, *, replace: bool = False) -> Diagnosis:
    """Add *diagnosis* to the registry (``replace=True`` to override a kind).

    Raises
    ------
    ValueError
        When the kind is already registered and *replace* is false.
    """
    global _ALL
    try:
        out = _REGISTRY.register(diagnosis.kind, diagnosis, replace=replace)
    except ValueError:
        raise ValueError(f"a diagnosis of kind {diagnosis.kind!r} is already registered") from None
    _ALL = None
    return out


def unregister(kind: str) -> None:
    """Remove the diagnosis of *kind* (one added at run time, e.g. in a test)."""
    global _ALL
    _REGISTRY.unregister(kind)
    _ALL = None


def _load() -> None:
    """Import the built-in diagnoses, then load every ``precnb.diagnoses`` plug-in (a broken one warns)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in BUILTIN_MODULES:
        importlib.import_module(mod)
    _REGISTRY.items()  # loads the entry points; failures are RuntimeWarnings naming the plug-in


def refresh() -> None:
    """Forget the plug-ins found so far; the next use lists the entry points again."""
    global _loaded, _ALL
    _REGISTRY.refresh()
    _loaded = False
    _ALL = None


def _all() -> dict[str, Diagnosis]:
    """Every diagnosis by kind (kept until the registry changes: titles and priorities are asked for often)."""
    global _ALL
    _load()
    if _ALL is None:
        _ALL = dict(_REGISTRY.items())
    return _ALL


def diagnoses(kinds: Sequence[str] | None = None) -> list[Diagnosis]:
    """Registered diagnoses by priority (only *kinds* when given, in priority order).

    Raises
    ------
    ValueError
        For a kind that is not registered.
    """
    _load()
    if kinds is not None:
        known = _all()
        unknown = [k for k in kinds if k not in known]
        if unknown:
            raise ValueError(f"unknown diagnosis kind(s) {unknown}; known: {sorted(known)}")
        chosen = [known[k] for k in dict.fromkeys(kinds)]
    else:
        chosen = list(_all().values())
    return sorted(chosen, key=lambda d: (d.priority, d.kind))


def get(kind: str) -> Diagnosis:
    """The diagnosis of *kind* (KeyError when unknown)."""
    _load()
    return _REGISTRY.get(kind)


def lookup(kind: str) -> Diagnosis | None:
    """The diagnosis of *kind*, or None (``"none"``, a kind no diagnosis registers)."""
    return _all().get(kind)


def checklist(finding: Any) -> list[dict[str, Any]] | None:
    """The checks of a result whose diagnosis keeps a checklist (:attr:`ReportHooks.checklist`), else None.

    ``evidence["diagnosis"]`` names the diagnosis (a clean result's kind is ``"none"``).
    """
    ev = getattr(finding, "evidence", None) or {}
    d = lookup(str(ev.get("diagnosis") or getattr(finding, "kind", "")))
    checks = ev.get("checks")
    return list(checks) if d is not None and d.report.checklist and isinstance(checks, list) else None


def kinds() -> list[str]:
    """Every registered finding kind (by priority), plus ``"none"``."""
    return [d.kind for d in diagnoses()] + ["none"]


def title(kind: str) -> str:
    """Display title of a finding kind (the kind itself when unknown)."""
    d = _all().get(kind)
    if d is not None:
        return d.title
    return _TITLES_WITHOUT_DIAGNOSIS.get(kind, kind.replace("_", " "))


def priority(kind: str, *, found: bool = True) -> int:
    """Ordering key of a finding kind (unknown kinds after the known ones).

    With ``found=False``, the key of the diagnosis's "nothing found" result (``clean_last``
    diagnoses after the others).
    """
    d = _all().get(kind)
    if d is None:
        return 1000
    return d.priority + (500 if d.order.clean_last and not found else 0)


def _warns(f: Any) -> bool:
    """A clean result whose checks warn (``stats["status"] == "warn"``)."""
    return not f.found and isinstance(f.stats, dict) and f.stats.get("status") == "warn"


def order_findings(results: Iterable[Any], *, warn_first: bool = True) -> list[Any]:
    """The one order of findings (the pipeline's, the pre-flight join's, the report's).

    Found first; then a "nothing found" that warns (a pre-flight warning may be the cause: a weight
    left at zero) before the other "nothing found" results; then by :func:`priority` of the kind
    (found or not); stable otherwise.

    Parameters
    ----------
    results : iterable of Finding or of (kind, Finding)
    warn_first : bool
        Put a warning "nothing found" before the other ones. The pre-flight join of a step-wise search
        passes False: there the search's own "nothing found" says what was compared (its ``stats``),
        and the pre-flight warning stays in ``checks``.

    Returns
    -------
    list of Finding
    """
    pairs = [r if isinstance(r, tuple) else (r.kind, r) for r in results]
    ranked = sorted(enumerate(pairs), key=lambda x: (not x[1][1].found, warn_first and not _warns(x[1][1]),
                                                     priority(x[1][0], found=x[1][1].found), x[0]))
    return [f for _, (_, f) in ranked]
