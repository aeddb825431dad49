"""``precnb spike``: why did the loss spike (step, rank, origin, cause), from a dump and/or a monitor output."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from precnb.cli import _term
from precnb.cli._args import existing_folder, integer

__all__ = ["add_side_options", "register", "side_options", "with_loss_spike"]


def side_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``monitor`` / ``loss`` pipeline options a command line gave."""
    out: dict[str, Any] = {}
    if getattr(args, "monitor", None):
        out["monitor"] = args.monitor
    if getattr(args, "loss", None):
        out["loss"] = args.loss
    return out


def add_side_options(p: argparse.ArgumentParser) -> None:
    """``--monitor DIR`` and ``--loss FILE``: read beside the run."""
    p.add_argument("--monitor", type=existing_folder, metavar="DIR",
                   help="msprobe monitor output (TrainerMon) of the same job, read beside RUN")
    p.add_argument("--loss", metavar="FILE",
                   help="loss log of every step: CSV step,loss[,rank], or TensorBoard event files (a file or a folder)")


def with_loss_spike(triage: Any, args: argparse.Namespace) -> int:
    """``precnb anomalies``: the anomaly finding, with the loss spike beside it when one is found.

    ``--json`` prints the anomaly finding (its shape unchanged) with ``values["loss_spike"]``
    (step, rank, origin, first cause) and a hint; the text prints both findings.
    """
    anomaly = triage.result("anomaly") or triage.finding
    spike = triage.result("loss_spike")
    if spike is not None and spike.found:
        first = spike.causes[0] if spike.causes else {}
        anomaly.values["loss_spike"] = {"step": spike.step, "rank": spike.rank, "node": spike.node,
                                        "tensor": spike.tensor, "module": spike.module,
                                        "cause": first.get("cause"), "certain": first.get("certain")}
        anomaly.hints.append(f"loss spike at step {spike.step}"
                             + (f" (origin rank {spike.rank})" if spike.rank is not None else "")
                             + (f": {first.get('cause')}" if first else "") + " — `precnb spike` explains it")
    if args.json:
        _term.out(anomaly.to_json(indent=2) + "\n")
    else:
        shown = [anomaly] + ([spike] if spike is not None and spike.found else [])
        _term.out("\n\n".join(f.summary() for f in shown) + "\n")
    return 0


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
    text = f.summary()
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
