"""Sub-commands backed by :mod:`precnb.analysis`: ``diff``, ``align``, ``merge``.

With ``--json`` each prints exactly one JSON object (a Finding, see
:mod:`precnb.analysis.findings`) on stdout; without it, a readable summary. They exit 0
whether or not something was found.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from precnb.analysis.diagnoses import FIRST_DIVERGENCE, PREFLIGHT
from precnb.cli import _term
from precnb.cli.analysis_parsers import (
    add_align_parser,
    add_diff_parser,
    add_merge_parser,
)

__all__ = ["layout_run", "preflight_emit", "register"]


def _emit_finding(finding: Any, args: argparse.Namespace) -> int:
    if args.json:
        _term.out(finding.to_json(indent=2) + "\n")
    else:
        _term.out(finding.summary(_term.WIDTH) + "\n")
    return 0


def _steps_arg(args: argparse.Namespace) -> list[int] | None:
    from precnb.cli._common import parse_int_set

    if getattr(args, "step", None) is not None:
        return [args.step]
    return parse_int_set(args.steps, "steps")


def _load(path: str, args: argparse.Namespace, *, steps: list[int] | None) -> Any:
    """Open *path* (``merge`` transforms a run; diagnoses go through :func:`run_triage`)."""
    from precnb.cli._common import open_checked

    return open_checked(path, args, steps=steps, use_steps_option=False)


def triage_options(args: argparse.Namespace, **extra: Any) -> Any:
    """The pipeline :class:`~precnb.pipeline.Options` of a parsed command line.

    Only what the user gave is set; everything else keeps the pipeline's one default.
    """
    from precnb.cli._common import parse_int_set
    from precnb.pipeline import Options

    kw: dict[str, Any] = {}
    for name in ("format", "workers"):
        if getattr(args, name, None) is not None:
            kw[name] = getattr(args, name)
    steps = _steps_arg(args) if hasattr(args, "steps") else None
    if steps is not None:
        kw["steps"] = steps
    ranks = parse_int_set(getattr(args, "ranks", None), "ranks")
    if ranks is not None:
        kw["ranks"] = ranks
    if getattr(args, "step_offset", None) is not None:
        kw["step_offset"] = args.step_offset
    if getattr(args, "rtol", None) is not None:  # diff's one tolerance (the replica check's is its own option)
        kw["tolerance"] = args.rtol
    if getattr(args, "reference", None) and getattr(args, "command", "") != "merge":
        kw["reference"] = tuple(args.reference)
    if getattr(args, "crc_strict", False):
        kw["crc"] = "strict"
    if getattr(args, "no_tensor_metrics", False):  # issue #17
        kw["tensor_metrics"] = False
    t_lay = getattr(args, "target_layout", None)
    alias = getattr(args, "layout", None) if getattr(args, "command", "") in ("diff", "report") else None
    if alias and t_lay and alias != t_lay:
        from precnb.cli._common import UsageError

        raise UsageError("--layout and --target-layout name the same thing (the target's layout); give one")
    if t_lay or alias:
        kw["target_layout"] = t_lay or alias
    if getattr(args, "baseline_layout", None):
        kw["baseline_layout"] = args.baseline_layout
    if getattr(args, "mapping", None):
        kw["mapping"] = list(args.mapping)
    if getattr(args, "rank_table", None):  # issue #28
        kw["rank_table"] = args.rank_table
    if getattr(args, "replica_baseline", None):
        kw["replica_baseline"] = args.replica_baseline
    if getattr(args, "rng_region", None):
        kw["rng_regions"] = tuple(args.rng_region)
    from precnb.cli._common import cli_client

    client = cli_client(args)
    if client is not None:
        kw["client"] = client
    kw.update(extra)
    return Options.from_kwargs(**kw)


def run_triage(args: argparse.Namespace, target: Any, baseline: Any = None, **extra: Any) -> Any:
    """:func:`precnb.diagnose` for a command; unreadable files are remembered on *args*.

    :func:`precnb.cli.main` names them on stderr and exits 1 once the command is done.
    Option errors (a layout that does not fit, runs that share no step) are usage errors.
    """
    from precnb.analysis import LayoutError
    from precnb.cli._common import UsageError
    from precnb.pipeline import diagnose

    opts = triage_options(args, **extra)
    try:
        triage = diagnose(target, baseline=baseline, options=opts)
    except (LayoutError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    failures = getattr(args, "load_failures", None)
    if failures is None:
        failures = []
        args.load_failures = failures
    failures.extend(f for f in triage.load_failures if f not in failures)
    for problem in getattr(triage.alignment, "mapping_problems", None) or []:  # said, never applied silently
        _term.err(f"precnb {getattr(args, 'command', '')}: mapping: {' '.join(problem.split())}\n")
    from precnb.io.rank_table import NOTE_PREFIX

    for note in triage.notes:  # a rank table's rows for ranks the run does not have (#49)
        if note.startswith(NOTE_PREFIX):
            _term.err(f"precnb {getattr(args, 'command', '')}: note: {' '.join(note.split())}\n")
    return triage


def _cmd_diff(args: argparse.Namespace) -> int:
    from precnb.cli._common import UsageError

    if args.target is None:  # one input holding two runs (e.g. a compare result CSV)
        from precnb.cli._common import open_checked

        both = open_checked(args.baseline, args)
        if "run" not in both.dims or both.sizes["run"] != 2:
            raise UsageError("give BASELINE and TARGET, or one input that holds two runs")
        names = [str(r) for r in both["run"].values]
        base_name = "baseline" if set(names) == {"baseline", "target"} else names[0]
        triage = run_triage(args, both, base_name, kinds=[FIRST_DIVERGENCE])
    else:
        triage = run_triage(args, args.target, args.baseline, kinds=[PREFLIGHT, FIRST_DIVERGENCE])
    if args.json:  # one object: the most important finding (a failing pre-flight one names the divergence)
        _emit_finding(triage.finding, args)
        return 1 if triage.nothing_compared else 0
    if triage.nothing_compared:  # nothing in common: that is the answer (and not a clean one: exit 1)
        shown = [triage.finding]
    else:
        shown = triage.found or [triage.result(FIRST_DIVERGENCE) or triage.finding]
    _term.out("\n\n".join(f.summary(_term.WIDTH) for f in shown) + "\n")
    return 1 if triage.nothing_compared else 0


def preflight_emit(triage: Any, args: argparse.Namespace) -> int:
    """How ``precnb preflight`` prints (the pre-flight checks' ``emit``): the checks, or ``{"checks": [...]}``."""
    from precnb.analysis.findings import to_json
    from precnb.pipeline.run import checklist

    if args.json:
        _term.out(to_json(checklist(triage), indent=2) + "\n")
    else:
        _term.out(triage.result(PREFLIGHT).summary(_term.WIDTH) + "\n")
    return 0


def _cmd_align(args: argparse.Namespace) -> int:
    from precnb._write import check_output
    from precnb.analysis.findings import to_json
    from precnb.cli._common import UsageError, command_inputs

    inputs = command_inputs(args)
    if args.output:  # refuse a bad -o before aligning
        check_output(args.output, inputs=inputs, overwrite=args.overwrite, content="json")
    triage = run_triage(args, args.target, args.baseline, kinds=[])
    a = triage.alignment
    if a is None:
        raise UsageError("align needs two runs")
    if args.output:
        from precnb.mapping import MappingError

        try:
            out = a.to_file(args.output, overwrite=args.overwrite, inputs=inputs)
        except MappingError as exc:
            from precnb.errors import PrecnbError

            raise PrecnbError(str(exc)) from None
    if args.json:
        _term.out(to_json(a.to_dict(), indent=2) + "\n")
    else:
        _term.out(_alignment_text(a, triage) + "\n")
    if args.output and not args.json:
        _term.out(f"wrote {out} (edit it and reuse it: precnb diff BASE TARGET --mapping {out})\n")
    return 0


def _alignment_text(a: Any, triage: Any) -> str:
    c = a.counts()
    lines = [f"ALIGNMENT: {a.describe()}"]
    lines.append(f"  frameworks  baseline {a.frameworks[0] or '?'}, target {a.frameworks[1] or '?'}")
    for kind in ("modules", "nodes", "tensors"):
        how = ", ".join(f"{k} {v}" for k, v in sorted(c[kind]["by_how"].items(), key=lambda kv: -kv[1]))
        lines.append(f"  {kind:<11} {c[kind]['paired']} paired ({how or '-'})")
    u = c["unpaired"]
    lines.append(f"  unpaired    baseline {u['baseline']}, target {u['target']}; glue / organisation / not "
                 f"captured {u['glue']}")
    for note in triage.notes:
        if not note.startswith("aligned:"):
            lines.append(f"  note        {note}")
    lines.append("  module pairs (baseline -> target):")
    for p in a.modules[:60]:
        lines.append(f"    {p.baseline or '<root>':<40} -> {p.target or '<root>'}  ({p.how}, {p.confidence:.2f})")
    if len(a.modules) > 60:
        lines.append(f"    ... {len(a.modules) - 60} more (--json lists all)")
    weak = [p for p in a.least_confident(8) if p.confidence < 0.9]
    if weak:
        lines.append("  least confident node pairs:")
        for p in weak:
            lines.append(f"    {p.baseline} -> {p.target}  ({p.how}, {p.confidence:.2f})")
    for side in ("baseline", "target"):
        left = a.unpaired[side]
        if left:
            lines.append(f"  only in {side} ({len(left)}): " + ", ".join(x["node"] for x in left[:6])
                         + (" ..." if len(left) > 6 else ""))
    return "\n".join(lines)


def _layout_from_args(args: argparse.Namespace, ds: Any) -> Any:
    """The layout the flags give, checked against the dumps; with no layout flag, the one the dumps show."""
    from precnb.analysis import Layout, LayoutError
    from precnb.pipeline.prepare import resolve_layout, run_layout

    world_size = int(ds.sizes["rank"])
    given = args.layout or any(getattr(args, d, None) is not None for d in ("tp", "pp", "vpp", "cp", "ep", "etp"))
    if not given:  # nothing said: the pipeline's rule (the dumps' layout, else every rank a DP replica)
        notes: list[str] = []
        lay = run_layout(None, ds, "run", notes, order=args.order, num_layers=args.num_layers)
        for n in notes:
            _term.err(f"note: {n}\n")
        return lay
    flags = {d: getattr(args, d, None) for d in ("tp", "pp", "vpp", "cp", "ep", "etp")}
    lay = Layout.coerce(args.layout or {**{d: v for d, v in flags.items() if v is not None}, "order": args.order,
                                         "num_layers": args.num_layers}, world_size)
    try:
        return resolve_layout(lay, ds, "run")
    except ValueError as exc:
        raise LayoutError(str(exc)) from None


def _cmd_merge(args: argparse.Namespace) -> int:
    from precnb.analysis import LayoutError, merge_shards
    from precnb.cli._common import UsageError, command_inputs
    from precnb.io.store import to_zarr

    inputs = command_inputs(args)
    if args.output:
        from precnb._write import check_output

        check_output(args.output, inputs=inputs, overwrite=args.overwrite, folder=True)  # before the long part
    ds = _load(args.run, args, steps=_steps_arg(args))
    ref = _load(args.reference, args, steps=_steps_arg(args)) if args.reference else None
    try:
        layout = _layout_from_args(args, ds)
        merged = merge_shards(ds, layout, reference=ref)
    except LayoutError as exc:
        raise UsageError(str(exc)) from None
    counts: dict[str, int] = {}
    for name in [c for c in merged.coords if str(c).startswith("shard_kind_")]:
        for k in merged[name].values:
            counts[f"{name[len('shard_kind_'):]}:{k}"] = counts.get(f"{name[len('shard_kind_'):]}:{k}", 0) + 1
    if args.output:
        to_zarr(merged, args.output, mode="w" if args.overwrite else "w-", inputs=inputs)
    summary = {"layout": layout.describe(), "merged_ranks": [int(r) for r in merged["rank"].values],
               "tensors": int(merged.sizes["tensor"]), "classification": counts, "output": args.output}
    if args.json:
        from precnb.analysis.findings import to_json

        _term.out(to_json(summary, indent=2) + "\n")
    else:
        _term.out(f"merged {layout.describe()} into ranks {summary['merged_ranks']}\n")
        for k, v in sorted(counts.items()):
            _term.out(f"  {k:<24} {v}\n")
        if args.output:
            _term.out(f"wrote {args.output}\n")
    return 0


def layout_run(args: argparse.Namespace) -> tuple[Any, Any]:
    """The run and its layout from the layout flags (``--layout`` or ``--tp``/``--pp``/...; none: the dumps').

    ``--layout`` text is parsed against the run's ranks by the pipeline; the flags need the world size, so the run is
    read first and handed on as read (its path kept: the origin's dump records are read as with ``--layout``).
    """
    from precnb.analysis import LayoutError
    from precnb.cli._common import UsageError, open_checked

    if args.layout:
        return args.run, args.layout
    ds = open_checked(args.run, args)
    try:
        layout = _layout_from_args(args, ds)
    except LayoutError as exc:
        raise UsageError(str(exc)) from None
    from precnb.pipeline import ReadRun

    return (ReadRun(ds, str(args.run)) if isinstance(args.run, str) else ds), layout


def register(sub: Any, add_load_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the analysis sub-commands to *sub* (defaults come from :data:`precnb.pipeline.DEFAULTS`)."""
    add_diff_parser(sub, add_load_options).set_defaults(func=_cmd_diff)
    add_align_parser(sub, add_load_options).set_defaults(func=_cmd_align)
    add_merge_parser(sub, add_load_options).set_defaults(func=_cmd_merge)
