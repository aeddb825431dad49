"""Argument types of the command line: every value is checked when it is parsed.

A bad value is a usage error (exit 2) of one line naming the option and what is expected,
before any input is read. Each type is an :class:`ArgType`, which also carries a few values it
must refuse (``bad``) and one it accepts (``good``): ``tests/test_cli_args.py`` walks every
sub-command's options through the parser with them, so an option added later with a plain
``type=int`` / ``type=float`` (no bounds, NaN accepted) fails that test.

Examples
--------
>>> integer(0, 10)("7")
7
>>> integer(0, 10)("11")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: must be between 0 and 10, got '11'
>>> int_set("steps")("0:2,5")
[0, 1, 2, 5]
>>> number(0)("nan")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected a finite number, got 'nan'
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "MAX_INDEX",
    "MAX_SELECTED",
    "ArgType",
    "existing_folder",
    "int_set",
    "integer",
    "layout_text",
    "number",
    "order_text",
    "scheduler_address",
]

MAX_INDEX = 2**31 - 1
"""Largest step or rank number (as the readers accept them)."""
MAX_SELECTED = 1_000_000
"""Most steps or ranks one ``--steps`` / ``--ranks`` may select."""


class ArgType:
    """A callable argparse ``type`` with examples of values it refuses and one it accepts."""

    def __init__(self, name: str, parse: Callable[[str], Any], bad: tuple[str, ...], good: str) -> None:
        self.__name__ = name
        self._parse = parse
        self.bad = bad
        self.good = good

    def __call__(self, text: str) -> Any:
        return self._parse(text)

    def __repr__(self) -> str:
        return self.__name__


def _int(text: str) -> int:
    s = text.strip()
    if not s or len(s.lstrip("+-")) > 40 or not s.lstrip("+-").isdecimal():
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    return int(s)


def _bounded(n: int, lo: int | None, hi: int | None, text: str, why: str) -> int:
    note = f" ({why})" if why else ""
    if lo is not None and hi is not None and not lo <= n <= hi:
        raise argparse.ArgumentTypeError(f"must be between {lo} and {hi}{note}, got {text!r}")
    if lo is not None and n < lo:
        raise argparse.ArgumentTypeError(f"must be >= {lo}{note}, got {text!r}")
    if hi is not None and n > hi:
        raise argparse.ArgumentTypeError(f"must be <= {hi}{note}, got {text!r}")
    return n


def integer(lo: int | None = None, hi: int | None = None, *, auto: bool = False, why: str = "") -> ArgType:
    """An integer in ``[lo, hi]`` (``auto``: the word ``auto`` is accepted too)."""

    def parse(text: str) -> int | str:
        if auto and text.strip().lower() == "auto":
            return "auto"
        try:
            n = _int(text)
        except argparse.ArgumentTypeError:
            extra = " or 'auto'" if auto else ""
            raise argparse.ArgumentTypeError(f"expected an integer{extra}, got {text!r}") from None
        return _bounded(n, lo, hi, text, why)

    bad = ["x", "1.5", "nan", "inf", "", "9" * 25]
    if lo is not None:
        bad.append(str(lo - 1))
    if hi is not None:
        bad.append(str(hi + 1))
    good = str(lo if lo is not None else 0)
    return ArgType("integer or 'auto'" if auto else "integer", parse, tuple(bad), good)


def number(lo: float | None = None, hi: float | None = None, *, why: str = "") -> ArgType:
    """A finite float in ``[lo, hi]`` (NaN and ±inf refused)."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        note = f" ({why})" if why else ""
        if lo is not None and v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo:g}{note}, got {text!r}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi:g}{note}, got {text!r}")
        return v

    bad = ["x", "nan", "NaN", "inf", "-inf", "1e400", ""]
    if lo is not None:
        bad.append(repr(lo - 1.0))
    return ArgType("number", parse, tuple(bad), repr(float(lo if lo is not None else 0.0)))


def int_set(what: str, hi: int = MAX_INDEX) -> ArgType:
    """``N``, ``A:B`` (inclusive, A <= B) or a comma list of them; numbers in ``[0, hi]``; a sorted list."""

    def parse(text: str) -> list[int]:
        out: set[int] = set()
        parts = [p.strip() for p in text.split(",")]
        if not any(parts):
            raise argparse.ArgumentTypeError(f"expected N, A:B or a comma list, got {text!r}")
        for part in parts:
            if not part:
                continue
            try:
                a_txt, b_txt = part.split(":", 1) if ":" in part else (part, part)
                a, b = _int(a_txt), _int(b_txt)
            except (argparse.ArgumentTypeError, ValueError):
                raise argparse.ArgumentTypeError(f"expected N, A:B or a comma list of {what}, got {text!r}") from None
            for n, t in ((a, a_txt), (b, b_txt)):
                if not 0 <= n <= hi:
                    raise argparse.ArgumentTypeError(f"{what} number {t.strip()} is out of range (0..{hi})")
            if a > b:
                raise argparse.ArgumentTypeError(f"{part} is an empty range (A:B needs A <= B)")
            if b - a + 1 + len(out) > MAX_SELECTED:
                raise argparse.ArgumentTypeError(f"{text!r} selects more than {MAX_SELECTED:,} {what}; "
                                                 "give a smaller range")
            out.update(range(a, b + 1))
        return sorted(out)

    bad = ("x", "5:2", "-1", "1:x", ",", "0:99999999999999999999", "99999999999999999999", f"0:{hi + 1}",
           f"0:{MAX_SELECTED + 5}", "1.5", "nan")
    return ArgType(f"{what} selection", parse, bad, "0")


_LAYOUT_KEYS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "edp", "num_layers", "world_size")
_ORDER_DIMS = {"tp", "cp", "ep", "dp", "pp"}


def _order(text: str) -> str:
    dims = text.strip().split("-")
    if sorted(dims) != sorted(_ORDER_DIMS):
        raise argparse.ArgumentTypeError(f"expected a Megatron order naming each of tp, cp, ep, dp, pp once, "
                                         f"joined by '-' (e.g. tp-cp-ep-dp-pp), got {text!r}")
    return text.strip()


def _layout(text: str) -> str:
    import re

    items = [p for p in (q.strip() for q in re.split(r"[,\s]+", text)) if p]
    if not items:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE items, e.g. tp=2,pp=2, got {text!r}")
    for part in items:
        key, sep, val = part.partition("=")
        key, val = key.strip(), val.strip()
        if not sep:
            raise argparse.ArgumentTypeError(f"layout item {part!r} is not KEY=VALUE (e.g. tp=2)")
        if key == "order":
            _order(val)
            continue
        if key not in _LAYOUT_KEYS:
            raise argparse.ArgumentTypeError(f"unknown layout key {key!r} (known: {', '.join(_LAYOUT_KEYS)}, order)")
        try:
            _bounded(_int(val), 1, 2**20, val, "")
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"layout {key}={val!r} must be an integer between 1 and "
                                             f"{2**20}") from None
    return text


layout_text = ArgType("layout", _layout, ("tp", "tp=x", "tp=0", "tp=-1", "bogus=2", "tp=99999999999999999999",
                                          "order=tp-tp", ","), "tp=1")
order_text = ArgType("order", _order, ("bogus", "tp-tp-dp-pp", "tp-dp", ""), "tp-cp-ep-dp-pp")


def _existing_folder(text: str) -> str:
    import os

    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder, got ''")
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an existing folder")
    return text


existing_folder = ArgType("folder", _existing_folder, ("/nonexistent/precnb-folder", "", "/dev/null"), ".")


_ADDRESS = re.compile(r"^(?:(?:tcp|tls|ucx|inproc|ws|wss)://)?[\w.\-\[\]:]+:\d{1,5}$")


def _scheduler(text: str) -> str:
    s = text.strip()
    if not _ADDRESS.match(s) or int(s.rsplit(":", 1)[1]) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a Dask scheduler address (e.g. tcp://10.0.0.2:8786)")
    return s


scheduler_address = ArgType("Dask scheduler address", _scheduler,
                            ("not an address", "tcp://", "http//x:1", "host", "host:99999", "tcp://h:x", ""),
                            "tcp://127.0.0.1:8786")
