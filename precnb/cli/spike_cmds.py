"""``precnb spike``: why did the loss spike (step, rank, origin, cause), from a dump and/or a monitor output.

The subcommand is generated from the loss-spike diagnosis (:mod:`precnb.cli.generated`); this module is how it
prints (:func:`emit`).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from precnb.cli import _term

__all__ = ["emit"]


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


def emit(triage: Any, args: argparse.Namespace) -> int:
    """How ``precnb spike`` prints: the finding and the loss around the spike, or the finding's JSON.

    It is the loss-spike diagnosis's :class:`~precnb.analysis.hooks.CliHooks` ``emit``.
    """
    f = triage.finding
    if args.json:
        _term.out(f.to_json(indent=2) + "\n")
        return 0
    table = _loss_table(f)
    _term.out(f.summary(_term.WIDTH) + ("\n" + "\n".join(table) if table else "") + "\n")
    return 0
