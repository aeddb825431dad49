r"""Terminal output of the command line: the one place every printer goes through.

Text from the data (node and module names, paths, hints, reasons) may hold control characters:
an ANSI/OSC escape sequence would set the terminal title, clear the screen or hide lines, and
bidirectional overrides would reorder what is shown. :func:`escape_controls` writes them as
``\uXXXX`` (so JSON stays valid JSON with the same value); :func:`out` / :func:`err` apply it
to everything the CLI prints. Line feeds and tabs are kept.

Examples
--------
>>> escape_controls("blocks.0\x1b]0;pwned\x07.attn")
'blocks.0\\u001b]0;pwned\\u0007.attn'
>>> escape_controls("a\tb\n")
'a\tb\n'
"""

from __future__ import annotations

import re
import sys
from typing import TextIO

__all__ = ["WIDTH", "err", "escape_controls", "out"]

#: the width the CLI wraps its own text to (a finding's summary: :func:`precnb.analysis.findings.wrap_lines`)
WIDTH = 120

# C0 controls but tab and line feed, DEL, C1 controls, bidi embeddings/overrides/isolates and marks,
# line/paragraph separators
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def escape_controls(text: str) -> str:
    r"""*text* with every control character but ``\t`` and ``\n`` written as ``\uXXXX``."""
    return _CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _write(stream: TextIO, text: str) -> None:
    stream.write(escape_controls(text))


def out(text: str) -> None:
    """Write *text* to stdout, control characters escaped."""
    _write(sys.stdout, text)


def err(text: str) -> None:
    """Write *text* to stderr, control characters escaped."""
    _write(sys.stderr, text)
