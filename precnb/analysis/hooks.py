"""A diagnosis's optional hook groups (:class:`precnb.analysis.registry.Diagnosis`, issue #50 item 2).

A diagnosis is a small core (kind, title, priority, mode, run, description, applies, options) plus the groups
below, each a small frozen dataclass for one front end or one stage of the pipeline; a group left out is its
default (every hook off). Each group is read by one place: :class:`CliHooks` by the CLI, :class:`ExplorerHooks` by
the explorer's flagged records, :class:`ReportHooks` by the summary, the report and the checks, :class:`OrderHooks`
by the ordering of findings, :class:`StepwiseHooks` by the step-wise read of a pair, :class:`FindingHooks` by the
enrichment and the dump plan of a found finding, :class:`InputHooks` by what the pipeline reads beside the run.

Examples
--------
>>> ExplorerHooks(flag_text="anomalies").unmerged
False
>>> sorted(GROUPS)[:3]
['cli', 'explorer', 'finding']
>>> LEGACY["flag_text"]
'explorer'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["GROUPS", "LEGACY", "CliHooks", "ExplorerHooks", "FindingHooks", "InputHooks", "OrderHooks", "ReportHooks",
           "StepwiseHooks"]


@dataclass(frozen=True)
class CliHooks:
    """Its command line.

    Attributes
    ----------
    command : str, optional
        The CLI subcommand that runs it alone, generated from the registry (:mod:`precnb.cli.generated`):
        ``precnb <command> RUN [--baseline BASE] [--json]`` with a flag for each of its options. None: no subcommand.
    help : str
        The subcommand's help (default: "<title>: <description>").
    shared : tuple of str
        The CLI's shared flags it takes (:data:`precnb.cli.generated.SHARED`: ``"step"``, ``"rank_table"``,
        ``"layout"``: ``--layout`` or ``--tp``/``--pp``/..., the target's resolved against its ranks;
        ``"layout_text"``: ``--layout`` as given; ``"baseline_layout"``, ``"step_offset"``, ``"mapping"``), read by the
        pipeline's own options. A diagnosis option (``--limit``, ``--rtol``) is a field of its :attr:`Diagnosis.options`
        instead.
    beside : tuple of str
        Kinds the subcommand runs with it (their options are its flags too; the anomalies: the loss spike).
    base_first : bool
        A diagnosis of either mode (``"any"``) takes ``BASE [TARGET]`` (the one run checked, or the baseline then the
        run compared, as ``precnb diff``) instead of ``RUN [--baseline BASE]``.
    emit : callable or str, optional
        ``emit(triage, args) -> exit code``: how the subcommand prints (a callable or ``"module:function"``, e.g. a
        front-end function the analysis layer does not import); default: the finding, or its JSON with ``--json``.
    """

    command: str | None = None
    help: str = ""
    shared: tuple[str, ...] = ()
    beside: tuple[str, ...] = ()
    base_first: bool = False
    emit: str | Callable[..., int] | None = None


@dataclass(frozen=True)
class ExplorerHooks:
    """The records the explorer colours as flagged for its finding (besides NaN / ±inf).

    Attributes
    ----------
    flags : callable, optional
        ``flags(ds, finding, *, triage) -> [{"step", "rank", "tensor"}, ...]`` (or a DataFrame with those columns);
        *triage* is the :class:`precnb.pipeline.Triage`. A hook ``flags(ds, finding)`` without *triage* still works.
    flag_text : str
        What those records are, in words (``"anomalies"``; default: the title in lower case).
    unmerged : bool
        Its finding names ranks as dumped, before the target's shards were merged (the replica check): the explorer
        shows it, and its ``flags``, on the target as dumped when there is one.
    """

    flags: Callable[..., Any] | None = None
    flag_text: str = ""
    unmerged: bool = False


@dataclass(frozen=True)
class ReportHooks:
    """How its result reads in the CLI summary, the HTML report and the triage's checks.

    Attributes
    ----------
    section : callable, optional
        ``section(finding, *, rows) -> {"title", "columns", "rows"} | None``: its own table in the HTML report (plain
        values, escaped by the report), at most *rows* rows.
    color : str
        The report's heat-map colour for one run whose first finding is its (``"stat"``; the NaN origin:
        ``"events"``). Two runs are always coloured by their relative difference.
    checklist : bool
        Its result (found or not) carries a checklist, ``evidence["checks"]`` (the pre-flight checks): the CLI
        summary, the report and the explorer show it as one (:func:`precnb.analysis.registry.checklist`).
    not_applicable : str
        Why it did not run when *applies* said no (default: "<title> does not apply to these inputs").
    """

    section: Callable[..., dict[str, Any] | None] | None = None
    color: str = "stat"
    checklist: bool = False
    not_applicable: str = ""


@dataclass(frozen=True)
class OrderHooks:
    """Its place among the findings.

    Attributes
    ----------
    keep : callable, optional
        ``keep(finding, results) -> bool``: whether its finding is listed among the triage's findings, given every
        diagnosis's result by kind (*results*); its check is listed either way.
    clean_last : bool
        A precondition check (the pre-flight checks): when it finds nothing, its "nothing found" result is listed
        after the other diagnoses' (when it finds something, its priority applies as usual).
    """

    keep: Callable[[Any, dict[str, Any]], bool] | None = None
    clean_last: bool = False


@dataclass(frozen=True)
class StepwiseHooks:
    """How it reads a pair of dump folders step batch by step batch.

    Attributes
    ----------
    stepwise : callable, optional
        ``stepwise(load, steps, *, tolerance, step_offset, crc, alignment) -> Finding``: the same answer read step
        batch by step batch (``load(batch) -> (baseline, target)``, shards merged), so that a fault at an early step
        reads no later one. Taken for a pair of dump folders when the diagnoses asked for are this one and ones that
        need the first steps only (*first_steps*).
    first_steps : int
        On a pair it reads the first *first_steps* common steps only (the pre-flight checks: 2), so it can run beside
        a step-wise search; 0: it needs every step.
    """

    stepwise: Callable[..., Any] | None = None
    first_steps: int = 0


@dataclass(frozen=True)
class FindingHooks:
    """What its found finding gets beside what the run gives.

    Attributes
    ----------
    enrich : callable, optional
        ``enrich(finding, target, baseline)``: evidence from both runs (in place; called for a pair, e.g. the first
        divergence's coverage gap and ratio hint).
    plan : callable, optional
        ``plan(finding, ds, dump_path=..., task=...) -> dict | None``: its own dump plan (the shape
        :func:`precnb.analysis.findings.plan.plan_dump` returns) instead of the generic one; ``task`` is passed only
        when the caller asked for one.
    """

    enrich: Callable[[Any, Any, Any], None] | None = None
    plan: Callable[..., dict[str, Any] | None] | None = None


@dataclass(frozen=True)
class InputHooks:
    """What it reads beside the run.

    Attributes
    ----------
    inputs : callable or str, optional
        ``inputs(source, options, raw_target, *, loaded, common) -> params`` merged into ``Context.params`` before
        the diagnoses run: a callable, or ``"module:function"`` resolved by the pipeline (a diagnosis of the analysis
        layer may name a reader of the pipeline's without importing it).
    """

    inputs: str | Callable[..., dict[str, Any]] | None = None


#: every hook group by the :class:`~precnb.analysis.registry.Diagnosis` field that holds it
GROUPS: dict[str, type] = {"cli": CliHooks, "explorer": ExplorerHooks, "report": ReportHooks, "order": OrderHooks,
                           "steps": StepwiseHooks, "finding": FindingHooks, "reads": InputHooks}
#: each hook's group, by the hook's name (``Diagnosis(flags=...)`` as before the groups: :meth:`Diagnosis.__init__`)
LEGACY: dict[str, str] = {f.name: group for group, cls in GROUPS.items() for f in fields(cls)}
