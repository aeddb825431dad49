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
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from precnb._plugins import PluginRegistry

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


@dataclass(frozen=True)
class Diagnosis:
    """One registered diagnosis.

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
    command : str, optional
        The CLI subcommand that runs it alone. Built-in diagnoses have a hand-written one (with their
        own options); for any other, ``precnb <command> RUN [--baseline BASE] [--json]`` is generated
        from the registry (:mod:`precnb.cli.generated`).
    color : str
        The report's heat-map colour for one run whose first finding is its (``"stat"``; the NaN
        origin: ``"events"``). Two runs are always coloured by their relative difference.
    clean_last : bool
        A precondition check (the pre-flight checks): when it finds nothing, its "nothing found"
        result is listed after the other diagnoses' (when it finds something, its priority
        applies as usual).
    flags : callable, optional
        ``flags(ds, finding, *, triage) -> [{"step", "rank", "tensor"}, ...]`` (or a DataFrame with those
        columns): the records of one run the explorer colours as flagged for its finding (besides NaN /
        ±inf); *triage* is the :class:`precnb.pipeline.Triage` (its options, layout and cache). A hook
        ``flags(ds, finding)`` without *triage* still works.
    flag_text : str
        What those records are, in words (``"anomalies"``; default: the title in lower case).
    not_applicable : str
        Why it did not run when *applies* said no (default: "<title> does not apply to these inputs").
    keep : callable, optional
        ``keep(finding, results) -> bool``: whether its finding is listed among the triage's findings,
        given every diagnosis's result by kind (*results*); its check is listed either way. E.g. the
        anomaly list next to a NaN origin is kept only when it holds a spike or a drift.
    unmerged : bool
        Its finding names ranks as dumped, before the target's shards were merged (the replica check): the
        explorer shows it, and its ``flags``, on the target as dumped when there is one.
    checklist : bool
        Its result (found or not) carries a checklist, ``evidence["checks"]`` (the pre-flight checks): the
        CLI summary, the report and the explorer show it as one (:func:`checklist`).
    enrich : callable, optional
        ``enrich(finding, target, baseline)``: evidence its found finding gets from both runs (in place; the
        pipeline calls it for a pair, e.g. the first divergence's coverage gap and ratio hint).
    section : callable, optional
        ``section(finding, *, rows) -> {"title", "columns", "rows"} | None``: its own table in the HTML
        report (plain values, escaped by the report), at most *rows* rows.
    plan : callable, optional
        ``plan(finding, ds, dump_path=..., task=...) -> dict | None``: its own dump plan (the
        shape :func:`precnb.analysis.findings.plan.plan_dump` returns), instead of the generic one
        (:func:`precnb.analysis.findings.plan.generic_plan`); ``task`` is passed only when the caller asked for one.
    stepwise : callable, optional
        ``stepwise(load, steps, *, tolerance, step_offset, crc, alignment) -> Finding``: the same answer read
        step batch by step batch (``load(batch) -> (baseline, target)``, shards merged), so that a fault at an
        early step reads no later one. The pipeline takes it for a pair of dump folders when the diagnoses
        asked for are this one and ones that need the first steps only (*first_steps*).
    first_steps : int
        On a pair it reads the first *first_steps* common steps only (the pre-flight checks: 2), so it can run
        beside a step-wise search; 0 (default): it needs every step.
    inputs : callable or str, optional
        What it reads beside the run: ``inputs(source, options, raw_target, *, loaded, common) -> params``
        merged into :attr:`Context.params` before the diagnoses run. A callable, or ``"module:function"``
        resolved by the pipeline (a diagnosis of this layer may name a reader of the pipeline's without
        importing it).
    options : type, optional
        Its own options: a frozen dataclass of :func:`precnb.analysis.options.option` fields, each a keyword of
        :func:`precnb.diagnose` and a flag of its generated subcommand, read as ``ctx.options[kind]``.
    """

    kind: str
    title: str
    priority: int
    mode: Mode
    run: Callable[[Context], Any]
    description: str
    applies: Callable[[Context], bool] | None = None
    command: str | None = None
    color: str = "stat"
    clean_last: bool = False
    flags: Callable[..., Any] | None = None
    plan: Callable[..., dict[str, Any] | None] | None = None
    flag_text: str = ""
    not_applicable: str = ""
    keep: Callable[[Any, dict[str, Any]], bool] | None = None
    section: Callable[..., dict[str, Any] | None] | None = None
    unmerged: bool = False
    checklist: bool = False
    enrich: Callable[[Any, xr.Dataset, xr.Dataset], None] | None = None
    stepwise: Callable[..., Any] | None = None
    first_steps: int = 0
    inputs: str | Callable[..., dict[str, Any]] | None = None
    options: type | None = None

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
        return self.not_applicable or f"{self.title.lower()} does not apply to these inputs"


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
    """The checks of a result whose diagnosis keeps a checklist (:attr:`Diagnosis.checklist`), else None.

    ``evidence["diagnosis"]`` names the diagnosis (a clean result's kind is ``"none"``).
    """
    ev = getattr(finding, "evidence", None) or {}
    d = lookup(str(ev.get("diagnosis") or getattr(finding, "kind", "")))
    checks = ev.get("checks")
    return list(checks) if d is not None and d.checklist and isinstance(checks, list) else None


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
    return d.priority + (500 if d.clean_last and not found else 0)


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
