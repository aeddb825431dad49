"""The text layout of a finding's summary: long lines wrapped at a width, with a hanging indent.

:meth:`precnb.analysis.findings.Finding.summary` lays its lines out with :func:`wrap_lines` when given a width
(the CLI passes 120 columns, :data:`precnb.cli._term.WIDTH`); the JSON of a finding is not concerned.
"""

from __future__ import annotations

import re
import textwrap

__all__ = ["Statement", "Verbatim", "wrap_lines"]


class Verbatim(str):
    """A summary line printed as it is, whatever its length: a stack frame."""


class Statement(Verbatim):
    """A statement to paste: printed whole; wrapped, its trailing ``  # comment`` goes to the lines below it."""


# a line's label, continued under: ``  hint: ``, ``FIRST DIVERGENCE: `` (a short label and a colon) or ``  entry     ``
# (a word before ``key=value`` fields)
_LABEL = re.compile(r"^\s*(?:[\w?/ .-]{1,40}?:\s+|[\w?]+\s+(?=[\w.]+=))")


# kept on one line: a list (``shape=[2, 8, 32]``, ``list ['Module.x.']``) and a command in backquotes
_WHOLE = re.compile(r"\[[^\[\]\n]*\]|`[^`\n]*`")


def wrap_lines(lines: list[str], width: int | None) -> list[str]:
    """*lines* with each line longer than *width* wrapped at spaces, continued under its label.

    A continuation is indented to the end of the line's label (``  hint: ``, ``  entry     ``), else 4 columns
    more than the line. Every word is kept and none is broken (a word longer than the width stays whole, on a
    line of its own, and so do a bracketed list and a command in backquotes); lines marked verbatim (stack
    frames, code to paste) are not wrapped, but a statement's trailing ``  # comment`` moves below it, under
    the statement.

    Parameters
    ----------
    lines : list of str
        One line each (a line holding a newline is wrapped per physical line).
    width : int or None
        The width; None returns *lines* unchanged.

    Returns
    -------
    list of str
        The wrapped lines.

    Examples
    --------
    >>> wrap_lines(["  hint: " + "word " * 6 + "end"], 30)
    ['  hint: word word word word', '        word word end']
    >>> wrap_lines(["  entry     max=1.5  min=-2  mean=0.25  norm=3"], 32)
    ['  entry     max=1.5  min=-2', '            mean=0.25  norm=3']
    """
    if width is None:
        return list(lines)
    out: list[str] = []
    for line in lines:
        if isinstance(line, Verbatim):
            code, sep, comment = str(line).partition("  # ")
            if len(line) <= width or not sep or not isinstance(line, Statement):
                out.append(str(line))
                continue
            label = re.match(r"\s*\S+\s{2,}", code)  # ``    capture     ``: the comment goes under the statement
            start = " " * (label.end() if label else len(code) - len(code.lstrip()))
            out.append(code)
            out += textwrap.wrap(f"{start}# {comment}", width=width, subsequent_indent=start + "  ",
                                 break_long_words=False, break_on_hyphens=False)
            continue
        for part in str(line).split("\n"):
            if len(part) <= width:
                out.append(part)
                continue
            m = _LABEL.match(part)
            hang = m.end() if m and m.end() <= width // 2 else len(part) - len(part.lstrip()) + 4
            whole = _WHOLE.sub(lambda g: g.group(0).replace(" ", "\0"), part)  # "[2, 8, 32]" is not broken
            out += [w.replace("\0", " ") for w in textwrap.wrap(whole, width=width, subsequent_indent=" " * hang,
                                                                break_long_words=False, break_on_hyphens=False)]
    return out
