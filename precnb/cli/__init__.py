"""The ``precnb`` command line: thin argparse wrappers over the Python API.

Exit codes: 0 success (whether or not a problem was found in the data); 1 unreadable input
(nothing readable, or some files skipped: the command still runs on the rest and names them
on stderr); 2 usage error; 130 interrupted. Errors are one line on stderr, without a
traceback; ``--debug`` (anywhere on the command line) shows it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from precnb.cli import _term
from precnb.cli._common import (  # noqa: F401 - the shared helpers, also under their old path precnb.cli.X
    Parser,
    UsageError,
    _add_load_options,
    _emit,
    _json_default,
    _one_line_text,
    _open,
    _workers,
    cli_client,
    cli_workers,
    close_client,
    command_inputs,
    int_or_auto,
    open_checked,
    parse_int_set,
)
from precnb.errors import PrecnbError

__all__ = ["main"]


def _cmd_info(args: argparse.Namespace) -> int:
    from precnb.analysis.summary import summarize
    from precnb.io.api import load_report

    args.store_gaps = True  # a damaged store's missing chunks are listed (SKIPPED), not refused
    ds = _open(args.path, args)
    s = summarize(ds)
    rep = load_report(ds)
    lines = [
        f"source     {s['source'] or args.path}",
        f"format     {s['format']}  task={s['task'] or '-'}  level={s['level'] or '-'}  "
        f"framework={s['framework'] or '-'}",
    ]
    if s["runs"]:
        lines.append(f"runs       {', '.join(s['runs'])}")
    release = str(ds.attrs.get("msprobe_release", "") or "")
    if release:
        s.setdefault("msprobe_release", release)
        lines.append(f"release    msprobe {release} (as far as the dump says: precnb.io.msprobe.release)")
    lines += [
        f"steps      {_ranges(s['steps'])}  ({len(s['steps'])})",
        f"ranks      {_ranges(s['ranks'])}  ({len(s['ranks'])})",
        f"tensors    {s['tensors']} in {s['nodes']} nodes; {s['records']} records",
        "kinds      " + ", ".join(f"{k}={v}" for k, v in s["kinds"].items()),
        "dtypes     " + ", ".join(f"{k or '?'}={v}" for k, v in s["dtypes"].items()),
        f"non-finite {s['nonfinite']['nan_values']} NaN and {s['nonfinite']['inf_values']} ±inf "
        f"statistic values in {s['nonfinite']['tensors']} tensors",
    ]
    if s["has_crc"]:
        lines.append("checksums  CRC recorded (md5 mode)")
    lines.append(f"read       {len(rep.read)} file(s); skipped {len(rep.skipped)}; "
                 f"{rep.unread_count} section(s) or leaf(s) not read")
    for w in rep.warnings:
        lines.append(f"warning    {w}")
    for f, rec, where, why in rep.unread[:10]:
        lines.append(f"NOT READ   {f}: {rec} {where or '(the record)'}: {why}")
    if rep.unread_count > 10:
        lines.append(f"NOT READ   ... {rep.unread_count - 10} more (precnb.load_report(ds).unread)")
    for path, reason in rep.skipped:
        lines.append(f"SKIPPED    {reason}" if reason.startswith(path) else f"SKIPPED    {path}: {reason}")
    s.setdefault("files_read", len(rep.read))
    s.setdefault("warnings", list(rep.warnings))
    s.setdefault("unread_count", rep.unread_count)
    s.setdefault("unread", [{"file": f, "record": r, "where": w, "why": y} for f, r, w, y in rep.unread[:100]])
    _emit(s, args.json, "\n".join(lines))
    args.load_failures_reported = True  # printed above: main() need not repeat them
    return 0 if rep.ok else 1


def _ranges(vals: list[int]) -> str:
    from precnb.analysis.summary import format_ranges

    return format_ranges(vals)


def _cmd_convert(args: argparse.Namespace) -> int:
    import warnings

    import xarray as xr

    from precnb.io.api import load_report
    from precnb.io.store import store_outline, to_zarr

    with warnings.catch_warnings():  # stream the run one step at a time (bounded memory)
        warnings.simplefilter("ignore")
        out = to_zarr(args.path, args.output, mode="w" if args.overwrite else "w-", format=args.format,
                      steps=parse_int_set(args.steps, "steps"), ranks=parse_int_set(args.ranks, "ranks"),
                      workers=cli_workers(args), client=cli_client(args))
    sizes, attrs = store_outline(out)  # metadata only: reopening the store would add its strings to the peak
    failures = load_report(xr.Dataset(attrs=attrs)).failures
    args.load_failures = [*(getattr(args, "load_failures", None) or []), *failures]
    _term.out(f"wrote {out} ({sizes['step']} steps × {sizes['rank']} ranks × {sizes['tensor']} tensors)\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser (also used to generate docs)."""
    from precnb._version import __version__

    parser = Parser(
        prog="precnb", description="Numerical-accuracy triage of msprobe dumps and monitor data.")
    parser.add_argument("--version", action="version", version=f"precnb {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("info", help="summarise a run: steps, ranks, tensors, dtypes, non-finite")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _add_load_options(p)
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("convert", help="materialise a run into a zarr store that reopens instantly")
    p.add_argument("path")
    p.add_argument("-o", "--output", required=True, help="store folder to create (e.g. run.zarr); its parent "
                                                        "folder must exist")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store precnb wrote (never "
                                                            "anything else)")
    _add_load_options(p)
    p.set_defaults(func=_cmd_convert)

    from precnb.cli import analysis_cmds

    analysis_cmds.register(sub, _add_load_options)
    from precnb.cli import report_cmds

    report_cmds.register(sub, _add_load_options)
    from precnb.cli import plan_cmds

    plan_cmds.register(sub, _add_load_options)
    from precnb.cli import tensor_cmds

    tensor_cmds.register(sub, _add_load_options)
    from precnb.cli import device_cmds

    device_cmds.register(sub, _add_load_options)
    from precnb.cli import generated

    generated.register(sub, _add_load_options)  # nan, anomalies, spike and every plug-in diagnosis: from the registry
    return parser



def _one_line(exc: BaseException) -> str:
    return _one_line_text(str(exc)) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments (default ``sys.argv[1:]``). ``--debug`` may appear anywhere.

    Returns
    -------
    int
        0 success, 1 unreadable input (or some files skipped), 2 usage error, 130 interrupted.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # usage errors: one line, exit 2 (Parser.error)
    except SystemExit as exc:  # also --help / --version (exit 0)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    args.debug = debug
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 2
    cmd = f"precnb {args.command}"
    try:
        try:
            code = int(args.func(args))
        finally:
            close_client(args)
    except UsageError as exc:
        if debug:
            raise
        _term.err(f"{cmd}: usage error: {_one_line(exc)}\n")
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        _term.err("interrupted\n")
        return 130
    except BrokenPipeError:  # e.g. `precnb info run | head -1`: not an error of ours
        with contextlib.suppress(OSError, ValueError):  # silence the flush at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (PrecnbError, OSError) as exc:
        if debug:
            raise
        _term.err(f"{cmd}: error: {_one_line(exc)}\n")
        return 1
    except MemoryError:
        if debug:
            raise
        _term.err(f"{cmd}: error: out of memory (try --steps / --ranks to load less)\n")
        return 1
    except Exception as exc:  # a bug: still one line, but say so
        if debug:
            raise
        _term.err(f"{cmd}: internal error: {type(exc).__name__}: {_one_line(exc)} "
                         "(please report it; rerun with --debug for the traceback)\n")
        return 1
    failures = getattr(args, "load_failures", None) or []
    if failures:
        if not getattr(args, "load_failures_reported", False):
            for path, reason in failures:
                text = reason if reason.startswith(path) else f"{path}: {reason}"
                what = "skipped" if reason.startswith(("not loaded", "duplicate row")) else "skipped unreadable"
                _term.err(f"{cmd}: {what} {' '.join(text.split())}\n")
        code = max(code, 1)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
