"""Subcommands generated from the diagnosis registry (issue #27 item 2, issue #50 item 2).

Every registered :class:`~precnb.analysis.registry.Diagnosis` with a command (its
:class:`~precnb.analysis.hooks.CliHooks`) that no hand-written subcommand already uses gets one: a diagnosis of one
run (``mode="single"``) is ``precnb COMMAND RUN``, one of a pair (``"pair"``) ``precnb COMMAND BASE TARGET``
(baseline first, as ``precnb diff``), one of either (``"any"``) ``precnb COMMAND RUN [--baseline BASE]``; each with
``--json`` (the finding, ``precnb.finding/1``), the loading options, the CLI's shared flags it asks for
(:data:`SHARED`: ``--step``, ``--rank-table``, the layout flags) and a flag for each field of its own options and of
the options of the diagnoses it runs beside (:attr:`CliHooks.beside`; ``--limit`` is one), once per name: the
field's ``flag`` and ``help``, its default said, its ``type`` a validating one (:data:`TYPES`). It runs
``precnb.diagnose(..., kinds=[kind, *beside], **given_options)`` and prints the finding, or calls the diagnosis's
``emit`` hook; so ``preflight``, ``nan``, ``anomalies``, ``replicas``, ``spike`` and a plug-in diagnosis are on the
command line once registered. ``diff`` stays hand-written (one input holding two runs, the pre-flight checks beside
the search), as ``align`` and ``merge`` (no diagnosis).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any

from precnb.cli._args import MAX_INDEX, existing_folder, integer, number

__all__ = ["SHARED", "TYPES", "register"]

#: what an option's ``type`` metadata may name (a plain ``int`` / ``float`` becomes a validating one)
TYPES: dict[Any, Any] = {int: integer(), float: number(), "positive": number(0), "count": integer(0, 10**9),
                         "folder": existing_folder}


def _step(p: argparse.ArgumentParser) -> None:
    p.add_argument("--step", type=integer(0, MAX_INDEX), help="only this step")


def _rank_table(p: argparse.ArgumentParser) -> None:
    from precnb.cli.analysis_parsers import add_rank_table_option

    add_rank_table_option(p)


def _layout(p: argparse.ArgumentParser) -> None:
    from precnb.cli.analysis_parsers import add_layout_options

    add_layout_options(p)


def _layout_text(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", help="layout of the checked (target) run, e.g. tp=2,dp=2: which ranks share a batch "
                   "by design (TP, CP, PP groups); with two runs its shards are merged before comparing")


def _baseline_layout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline-layout", help="layout of BASE when TARGET is given (merge its shards first)")


def _step_offset(p: argparse.ArgumentParser) -> None:
    from precnb.cli.analysis_parsers import add_step_offset_option

    add_step_offset_option(p)


def _mapping(p: argparse.ArgumentParser) -> None:
    from precnb.cli.analysis_parsers import add_mapping_option

    add_mapping_option(p)


#: the CLI's shared flags a diagnosis may ask for (:attr:`CliHooks.shared`), read by the pipeline's own options
SHARED: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "step": _step, "rank_table": _rank_table, "layout": _layout, "layout_text": _layout_text,
    "baseline_layout": _baseline_layout, "step_offset": _step_offset, "mapping": _mapping}


def _resolve(ref: Any) -> Any:
    """A callable, or ``"module:function"`` imported."""
    if not isinstance(ref, str):
        return ref
    mod, _, name = ref.partition(":")
    return getattr(importlib.import_module(mod), name)


def _run(kind: str, beside: tuple[str, ...], names: tuple[str, ...], emit: Any, args: argparse.Namespace) -> int:
    from precnb.cli.analysis_cmds import _emit_finding, run_triage

    given: dict[str, Any] = {n: getattr(args, f"opt_{n}") for n in names if getattr(args, f"opt_{n}") is not None}
    given = {n: tuple(v) if isinstance(v, list) else v for n, v in given.items()}  # appended flags: frozen options
    kinds = [kind, *beside]
    if hasattr(args, "num_layers"):  # the layout flags: the target's layout, resolved against the run's ranks
        from precnb.cli.analysis_cmds import layout_run

        run, given["target_layout"] = layout_run(args)
        triage = run_triage(args, run, getattr(args, "baseline", None), kinds=kinds, **given)
    else:
        if getattr(args, "layout", None):  # the layout as given: the target's
            given["target_layout"] = args.layout
        triage = _triage(args, kinds, given)
    if emit is not None:
        return int(_resolve(emit)(triage, args))
    return _emit_finding(triage.result(kind) or triage.finding, args)


def _triage(args: argparse.Namespace, kinds: list[str], given: dict[str, Any]) -> Any:
    """The triage of the runs the command line gave (RUN [--baseline BASE], BASE TARGET or BASE [TARGET])."""
    from precnb.cli.analysis_cmds import run_triage

    if getattr(args, "target", None) is not None:  # a pair: BASE TARGET
        return run_triage(args, args.target, args.base, kinds=kinds, **given)
    run = args.run if hasattr(args, "run") else args.base  # RUN, or BASE alone (BASE [TARGET])
    return run_triage(args, run, getattr(args, "baseline", None), kinds=kinds, **given)


def _default_text(v: Any) -> str:
    if v in (None, (), dataclasses.MISSING):
        return ""
    if isinstance(v, float):
        return f" (default {v:g})"
    if isinstance(v, tuple):
        return f" (default {', '.join(map(str, v))})"
    return f" (default {v})"


def _add_options(p: argparse.ArgumentParser, classes: list[type], seen: set[str]) -> tuple[str, ...]:
    """A flag for each field of the diagnoses' options dataclasses (once per name); returns the field names."""
    names = []
    for cls in classes:
        for f in dataclasses.fields(cls):
            if f.name in seen:
                continue
            seen.add(f.name)
            md = f.metadata
            flag = md.get("flag") or "--" + f.name.replace("_", "-")
            kw = dict(md.get("argparse") or {})
            if "type" in kw:
                kw["type"] = TYPES.get(kw["type"], kw["type"])
            if kw.get("action") in (None, "append", "store") and "choices" not in kw:
                kw.setdefault("metavar", flag.lstrip("-").replace("-", "_").upper())
            p.add_argument(flag, dest=f"opt_{f.name}", default=None,
                           help=str(md.get("help", "")) + _default_text(f.default), **kw)
            names.append(f.name)
    return tuple(names)


def _flags(d: Any) -> set[str]:
    """The flags of a diagnosis's own options."""
    fields = dataclasses.fields(d.options) if d.options is not None else ()
    return {f.metadata.get("flag") or "--" + f.name.replace("_", "-") for f in fields}


def _parser(sub: Any, d: Any) -> argparse.ArgumentParser:
    """The subcommand's parser with its positional runs and ``--json``."""
    what = d.cli.help or f"{d.title}: {d.description}"
    p = sub.add_parser(d.cli.command, help=what, description=what)
    if d.mode == "any" and d.cli.base_first:
        p.add_argument("base", metavar="BASE", help="the baseline run, or the one run checked")
        p.add_argument("target", metavar="TARGET", nargs="?", help="the run compared with BASE")
    elif d.mode == "pair":
        p.add_argument("base", help="the baseline run")
        p.add_argument("target", help="the run diagnosed")
    else:
        p.add_argument("run", help="the run diagnosed")
    if d.mode == "any" and not d.cli.base_first and "--baseline" not in _flags(d):  # (the replica check's own)
        p.add_argument("--baseline", default=None, help="a baseline run to compare with")
    what_json = "print the finding as JSON (precnb.finding/1)" if d.cli.emit is None else "print one JSON object"
    p.add_argument("--json", action="store_true", help=what_json)
    return p


def register(sub: Any, add_load_options: Callable[[argparse.ArgumentParser], None]) -> list[str]:
    """Add a subcommand to *sub* for each registered diagnosis without one; returns their names."""
    from precnb.analysis import registry

    added = []
    for d in registry.diagnoses():
        if not d.cli.command or d.cli.command in sub.choices:
            continue
        p = _parser(sub, d)
        for name in d.cli.shared:
            SHARED[name](p)
        beside = tuple(k for k in d.cli.beside if registry.lookup(k) is not None)
        classes = [x.options for x in (d, *map(registry.get, beside)) if x.options is not None]
        names = _add_options(p, classes, set())
        add_load_options(p)
        p.set_defaults(func=functools.partial(_run, d.kind, beside, names, d.cli.emit))
        added.append(d.cli.command)
    return added
