"""``precnb spike``: why did the loss spike (step, rank, origin, cause), from a dump and/or a monitor output."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from precnb.cli import _term
from precnb.cli._args import integer
from precnb.cli._side import add_side_options, side_options

__all__ = ["register"]


def _fmt(v: float) -> str:
    return "-" if not isinstance(v, float) or math.isnan(v) else f"{v:.4g}"


def _loss_table(f: Any) -> list[str]:
    loss = f.evidence.get("loss") or {}
    steps = loss.get("steps") or []
    if not steps:
        return []
    keys = [k for k in loss if k.startswith("rank")] + ["all"]
    lines = ["  loss around the spike:", "    " + "step".ljust(8) + "".join(k.ljust(10) for k in keys)]
    for i, s in enumerate(steps):
        mark = " <" if s == f.step else ""
        lines.append("    " + str(s).ljust(8) + "".join(_fmt(loss[k][i]).ljust(10) for k in keys) + mark)
    return lines


def _cmd_spike(args: argparse.Namespace) -> int:
    from precnb.cli._common import UsageError
    from precnb.cli.analysis_cmds import run_triage

    extra = side_options(args)
    if args.limit is not None:
        extra["limit"] = args.limit
    try:
        f = run_triage(args, args.run, kinds=["loss_spike"], **extra).finding
    except TypeError as exc:  # a loss option of the wrong kind
        raise UsageError(str(exc)) from None
    if args.json:
        _term.out(f.to_json(indent=2) + "\n")
        return 0
    text = f.summary(_term.WIDTH)
    table = _loss_table(f)
    _term.out(text + ("\n" + "\n".join(table) if table else "") + "\n")
    return 0


def register(sub: Any, add_load_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``spike`` to *sub*."""
    p = sub.add_parser("spike", help="why did the loss spike: step, rank, origin (batch, parameter, op) and cause",
                       description="Find the first step whose loss departs from its own recent history and attribute "
                                   "it: the rank that spiked first, the batch input / parameter / op of the origin, "
                                   "and the cause (data, optimizer, hardware, numerics), most likely first, with the "
                                   "lead indicators and the dump that confirms it. RUN is a dump or a monitor output.")
    p.add_argument("run", metavar="RUN", help="msprobe dump (the steps around the spike suffice) or monitor output")
    add_side_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON finding")
    p.add_argument("--limit", type=integer(0, 10**9), default=None, help="how many further candidates to list")
    add_load_options(p)
    p.set_defaults(func=_cmd_spike)
