"""Every command-line argument is validated when it is parsed: one line, exit 2, no traceback.

The parser is introspected, so a sub-command or option added later is walked too: every option
with a ``type`` must use a validating :class:`precnb.cli._args.ArgType` (a plain ``int`` /
``float`` accepts 99999999999999999999, -1 or NaN), and is tried with the bad values that type
declares plus generic ones; every option with ``choices`` is tried with values outside them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from precnb.cli import build_parser, main
from precnb.cli._args import ArgType

GENERIC_BAD = {
    "integer": ("99999999999999999999", "-99999999999999999999", "nan", "inf", "-inf", "1e999", "1.5", "abc", "",
                "0x10", "1_000"),
    "number": ("nan", "-nan", "inf", "-inf", "1e999", "-1e999", "abc", "", "1,5"),
}


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _required_argv(p: argparse.ArgumentParser) -> list[str]:
    """Placeholder values for the positionals and required options (never read: parsing fails first)."""
    argv: list[str] = []
    for a in p._actions:
        if not a.option_strings and a.nargs not in ("?", "*", argparse.SUPPRESS):
            argv.append("some_path")
        elif a.option_strings and a.required:
            argv += [a.option_strings[0], "out_path"]
    return argv


def _cases():
    for name, p in _subcommands().items():
        base = _required_argv(p)
        for a in p._actions:
            if not a.option_strings or a.nargs == 0:
                continue
            opt = a.option_strings[-1]
            if a.type is not None:
                bads = list(getattr(a.type, "bad", ()))
                kind = getattr(a.type, "__name__", "").split(" ")[0]
                bads += [b for b in GENERIC_BAD.get(kind, ()) if b not in bads]
                for bad in bads:
                    yield name, [name, *base, f"{opt}={bad}"], opt
            if a.choices is not None:
                for bad in ("bogus", "", "NORM", "\x1b]0;pwned\x07"):
                    if bad not in a.choices:
                        yield name, [name, *base, f"{opt}={bad}"], opt


CASES = list(_cases())


def test_every_typed_option_validates_its_values():
    plain = []
    for name, p in _subcommands().items():
        for a in p._actions:
            if a.type is not None and not isinstance(a.type, ArgType):
                plain.append(f"precnb {name} {a.option_strings or a.dest}: type={a.type!r}")
    assert plain == [], "use a validating type from precnb.cli._args: " + "; ".join(plain)
    assert len(CASES) > 150  # the walk found the options (steps, ranks, limits, tolerances, choices, ...)


@pytest.mark.parametrize(("name", "argv", "opt"), CASES, ids=[" ".join(c[1])[:90] for c in CASES])
def test_bad_value_is_a_one_line_usage_error(capsys, name, argv, opt):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (argv, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"precnb {name}: usage error: "), err
    assert opt in lines[0] or opt.lstrip("-") in lines[0], err
    assert "Traceback" not in err and "internal error" not in err and "\x1b" not in err


def test_good_values_pass_the_parser():
    parser = build_parser()
    for name, p in _subcommands().items():
        base = _required_argv(p)
        for a in p._actions:
            if isinstance(a.type, ArgType):
                ns = parser.parse_args([name, *base, f"{a.option_strings[-1]}={a.type.good}"])
                assert getattr(ns, a.dest) is not None


@pytest.mark.parametrize(("argv", "needle"), [
    (["info", "x", "--steps", "0:99999999999999999999"], "out of range"),
    (["diff", "a", "b", "--step-offset", "99999999999999999999"], "--step-offset"),
    (["anomalies", "x", "--limit", "-1"], "must be between 0"),
    (["anomalies", "x", "--stat", "bogus"], "invalid choice: 'bogus'"),
    (["anomalies", "x", "--z", "nan"], "finite number"),
    (["diff", "a", "b", "--rtol", "nan"], "finite number"),
    (["info", "x", "--steps", "5:2"], "empty range"),
    (["info", "x", "--ranks=-1"], "out of range"),
    (["replicas", "x", "--tp", "0"], "must be between 1"),
    (["merge", "x", "--layout", "tp=zz"], "layout tp='zz'"),
    (["merge", "x", "--order", "tp-dp"], "Megatron order"),
    (["nan", "x", "--step=-3"], "must be between 0"),
    (["anomalies", "x", "--ratio", "inf"], "finite number"),
    (["info", "x", "--workers", "0"], "--workers"),
    (["info", "x", "--steps", "0:100000000"], "selects more than"),
])
def test_the_issue_examples(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


def test_parse_errors_in_a_subprocess_are_one_line():
    proc = subprocess.run([sys.executable, "-m", "precnb", "anomalies", "x", "--limit", "-1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and "usage error" in proc.stderr
