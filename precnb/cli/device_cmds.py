"""``precnb devices``: replica departures followed to hosts and devices across jobs (issue 28).

``precnb devices RUN [RUN ...] --rank-table T [--rank-table T ...] [--baseline RUN] [--tp N ...] [--json]``
pairs each run with its rank table (one table for all runs, or one per run, in order) and prints
``{"devices": [{"host", "device", "ranks", "departures", "verdict", "why"}]}``, most suspect first.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from precnb.cli import _term

__all__ = ["register"]


def _names(runs: list[str]) -> list[str]:
    """Display names: each run's folder name, or its path where two share one."""
    base = [os.path.basename(os.path.normpath(r)) or r for r in runs]
    return base if len(set(base)) == len(base) else list(runs)


def _layout(args: argparse.Namespace) -> Any:
    if args.layout:
        return args.layout
    parts = [f"{k}={getattr(args, k)}" for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "order", "num_layers")
             if getattr(args, k, None) is not None]
    if not parts:
        from precnb.cli._common import UsageError

        raise UsageError("give the jobs' layout: --layout tp=2,dp=2 or --tp N (--pp, --cp, ...)")
    return ",".join(parts)


def _text(devices: list[dict[str, Any]]) -> str:
    lines = []  # control characters are escaped by _term.out
    n = sum(1 for d in devices if d["verdict"] == "suspect")
    lines.append(f"DEVICES: {n} suspect of {len(devices)}" + (" (most suspect first)" if n else ""))
    for d in devices:
        ranks = ", ".join(f"{run} rank {r}" for run, r in d["ranks"].items())
        lines.append(f"  {d['verdict'].upper():<12} {d['host']}:{d['device']}  ({ranks})")
        lines.append(f"    {d['why']}")
        for x in d["departures"][:6]:
            lines.append(f"    departure {x['run']} step {x['step']} rank {x['rank']} {x['node']}"
                         f"  inputs identical: {'yes' if x['inputs_identical'] else 'no'}")
        if len(d["departures"]) > 6:
            lines.append(f"    ... {len(d['departures']) - 6} more (--json lists all)")
    return "\n".join(lines)


def _cmd_devices(args: argparse.Namespace) -> int:
    from precnb.analysis import LayoutError
    from precnb.analysis.findings import to_json
    from precnb.cli._common import UsageError
    from precnb.cli.analysis_cmds import triage_options
    from precnb.pipeline.run import follow_devices

    tables = list(args.rank_table or [])
    if not tables:
        raise UsageError("give --rank-table (one for all runs, or one per run in the order of the runs)")
    if len(tables) not in (1, len(args.runs)):
        raise UsageError(f"{len(args.runs)} runs and {len(tables)} rank tables: give one table, or one per run")
    names = _names(args.runs)
    paired = dict(zip(names, tables * len(names) if len(tables) == 1 else tables, strict=True))
    base = triage_options(args)  # --workers, --format, --steps, --ranks, --rtol as the other commands take them
    opts = {k: getattr(base, k) for k in ("format", "workers", "steps", "ranks", "client") if getattr(base, k)
            is not None}
    if args.rtol is not None:
        opts["replica_rtol"] = args.rtol
    if args.rng_region:
        opts["rng_regions"] = tuple(args.rng_region)
    try:
        out = follow_devices(dict(zip(names, args.runs, strict=True)), paired, layout=_layout(args),
                             baseline=args.replica_baseline, **opts)
    except (LayoutError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    for note in out.get("notes", []):  # rows of a rank table for ranks its run does not have (#49)
        _term.err(f"precnb devices: note: {' '.join(note.split())}\n")
    if args.json:
        _term.out(to_json({"devices": out["devices"]}, indent=2) + "\n")
    else:
        _term.out(_text(out["devices"]) + "\n")
    return 0


def register(sub: Any, add_load_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the ``devices`` sub-command to *sub*."""
    from precnb.cli.analysis_parsers import add_layout_options as _add_layout_options
    from precnb.cli.analysis_parsers import add_rng_region_option
    from precnb.cli.analysis_parsers import positive as _positive

    p = sub.add_parser("devices", help="follow replica departures to hosts and devices across jobs: the faulty "
                       "device", description="Check each RUN's replicas (its layout: --layout or --tp ...), classify "
                       "each departure, map ranks to hosts and devices with its rank table and follow the devices "
                       "across steps and jobs. A device whose replicas departed with identical inputs in more than "
                       "one job (or, decided by --baseline or a third replica, at several steps) is suspect; a "
                       "departure that follows a rank across devices points at code or data.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="the jobs (dump roots), e.g. the same training "
                                                           "rescheduled with another rank placement")
    p.add_argument("--rank-table", action="append", metavar="T",
                   help="HCCL rank_table_file JSON or rank,host,device CSV: one for all runs, or one per run "
                        "(repeat, in the order of the runs)")
    p.add_argument("--baseline", dest="replica_baseline", metavar="RUN",
                   help="a clean run of the same training: decides which side of a two-replica departure is wrong")
    p.add_argument("--json", action="store_true", help='print {"devices": [...]}')
    p.add_argument("--rtol", type=_positive, default=None, help="relative tolerance of the replica check")
    add_rng_region_option(p)
    _add_layout_options(p)
    add_load_options(p)
    p.set_defaults(func=_cmd_devices)
