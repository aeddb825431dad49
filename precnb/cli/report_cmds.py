"""Sub-commands backed by :mod:`precnb.report`: ``report`` and ``template``.

``precnb report RUN [--baseline RUN] [--layout tp=2] -o report.html`` writes one
self-contained offline HTML file; ``precnb template NAME -o my.ipynb [-p key value ...]``
copies a notebook template out with its parameters filled (``--list`` shows them).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from precnb.cli import _term
from precnb.cli._args import existing_folder, layout_text
from precnb.cli._common import int_or_auto
from precnb.cli.analysis_parsers import positive as _positive

__all__ = ["register"]

# argument types shared with the analysis commands
_offset = int_or_auto()


def _load(path: str, args: argparse.Namespace) -> Any:
    from precnb.cli._common import open_checked

    return open_checked(path, args)  # remembers skipped files: main() names them and exits 1


def _cmd_report(args: argparse.Namespace) -> int:
    from precnb import _extras

    _extras.require("precnb report", _extras.REPORT)
    from precnb._write import check_output
    from precnb.cli._common import command_inputs
    from precnb.cli.analysis_cmds import run_triage
    from precnb.report import write_html

    inputs = command_inputs(args)
    check_output(args.output, inputs=inputs, overwrite=args.overwrite, content="html")  # before the long part
    from precnb.cli._side import side_options
    from precnb.report._assets import vega_bundle

    vega_bundle()  # the charts' JavaScript (a child process; under a hard ulimit -v it says so) before it too
    triage = run_triage(args, args.run, args.baseline, **side_options(args))
    out = write_html(triage, args.output, title=args.title, stat=args.stat, overwrite=args.overwrite,
                     inputs=inputs)
    size = out.stat().st_size
    _term.out(f"wrote {out} ({size / 1e6:.2f} MB, self-contained, opens offline)\n")
    return 0


def _value(text: str) -> Any:
    """Command-line parameter text → Python value (int, float, bool, None, JSON, else str)."""
    import json

    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def _cmd_template(args: argparse.Namespace) -> int:
    from precnb import _extras
    from precnb.cli._common import UsageError

    _extras.require("precnb template", (*_extras.TEMPLATE, *_extras.REPORT))
    if args.execute or args.html:
        _extras.require("precnb template --execute", _extras.TEMPLATE_EXECUTE)
    if args.html:
        _extras.require("precnb template --html", _extras.TEMPLATE_HTML)
    from precnb.report import notebooks

    if args.list:
        for name in notebooks.list_templates():
            info = notebooks.describe(name)
            _term.out(f"{name:<20} {info['summary']}\n")
            for p, spec in info["parameters"].items():
                _term.out(f"    -p {p:<16} default {spec['default']}"
                                 f"{'  # ' + spec['help'] if spec['help'] else ''}\n")
        return 0
    if not args.name:
        raise UsageError("give a template NAME (see `precnb template --list`)")
    if not args.output:
        raise UsageError("-o/--output is required (the .ipynb to write)")
    params = {k: _value(v) for k, v in (args.param or [])}
    import os

    if args.html and os.path.abspath(args.html) == os.path.abspath(args.output):
        raise UsageError("--html and -o name the same file; give the HTML page another name")
    if args.html:  # refuse a bad --html before writing and running the notebook
        from precnb._write import check_output

        check_output(args.html, inputs=[args.output, *notebooks.parameter_paths(params)], overwrite=args.overwrite,
                     content="html")
    try:
        out = notebooks.fill_template(args.name, args.output, params, overwrite=args.overwrite)
    except (KeyError, ValueError) as exc:
        raise UsageError(str(exc.args[0]) if exc.args else str(exc)) from None
    _term.out(f"wrote {out}\n")
    if args.execute or args.html:
        out = notebooks.execute(out, cwd=args.cwd)
        _term.out(f"executed {out}\n")
    if args.html:
        html = notebooks.export_html(out, args.html, overwrite=args.overwrite,
                                     inputs=notebooks.parameter_paths(params))
        _term.out(f"wrote {html} (offline HTML)\n")
    return 0


def register(sub: Any, add_load_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the ``report`` and ``template`` sub-commands to *sub*."""
    p = sub.add_parser("report", help="write one self-contained offline HTML report (findings, charts, tables)",
                       description="Diagnose RUN (NaN/Inf origin and anomalies; first divergence with "
                                   "--baseline; replica check with --layout) and write one HTML file that "
                                   "opens offline: findings, a heat map linked to a line chart, tables.")
    p.add_argument("run", help="the run (dump root, monitor output, compare CSV or zarr store)")
    p.add_argument("-o", "--output", required=True, help="HTML file to write (e.g. report.html); its folder "
                                                        "must exist")
    p.add_argument("--overwrite", action="store_true", help="replace an existing precnb report (never any "
                                                            "other file)")
    p.add_argument("--baseline", help="a run to compare against: report the first divergence")
    p.add_argument("--layout", type=layout_text,
                   help="parallel layout of RUN, e.g. tp=2,pp=2 or dp=8: replica check; with "
                        "--baseline, RUN's shards are merged before comparing")
    p.add_argument("--target-layout", type=layout_text, help="same as --layout (the name `precnb diff` uses)")
    p.add_argument("--baseline-layout", type=layout_text,
                   help="layout of the baseline (its shards are merged before comparing)")
    p.add_argument("--step-offset", type=_offset, default=None,
                   help="target step = baseline step + OFFSET, or 'auto' (resumed runs); default: 0 when "
                        "both runs hold the same steps, else auto")
    p.add_argument("--rtol", type=_positive, help="one relative tolerance for all tensors (default: by dtype)")
    p.add_argument("--reference", nargs=2, metavar=("RUN_A", "RUN_B"),
                   help="calibrate tolerances from two healthy runs of the same job")
    from precnb.cli.analysis_parsers import add_mapping_option, add_rank_table_option

    add_mapping_option(p)
    add_rank_table_option(p)
    p.add_argument("--stat", default="norm", choices=["norm", "max", "min", "mean"],
                   help="statistic the charts draw (default norm)")
    p.add_argument("--title", help="page title (default: the run's folder name)")
    from precnb.cli._side import add_side_options

    add_side_options(p)
    add_load_options(p)
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("template", help="copy a notebook template out with its parameters filled",
                       description="Copy one of precnb's notebook templates (NaN origin, divergence, TP/PP "
                                   "merge, DP gradient sync, monitor trends) with papermill parameters filled.")
    p.add_argument("name", nargs="?", help="template name (see --list)")
    p.add_argument("-o", "--output", help="notebook to write (e.g. my_incident.ipynb)")
    p.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"),
                   help="set a parameter (repeatable); numbers, true/false and none are converted")
    p.add_argument("--list", action="store_true", help="list the templates and their parameters")
    p.add_argument("--overwrite", action="store_true", help="replace an existing notebook (and --html page) "
                                                            "that precnb wrote (never any other file)")
    p.add_argument("--execute", action="store_true", help="run the filled notebook (papermill) in place")
    p.add_argument("--html", help="also export the executed notebook to this offline HTML file "
                                  "(needs the offline_lab nbconvert template: `make offline-template`)")
    p.add_argument("--cwd", type=existing_folder, help="working directory for --execute (default: the notebook's "
                                                       "folder)")
    p.set_defaults(func=_cmd_template)
