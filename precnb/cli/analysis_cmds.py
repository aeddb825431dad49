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

from precnb.cli import int_or_auto

__all__ = ["register"]


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
    """Open *path*; unreadable files are named on stderr and make the command exit 1."""
    from precnb.cli import open_checked

    return open_checked(path, args, steps=steps, use_steps_option=False)


def _tolerance(args: argparse.Namespace) -> Any:
    from precnb.analysis import Tolerance

    tol_kw: dict[str, Any] = {}
    if args.rtol is not None:
        tol_kw["rtol"] = args.rtol
    if args.reference:
        ref_a = _load(args.reference[0], args, steps=None)
        ref_b = _load(args.reference[1], args, steps=None)
        return Tolerance.calibrate(ref_a, ref_b, **tol_kw)
    return Tolerance(**tol_kw)


def _merge_layouts(base: Any, target: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    """Merge shards first when ``--baseline-layout`` / ``--target-layout`` are given."""
    if not (args.baseline_layout or args.target_layout):
        return base, target
    from precnb.analysis import Layout, LayoutError, merge_shards
    from precnb.cli import UsageError

    try:
        b_lay = Layout.parse(args.baseline_layout, world_size=base.sizes["rank"]) \
            if args.baseline_layout else None
        t_lay = Layout.parse(args.target_layout, world_size=target.sizes["rank"]) \
            if args.target_layout else None
        merged_base = merge_shards(base, b_lay, reference=None if t_lay else target) if b_lay else base
        if t_lay:
            target = merge_shards(target, t_lay, reference=None if b_lay else base)
        return merged_base, target
    except LayoutError as exc:
        raise UsageError(str(exc)) from None


def _stepwise_plan(args: argparse.Namespace, steps: list[int] | None, offset: int) -> list[int] | None:
    """Baseline steps to search one batch at a time, or None when the inputs must be read whole.

    Stepwise needs both step lists without parsing (msprobe dumps, zarr stores) and at least
    two steps to search.
    """
    from precnb.cli import parse_int_set
    from precnb.io.api import available_steps

    fmt = getattr(args, "format", None)
    ranks = parse_int_set(getattr(args, "ranks", None), "ranks")
    bsteps = available_steps(args.baseline, format=fmt, ranks=ranks)
    tsteps = available_steps(args.target, format=fmt, ranks=ranks)
    if bsteps is None or tsteps is None:
        return None
    search = [s for s in bsteps if s + offset in set(tsteps)]
    if steps is not None:
        search = [s for s in search if s in set(steps)]
    return search if len(search) >= 2 else None


def _diff_stepwise(args: argparse.Namespace, search: list[int], offset: int, tol: Any, crc: Any) -> Any:
    from precnb.analysis import first_divergence_stepwise

    def load(batch: list[int]) -> tuple[Any, Any]:
        base = _load(args.baseline, args, steps=batch)
        target = _load(args.target, args, steps=[s + offset for s in batch])
        return _merge_layouts(base, target, args)

    return first_divergence_stepwise(load, search, tolerance=tol, step_offset=offset, crc=crc)


def _cmd_diff(args: argparse.Namespace) -> int:
    from precnb.analysis import first_divergence
    from precnb.cli import UsageError
    from precnb.errors import NotADumpError

    steps = _steps_arg(args)
    offset = args.step_offset
    tol = _tolerance(args)
    crc = "strict" if args.crc_strict else "report"
    if args.target is not None and offset != "auto":
        # read the steps up to the first divergence only (answer identical to a whole read)
        search = _stepwise_plan(args, steps, int(offset))
        if search is not None:
            try:
                return _emit_finding(_diff_stepwise(args, search, int(offset), tol, crc), args)
            except NotADumpError:  # a step with no readable file: read the runs whole instead
                args.load_failures = []
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    load_steps = steps if offset == 0 else None
    base = _load(args.baseline, args, steps=load_steps)
    if args.target is None:  # one input holding two runs (e.g. a compare result CSV)
        if "run" not in base.dims or base.sizes["run"] != 2:
            raise UsageError("give BASELINE and TARGET, or one input that holds two runs")
        names = [str(r) for r in base["run"].values]
        pair = ("baseline", "target") if set(names) == {"baseline", "target"} else (names[0], names[1])
        from precnb.combine import select_run

        base, target = (select_run(base, n) for n in pair)
    else:
        target = _load(args.target, args, steps=load_steps)
    base, target = _merge_layouts(base, target, args)
    try:
        finding = first_divergence(base, target, tolerance=tol, steps=steps, ranks=None,
                                   step_offset=offset, crc=crc)
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


def _layout_from_args(args: argparse.Namespace, world_size: int) -> Any:
    from precnb.analysis import Layout

    if args.layout:
        return Layout.parse(args.layout, world_size=world_size)
    return Layout(world_size, tp=args.tp, pp=args.pp, vpp=args.vpp, cp=args.cp, ep=args.ep,
                  order=args.order, num_layers=args.num_layers)


def _add_layout_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", help="layout as text, e.g. tp=2,pp=2 (instead of the flags below)")
    for dim in ("tp", "pp", "vpp", "cp", "ep"):
        p.add_argument(f"--{dim}", type=int, default=1, help=f"{dim.upper()} size (default 1)")
    p.add_argument("--order", default="tp-cp-ep-dp-pp", help="Megatron order string")
    p.add_argument("--num-layers", type=int, help="total layers, for PP/VPP renumbering")


def _cmd_merge(args: argparse.Namespace) -> int:
    from precnb.analysis import LayoutError, merge_shards
    from precnb.cli import UsageError
    from precnb.io.store import to_zarr

    ds = _load(args.run, args, steps=_steps_arg(args))
    ref = _load(args.reference, args, steps=_steps_arg(args)) if args.reference else None
    try:
        layout = _layout_from_args(args, ds.sizes["rank"])
        merged = merge_shards(ds, layout, reference=ref)
    except LayoutError as exc:
        raise UsageError(str(exc)) from None
    counts: dict[str, int] = {}
    for name in [c for c in merged.coords if str(c).startswith("shard_kind_")]:
        for k in merged[name].values:
            counts[f"{name[len('shard_kind_'):]}:{k}"] = counts.get(f"{name[len('shard_kind_'):]}:{k}", 0) + 1
    if args.output:
        to_zarr(merged, args.output, mode="w" if args.overwrite else "w-")
    summary = {"layout": layout.describe(), "merged_ranks": [int(r) for r in merged["rank"].values],
               "tensors": int(merged.sizes["tensor"]), "classification": counts, "output": args.output}
    if args.json:
        from precnb.analysis.findings import to_json

        sys.stdout.write(to_json(summary, indent=2) + "\n")
    else:
        sys.stdout.write(f"merged {layout.describe()} into ranks {summary['merged_ranks']}\n")
        for k, v in sorted(counts.items()):
            sys.stdout.write(f"  {k:<24} {v}\n")
        if args.output:
            sys.stdout.write(f"wrote {args.output}\n")
    return 0


def _cmd_replicas(args: argparse.Namespace) -> int:
    from precnb.analysis import LayoutError, check_replicas
    from precnb.cli import UsageError

    ds = _load(args.run, args, steps=_steps_arg(args))
    try:
        layout = _layout_from_args(args, ds.sizes["rank"])
        finding = check_replicas(ds, layout, rtol=args.rtol)
    except (LayoutError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    return _emit_finding(finding, args)


def register(sub: Any, add_load_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the analysis sub-commands to *sub*."""
    p = sub.add_parser("diff", help="first divergence between a baseline and a target run")
    p.add_argument("baseline")
    p.add_argument("target", nargs="?", help="omit when BASELINE holds two runs (a compare result CSV)")
    p.add_argument("--json", action="store_true", help="print one JSON finding")
    p.add_argument("--step", type=int, help="only this step")
    p.add_argument("--step-offset", type=int_or_auto(), default=0,
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
    p.set_defaults(func=_cmd_anomalies)

    p = sub.add_parser("merge", help="merge TP/CP shards (and PP/VPP/EP stages) into whole-layer statistics")
    p.add_argument("run")
    p.add_argument("-o", "--output", help="zarr store to write (e.g. merged.zarr)")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--reference", help="an unsharded run: names split dims, spots partial sums by shape")
    p.add_argument("--json", action="store_true")
    p.add_argument("--step", type=int, help="only this step")
    _add_layout_options(p)
    add_load_options(p)
    p.set_defaults(func=_cmd_merge)

    p = sub.add_parser("replicas", help="ranks whose replicated tensors differ from their replicas")
    p.add_argument("run")
    p.add_argument("--json", action="store_true")
    p.add_argument("--step", type=int, help="only this step")
    p.add_argument("--rtol", type=_positive, default=1e-6, help="relative tolerance (default 1e-6)")
    _add_layout_options(p)
    add_load_options(p)
    p.set_defaults(func=_cmd_replicas)
