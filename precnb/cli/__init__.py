"""The ``precnb`` command line: thin argparse wrappers over the Python API.

Exit codes: 0 success (whether or not a problem was found in the data); 1 unreadable input
(nothing readable, or some files skipped: the command still runs on the rest and names them
on stderr); 2 usage error; 130 interrupted. Errors are one line on stderr, without a
traceback; ``--debug`` (anywhere on the command line) shows it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import IO, Any, NoReturn

from precnb.cli import _term
from precnb.cli._args import MAX_INDEX, int_set, integer
from precnb.errors import PrecnbError

__all__ = ["main"]


class UsageError(Exception):
    """A command-line usage error (exit code 2)."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 2) and control characters escaped in its output."""

    def error(self, message: str) -> NoReturn:
        message = message[len("argument "):] if message.startswith("argument ") else message
        self.exit(2, f"{self.prog}: usage error: {_one_line_text(message)} (see `{self.prog} --help`)\n")

    def _print_message(self, message: str, file: IO[str] | None = None) -> None:
        if message:
            (file or sys.stderr).write(_term.escape_controls(message))


def _add_load_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int_set("steps"), help="steps to load: N, A:B (inclusive) or a comma list")
    p.add_argument("--ranks", type=int_set("ranks"), help="ranks to load: comma list or A:B")
    from precnb.io.readers import reader_names

    p.add_argument("--format", choices=reader_names(), help="force a reader instead of detecting it")
    p.add_argument("--workers", type=_workers, default=None,
                   help="local processes that parse dump files: N, or 'auto' (default: "
                        "$PRECNB_WORKERS, else auto = one per available CPU, at most 8)")


def int_or_auto(minimum: int | None = None, why: str = "", maximum: int | None = MAX_INDEX) -> Callable[[str], Any]:
    """An argparse type: ``auto`` or an integer in [*minimum*, *maximum*] (*why* explains the bound)."""
    lo = minimum if minimum is not None else -MAX_INDEX
    return integer(lo, maximum, auto=True, why=why)


_workers = int_or_auto(1, "1: parse in this process", maximum=1024)


def cli_workers(args: argparse.Namespace) -> int | str:
    """``--workers``, else ``$PRECNB_WORKERS``, else ``"auto"`` (the command line parses in parallel)."""
    import os

    given = getattr(args, "workers", None)
    if given is not None:
        return given
    return os.environ.get("PRECNB_WORKERS") or "auto"


def parse_int_set(text: str | list[int] | None, what: str) -> list[int] | None:
    """Parse ``"3"``, ``"1:4"`` (inclusive) or ``"0,3,5"`` into a sorted list of ints (a list passes).

    ``--steps`` / ``--ranks`` are parsed by argparse already (:func:`precnb.cli._args.int_set`).
    """
    if text is None or isinstance(text, list):
        return text
    try:
        return int_set(what)(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"--{what}: {exc}") from None


def command_inputs(args: argparse.Namespace) -> list[str]:
    """Every path a command reads (runs, baseline, reference runs, mapping files).

    Writers get them as ``inputs=`` (:mod:`precnb._write`): an output never lands in, on or
    around one of them.
    """
    paths: list[Any] = [getattr(args, n, None) for n in ("path", "run", "baseline", "target")]
    for n in ("reference", "mapping"):
        value = getattr(args, n, None)
        paths += list(value) if isinstance(value, (list, tuple)) else [value]
    return [str(p) for p in paths if p]


def open_checked(path: str, args: argparse.Namespace, *, steps: list[int] | None = None,
                 use_steps_option: bool = True) -> Any:
    """Open *path* for a command; files that could not be read are remembered on *args*.

    :func:`main` names them on stderr (one line each) and exits 1 once the command is done,
    so a partly unreadable run is analysed but never silently (``info`` prints them itself).

    Parameters
    ----------
    path : str
    args : argparse.Namespace
        The parsed command line (``--format``, ``--steps``, ``--ranks``).
    steps : list of int, optional
        Steps to load (default: ``--steps``).
    use_steps_option : bool
        Read ``--steps`` when *steps* is None (False: load every step).

    Returns
    -------
    xarray.Dataset
    """
    import warnings

    from precnb.io.api import load_report, open_run

    if steps is None and use_steps_option:
        steps = parse_int_set(getattr(args, "steps", None), "steps")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = open_run(path, format=getattr(args, "format", None), steps=steps,
                      ranks=parse_int_set(getattr(args, "ranks", None), "ranks"), progress=None,
                      workers=cli_workers(args))
    failures = getattr(args, "load_failures", None)
    if failures is None:
        failures = []
        args.load_failures = failures
    failures.extend(load_report(ds).failures)
    return ds


def _open(path: str, args: argparse.Namespace) -> Any:
    return open_checked(path, args)


def _emit(obj: dict[str, Any], as_json: bool, text: str) -> None:
    if as_json:
        _term.out(json.dumps(obj, indent=2, default=_json_default, allow_nan=False) + "\n")
    else:
        _term.out(text.rstrip() + "\n")


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o)}")


def _cmd_info(args: argparse.Namespace) -> int:
    from precnb.analysis.summary import summarize
    from precnb.io.api import load_report

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
    lines.append(f"read       {len(rep.read)} file(s); skipped {len(rep.skipped)}")
    for w in rep.warnings:
        lines.append(f"warning    {w}")
    for path, reason in rep.skipped:
        lines.append(f"SKIPPED    {reason}" if reason.startswith(path) else f"SKIPPED    {path}: {reason}")
    s.setdefault("files_read", len(rep.read))
    s.setdefault("warnings", list(rep.warnings))
    _emit(s, args.json, "\n".join(lines))
    args.load_failures_reported = True  # printed above: main() need not repeat them
    return 0 if rep.ok else 1


def _ranges(vals: list[int]) -> str:
    from precnb.analysis.summary import format_ranges

    return format_ranges(vals)


def _cmd_convert(args: argparse.Namespace) -> int:
    import warnings

    from precnb.io.api import load_report
    from precnb.io.store import open_store, to_zarr

    with warnings.catch_warnings():  # stream the run one step at a time (bounded memory)
        warnings.simplefilter("ignore")
        out = to_zarr(args.path, args.output, mode="w" if args.overwrite else "w-", format=args.format,
                      steps=parse_int_set(args.steps, "steps"), ranks=parse_int_set(args.ranks, "ranks"),
                      workers=cli_workers(args))
    ds = open_store(out, lazy=True)
    failures = load_report(ds).failures
    args.load_failures = [*(getattr(args, "load_failures", None) or []), *failures]
    _term.out(f"wrote {out} ({ds.sizes['step']} steps × {ds.sizes['rank']} ranks × "
                     f"{ds.sizes['tensor']} tensors)\n")
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
    return parser


def _one_line_text(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 2000 else text[:1997] + "..."


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
        code = int(args.func(args))
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
