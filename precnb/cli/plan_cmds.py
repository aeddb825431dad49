"""``precnb plan``: the msprobe config.json that confirms the first finding (or closes its gap) next run.

Without ``-o`` the config is printed on stdout and what it selects on stderr; with ``-o`` the
config is written by the rules of :mod:`precnb._write` (atomically; an existing file is never
replaced unless precnb wrote it and ``--overwrite`` is given; never inside an input) and the
summary printed. ``--json``
prints one object: the finding, the config, what it selects and the size estimate.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from precnb.cli import _term
from precnb.cli._args import layout_text

__all__ = ["MARKER_KEY", "register", "write_config"]

MARKER_KEY = "precnb_output"
"""Top-level key marking a config precnb wrote (msprobe ignores keys it does not know)."""
MARKER = "precnb dump plan"


def write_config(config: dict[str, Any], path: str | os.PathLike[str], *, inputs: list[str],
                 overwrite: bool = False) -> Path:
    """Write *config* as JSON to *path* by the rules of :mod:`precnb._write`.

    Atomic; never inside (or over, or around) an input; an existing file is replaced only with
    *overwrite* and only when it is a plan (or another output) precnb wrote, recognised by the
    top-level ``"precnb_output": "precnb dump plan"`` marker (msprobe ignores keys it does not know).

    Raises
    ------
    precnb.errors.OutputRefusedError
        With the reason, one line.
    """
    from precnb._write import write_text

    body = json.dumps({**config, MARKER_KEY: MARKER}, indent=4, allow_nan=False) + "\n"
    return write_text(Path(path).expanduser(), body, inputs=inputs, overwrite=overwrite)


def _summary_lines(f: Any, plan: dict[str, Any]) -> list[str]:
    from precnb.analysis.registry import title

    lines = [f"# {title(f.kind)}: {f.reason}",
             f"# plan: {plan['summary']}"]
    sel = plan["selects"]
    shown = ", ".join(sel["nodes"][:8]) + (" ..." if sel["node_count"] > 8 else "")
    if shown:
        lines.append(f"# selects {sel['node_count']} recorded node(s): {shown}")
    if plan["estimated_bytes"] > 0:
        lines.append(f"# estimated dump size: {plan['estimate']} ({plan['estimated_bytes']} bytes of tensors)")
    else:  # never "0 bytes": the summary says why the size is not known
        lines.append("# estimated dump size: unknown")
    if plan.get("register_custom_api"):
        lines.append(f"# add to the training script: {plan['register_custom_api']}")
    for n in plan.get("notes", []):
        lines.append(f"# note: {n}")
    lines.append("# use: PrecisionDebugger(config_path=<this file>)")
    return lines


def _cmd_plan(args: argparse.Namespace) -> int:
    from precnb.analysis.findings.plan import plan_dump
    from precnb.cli.analysis_cmds import run_triage

    kinds = [args.kind] if args.kind else None
    from precnb.cli._common import command_inputs

    inputs = command_inputs(args)
    if args.output:  # refuse a bad -o before diagnosing
        from precnb._write import check_output

        check_output(args.output, inputs=inputs, overwrite=args.overwrite, content="json")
    from precnb.cli._side import side_options

    extra: dict[str, Any] = {"kinds": kinds} if kinds else {}
    if args.layout:  # the replica check (issue #28): plan a departure
        extra["target_layout"] = args.layout
    triage = run_triage(args, args.run, args.baseline, **extra, **side_options(args))
    found = triage.found
    if not found:
        msg = "nothing found: no finding to confirm (" + "; ".join(f.reason for f in triage.findings) + ")"
        if args.json:
            _term.out(json.dumps({"plan": None, "reason": msg}, indent=2) + "\n")
        else:
            _term.out(msg + "\n")
        return 0
    f = found[0]
    from precnb.analysis.findings.plan import DEFAULT_DUMP_PATH

    plan = plan_dump(f, triage.target, dump_path=args.dump_path or DEFAULT_DUMP_PATH, task=args.task)
    if plan is None:
        _term.out(f"no dump plan for this finding ({f.kind}: {f.reason})\n")
        return 0
    written = None
    if args.output:
        written = str(write_config(plan["config"], args.output, inputs=inputs, overwrite=args.overwrite))
    if args.json:
        from precnb.analysis.findings import to_json

        out = {"finding": {k: f.to_dict()[k] for k in ("kind", "step", "rank", "node", "tensor", "module", "reason")},
               **plan, "output": written}
        _term.out(to_json(out, indent=2) + "\n")
        return 0
    lines = _summary_lines(f, plan)
    if written:
        _term.out("\n".join(lines) + f"\nwrote {written}\n")
    else:
        _term.err("\n".join(lines) + "\n")
        _term.out(json.dumps(plan["config"], indent=4) + "\n")
    return 0


def register(sub: Any, add_load_options: Any) -> None:
    """Add ``plan`` to the sub-commands."""
    p = sub.add_parser("plan", help="the msprobe config.json that confirms the first finding (or closes its gap)")
    p.add_argument("run", help="the run that shows the finding")
    p.add_argument("--baseline", help="a baseline run (plans the first divergence against it)")
    p.add_argument("-o", "--output", help="write the config here (default: print it)")
    p.add_argument("--overwrite", action="store_true", help="replace a plan precnb wrote before")
    p.add_argument("--json", action="store_true", help="print one JSON object (finding, config, selection, size)")
    p.add_argument("--dump-path", default=None,  # resolved when the command runs: the parser stays light
                   help="dump_path written into the config (default ./precnb_confirm)")
    p.add_argument("--task", choices=["tensor", "statistics"], default=None,
                   help="tensor (save the selected tensors; the default) or statistics; a replica departure's "
                        "default is an md5-mode statistics dump of its TP/DP group at the next steps")
    p.add_argument("--kind", help="plan for the first finding of this kind (e.g. nan_origin, anomaly, loss_spike)")
    p.add_argument("--layout", type=layout_text, help="parallel layout of RUN, e.g. tp=2,dp=2: plans a replica "
                   "departure (replica_mismatch) too")
    from precnb.cli._side import add_side_options
    from precnb.cli.analysis_parsers import add_rank_table_option

    add_side_options(p)
    add_rank_table_option(p)
    add_load_options(p)
    p.set_defaults(func=_cmd_plan)
