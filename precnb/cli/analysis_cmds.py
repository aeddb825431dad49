"""Sub-commands backed by :mod:`precnb.analysis`: ``diff``, ``nan``, ``anomalies``.

With ``--json`` each prints exactly one JSON object (a Finding, see
:mod:`precnb.analysis.findings`) on stdout; without it, a readable summary. They exit 0
whether or not something was found.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["register"]


def _parse_offset(text: str) -> int | str:
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return v


def _emit_finding(finding: Any, args: argparse.Namespace) -> int:
    if args.json:
        sys.stdout.write(finding.to_json(indent=2) + "\n")
    else:
        sys.stdout.write(finding.summary() + "\n")
    return 0


def _steps_arg(args: argparse.Namespace) -> list[int] | None:
    from precnb.cli import parse_int_set

    if getattr(args, "step", None) is not None:
        return [args.step]
    return parse_int_set(args.steps, "steps")


def _load(path: str, args: argparse.Namespace, *, steps: list[int] | None) -> Any:
    import warnings

    from precnb.cli import parse_int_set
    from precnb.io.api import open_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return open_run(path, format=args.format, steps=steps, ranks=parse_int_set(args.ranks, "ranks"))


def _cmd_diff(args: argparse.Namespace) -> int:
    from precnb.analysis import Tolerance, first_divergence

    steps = _steps_arg(args)
    offset = args.step_offset
    load_steps = steps if offset == 0 else None
    base = _load(args.baseline, args, steps=load_steps)
    target = _load(args.target, args, steps=load_steps)
    tol_kw: dict[str, Any] = {}
    if args.rtol is not None:
        tol_kw["rtol"] = args.rtol
    tol = Tolerance(**tol_kw)
    if args.reference:
        ref_a = _load(args.reference[0], args, steps=None)
        ref_b = _load(args.reference[1], args, steps=None)
        tol = Tolerance.calibrate(ref_a, ref_b, **tol_kw)
    if args.baseline_layout or args.target_layout:
        from precnb.analysis.layout import Layout, merge_shards

        if args.baseline_layout:
            base = merge_shards(base, Layout.parse(args.baseline_layout, world_size=base.sizes["rank"]))
        if args.target_layout:
            target = merge_shards(target, Layout.parse(args.target_layout, world_size=target.sizes["rank"]))
    from precnb.cli import UsageError

    try:
        finding = first_divergence(base, target, tolerance=tol, steps=steps,
                                   ranks=None, step_offset=offset,
                                   crc="strict" if args.crc_strict else "report")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return _emit_finding(finding, args)


def _cmd_nan(args: argparse.Namespace) -> int:
    from precnb.analysis import nan_origin

    ds = _load(args.run, args, steps=_steps_arg(args))
    return _emit_finding(nan_origin(ds), args)


def _cmd_anomalies(args: argparse.Namespace) -> int:
    from precnb.analysis import SpikeRule, anomalies

    ds = _load(args.run, args, steps=_steps_arg(args))
    rule = SpikeRule(z=args.z, ratio=args.ratio, stats=tuple(args.stat or ("norm",)))
    return _emit_finding(anomalies(ds, rule=rule, limit=args.limit), args)


def register(sub: Any, add_load_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the analysis sub-commands to *sub*."""
    p = sub.add_parser("diff", help="first divergence between a baseline and a target run")
    p.add_argument("baseline")
    p.add_argument("target")
    p.add_argument("--json", action="store_true", help="print one JSON finding")
    p.add_argument("--step", type=int, help="only this step")
    p.add_argument("--step-offset", type=_parse_offset, default=0,
                   help="target step = baseline step + OFFSET, or 'auto' (resumed runs)")
    p.add_argument("--rtol", type=_positive, help="one relative tolerance for all tensors "
                   "(default: by dtype, bf16 2^-8, fp16 2^-11, fp32 2^-14)")
    p.add_argument("--reference", nargs=2, metavar=("RUN_A", "RUN_B"),
                   help="calibrate tolerances from two healthy runs of the same job")
    p.add_argument("--crc-strict", action="store_true",
                   help="count CRC differences with identical statistics as divergence")
    p.add_argument("--baseline-layout", help="merge baseline shards first, e.g. tp=2,pp=2")
    p.add_argument("--target-layout", help="merge target shards first, e.g. tp=2")
    add_load_options(p)
    p.set_defaults(func=_cmd_diff)

    p = sub.add_parser("nan", help="where NaN (or a new ±inf) first appeared, across ranks")
    p.add_argument("run")
    p.add_argument("--json", action="store_true", help="print one JSON finding")
    p.add_argument("--step", type=int, help="only this step")
    add_load_options(p)
    p.set_defaults(func=_cmd_nan)

    p = sub.add_parser("anomalies", help="NaN/Inf transitions and spikes over steps, ranked")
    p.add_argument("run")
    p.add_argument("--json", action="store_true", help="print one JSON finding")
    p.add_argument("--step", type=int, help="only this step")
    p.add_argument("--z", type=_positive, default=10.0, help="robust z-score threshold (default 10)")
    p.add_argument("--ratio", type=_positive, default=5.0, help="minimum jump ratio (default 5)")
    p.add_argument("--stat", action="append", default=None,
                   help="statistic(s) to test for spikes (default norm)")
    p.add_argument("--limit", type=int, default=50, help="how many further anomalies to list")
    add_load_options(p)
    p.set_defaults(func=_cmd_anomalies, stat_default=("norm",))
