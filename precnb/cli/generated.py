"""Subcommands generated from the diagnosis registry (issue #27 item 2).

Every registered :class:`~precnb.analysis.registry.Diagnosis` with a ``command`` that no hand-written
subcommand already uses gets one: a diagnosis of one run (``mode="single"``) is
``precnb COMMAND RUN``, one of a pair (``"pair"``) ``precnb COMMAND BASE TARGET`` (baseline first, as
``precnb diff``), one of either (``"any"``) ``precnb COMMAND RUN [--baseline BASE]``; each with
``--json`` (the finding, ``precnb.finding/1``), the loading options and a flag for each field of the
diagnosis's own options (:attr:`~precnb.analysis.registry.Diagnosis.options`: the field's ``flag`` and ``help``,
its default said). It runs ``precnb.diagnose(..., kinds=[kind], **given_options)``, so a plug-in diagnosis and
its options are on the command line once registered.
The built-in diagnoses keep their own subcommands (``diff``, ``nan``, ``anomalies``, ``replicas``,
``spike``, ``preflight``), which add options of their own.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any

__all__ = ["register"]


def _run(kind: str, names: tuple[str, ...], args: argparse.Namespace) -> int:
    from precnb.cli.analysis_cmds import _emit_finding, run_triage

    given = {n: getattr(args, f"opt_{n}") for n in names if getattr(args, f"opt_{n}") is not None}
    given = {n: tuple(v) if isinstance(v, list) else v for n, v in given.items()}  # appended flags: frozen options
    if getattr(args, "target", None) is not None:  # a pair: BASE TARGET
        triage = run_triage(args, args.target, args.base, kinds=[kind], **given)
    else:
        triage = run_triage(args, args.run, getattr(args, "baseline", None), kinds=[kind], **given)
    return _emit_finding(triage.result(kind) or triage.finding, args)


def _add_options(p: argparse.ArgumentParser, cls: type | None) -> tuple[str, ...]:
    """A flag for each field of a diagnosis's options dataclass; returns the field names."""
    if cls is None:
        return ()
    import dataclasses

    names = []
    for f in dataclasses.fields(cls):
        md = f.metadata
        flag = md.get("flag") or "--" + f.name.replace("_", "-")
        default = "" if f.default in (None, (), dataclasses.MISSING) else f" (default {f.default})"
        p.add_argument(flag, dest=f"opt_{f.name}", default=None, help=str(md.get("help", "")) + default,
                       **dict(md.get("argparse") or {}))
        names.append(f.name)
    return tuple(names)


def register(sub: Any, add_load_options: Callable[[argparse.ArgumentParser], None]) -> list[str]:
    """Add a subcommand to *sub* for each registered diagnosis without one; returns their names."""
    from precnb.analysis import registry

    added = []
    for d in registry.diagnoses():
        if not d.cli.command or d.cli.command in sub.choices:
            continue
        p = sub.add_parser(d.cli.command, help=f"{d.title}: {d.description}", description=f"{d.title}: {d.description}")
        if d.mode == "pair":
            p.add_argument("base", help="the baseline run")
            p.add_argument("target", help="the run diagnosed")
        else:
            p.add_argument("run", help="the run diagnosed")
        if d.mode == "any":
            p.add_argument("--baseline", default=None, help="a baseline run to compare with")
        p.add_argument("--json", action="store_true", help="print the finding as JSON (precnb.finding/1)")
        add_load_options(p)
        names = _add_options(p, d.options)
        p.set_defaults(func=functools.partial(_run, d.kind, names))
        added.append(d.cli.command)
    return added
