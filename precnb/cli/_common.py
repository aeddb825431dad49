"""What the subcommand modules share: usage errors, the argument parser, load options, opening inputs.

Kept apart from :mod:`precnb.cli` (which dispatches to the subcommand modules) so that no
subcommand module imports the package that imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from typing import IO, Any, NoReturn

from precnb.cli import _term
from precnb.cli._args import MAX_INDEX, int_set, integer, scheduler_address

__all__ = ["Parser", "UsageError", "cli_client", "cli_workers", "close_client", "command_inputs", "int_or_auto",
           "open_checked", "parse_int_set"]

def _one_line_text(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 2000 else text[:1997] + "..."


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
    p.add_argument("--scheduler", type=scheduler_address, default=None, metavar="ADDRESS",
                   help="parse on a running Dask cluster: its scheduler's address (tcp://host:8786; default "
                        "$PRECNB_SCHEDULER). The workers must see the dump paths (a shared file system). "
                        "Needs the dask extra: pip install 'precnb[dask]'")


def cli_client(args: argparse.Namespace) -> Any:
    """The Dask client of ``--scheduler`` (else ``$PRECNB_SCHEDULER``), connected once per command; or None.

    Raises
    ------
    UsageError
        When the ``dask`` extra (dask, distributed) is not installed (the message says what to install).
    precnb.errors.PrecnbError
        When the scheduler cannot be reached (one line naming the address and where it came from).
    """
    client = getattr(args, "_dask_client", None)
    if client is not None:
        return client
    address, origin = getattr(args, "scheduler", None), "--scheduler"
    if address is None and os.environ.get("PRECNB_SCHEDULER"):
        address, origin = os.environ["PRECNB_SCHEDULER"].strip(), "$PRECNB_SCHEDULER"
        try:
            address = scheduler_address(address)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"{origin}: {exc}") from None
    if address is None:
        return None
    from precnb._extras import DASK, MissingExtraError, require

    try:  # a usage error of one line naming the extra, before anything imports dask
        require(origin, DASK, extra="dask")
    except MissingExtraError as exc:
        raise UsageError(str(exc)) from None
    from precnb.cli._scheduler import connect_client, scheduler_timeout

    try:
        timeout = scheduler_timeout()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    client = connect_client(address, origin, timeout)
    args._dask_client = client
    return client


def close_client(args: argparse.Namespace) -> None:
    """Close the client :func:`cli_client` opened (the cluster itself keeps running)."""
    client = getattr(args, "_dask_client", None)
    if client is not None:
        args._dask_client = None
        with contextlib.suppress(Exception):
            client.close()


def int_or_auto(minimum: int | None = None, why: str = "", maximum: int | None = MAX_INDEX) -> Callable[[str], Any]:
    """An argparse type: ``auto`` or an integer in [*minimum*, *maximum*] (*why* explains the bound)."""
    lo = minimum if minimum is not None else -MAX_INDEX
    return integer(lo, maximum, auto=True, why=why)


_workers = int_or_auto(1, "1: parse in this process", maximum=1024)


def cli_workers(args: argparse.Namespace) -> int | str:
    """``--workers``, else ``$PRECNB_WORKERS``, else ``"auto"`` (the command line parses in parallel)."""
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
                      workers=cli_workers(args), client=cli_client(args),
                      gaps="report" if getattr(args, "store_gaps", False) else "raise")
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
