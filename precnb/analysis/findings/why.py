"""Why a finding is what it is, in the words every front end shares (the text summary, the explorer's bar)."""

from __future__ import annotations

from typing import Any

__all__ = ["cause_lines", "why_lines"]


def cause_lines(f: Any) -> list[str]:
    """The finding's causes as the text summary prints them, likeliest first: ``"cause: ..."`` (``"cause?:"`` unsure).

    Examples
    --------
    >>> from precnb.analysis.findings import Finding
    >>> cause_lines(Finding(kind="nan", reason="", causes=[{"cause": "0/0", "text": "0/0: a zero count",
    ...                                                     "certain": True}]))
    ['cause: 0/0: a zero count']
    """
    return [f"cause{'' if c.get('certain') else '?'}: {c.get('text', '')}" for c in getattr(f, "causes", None) or []]


def why_lines(f: Any, *, limit: int = 2) -> list[str]:
    """Why the finding is what it is, in at most *limit* lines: its causes (:func:`cause_lines`), else its reason.

    The front ends put these lines beside the finding's title and where (the explorer's finding bar), from the
    same text as :meth:`Finding.summary`.

    Examples
    --------
    >>> from precnb.analysis.findings import Finding
    >>> why_lines(Finding(kind="divergence", reason="x at step 0, rank 0: inputs agree, output differs"))
    ['x at step 0, rank 0: inputs agree, output differs']
    """
    if not getattr(f, "found", False):
        return []
    return cause_lines(f)[:limit] or ([str(f.reason)] if f.reason else [])

