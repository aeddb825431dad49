"""Duplicates that would overwrite each other silently: folders and rows.

Folders whose names mean the same number (``step1`` / ``step01``, ``rank`` / ``rank0``,
``rank_1`` / ``rank_01``, ``proc12`` / ``proc012``) and monitor CSV rows for the same (step,
name, micro step) are detected here. Of two such folders the readers keep one (the canonical
spelling, ``step1`` / ``rank0``, else the first by name); of two such rows, the last one. Every
other one is listed as skipped, naming both, so the load report shows it and the command line
exits 1.

Examples
--------
>>> from precnb.io._assemble import LoadReport
>>> rep = LoadReport()
>>> kept = keep_one_per_number([(1, "d/step01"), (1, "d/step1"), (2, "d/step2")], "step",
...                            lambda n: f"step{n}", rep, name=lambda p: p.rsplit("/", 1)[-1])
>>> kept
[(1, 'd/step1'), (2, 'd/step2')]
>>> rep.skipped[0][0], rep.skipped[0][1][:43]
('d/step01', 'not loaded: step 1 is also d/step1 (loaded)')
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from precnb.io._assemble import LoadReport

__all__ = ["keep_one_per_number", "last_row_wins"]

T = TypeVar("T")


def keep_one_per_number(items: Sequence[tuple[Hashable, T]], what: str, canonical: Callable[[Any], str],
                        report: LoadReport, *, name: Callable[[T], str], where: Callable[[T], str] = str
                        ) -> list[tuple[Hashable, T]]:
    """One item per number; the others are reported as skipped (a failure), naming both.

    Parameters
    ----------
    items : sequence of (number, item)
        In any order; the result keeps the input order of the kept items.
    what : str
        ``"step"``, ``"rank"``, ... (for the message).
    canonical : callable
        number → the canonical folder name (``lambda n: f"step{n}"``).
    report : LoadReport
    name : callable
        item → its folder name (compared with *canonical*).
    where : callable
        item → its path as shown.

    Returns
    -------
    list of (number, item)
    """
    by_number: dict[Hashable, list[T]] = defaultdict(list)
    for number, item in items:
        by_number[number].append(item)
    keep: dict[Hashable, T] = {}
    for number, group in by_number.items():
        if len(group) == 1:
            keep[number] = group[0]
            continue
        ordered = sorted(group, key=lambda it: (name(it) != canonical(number), name(it)))
        keep[number] = ordered[0]
        for other in ordered[1:]:
            report.skipped.append((where(other), f"not loaded: {what} {number} is also {where(ordered[0])} "
                                                 "(loaded); the two folder names mean the same number, so "
                                                 "their values would overwrite each other: rename or remove one"))
    return [(n, it) for n, it in items if keep.get(n) is it]


def last_row_wins(order: Sequence[int], labels: Sequence[str], values: Mapping[str, np.ndarray],
                  null_stats: np.ndarray, where: Sequence[str], step: int, report: LoadReport) -> list[int]:
    """Drop duplicate rows (the same label at one step and rank): the last one in *order* wins.

    A dropped row whose statistics differ from the kept one is listed in ``report.skipped``
    (its file and line, and those of the row kept), so the command line names it and exits 1;
    repeated rows with identical values are loaded once and counted in a warning.

    Parameters
    ----------
    order : sequence of int
        Row indices in execution order.
    labels : sequence of str
        Tensor label of each row.
    values : mapping of str to ndarray
        Statistics per row.
    null_stats : ndarray
    where : sequence of str
        ``"file line N"`` of each row.
    step : int
    report : LoadReport

    Returns
    -------
    list of int
        *order* without the dropped rows.

    Examples
    --------
    >>> rep = LoadReport()
    >>> vals = {"norm": np.array([1.0, 2.0, 1.0])}
    >>> last_row_wins([0, 1, 2], ["a", "a", "b"], vals, np.zeros(3, np.uint8), ["f line 2", "f line 3",
    ...               "f line 4"], 0, rep)
    [1, 2]
    >>> rep.skipped[0][0]
    'f line 2'
    """
    last: dict[str, int] = {}
    for i in order:
        last[labels[i]] = i
    if len(last) == len(order):
        return list(order)
    identical: dict[str, int] = defaultdict(int)
    for i in order:
        j = last[labels[i]]
        if i == j:
            continue
        same = null_stats[i] == null_stats[j] and all(
            (v[i] == v[j]) or (np.isnan(v[i]) and np.isnan(v[j])) for v in values.values())
        if same:
            identical[where[i].rsplit(" line ", 1)[0]] += 1
            continue
        report.skipped.append((where[i], f"duplicate row: step {step}, {labels[i]} is also on {where[j]} with "
                                         "different values; not loaded (the last row wins)"))
    for path, n in identical.items():
        report.warnings.append(f"{path}: {n} repeated row(s) with the same values as a later row (loaded once)")
    return [i for i in order if last[labels[i]] == i]
