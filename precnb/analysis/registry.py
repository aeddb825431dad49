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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import xarray as xr

__all__ = [
    "BUILTIN_MODULES",
    "Context",
    "Diagnosis",
    "diagnoses",
    "get",
    "kinds",
    "register",
    "title",
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
        Per-diagnosis options (``spike_rule``, ``limit``, ``replica_rtol``, ...).
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
        The CLI subcommand that runs it alone.
    color : str
        The explorer's heat-map colour when showing its finding.
    clean_last : bool
        A precondition check (the pre-flight checks): when it finds nothing, its "nothing found"
        result is listed after the other diagnoses' (when it finds something, its priority
        applies as usual).
    flags : callable, optional
        ``flags(ds, finding) -> [{"step", "rank", "tensor"}, ...]``: the records of one run the
        explorer colours as flagged for its finding (besides NaN / ±inf).
    plan : callable, optional
        ``plan(finding, ds, dump_path=..., task=...) -> dict | None``: its own dump plan (the
        shape :func:`precnb.analysis.plan.plan_dump` returns), instead of the generic one
        (:func:`precnb.analysis.plan.generic_plan`); ``task`` is passed only when the caller asked for one.
    """

    kind: str
    title: str
    priority: int
    mode: Mode
    run: Callable[[Context], Any]
    description: str
    applies: Callable[[Context], bool] | None = None
    command: str | None = None
    color: str = "first_bad"
    clean_last: bool = False
    flags: Callable[[xr.Dataset, Any], list[dict[str, Any]]] | None = None
    plan: Callable[..., dict[str, Any] | None] | None = None

    def applicable(self, ctx: Context) -> bool:
        """Whether it runs on *ctx*."""
        if self.mode == "single" and ctx.paired:
            return False
        if self.mode == "pair" and not ctx.paired:
            return False
        return True if self.applies is None else bool(self.applies(ctx))


_REGISTRY: dict[str, Diagnosis] = {}
_TITLES_WITHOUT_DIAGNOSIS = {"none": "Nothing found"}
BUILTIN_MODULES: tuple[str, ...] = ("precnb.analysis.diagnoses", "precnb.analysis.spike.diagnosis")
"""Modules whose import registers the built-in diagnoses."""
_loaded = False


def register(diagnosis: Diagnosis, *, replace: bool = False) -> Diagnosis:
    """Add *diagnosis* to the registry (``replace=True`` to override a kind).

    Raises
    ------
    ValueError
        When the kind is already registered and *replace* is false.
    """
    if diagnosis.kind in _REGISTRY and not replace and _REGISTRY[diagnosis.kind] is not diagnosis:
        raise ValueError(f"a diagnosis of kind {diagnosis.kind!r} is already registered")
    _REGISTRY[diagnosis.kind] = diagnosis
    return diagnosis


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in BUILTIN_MODULES:
        importlib.import_module(mod)
    from importlib.metadata import entry_points

    for ep in entry_points(group="precnb.diagnoses"):
        try:
            ep.load()
        except Exception as exc:  # a broken plug-in must not break precnb
            import warnings

            warnings.warn(f"precnb: diagnosis plug-in {ep.name!r} failed to load: {exc}", stacklevel=2)


def diagnoses(kinds: Sequence[str] | None = None) -> list[Diagnosis]:
    """Registered diagnoses by priority (only *kinds* when given, in priority order).

    Raises
    ------
    ValueError
        For a kind that is not registered.
    """
    _load()
    if kinds is not None:
        unknown = [k for k in kinds if k not in _REGISTRY]
        if unknown:
            raise ValueError(f"unknown diagnosis kind(s) {unknown}; known: {sorted(_REGISTRY)}")
        chosen = [_REGISTRY[k] for k in dict.fromkeys(kinds)]
    else:
        chosen = list(_REGISTRY.values())
    return sorted(chosen, key=lambda d: (d.priority, d.kind))


def get(kind: str) -> Diagnosis:
    """The diagnosis of *kind* (KeyError when unknown)."""
    _load()
    return _REGISTRY[kind]


def kinds() -> list[str]:
    """Every registered finding kind (by priority), plus ``"none"``."""
    return [d.kind for d in diagnoses()] + ["none"]


def title(kind: str) -> str:
    """Display title of a finding kind (the kind itself when unknown)."""
    _load()
    d = _REGISTRY.get(kind)
    if d is not None:
        return d.title
    return _TITLES_WITHOUT_DIAGNOSIS.get(kind, kind.replace("_", " "))


def priority(kind: str, *, found: bool = True) -> int:
    """Ordering key of a finding kind (unknown kinds after the known ones).

    With ``found=False``, the key of the diagnosis's "nothing found" result (``clean_last``
    diagnoses after the others).
    """
    _load()
    d = _REGISTRY.get(kind)
    if d is None:
        return 1000
    return d.priority + (500 if d.clean_last and not found else 0)
